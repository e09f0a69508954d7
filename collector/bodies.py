"""Request bodies of the OTLP/HTTP receiver: a limit on the bytes that arrive *and* on what they inflate to.

A body is fed to a :class:`BodyReader` chunk by chunk as it arrives (sans-I/O: the receiver owns the socket).
``gzip`` and ``deflate`` are inflated incrementally (``zlib.decompressobj`` with ``max_length``), so no more
than the limit and one 1 MiB piece of inflated bytes ever exist: a 4.7 MB gzip body of zeros (level 1) that would inflate to
1 GiB is refused after 64 MiB of it, in ~0.1 s, and the buffer is emptied at once. Before this, aiohttp
inflated the body and ``request.read()`` raised ``HTTPRequestEntityTooLarge`` past ``client_max_size``; the
read buffers (64-400 MB per refused request) stayed behind in reference cycles (the exception, its traceback,
the frames holding them) that ``deltatap collect``'s young-generation threshold of 1,000,000 allocations left
alone for minutes
(3 oversized bodies and 3 such bombs, sent as benchmarks/collector_abuse.py sends them: RSS 115 MB -> 1.5 GB).

Refusals are values, not exceptions carried up the stack: :class:`Refusal` (an HTTP status and one line).
413 for a body over the limit, compressed or inflated; 400 for a body its ``Content-Encoding`` does not
describe (not gzip, truncated, trailing bytes); 415 with ``Accept-Encoding`` for a content coding the receiver
does not take (RFC 9110 section 15.5.16: "If the problem was caused by an unsupported content coding, the
Accept-Encoding response header field ... ought to be used to indicate which (if any) content codings would
have been accepted"; OTLP/HTTP clients retry only 429, 502, 503 and 504, so neither 400 nor 415 is retried).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

__all__ = ["ACCEPTED_CODINGS", "MAX_BODY", "BodyReader", "Refusal", "parse_coding"]

MAX_BODY = 64 * 1024 * 1024
"""The most one OTLP export may carry, as received and as inflated (also gRPC's max receive message length)."""

_PIECE = 1024 * 1024
ACCEPTED_CODINGS = "gzip, deflate, identity"  # the Accept-Encoding of a 415
_GZIP = ("gzip", "x-gzip")


@dataclass(frozen=True)
class Refusal:
    """Why a body is refused: the HTTP status and one line that says what is wrong and what to do."""

    status: int
    message: str


def _mib(n: int) -> str:
    return f"{n / (1024 * 1024):g} MiB"


def parse_coding(header: str) -> str | Refusal:
    """The one content coding of a ``Content-Encoding`` value (``""`` for none), or a 415 :class:`Refusal`.

    ``identity`` entries are ignored; more than one real coding (``gzip, gzip``) is refused: no exporter
    stacks them, and each layer would multiply what a small body can inflate to."""
    codings = [c.strip().lower() for c in header.split(",")]
    codings = [c for c in codings if c and c != "identity"]
    if not codings:
        return ""
    if len(codings) == 1 and (codings[0] in _GZIP or codings[0] == "deflate"):
        return "gzip" if codings[0] in _GZIP else "deflate"
    return Refusal(415, f"Content-Encoding {header.strip()[:40]!r} is not supported; send gzip, deflate or no Content-Encoding")


class BodyReader:
    """Collects one request body under ``limit`` bytes, inflating ``gzip`` / ``deflate`` as it arrives.

    :meth:`feed` each chunk, then :meth:`finish` for the body; either returns a :class:`Refusal` instead
    (then stop reading: the reader has already dropped what it held). :meth:`check_declared` first: a
    ``Content-Length`` over the limit is refused before any byte of the body is read."""

    __slots__ = ("_coding", "_limit", "_out", "_received", "_z", "_refused")

    def __init__(self, coding: str, limit: int = MAX_BODY) -> None:
        self._coding = coding
        self._limit = limit
        self._out = bytearray()
        self._received = 0
        self._z: zlib._Decompress | None = None
        self._refused: Refusal | None = None

    def check_declared(self, declared: int | None) -> Refusal | None:
        if declared is not None and declared > self._limit:
            return self._refuse(413, f"request body of {declared} bytes is over the {_mib(self._limit)} limit; send smaller exports "
                                     "(the SDK's max_export_batch_size)")
        return None

    def _refuse(self, status: int, message: str) -> Refusal:
        self._out = bytearray()  # free now, whoever still holds the reader
        self._z = None
        self._refused = Refusal(status, message)
        return self._refused

    def _too_large(self) -> Refusal:
        if self._coding:
            return self._refuse(413, f"request body inflates ({self._coding}) to more than the {_mib(self._limit)} limit; "
                                     "send smaller exports (the SDK's max_export_batch_size)")
        return self._refuse(413, f"request body is over the {_mib(self._limit)} limit; send smaller exports (the SDK's max_export_batch_size)")

    def _new_stream(self, head: bytes) -> zlib._Decompress:
        if self._coding == "gzip":
            return zlib.decompressobj(16 + zlib.MAX_WBITS)
        # "deflate" is the zlib format (RFC 9110 8.4.1.2); some senders send raw deflate: tell them apart by the
        # zlib header (CM = 8 and the header check), as browsers and aiohttp do
        zlib_header = len(head) >= 2 and head[0] & 0x0F == 8 and (head[0] << 8 | head[1]) % 31 == 0
        return zlib.decompressobj(zlib.MAX_WBITS if zlib_header else -zlib.MAX_WBITS)

    def feed(self, chunk: bytes) -> Refusal | None:
        if self._refused is not None:
            return self._refused
        self._received += len(chunk)
        if self._received > self._limit:
            return self._refuse(413, f"request body is over the {_mib(self._limit)} limit; send smaller exports (the SDK's max_export_batch_size)")
        if not self._coding:
            self._out += chunk
            return None
        data = chunk
        while data:
            if self._z is None:
                self._z = self._new_stream(data)
            elif self._z.eof:  # a gzip body may hold several members (RFC 1952 2.2); deflate holds one stream
                if self._coding != "gzip":
                    return self._refuse(400, f"deflate body has {len(data)} bytes after the end of its compressed stream")
                self._z = self._new_stream(data)
            try:  # in pieces of at most _PIECE: the body and one piece are all that is ever held
                piece = self._z.decompress(data, min(self._limit - len(self._out) + 1, _PIECE))
            except zlib.error as exc:
                return self._refuse(400, f"request body is labelled Content-Encoding: {self._coding} but is not valid {self._coding} data ({exc})")
            self._out += piece
            if len(self._out) > self._limit:
                return self._too_large()
            data = self._z.unconsumed_tail or self._z.unused_data
        return None

    def finish(self) -> bytes | Refusal:
        """The whole (inflated) body, or why it is refused; the reader lets go of it."""
        if self._refused is not None:
            return self._refused
        if self._coding and (self._z is None or not self._z.eof):
            if self._z is None and not self._out:  # an empty body with a coding: an empty export, as before
                return b""
            return self._refuse(400, f"request body is labelled Content-Encoding: {self._coding} but ends before its compressed "
                                     f"stream does (truncated after {self._received} bytes)")
        body = bytes(self._out)
        self._out = bytearray()
        self._z = None
        return body
