"""Header handling for a transparent proxy (RFC 9110 section 7.6.1), without I/O.

Forwarded unchanged: every end-to-end header, in order, duplicates kept, names as sent.
Dropped: the hop-by-hop headers below and every header the ``Connection`` header names; the
tap's own HTTP stacks set framing (``Transfer-Encoding``) and connection management per hop.
``Expect`` is also dropped towards the upstream: the tap's server side has already answered
``100-continue`` when the body is read.
"""

from __future__ import annotations

import os
import random

from multidict import CIMultiDict, CIMultiDictProxy

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
TRACE_HEADERS = frozenset({"traceparent", "tracestate"})
_UPSTREAM_DROP = HOP_BY_HOP | TRACE_HEADERS | {"expect"}
_rand = random.Random(os.urandom(32))  # request ids: private generator, no syscall per id (see proxy.spans)
os.register_at_fork(after_in_child=lambda: _rand.seed(os.urandom(32)))


def _connection_tokens(headers: CIMultiDictProxy[str] | CIMultiDict[str]) -> set[str]:
    out: set[str] = set()
    for value in headers.getall("Connection", ()):
        out.update(t.strip().lower() for t in value.split(",") if t.strip())
    return out


def end_to_end(headers: CIMultiDictProxy[str] | CIMultiDict[str], also_drop: frozenset[str] = frozenset()) -> CIMultiDict[str]:
    drop = also_drop | HOP_BY_HOP
    if "Connection" in headers:
        drop = drop | _connection_tokens(headers)
    return CIMultiDict([(k, v) for k, v in headers.items() if k.lower() not in drop])


def upstream_request_headers(
    headers: CIMultiDictProxy[str] | CIMultiDict[str],
    *,
    correlation_header: str,
    host_header: str | None,
    trace_headers: dict[str, str],
) -> tuple[CIMultiDict[str], str]:
    """Headers to send upstream and the request id (the correlation header's value, created if absent).

    ``trace_headers`` (``traceparent`` and maybe ``tracestate`` of the tap's span) replace the
    incoming ones.
    """
    out = end_to_end(headers, _UPSTREAM_DROP)
    if host_header:
        out["Host"] = host_header
    request_id = headers.get(correlation_header)
    if not request_id:
        request_id = f"{_rand.getrandbits(128):032x}"
        out[correlation_header] = request_id
    out.update(trace_headers)
    return out, request_id


def downstream_response_headers(headers: CIMultiDictProxy[str] | CIMultiDict[str]) -> CIMultiDict[str]:
    return end_to_end(headers)
