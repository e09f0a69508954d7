"""A request head's lookups without its name index: ``Head.values`` / ``Head.get`` read from the headers list in one C
call (``_h1.header_values``) against the definition, the index ``Head.index()`` builds; the heads ``_h1.feed_head``
makes (slots written directly) against the Python reader's; and the trace context and request id a tap reads from a
head (proxy/headers.py) with and without the accelerator.
"""

from __future__ import annotations

import random
import sys
import tracemalloc

import pytest

from deltatap.net import h1
from deltatap.proxy import headers as hdrs
from tests.kernel.test_h1_native import head_fields, reference

native = pytest.mark.skipif(h1._acc is None, reason="deltatap.net._h1 is not built or DELTATAP_NATIVE turns it off")

NAMES = [b"Host", b"host", b"HOST", b"traceparent", b"TraceParent", b"TRACEPARENT", b"tracestate",
         b"Tracestate", b"X-Request-Id", b"x-request-id", b"X-Tenant", b"x-tenant", b"Connection", b"Upgrade", b"A", b"a",
         b"Z", b"z", b"`", b"X-Y~1", b"ab", b"AB", b"aB"]
VALUES = [b"", b"v", b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", b"rojo=00f067aa0ba902b7", b"r\xe9sum\xe9",
          b"a, b", b"close"]


def _heads(seed: int, count: int) -> list[bytes]:
    rnd = random.Random(seed)
    out = []
    for _ in range(count):
        lines = [rnd.choice([b"GET / HTTP/1.1", b"POST /v1/chat/completions?x=1 HTTP/1.1", b"get /a HTTP/1.0"])]
        for _ in range(rnd.randrange(0, 10)):
            lines.append(rnd.choice(NAMES) + rnd.choice([b": ", b":", b":\t"]) + rnd.choice(VALUES))
        eol = rnd.choice([b"\r\n", b"\n"])
        out.append(eol.join(lines) + eol + eol)
    return out


def _lnames(head: h1.Head) -> list[bytes]:
    """Every name to look up: each header's own name lower-cased and as sent (mixed case: never found), and absent ones."""
    names = [n for n, _ in head.headers]
    return [n.lower() for n in names] + names + [b"traceparent", b"tracestate", b"x-request-id", b"absent", b"", b"[", b"{"]


def _read(raw: bytes) -> h1.Head:
    (ev,) = [e for e in h1.Reader(True).feed(raw) if e[0] == h1.HEAD]
    return ev[3]


@native
def test_lookups_without_the_index_are_the_index_s():
    for raw in _heads(21, 400):
        head = _read(raw)
        assert head._index is None  # (made by feed_head: no index until asked)
        got = [(head.values(n), head.get(n)) for n in _lnames(head)]
        assert head._index is None  # (the lookups did not build it)
        index = head.index()  # the definition
        assert got == [(index.get(n, []), (index.get(n) or [None])[0]) for n in _lnames(head)]
        with reference():
            slow = _read(raw)
        assert head_fields(head) == head_fields(slow)
        assert [(slow.values(n), slow.get(n)) for n in _lnames(slow)] == got


@native
def test_heads_of_other_shapes_take_the_index():
    """A header list that is not the reader's (HTTP/2's header tuples, str names, a tuple for a list): the same answers
    as the index gives."""

    class Tagged(tuple):  # (hpack's HeaderTuple / NeverIndexedHeaderTuple are tuple subclasses)
        pass

    cases = [
        [Tagged((b"traceparent", b"00-1")), (b"X-A", b"1"), Tagged((b"x-a", b"2"))],
        [("traceparent", "s"), (b"traceparent", b"b")],
        ((b"traceparent", b"t"),),
        [],
    ]
    for headers in cases:
        head = h1.Head(b"", b"", b"", b"HTTP/2", 0, b"", headers)
        asked = [(head.values(n), head.get(n)) for n in (b"traceparent", b"x-a", b"x", b"absent")]
        ref = h1.Head(b"", b"", b"", b"HTTP/2", 0, b"", headers).index()
        assert asked == [(ref.get(n, []), (ref.get(n) or [None])[0]) for n in (b"traceparent", b"x-a", b"x", b"absent")]
    with pytest.raises(TypeError):
        h1._acc.header_values([], b"x")


@native
def test_trace_context_and_request_id_as_the_python_reads_them():
    for raw in _heads(2121, 300):
        fast = _read(raw)
        with reference():
            slow = _read(raw)
            want = hdrs.trace_context(slow), hdrs.rewrite_request_head(slow, correlation_header=b"x-request-id", trace_headers={"traceparent": "t"})
        got = hdrs.trace_context(fast), hdrs.rewrite_request_head(fast, correlation_header=b"x-request-id", trace_headers={"traceparent": "t"})
        if want[1][2]:  # (a request id made here is new each time: only whether it was made, and where, compare)
            assert got[1][2] and got[1][0].replace(got[1][1].encode(), b"ID") == want[1][0].replace(want[1][1].encode(), b"ID")
        else:
            assert got[1] == want[1]
        assert got[0] == want[0]


@native
def test_set_head_refuses_a_class_without_head_s_slots():
    class NoSlots:
        pass

    class ReadOnly:
        __slots__ = ("raw",)

    for cls in (NoSlots, ReadOnly, int):
        with pytest.raises(TypeError):
            h1._acc.set_head(cls)
    with pytest.raises(TypeError):
        h1._acc.set_head(object())
    head = _read(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")  # (the Head class set at import is still the one used)
    assert type(head) is h1.Head and head.get(b"host") == b"h"


@native
def test_no_leak_per_head():
    raw = b"POST /v1/chat/completions HTTP/1.1\r\nHost: h\r\nTraceparent: 00-1-2-01\r\nContent-Length: 0\r\n\r\n"
    reader = h1.Reader(True)

    def work(n: int) -> None:
        for _ in range(n):
            head = reader.feed(raw)[0][3]
            head.values(b"traceparent"), head.get(b"host"), head.get(b"absent"), head.values(b"absent")

    work(2000)
    tracemalloc.start()
    try:
        work(2000)
        before = tracemalloc.get_traced_memory()[0]
        work(20000)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 64 * 1024, grown  # (a leaked head or value per call: megabytes)


@native
def test_lookups_hold_no_reference():
    head = _read(b"GET / HTTP/1.1\r\nHost: h\r\nX-A: 1\r\nx-a: 2\r\n\r\n")
    values = [v for _, v in head.headers]
    refs = [sys.getrefcount(v) for v in values]
    for _ in range(1000):
        head.get(b"host"), head.values(b"x-a"), head.get(b"absent"), head.values(b"absent")
    assert [sys.getrefcount(v) for v in values] == refs


def test_a_tracestate_alone_names_no_parent():
    """trace_context leaves out a tracestate without a traceparent: the SDK's propagator finds no parent in it either,
    and begin() starts a new trace whose traceparent carries no tracestate."""
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    from deltatap.proxy.spans import begin

    head = _read(b"GET / HTTP/1.1\r\nHost: h\r\ntracestate: rojo=00f067aa0ba902b7\r\nTracestate: congo=t61rcWkgMzE\r\n\r\n")
    assert hdrs.trace_context(head) == {}
    ctx = TraceContextTextMapPropagator().extract({"tracestate": "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"})
    assert not trace.get_current_span(ctx).get_span_context().is_valid
    span = begin(hdrs.trace_context(head))
    assert span.parent_span_id is None and span.trace_state == "" and list(span.trace_headers) == ["traceparent"]
    tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    head = _read(b"GET / HTTP/1.1\r\nTraceparent: " + tp.encode() + b"\r\ntracestate: rojo=1\r\nTracestate: congo=2\r\n\r\n")
    assert hdrs.trace_context(head) == {"traceparent": tp, "tracestate": "rojo=1,congo=2"}
    span = begin(hdrs.trace_context(head))
    assert span.parent_span_id == 0xB7AD6B7169203331 and span.trace_state == "rojo=1,congo=2"


def test_request_ids_are_32_hex_digits_of_the_trace_id_generator():
    from deltatap.telemetry import spans as tspans

    state = tspans._rand.getstate()
    try:
        ids = [hdrs.new_request_id() for _ in range(200)]
        tspans._rand.setstate(state)
        want = [f"{tspans.new_trace_id():032x}" for _ in range(200)]  # (the format spec: the same digits)
    finally:
        tspans._rand.setstate(state)
    assert ids == want and all(len(i) == 32 and int(i, 16) > 0 for i in ids)
