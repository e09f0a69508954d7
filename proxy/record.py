"""One request as a tap saw it, and how it becomes a span — no sockets here.

The socket-owning module (:mod:`deltatap.proxy.server`) only fills a :class:`TapRecord` with
``mono_ns`` stamps and counters while it forwards; everything below turns the record into span
events and attributes once the request is over, off the forwarding path.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

from deltatap.core.clocksync import ClockEstimate
from deltatap.core.redact import redact_query
from deltatap.core.sse import StreamFacts, StreamObserver
from deltatap.core.vocab import Attr, Observer, Outcome, TapEvent, format_stamp_bounds
from deltatap.proxy.errors import Failure
from deltatap.proxy.grpc import DEADLINE_SLACK_NS, GrpcObserver, GrpcRequestObserver
from deltatap.proxy.websocket import WsTunnel

# request path suffix -> gen_ai.operation.name
_OPERATIONS: tuple[tuple[str, str], ...] = (
    ("/chat/completions", "chat"),
    ("/completions", "text_completion"),
    ("/completion", "text_completion"),
    ("/responses", "chat"),
    ("/messages", "chat"),
    ("/embeddings", "embeddings"),
)
_MAX_TOKEN_KEYS = ("max_tokens", "max_completion_tokens", "max_output_tokens", "n_predict")


def operation_for_path(path: str) -> str | None:
    p = path.rstrip("/")
    return next((op for suffix, op in _OPERATIONS if p.endswith(suffix)), None)


_PATH_OPS_MAX = 1024
_path_ops: dict[str, str | None] = {}


def _operation(path: str) -> str | None:
    """:func:`operation_for_path`, remembered for the last distinct paths (a client sends the same few)."""
    try:
        return _path_ops[path]
    except KeyError:
        op = operation_for_path(path)
        if len(_path_ops) >= _PATH_OPS_MAX:
            _path_ops.clear()
        _path_ops[path] = op
        return op


# the outcomes final_outcome() returns, read once (in Python 3.11 a member read through its Enum class, Outcome.OK, runs
# EnumType's __getattr__ hook: ~0.1 us a read, once per request)
_OK, _HTTP_ERROR, _CLIENT_CANCEL, _TIMEOUT = Outcome.OK, Outcome.HTTP_ERROR, Outcome.CLIENT_CANCEL, Outcome.TIMEOUT


@dataclass(slots=True)
class TapRecord:
    received: int  # first byte of the request read
    method: str = ""
    path: str = ""
    query: str = ""
    client_address: str | None = None
    request_id: str = ""
    request_id_created: bool = False
    head: int | None = None  # read that completed the request head
    body_received: int | None = None  # read that delivered the request's last byte
    forwarded: int | None = None  # last byte of the request written upstream
    response_headers: int | None = None  # read that completed the upstream response head
    response_headers_forwarded: int | None = None
    response_end: int | None = None  # read that delivered the upstream body's last byte
    end: int | None = None  # last byte written downstream (span end)
    downstream_closed: int | None = None
    upstream_closed: int | None = None
    upstream_error: int | None = None
    timeout: int | None = None
    status: int | None = None
    request_bytes: int = 0
    response_bytes: int = 0
    chunks: int = 0
    fingerprint: str | None = None
    request_body: bytes | None = None  # a small request body read whole: fingerprinted when the request is over
    request_capture: bytes | bytearray | None = None  # small request bodies, parsed for model / max_tokens only
    response_capture: bytearray | None = None  # small non-SSE response bodies, parsed for usage only
    stream: StreamObserver | None = None
    ws: WsTunnel | None = None  # the exchange upgraded to WebSocket: the tunnel's frames as watched
    failure: Failure | None = None
    outcome: Outcome | None = None
    facts: StreamFacts = field(default_factory=StreamFacts)
    # event -> (before_ns, after_ns): the event happened in [t - before, t + after] (reads: bytes may have waited in
    # the socket; writes: bytes may have left later). The stream's own are on ``stream``; see bounds().
    bounds: dict[str, tuple[int, int]] = field(default_factory=dict)
    deadline_ns: int | None = None  # the request's own deadline, from its arrival (gRPC: grpc-timeout)
    grpc_request: GrpcRequestObserver | None = None  # a gRPC request's messages (HTTP/2 relay), as read and forwarded

    def final_outcome(self) -> Outcome:
        if self.outcome is not None:
            return self.outcome
        if self.failure is not None:
            return self.failure.outcome
        if self.downstream_closed is not None:
            if self.deadline_ns is not None and self.downstream_closed - self.received >= self.deadline_ns - DEADLINE_SLACK_NS:
                return _TIMEOUT  # the client gave up at its own deadline
            return _CLIENT_CANCEL
        if isinstance(self.stream, GrpcObserver) and self.stream.outcome is not None:
            return self.stream.outcome  # grpc-status (the HTTP status of a gRPC answer is 200)
        if self.status is not None and self.status >= 400:
            return _HTTP_ERROR
        return _OK

    def overheads(self) -> tuple[int | None, int | None, int | None]:
        """The tap's three overhead figures, ``(request, first_token, hop)`` — the definition the properties below and
        the tap's end (``Tap.finish``: its histograms, the span's attributes) read, in one call.

        request: the request's last byte read (its head's read for a request without a body) to its last byte
        written upstream; first_token: the first token's read to its write downstream; hop: what those two cannot
        stamp, bounded (:attr:`overhead_hop_ns`). Each None unless both of its ends are known."""
        forwarded = self.forwarded
        begun = self.body_received if self.body_received is not None else self.head
        request = first_token = None  # (below, ``d if d > 0 else 0``: max(0, d) without the builtin's call)
        if begun is not None and forwarded is not None:
            request = forwarded - begun
            if request < 0:
                request = 0
        s = self.stream
        if s is None:
            return request, None, None
        ftf = s.first_token_forwarded_mono_ns
        if ftf is None:
            return request, None, None
        ft_read = s.first_token_mono_ns
        if ft_read is not None:
            first_token = ftf - ft_read if ftf > ft_read else 0
        if forwarded is None:
            return request, first_token, None
        req = self.bounds.get(_E_FORWARDED)
        ft = s.first_token_forwarded_bound_ns
        if req is None or req[1] < 0 or ft is None or ft < 0:
            return request, first_token, None
        return request, first_token, req[1] + ft

    @property
    def overhead_request_ns(self) -> int | None:
        return self.overheads()[0]

    @property
    def overhead_first_token_ns(self) -> int | None:
        return self.overheads()[1]

    @property
    def overhead_hop_ns(self) -> int | None:
        """What the two overhead figures cannot stamp, bounded: how long the tap's two forwarding writes (the request's
        last byte upstream, the first token downstream) took to hand their bytes on — on loopback, ``send`` returns
        once the bytes sit in the next socket, so this bounds the kernel's delivery of the extra hop a tap inserts,
        one transit each way. The tap's added latency lies in ``[request + first_token, request + first_token +
        hop]`` (plus the propagation of a link that is not loopback). None unless both writes' bounds are known
        (a write that waited behind others and was placed at its departure from the packet log counts 0: its stamp
        already is its departure)."""
        return self.overheads()[2]


# the tap's event names as plain strings (their values: the span's event names), in the span's logical order
(_E_RECEIVED, _E_BODY, _E_FORWARDED, _E_HEADERS, _E_HEADERS_FWD, _E_FT, _E_FT_FWD, _E_LT, _E_LT_FWD, _E_END, _E_UP_CLOSED,
 _E_UP_ERROR, _E_TIMEOUT, _E_DOWN_CLOSED) = map(str, (
    TapEvent.REQUEST_RECEIVED, TapEvent.REQUEST_BODY_RECEIVED, TapEvent.REQUEST_FORWARDED, TapEvent.RESPONSE_HEADERS,
    TapEvent.RESPONSE_HEADERS_FORWARDED, TapEvent.FIRST_TOKEN_RECEIVED, TapEvent.FIRST_TOKEN_FORWARDED,
    TapEvent.LAST_TOKEN_RECEIVED, TapEvent.LAST_TOKEN_FORWARDED, TapEvent.RESPONSE_END, TapEvent.UPSTREAM_CLOSED,
    TapEvent.UPSTREAM_ERROR, TapEvent.TIMEOUT, TapEvent.DOWNSTREAM_CLOSED))


def bounds(rec: TapRecord) -> dict[str, tuple[int, int]]:
    """Every event's interval ``(before_ns, after_ns)`` that is known, the stream's included: the record's own in
    their order, then a gRPC observer's, then the stream's tokens'."""
    out = rec.bounds.copy()
    s = rec.stream
    if isinstance(s, GrpcObserver):
        out.update(s.span_bounds())
    if rec.grpc_request is not None:
        out.update(rec.grpc_request.span_bounds())
    if s is None:
        return out
    if s.first_token_mono_ns is not None:
        out[_E_FT] = (s.first_token_bound_ns, 0)
        out[_E_LT] = (s.last_token_bound_ns, 0)
    # (a write's bound -1: its bytes were still held when stamped and nothing saw them leave by the exchange's end:
    # stated unknown, deltatap.core.vocab.BOUND_UNKNOWN, never exact)
    if s.first_token_forwarded_mono_ns is not None:
        out[_E_FT_FWD] = (0, s.first_token_forwarded_bound_ns)
    if s.last_token_forwarded_mono_ns is not None:
        out[_E_LT_FWD] = (0, s.last_token_forwarded_bound_ns)
    return out


def span_events(rec: TapRecord, off: int) -> list[tuple[str, int, None]]:
    """The span's events: ``(event name, mono_ns + off, None)`` (``off``: mono -> Unix; None: no event attributes)
    for every event the record holds, in time order (ties keep the logical order below: a stable sort)."""
    out = [(_E_RECEIVED, rec.received + off, None)]
    add = out.append
    t = rec.body_received
    if t is not None:
        add((_E_BODY, t + off, None))
    t = rec.forwarded
    if t is not None:
        add((_E_FORWARDED, t + off, None))
    t = rec.response_headers
    if t is not None:
        add((_E_HEADERS, t + off, None))
    t = rec.response_headers_forwarded
    if t is not None:
        add((_E_HEADERS_FWD, t + off, None))
    s = rec.stream
    if s is not None:
        t = s.first_token_mono_ns
        if t is not None:
            add((_E_FT, t + off, None))
        t = s.first_token_forwarded_mono_ns
        if t is not None:
            add((_E_FT_FWD, t + off, None))
        t = s.last_token_mono_ns
        if t is not None:
            add((_E_LT, t + off, None))
        t = s.last_token_forwarded_mono_ns
        if t is not None:
            add((_E_LT_FWD, t + off, None))
    t = rec.response_end
    if t is not None:
        add((_E_END, t + off, None))
    t = rec.upstream_closed
    if t is not None:
        add((_E_UP_CLOSED, t + off, None))
    t = rec.upstream_error
    if t is not None:
        add((_E_UP_ERROR, t + off, None))
    t = rec.timeout
    if t is not None:
        add((_E_TIMEOUT, t + off, None))
    t = rec.downstream_closed
    if t is not None:
        add((_E_DOWN_CLOSED, t + off, None))
    if isinstance(s, GrpcObserver):
        out += [(str(n), t + off, None) for n, t in s.span_events() if t is not None]
    if rec.grpc_request is not None:
        out += [(str(n), t + off, None) for n, t in rec.grpc_request.span_events() if t is not None]
    out.sort(key=_stamp)
    return out


def events(rec: TapRecord) -> list[tuple[str, int]]:
    """``(event name, mono_ns)`` pairs, in time order: :func:`span_events` at mono time."""
    return [(n, t) for n, t, _ in span_events(rec, 0)]


_stamp = itemgetter(1)


_scan = json.JSONDecoder().scan_once  # (json.loads without its Python steps: see _parse_json)
_JSON_WS = " \t\n\r"  # json's whitespace


def _parse_json(buf: bytearray | None) -> Any:
    """``json.loads(buf)``, None where it raises ValueError. A body that opens with an ASCII byte other than NUL
    followed by a non-NUL byte is UTF-8 to ``json.loads`` (``json.detect_encoding``): decoded here and scanned by
    json's own scanner between json's whitespace, with no regular expression or Python frame per call; any other
    body takes ``json.loads`` itself."""
    if not buf:
        return None
    try:
        if len(buf) < 2 or not 0 < buf[0] < 0x80 or not buf[1]:
            return json.loads(buf)
        text = buf.decode("utf-8", "surrogatepass")
        start = len(text) - len(text.lstrip(_JSON_WS))
        try:
            doc, end = _scan(text, start)
        except StopIteration:
            return None
        if end != len(text) and text[end:].strip(_JSON_WS):
            return None
        return doc
    except ValueError:
        return None


def _response_facts(rec: TapRecord) -> StreamFacts:
    """Facts from the SSE stream, or from a small JSON (non-streamed) response body."""
    if rec.stream is not None:
        return rec.stream.facts
    facts = rec.facts
    doc = _parse_json(rec.response_capture)
    if isinstance(doc, dict):
        if isinstance(doc.get("model"), str):
            facts.model = doc["model"]
        if isinstance(doc.get("id"), str):
            facts.response_id = doc["id"]
        usage = doc.get("usage")
        if isinstance(usage, dict) and "input_tokens" in usage:
            facts.take_usage(usage, "input_tokens", "output_tokens")
        else:
            facts.take_usage(usage, "prompt_tokens", "completion_tokens")
        facts.take_timings(doc.get("timings"))
        for ch in doc.get("choices") or ():
            if isinstance(ch, dict):
                facts.take_finish(ch.get("finish_reason"))
        facts.take_finish(doc.get("stop_reason"))
    return facts


_TIMING_ATTRS = {
    "prompt_ms": Attr.ENGINE_PROMPT_MS,
    "predicted_ms": Attr.ENGINE_PREDICTED_MS,
    "prompt_n": Attr.ENGINE_PROMPT_N,
    "predicted_n": Attr.ENGINE_PREDICTED_N,
    "cache_n": Attr.ENGINE_CACHE_N,
}


_REDACTED_MAX = 1024
_redacted: dict[tuple[str, Collection[str], str | bytes | None], str] = {}


def _redacted_query(query: str, keep: Collection[str], key: str | bytes | None) -> str:
    """:func:`redact_query`, remembered for the last distinct queries (a client sends the same few again and again;
    each value is an HMAC to compute)."""
    try:
        cache_key = (query, keep, key)
        hit = _redacted.get(cache_key)
    except TypeError:  # an unhashable keep collection
        return redact_query(query, keep, key)
    if hit is None:
        hit = redact_query(query, keep, key)
        if len(_redacted) >= _REDACTED_MAX:
            _redacted.clear()
        _redacted[cache_key] = hit
    return hit


@dataclass(frozen=True, slots=True)
class SpanConstants:
    """What every span of one tap carries the same (:func:`span_constants`, made once per tap)."""

    head: dict[str, Any]  # the attributes that open each span's dict
    labels: dict[str, Any]  # deltatap.label.* (closing it)
    query_keep: Collection[str]
    fingerprint_key: str | None


def span_constants(*, link: str, downstream: str, downstream_kind: str, upstream: str, upstream_kind: str, upstream_host: str,
                   upstream_port: int, correlation_header: str, labels: dict[str, str], query_keep: Collection[str] = (),
                   fingerprint_key: str | None = None) -> SpanConstants:
    head = {
        Attr.OBSERVER: Observer.TAP.value,
        Attr.LINK: link,
        Attr.DOWNSTREAM: downstream,
        Attr.DOWNSTREAM_KIND: downstream_kind,
        Attr.UPSTREAM: upstream,
        Attr.UPSTREAM_KIND: upstream_kind,
        Attr.CORRELATION_HEADER: correlation_header,
        Attr.SERVER_ADDRESS: upstream_host,
        Attr.SERVER_PORT: upstream_port,
    }
    return SpanConstants(head, {Attr.LABEL_PREFIX + k: v for k, v in labels.items()}, query_keep, fingerprint_key)


def attributes(rec: TapRecord, *, link: str, downstream: str, downstream_kind: str, upstream: str, upstream_kind: str,
               upstream_host: str, upstream_port: int, correlation_header: str, clock: ClockEstimate | None,
               labels: dict[str, str], query_keep: Collection[str] = (), fingerprint_key: str | None = None) -> dict[str, Any]:
    """The span's attributes: names from :class:`deltatap.vocab.Attr`, never any content or secret. ``url.query``
    keeps its keys; each value is a keyed hash (:func:`deltatap.core.redact.redact_query`, the body fingerprint's
    key) except the values of the keys in ``query_keep`` (``--query-keep``). (A tap makes its constants once and calls
    :func:`record_attributes`.)"""
    consts = span_constants(link=link, downstream=downstream, downstream_kind=downstream_kind, upstream=upstream,
                            upstream_kind=upstream_kind, upstream_host=upstream_host, upstream_port=upstream_port,
                            correlation_header=correlation_header, labels=labels, query_keep=query_keep,
                            fingerprint_key=fingerprint_key)
    return record_attributes(rec, consts, clock, rec.final_outcome())


def record_attributes(rec: TapRecord, consts: SpanConstants, clock: ClockEstimate | None, outcome: Outcome,
                      overheads: tuple[int | None, int | None, int | None] | None = None) -> dict[str, Any]:
    """:func:`attributes` with the tap's constants made once and the record's outcome (:meth:`TapRecord.final_outcome`)
    known (and its :meth:`TapRecord.overheads`, where the caller has them already)."""
    a: dict[str, Any] = consts.head.copy()
    a[Attr.REQUEST_ID] = rec.request_id
    a[Attr.BODY_BYTES_IN] = rec.request_bytes
    a[Attr.BODY_BYTES_OUT] = rec.response_bytes
    a[Attr.CHUNKS] = rec.chunks
    s = rec.stream
    a[Attr.STREAMING] = s is not None
    a[Attr.OUTCOME] = outcome._value_
    a[Attr.HTTP_METHOD] = rec.method
    a[Attr.URL_PATH] = path = rec.path
    if rec.query:
        a[Attr.URL_QUERY] = _redacted_query(rec.query, consts.query_keep, consts.fingerprint_key)
    if rec.client_address:
        a[Attr.CLIENT_ADDRESS] = rec.client_address
    if rec.fingerprint:
        a[Attr.BODY_FINGERPRINT] = rec.fingerprint
    status = rec.status
    if status is not None:
        a[Attr.HTTP_STATUS] = status
    failure = rec.failure
    if failure is not None:
        a[Attr.ERROR_TYPE] = failure.error_type
        a[Attr.ERROR_CAUSE] = failure.cause
    elif status is not None and status >= 500:
        a[Attr.ERROR_TYPE] = str(status)
    request, first_token, hop = overheads if overheads is not None else rec.overheads()
    if request is not None:
        a[Attr.OVERHEAD_REQUEST_NS] = request
    if first_token is not None:
        a[Attr.OVERHEAD_FIRST_TOKEN_NS] = first_token
    if hop is not None:
        a[Attr.OVERHEAD_HOP_NS] = hop
    if clock is not None:
        a[Attr.CLOCK_OFFSET_NS] = clock.offset_ns
        a[Attr.CLOCK_UNCERTAINTY_NS] = clock.uncertainty_ns
    stamp_bounds = format_stamp_bounds(bounds(rec))
    if stamp_bounds:
        a[Attr.STAMP_BOUNDS] = stamp_bounds
    if s is not None:
        a[Attr.STREAM_FORMAT] = s.format or "none"
        a[Attr.EVENTS] = s.events
        a[Attr.CONTENT_EVENTS] = s.content_events
        g, gf = s.gaps, s.gaps_forwarded
        a[Attr.GAP_COUNT] = g.count
        if g.count:
            a[Attr.GAP_MEAN_MS] = g.mean_ns / 1e6
            a[Attr.GAP_MAX_MS] = g.max_ns / 1e6
            a[Attr.GAP_P99_MS] = g.p99_ns() / 1e6
        if gf.count:
            a[Attr.GAP_FWD_MEAN_MS] = gf.mean_ns / 1e6
            a[Attr.GAP_FWD_MAX_MS] = gf.max_ns / 1e6
            a[Attr.GAP_FWD_P99_MS] = gf.p99_ns() / 1e6
    else:
        a[Attr.STREAM_FORMAT] = "none"
    op = _path_ops.get(path) or _operation(path)
    if op:
        a[Attr.GENAI_OPERATION] = op
        a[Attr.GENAI_SYSTEM] = "anthropic" if s is not None and s.format == "anthropic" else "openai"
    if rec.request_capture:  # the request's model and max_tokens, from its captured body
        doc = _parse_json(rec.request_capture)
        if isinstance(doc, dict):
            model = doc.get("model")
            if isinstance(model, str):
                a[Attr.GENAI_REQUEST_MODEL] = model
            for key in _MAX_TOKEN_KEYS:
                v = doc.get(key)
                if isinstance(v, int) and not isinstance(v, bool):
                    a[Attr.GENAI_REQUEST_MAX_TOKENS] = v
                    break
    facts = s.facts if s is not None else _response_facts(rec)
    if facts.model:
        a[Attr.GENAI_RESPONSE_MODEL] = facts.model
    if facts.response_id:
        a[Attr.GENAI_RESPONSE_ID] = facts.response_id
    if facts.input_tokens is not None:
        a[Attr.GENAI_INPUT_TOKENS] = facts.input_tokens
    if facts.output_tokens is not None:
        a[Attr.GENAI_OUTPUT_TOKENS] = facts.output_tokens
    elif s is not None and s.tokens:
        a[Attr.GENAI_OUTPUT_TOKENS] = s.tokens  # counted from content events: no usage in the stream
    if facts.finish_reasons:
        a[Attr.GENAI_FINISH_REASONS] = list(facts.finish_reasons)
    timings = facts.timings
    if timings:
        for key, attr in _TIMING_ATTRS.items():
            if key in timings:
                a[attr] = timings[key]
    if rec.ws is not None:
        rec.ws.attributes(a)
    if s is not None and isinstance(s, GrpcObserver):
        s.span_attributes(a)
    if rec.grpc_request is not None:
        rec.grpc_request.span_attributes(a)
    if consts.labels:
        a.update(consts.labels)
    return a
