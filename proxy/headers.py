"""The one change a tap makes to what passes through it: the request head's trace context, without I/O.

A tap forwards every byte as it came, in both directions, except each request head, which gets:

* the tap's own ``traceparent`` (and the incoming ``tracestate``), replacing the incoming ones — the tap's
  span becomes the parent of the upstream's;
* the correlation header (``x-request-id`` by default) when the request has none;
* ``Host`` set to ``--host-header`` when that option is given (off by default: the client's ``Host`` passes on),
  and the target prefixed with the upstream URL's path when it has one (``--upstream http://h:p/prefix``).

Everything else stays as sent: header order, names' case, duplicates, obs-text bytes, the line endings, framing
(``Content-Length`` / ``Transfer-Encoding``), ``Connection`` and the other hop-by-hop headers. A tap pairs
each downstream connection with one upstream connection for as long as both are open (see
:mod:`deltatap.proxy.relay`), so the two act as one hop: connection management, ``Expect``, ``Upgrade`` and
trailers are decided by the endpoints, exactly as over a direct connection.
"""

from __future__ import annotations

from deltatap.net import h1
from deltatap.net.h1 import Head
from deltatap.telemetry.spans import new_trace_id

TRACE_HEADERS = frozenset({b"traceparent", b"tracestate"})


def new_request_id() -> str:
    # (128 random bits from the span ids' private generator: no syscall per id; %-formatted: about half the time of
    # an f-string's format spec for a 128-bit int, the same 32 hex digits)
    return "%032x" % new_trace_id()


def trace_context(head: Head) -> dict[str, str]:
    """The incoming W3C trace context (``traceparent``, ``tracestate``) as text, for :func:`deltatap.proxy.spans.begin`:
    empty without a ``traceparent`` (a ``tracestate`` alone names no parent; begin() starts a new trace for both)."""
    value = head.get(b"traceparent")
    if value is None:
        return {}
    out = {"traceparent": value.decode("latin-1")}
    values = head.values(b"tracestate")
    if values:
        out["tracestate"] = ",".join(v.decode("latin-1") for v in values)
    return out


def rewrite_request_head(
    head: Head, *, correlation_header: bytes, trace_headers: dict[str, str], host_header: bytes | None = None, target_prefix: bytes = b"",
    lines: list[tuple[bytes, bytes]] | None = None, request_id: str | None = None
) -> tuple[bytes, str, bool]:
    """The head to send upstream, the request id (the correlation header's value, created if absent) and whether it
    was created. ``correlation_header``: lower-case name. Made ahead, off the request's path (a relay's spare,
    :attr:`deltatap.proxy.relay.Downstream.spare`): ``lines``, :func:`trace_lines` of ``trace_headers``
    (:attr:`deltatap.proxy.spans.SpanStart.trace_lines`), and ``request_id``, a :func:`new_request_id` the head gets
    if it has no correlation header (unused otherwise: ``created`` says whether it was taken). (With deltatap.net.h1's
    C accelerator the bytes are made in one call, ``_h1.rewrite_head``, exactly as below.)"""
    additions, request_id, created = _additions(head.get(correlation_header), correlation_header, trace_headers, lines, request_id)
    return _rewritten(head, additions, host_header, target_prefix), request_id, created


def rewrite_spare(
    head: Head, correlation_header: bytes, host_header: bytes | None, target_prefix: bytes, lines: list[tuple[bytes, bytes]], request_id: str | None
) -> tuple[bytes, str, bool] | None:
    """:func:`rewrite_request_head` of a head that brings no ``traceparent``, with a relay's spare made ahead
    (:attr:`deltatap.proxy.relay.Downstream.spare`): its span's trace lines ``lines`` and ``request_id`` (None: a new
    one if the head needs one); None for a head with a ``traceparent`` (its span is begun from its context, then
    :func:`rewrite_request_head`). With deltatap.net.h1's C accelerator one call, ``_h1.rewrite_spare``, does exactly
    this (the lookups and the bytes), for the heads its reader makes."""
    acc = h1._acc
    if acc is not None:
        got = acc.rewrite_spare(head, correlation_header, host_header, target_prefix, lines, request_id)
        if got is not NotImplemented:
            return got
    if head.get(b"traceparent") is not None:
        return None
    additions, request_id, created = _additions(head.get(correlation_header), correlation_header, {}, lines, request_id)
    return _rewritten(head, additions, host_header, target_prefix), request_id, created


def _rewritten(head: Head, additions: list[tuple[bytes, bytes]], host_header: bytes | None, target_prefix: bytes) -> bytes:
    """The bytes of :func:`rewrite_request_head` (the C twin: ``_h1.rewrite_head``)."""
    acc = h1._acc
    if acc is not None:
        return acc.rewrite_head(head.raw, host_header, target_prefix, additions)
    raw = head.raw
    crlf = b"\r\n" if raw.endswith(b"\r\n") else b"\n"
    drop = TRACE_HEADERS | ({b"host"} if host_header is not None else frozenset())
    if target_prefix or any(name.lower() in drop for name, _v in head.headers):
        lines = raw.split(b"\n")
        out_lines = [lines[0] if not target_prefix else _prefixed(lines[0], target_prefix)]
        skip = False
        for line in lines[1:-2]:  # (the last two: the empty line's terminator and what follows it)
            if line[:1] in (b" ", b"\t"):  # an obs-fold continuation belongs to the header before it
                if not skip:
                    out_lines.append(line)
                continue
            skip = line[: line.find(b":")].lower() in drop
            if not skip:
                out_lines.append(line)
        body = b"\n".join(out_lines) + b"\n"
    else:
        body = raw[: len(raw) - len(crlf)]  # the head without its final empty line
    added = [b"Host: " + host_header] if host_header is not None else []
    added += [name + b": " + value for name, value in additions]
    return body + crlf.join(added) + crlf + crlf


def rewrite_request_headers(
    headers: list[tuple[bytes, bytes]], *, correlation_header: bytes, trace_headers: dict[str, str], host_header: bytes | None = None,
    target_prefix: bytes = b""
) -> tuple[list[tuple[bytes, bytes]], str, bool]:
    """HTTP/2's form of :func:`rewrite_request_head` (:mod:`deltatap.proxy.h2relay`): the same changes to a header
    list (names in lower case, pseudo-headers first), every other entry kept as it came, in order, as the same
    objects (HPACK's never-indexed marks stay). ``--host-header`` sets ``:authority`` (and drops ``host``), the
    upstream URL's path prefixes an origin-form ``:path``."""
    additions, request_id, created = _additions(_first(headers, correlation_header), correlation_header, trace_headers)
    drop = TRACE_HEADERS | ({b"host"} if host_header is not None else frozenset())
    out: list[tuple[bytes, bytes]] = []
    for h in headers:
        name = h[0]
        if name in drop:
            continue
        if name == b":authority" and host_header is not None:
            h = (name, host_header)
        elif name == b":path" and target_prefix and h[1].startswith(b"/"):
            h = (name, target_prefix + h[1])
        out.append(h)
    return out + additions, request_id, created


def _first(headers: list[tuple[bytes, bytes]], lname: bytes) -> bytes | None:
    return next((v for n, v in headers if n == lname), None)


def trace_lines(trace_headers: dict[str, str]) -> list[tuple[bytes, bytes]]:
    """The header lines ``(name, value)`` a request head gets for the tap's trace context, in ``trace_headers``' order
    (:func:`deltatap.proxy.spans.begin` makes them with the span's ids; a caller never changes the list)."""
    added = []
    for name, value in trace_headers.items():  # (a loop, not a comprehension: no frame of its own)
        added.append((name.encode(), value.encode("latin-1")))
    return added


def _additions(existing: bytes | None, correlation_header: bytes, trace_headers: dict[str, str], lines: list[tuple[bytes, bytes]] | None = None,
               request_id: str | None = None) -> tuple[list[tuple[bytes, bytes]], str, bool]:
    """What every request gets, whatever its HTTP version: the tap's trace context (``lines``: its :func:`trace_lines`,
    made ahead) and, when absent, the correlation header with a new request id (``request_id``: one made ahead); and the
    request id, and whether it was created."""
    created = not existing
    if not created:
        request_id = existing.decode("latin-1")  # type: ignore[union-attr]
    elif request_id is None:
        request_id = new_request_id()
    added = trace_lines(trace_headers) if lines is None else [*lines]
    if created:
        added.append((correlation_header, request_id.encode()))
    return added, request_id, created


def _prefixed(start_line: bytes, prefix: bytes) -> bytes:
    method, sep, rest = start_line.partition(b" ")
    if rest.startswith(b"/"):
        return method + sep + prefix + rest
    return start_line  # absolute-form, authority-form and "*" targets go as sent
