"""Sans-I/O gRPC observation for one HTTP/2 stream: messages, their stamps, the status, the first content token.

Nothing here touches a socket or a clock. The HTTP/2 relay (:mod:`deltatap.proxy.h2relay`) feeds each response DATA
frame's payload as read, ``feed(data, t_mono_ns, bound_ns)``, after it wrote the frame on, calls ``forwarded`` once
the frame was written downstream, and hands the trailers (or a trailers-only response's headers) to
:meth:`GrpcObserver.trailers`. The bytes are only read.

``GrpcFramer``
    The length-prefixed message framing of gRPC over HTTP/2 (PROTOCOL-HTTP2.md, "Length-Prefixed-Message"):
    a 1-byte compressed flag, a 4-byte big-endian length, the message. Messages may be split across DATA
    frames and several may share one; ``feed(data) -> list[GrpcMessage]`` returns those a frame completed.

``GrpcObserver(path, encoding=None)``
    The tap's :class:`~deltatap.core.sse.StreamObserver` for a gRPC response: the same interface (``feed``,
    ``finish``, ``forwarded``, ``unforwarded``, the first/last token stamps, gaps), with messages in place of SSE
    events. Each message's arrival ``(t_mono_ns, bound_ns)`` is kept (``arrivals``, the first
    :data:`MAX_ARRIVALS`), and the first and last message's. A method with a decoder in :data:`DECODERS`
    (KServe v2 / Triton ``ModelStreamInfer`` and ``ModelInfer``) has its messages decoded to find the
    content: the first-content-token rule is :meth:`ContentStream.count`, written once for SSE and gRPC. Any
    other method: every response message is one content unit (``first_token_source = "message"`` on the span).

``GrpcRequestObserver()``
    The request side of the same stream (client streaming, bidi; a unary call's one message too): each request
    message's arrival from downstream and the write that carried it upstream, the first and the last, their count
    and payload bytes. The relay feeds each request DATA frame as read (``feed``) and calls ``forwarded`` with the
    write stamp once that frame's bytes went upstream.

Status (``grpc-status``, ``grpc-message``) maps onto the span's :class:`~deltatap.core.vocab.Outcome` through
:func:`outcome_for_status`.
"""

from __future__ import annotations

import struct
import zlib
from array import array
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from deltatap.core.sse import Extracted, StreamFacts, StreamObserver
from deltatap.core.vocab import Attr, Outcome, TapEvent

__all__ = [
    "DECODERS", "FIRST_TOKEN_CONTENT", "FIRST_TOKEN_MESSAGE", "GRPC_STATUS_NAMES", "MAX_ARRIVALS", "GrpcFramer",
    "GrpcMessage", "GrpcObserver", "GrpcRequestObserver", "grpc_timeout_ns", "is_grpc", "kserve_v2_infer_response", "outcome_for_status", "register_decoder",
]

FIRST_TOKEN_CONTENT = "content"  # the first token is the first message whose decoded content is not blank
FIRST_TOKEN_MESSAGE = "message"  # the method is not decoded: every response message is one content unit
MESSAGE_FORMAT = "grpc-message"  # Attr.STREAM_FORMAT of a method without a decoder
MAX_ARRIVALS = 65_536  # per-message arrival stamps kept per stream (counts go on beyond)

# https://grpc.github.io/grpc/core/md_doc_statuscodes.html
GRPC_STATUS_NAMES: dict[int, str] = {
    0: "OK", 1: "CANCELLED", 2: "UNKNOWN", 3: "INVALID_ARGUMENT", 4: "DEADLINE_EXCEEDED", 5: "NOT_FOUND",
    6: "ALREADY_EXISTS", 7: "PERMISSION_DENIED", 8: "RESOURCE_EXHAUSTED", 9: "FAILED_PRECONDITION", 10: "ABORTED",
    11: "OUT_OF_RANGE", 12: "UNIMPLEMENTED", 13: "INTERNAL", 14: "UNAVAILABLE", 15: "DATA_LOSS", 16: "UNAUTHENTICATED",
}
# a status onto the span's outcome vocabulary; every other non-zero code is the upstream answering with an error
_STATUS_OUTCOME: dict[int, Outcome] = {
    0: Outcome.OK,
    1: Outcome.CLIENT_CANCEL,  # CANCELLED: the caller gave up (a server's own cancel reads the same on the wire)
    4: Outcome.TIMEOUT,  # DEADLINE_EXCEEDED: the grpc-timeout deadline passed
    14: Outcome.UPSTREAM_ERROR,  # UNAVAILABLE: the server (or a proxy before it) could not serve
}


def outcome_for_status(code: int | None) -> Outcome | None:
    """The span outcome of a ``grpc-status`` (None: no status seen)."""
    if code is None:
        return None
    return _STATUS_OUTCOME.get(code, Outcome.HTTP_ERROR)


def _text(v: str | bytes) -> str:
    return v.decode("latin-1") if isinstance(v, (bytes, bytearray)) else v


def is_grpc(headers: Iterable[tuple[str | bytes, str | bytes]]) -> bool:
    """Whether a request's (or response's) ``content-type`` is ``application/grpc`` (``+proto``, ``+json``...)."""
    for k, v in headers:
        if _text(k).lower() == "content-type":
            ct = _text(v).lower()
            return ct == "application/grpc" or ct.startswith(("application/grpc+", "application/grpc;"))
    return False


_TIMEOUT_UNIT_NS = {"H": 3_600_000_000_000, "M": 60_000_000_000, "S": 1_000_000_000, "m": 1_000_000, "u": 1_000, "n": 1}
DEADLINE_SLACK_NS = 1_000_000  # a cancel this close to the deadline is the deadline (the client's clock started earlier)


def grpc_timeout_ns(value: str | bytes | None) -> int | None:
    """A request's ``grpc-timeout`` (1-8 digits and a unit H/M/S/m/u/n) in ns, None when absent or malformed."""
    if value is None:
        return None
    v = _text(value).strip()
    if not 2 <= len(v) <= 9 or not v[:-1].isdigit() or v[-1] not in _TIMEOUT_UNIT_NS:
        return None
    return int(v[:-1]) * _TIMEOUT_UNIT_NS[v[-1]]


# --------------------------------------------------------------------------------------------
# Message framing
# --------------------------------------------------------------------------------------------


@dataclass(slots=True)
class GrpcMessage:
    compressed: bool
    data: bytes


class GrpcFramer:
    """Incremental Length-Prefixed-Message reader: any split of the stream, any number of messages per feed."""

    __slots__ = ("_buf", "messages", "comments", "truncated", "malformed")

    def __init__(self) -> None:
        self._buf = bytearray()
        self.messages = 0
        self.comments = 0  # ContentStream's interface (SSE comments); gRPC has none
        self.truncated = False
        self.malformed = False  # a compressed flag other than 0/1: the stream is not gRPC framing; stop parsing

    def feed(self, data: bytes | bytearray | memoryview) -> list[GrpcMessage]:
        if self.malformed or not data:
            return []
        buf = self._buf
        buf += data
        out: list[GrpcMessage] = []
        pos, n = 0, len(buf)
        while n - pos >= 5:
            flag = buf[pos]
            if flag > 1:
                self.malformed = True
                buf.clear()
                return out
            (length,) = struct.unpack_from(">I", buf, pos + 1)
            end = pos + 5 + length
            if end > n:
                break
            out.append(GrpcMessage(flag == 1, bytes(buf[pos + 5 : end])))
            pos = end
        if pos:
            del buf[:pos]
        self.messages += len(out)
        return out

    def finish(self) -> list[GrpcMessage]:
        """End of stream: a partial message left over sets ``truncated``."""
        self.truncated = bool(self._buf)
        self._buf.clear()
        return []


# --------------------------------------------------------------------------------------------
# Protobuf wire format: just enough to walk a message's fields
# --------------------------------------------------------------------------------------------


class WireError(ValueError):
    pass


def _varint(buf: memoryview, pos: int) -> tuple[int, int]:
    result = shift = 0
    n = len(buf)
    while True:
        if pos >= n or shift > 63:
            raise WireError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7


def fields(data: bytes | memoryview) -> Iterator[tuple[int, int, Any]]:
    """``(field number, wire type, value)`` of each field: an int for varint/fixed fields, a memoryview for
    length-delimited ones (sub-messages, strings, bytes, packed repeated). Raises :class:`WireError` on bad input."""
    buf = memoryview(data)
    pos, n = 0, len(buf)
    while pos < n:
        key, pos = _varint(buf, pos)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, pos = _varint(buf, pos)
        elif wt == 2:
            ln, pos = _varint(buf, pos)
            if pos + ln > n:
                raise WireError("length-delimited field past the end")
            v, pos = buf[pos : pos + ln], pos + ln
        elif wt == 1:
            if pos + 8 > n:
                raise WireError("truncated fixed64")
            v, pos = int.from_bytes(buf[pos : pos + 8], "little"), pos + 8
        elif wt == 5:
            if pos + 4 > n:
                raise WireError("truncated fixed32")
            v, pos = int.from_bytes(buf[pos : pos + 4], "little"), pos + 4
        else:
            raise WireError(f"wire type {wt}")
        if num == 0:
            raise WireError("field number 0")
        yield num, wt, v


def _bytes_elements(raw: memoryview) -> list[bytes]:
    """A BYTES tensor in ``raw_output_contents``: each element a 4-byte little-endian length and its bytes."""
    out, pos, n = [], 0, len(raw)
    while pos + 4 <= n:
        ln = int.from_bytes(raw[pos : pos + 4], "little")
        pos += 4
        if pos + ln > n:
            raise WireError("BYTES element past the end")
        out.append(bytes(raw[pos : pos + ln]))
        pos += ln
    if pos != n:
        raise WireError("BYTES tensor with trailing bytes")
    return out


# --------------------------------------------------------------------------------------------
# Decoders of known methods: one function each, registered by the gRPC method path
# --------------------------------------------------------------------------------------------

Decoder = Callable[[bytes, StreamFacts], Extracted]
DECODERS: dict[str, tuple[str, Decoder]] = {}  # method path -> (Attr.STREAM_FORMAT name, decoder)


def register_decoder(path: str, format_name: str) -> Callable[[Decoder], Decoder]:
    def deco(fn: Decoder) -> Decoder:
        DECODERS[path] = (format_name, fn)
        return fn

    return deco


def _bool_param(param: memoryview) -> bool | None:
    """An ``InferParameter``'s ``bool_param`` (field 1), None when it holds another kind."""
    for num, wt, v in fields(param):
        if num == 1 and wt == 0:
            return bool(v)
    return None


def kserve_v2_infer_response(data: bytes | memoryview, facts: StreamFacts) -> Extracted:
    """A KServe v2 ``inference.ModelInferResponse``: the text of its ``BYTES`` outputs (``outputs[i].contents.
    bytes_contents``, or ``raw_output_contents[i]`` in the same order as ``outputs``), its model and id into
    ``facts``; a Triton decoupled model's ``triton_final_response`` parameter ends the stream."""
    outputs: list[tuple[str, memoryview | None]] = []  # (datatype, contents)
    raws: list[memoryview] = []
    done = False
    for num, wt, v in fields(data):
        if wt != 2:
            continue
        if num == 1:
            facts.model = bytes(v).decode("utf-8", "replace")
        elif num == 3 and len(v):
            facts.response_id = bytes(v).decode("utf-8", "replace")
        elif num == 4:  # map<string, InferParameter> entry: key 1, value 2
            key = value = None
            for en, ewt, ev in fields(v):
                if en == 1 and ewt == 2:
                    key = bytes(ev)
                elif en == 2 and ewt == 2:
                    value = ev
            if key == b"triton_final_response" and value is not None and _bool_param(value):
                done = True
        elif num == 5:  # InferOutputTensor: datatype 2, contents 5
            dtype, contents = "", None
            for tn, twt, tv in fields(v):
                if tn == 2 and twt == 2:
                    dtype = bytes(tv).decode("ascii", "replace")
                elif tn == 5 and twt == 2:
                    contents = tv
            outputs.append((dtype, contents))
        elif num == 6:
            raws.append(v)
    parts: list[bytes] = []
    for i, (dtype, contents) in enumerate(outputs):
        if dtype != "BYTES":
            continue
        if i < len(raws):
            parts.extend(_bytes_elements(raws[i]))
        elif contents is not None:
            parts.extend(bytes(cv) for cn, cwt, cv in fields(contents) if cn == 8 and cwt == 2)
    text = b"".join(parts).decode("utf-8", "replace")
    return text, (1 if text else 0), done


@register_decoder("/inference.GRPCInferenceService/ModelStreamInfer", "kserve-v2")
def kserve_v2_stream(data: bytes, facts: StreamFacts) -> Extracted:
    """``inference.ModelStreamInferResponse``: ``error_message`` (1, recorded as an in-stream error, never its
    text), ``infer_response`` (2)."""
    got: Extracted = ("", 0, False)
    for num, wt, v in fields(data):
        if wt != 2:
            continue
        if num == 1 and len(v):
            facts.take_error("error")
        elif num == 2:
            got = kserve_v2_infer_response(v, facts)
    return got


register_decoder("/inference.GRPCInferenceService/ModelInfer", "kserve-v2")(kserve_v2_infer_response)


# --------------------------------------------------------------------------------------------
# The observer
# --------------------------------------------------------------------------------------------

_MESSAGE_UNIT: Extracted = ("message", 1, False)  # a message of a method without a decoder: one content unit
_DECOMPRESS: dict[str, Callable[[bytes], bytes]] = {
    "gzip": lambda b: zlib.decompress(b, 16 + zlib.MAX_WBITS),
    "deflate": zlib.decompress,
    "identity": lambda b: b,
}


class GrpcObserver(StreamObserver):
    """One gRPC response stream as the tap sees it; see the module docstring. ``path`` is the request's ``:path``
    (``/package.Service/Method``), ``encoding`` the response's ``grpc-encoding``."""

    def __init__(self, path: str, encoding: str | None = None) -> None:
        super().__init__()
        self.parser = GrpcFramer()  # type: ignore[assignment]  # the framing ContentStream's feed/finish read
        self.path = path
        service, _, method = path.lstrip("/").rpartition("/")
        self.service, self.method = service, method
        found = DECODERS.get(path)
        self._decode = found[1] if found else None
        self.format = found[0] if found else MESSAGE_FORMAT
        self.first_token_source = FIRST_TOKEN_CONTENT if found else FIRST_TOKEN_MESSAGE
        self.encoding = (encoding or "identity").strip().lower()
        self.message_bytes = 0  # payload bytes of the messages (without their 5-byte prefixes)
        self.compressed_messages = 0
        self.undecodable = 0  # messages a decoder could not read (malformed, or an encoding it cannot undo)
        self.arrival_mono_ns = array("q")  # each message's read stamp, the first MAX_ARRIVALS
        self.arrival_bound_ns = array("q")
        self.first_message_mono_ns: int | None = None
        self.first_message_bound_ns = 0
        self.last_message_mono_ns: int | None = None
        self.last_message_bound_ns = 0
        self.status: int | None = None
        self.status_message: str | None = None  # grpc-message, percent-decoded
        self.trailers_mono_ns: int | None = None
        self.trailers_only = False

    @property
    def messages(self) -> int:
        return self.events

    def take(self, msg: GrpcMessage, t_mono_ns: int, bound_ns: int = 0) -> Extracted:  # type: ignore[override]
        """Account for one response message read at ``t_mono_ns``: its stamp, then its content through
        :meth:`ContentStream.count`."""
        self.events += 1
        self.message_bytes += len(msg.data)
        if len(self.arrival_mono_ns) < MAX_ARRIVALS:
            self.arrival_mono_ns.append(t_mono_ns)
            self.arrival_bound_ns.append(bound_ns)
        if self.first_message_mono_ns is None:
            self.first_message_mono_ns, self.first_message_bound_ns = t_mono_ns, bound_ns
        self.last_message_mono_ns, self.last_message_bound_ns = t_mono_ns, bound_ns
        data = msg.data
        if msg.compressed:
            self.compressed_messages += 1
        decode = self._decode
        if decode is None:
            return self.count(_MESSAGE_UNIT, t_mono_ns, bound_ns)
        try:
            if msg.compressed:
                undo = _DECOMPRESS.get(self.encoding)
                if undo is None:
                    raise WireError(f"grpc-encoding {self.encoding}")
                data = undo(data)
            got = decode(data, self.facts)
        except (WireError, zlib.error):
            self.undecodable += 1
            self.malformed += 1
            return ("", 0, False)
        return self.count(got, t_mono_ns, bound_ns)

    def trailers(self, headers: Iterable[tuple[str | bytes, str | bytes]], t_mono_ns: int | None, *,
                 trailers_only: bool = False) -> None:
        """The stream's trailers read at ``t_mono_ns`` (or the headers of a trailers-only response,
        ``trailers_only=True``, whose stamp is the span's ``response.headers``: None here): ``grpc-status`` and
        ``grpc-message``."""
        if t_mono_ns is not None:
            self.trailers_mono_ns = t_mono_ns
        self.trailers_only = self.trailers_only or trailers_only
        for k, v in headers:
            name = _text(k).lower()
            if name == "grpc-status":
                try:
                    self.status = int(_text(v).strip())
                except ValueError:
                    self.status = 2  # UNKNOWN: what a client makes of a status it cannot parse
            elif name == "grpc-message":
                self.status_message = unquote(_text(v), errors="replace")

    @property
    def outcome(self) -> Outcome | None:
        return outcome_for_status(self.status)

    @property
    def status_name(self) -> str | None:
        if self.status is None:
            return None
        return GRPC_STATUS_NAMES.get(self.status, str(self.status))

    def span_events(self) -> list[tuple[str, int]]:
        """The gRPC events this observer adds to the tap span (``(name, mono_ns)``)."""
        out = []
        for name, t in ((TapEvent.FIRST_MESSAGE_RECEIVED, self.first_message_mono_ns),
                        (TapEvent.LAST_MESSAGE_RECEIVED, self.last_message_mono_ns),
                        (TapEvent.RESPONSE_TRAILERS, self.trailers_mono_ns)):
            if t is not None:
                out.append((str(name), t))
        return out

    def span_bounds(self) -> dict[str, tuple[int, int]]:
        out: dict[str, tuple[int, int]] = {}
        if self.first_message_mono_ns is not None:
            out[TapEvent.FIRST_MESSAGE_RECEIVED] = (self.first_message_bound_ns, 0)
            out[TapEvent.LAST_MESSAGE_RECEIVED] = (self.last_message_bound_ns, 0)
        return out

    def span_attributes(self, a: dict[str, Any] | None = None) -> dict[str, Any]:
        """The gRPC attributes of the tap span (names from :class:`~deltatap.core.vocab.Attr`), added to ``a`` (the
        span's, built by :func:`deltatap.proxy.record.attributes`) and returned. The grpc-message text is not
        recorded (it may quote the request), only the status code and its name. A method without a decoder states
        no output tokens (its messages are not tokens)."""
        a = {} if a is None else a
        a.update({
            Attr.RPC_SYSTEM: "grpc",
            Attr.RPC_SERVICE: self.service,
            Attr.RPC_METHOD: self.method,
            Attr.FIRST_TOKEN_SOURCE: self.first_token_source,
            Attr.GRPC_MESSAGE_BYTES: self.message_bytes,
        })
        if self.first_token_source == FIRST_TOKEN_MESSAGE and self.facts.output_tokens is None:
            a.pop(Attr.GENAI_OUTPUT_TOKENS, None)
        if self.status is not None:
            a[Attr.RPC_GRPC_STATUS] = self.status
            if self.status != 0:
                a[Attr.ERROR_TYPE] = self.status_name
        if self.undecodable:
            a[Attr.GRPC_UNDECODABLE] = self.undecodable
        if self.compressed_messages:
            a[Attr.GRPC_COMPRESSED] = self.compressed_messages
        return a


class GrpcRequestObserver:
    """The request messages of one gRPC stream as the tap relays them upstream (see the module docstring). Stamps are
    ``(mono_ns, bound_ns)``: a read's (its bytes arrived at most ``bound`` earlier) or a write's (they left at most
    ``bound`` later)."""

    __slots__ = ("framer", "messages", "message_bytes", "first_received", "last_received", "first_forwarded", "last_forwarded",
                 "forwarded_messages", "last_forwarded_received", "answered")

    def __init__(self) -> None:
        self.framer = GrpcFramer()
        self.messages = 0
        self.message_bytes = 0
        self.first_received: tuple[int, int] | None = None
        self.last_received: tuple[int, int] | None = None
        self.first_forwarded: tuple[int, int] | None = None
        self.last_forwarded: tuple[int, int] | None = None
        self.forwarded_messages = 0  # messages whose last byte was written upstream
        self.last_forwarded_received: tuple[int, int] | None = None  # the read stamp of the last message forwarded
        # the request the first response message answers, while the client's stream was still open (bidi): (the read
        # and the write stamp of the last request message forwarded before it); see answer()
        self.answered: tuple[tuple[int, int], tuple[int, int]] | None = None

    def feed(self, data: bytes | memoryview, t_mono_ns: int, bound_ns: int = 0) -> int:
        """A request DATA frame's payload read at ``t_mono_ns``: the number of messages it completed (the caller then
        calls :meth:`forwarded` with ``messages`` once the frame was written upstream)."""
        got = self.framer.feed(data)
        if got:
            self.messages += len(got)
            self.message_bytes += sum(len(m.data) for m in got)
            if self.first_received is None:
                self.first_received = (t_mono_ns, bound_ns)
            self.last_received = (t_mono_ns, bound_ns)
        return len(got)

    def forwarded(self, upto: int, read: tuple[int, int], t_mono_ns: int, bound_ns: int) -> None:
        """The write at ``t_mono_ns`` carried the request's bytes upstream up to the end of message number ``upto``
        (read at ``read``: ``(mono_ns, bound_ns)``)."""
        if upto <= self.forwarded_messages:
            return
        if self.forwarded_messages == 0:
            self.first_forwarded = (t_mono_ns, bound_ns)
        self.forwarded_messages = upto
        self.last_forwarded = (t_mono_ns, bound_ns)
        self.last_forwarded_received = read

    def answer(self) -> tuple[tuple[int, int], tuple[int, int]] | None:
        """The first response message arrived while the request stream is still open (bidi streaming: the client ends
        its stream when it is done, after the answers): the request it answers is the messages forwarded so far. Their
        last one's read and write stamps are kept (once) and returned, for the span's ``request.body_received`` and
        ``request.forwarded`` (the engine's request point), or None when no message went upstream yet."""
        if self.answered is None and self.last_forwarded is not None and self.last_forwarded_received is not None:
            self.answered = (self.last_forwarded_received, self.last_forwarded)
        return self.answered

    def span_events(self) -> list[tuple[str, int]]:
        out: list[tuple[str, int]] = []
        for name, st in ((TapEvent.FIRST_REQUEST_MESSAGE_RECEIVED, self.first_received),
                         (TapEvent.FIRST_REQUEST_MESSAGE_FORWARDED, self.first_forwarded),
                         (TapEvent.LAST_REQUEST_MESSAGE_RECEIVED, self.last_received),
                         (TapEvent.LAST_REQUEST_MESSAGE_FORWARDED, self._last_forwarded())):
            if st is not None:
                out.append((str(name), st[0]))
        return out

    def _last_forwarded(self) -> tuple[int, int] | None:
        # (only once every message read went upstream: a stream cut short has no last message forwarded)
        return self.last_forwarded if self.forwarded_messages and self.forwarded_messages == self.messages else None

    def span_bounds(self) -> dict[str, tuple[int, int]]:
        out: dict[str, tuple[int, int]] = {}
        if self.first_received is not None and self.last_received is not None:
            out[TapEvent.FIRST_REQUEST_MESSAGE_RECEIVED] = (self.first_received[1], 0)
            out[TapEvent.LAST_REQUEST_MESSAGE_RECEIVED] = (self.last_received[1], 0)
        # (a write's bound -1: TCP, or the transport, still held its bytes when stamped and nothing saw them leave by the
        # stream's end, h2relay._settle_writes: stated unknown, deltatap.core.vocab.BOUND_UNKNOWN, never exact)
        if self.first_forwarded is not None:
            out[TapEvent.FIRST_REQUEST_MESSAGE_FORWARDED] = (0, self.first_forwarded[1])
        last = self._last_forwarded()
        if last is not None:
            out[TapEvent.LAST_REQUEST_MESSAGE_FORWARDED] = (0, last[1])
        return out

    def span_attributes(self, a: dict[str, Any]) -> dict[str, Any]:
        a[Attr.GRPC_REQUEST_MESSAGES] = self.messages
        a[Attr.GRPC_REQUEST_MESSAGE_BYTES] = self.message_bytes
        return a
