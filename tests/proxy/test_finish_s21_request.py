"""A tap's exchange end: the bookkeeping when the exchange ends, the span built in the event loop's next round
(``Tap.finish`` / ``Tap._emit_finished``), over a real tap and upstream on 127.0.0.1.

What must hold: the counters move at once; every span reaches the span processor, one per exchange, in the order the
exchanges ended, before a client on the same loop has read the response's end; a tap closed right after exchanges end
still exports their spans (close builds what is pending before its flush); a span built later is the same span
(its attributes and events come from the record alone)."""

from __future__ import annotations

import asyncio

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from deltatap.core.vocab import Attr
from deltatap.proxy import TapOptions, start_tap
from deltatap.telemetry.tracer import setup_telemetry

from tap_helpers import start_upstream


async def _get(port: int, n: int, *, keep: bool = True) -> list[bytes]:
    """``n`` GETs on one connection, each response read whole (Content-Length) before the next request."""
    r, w = await asyncio.open_connection("127.0.0.1", port)
    out = []
    try:
        for i in range(n):
            w.write(b"GET /status/200?i=%d HTTP/1.1\r\nHost: t\r\nX-Request-Id: rid-%d\r\n%s\r\n" % (i, i, b"" if keep else b"Connection: close\r\n"))
            head = await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), 10)
            length = int(next(ln.split(b":", 1)[1] for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length:")))
            out.append(head + await asyncio.wait_for(r.readexactly(length), 10))
    finally:
        w.close()
    return out


async def test_spans_in_order_before_the_client_reads_the_end():
    exporter = InMemorySpanExporter()
    tel = setup_telemetry("deltatap-test-finish", exporter=exporter)
    upstream = await start_upstream()
    running = await start_tap(TapOptions(link="edge", upstream=upstream.url, admin_port=None), tel)
    tap = running.tap
    try:
        r, w = await asyncio.open_connection("127.0.0.1", running.port)
        for i in range(3):
            w.write(b"GET /status/200?i=%d HTTP/1.1\r\nHost: t\r\nX-Request-Id: rid-%d\r\n\r\n" % (i, i))
            head = await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), 10)
            length = int(next(ln.split(b":", 1)[1] for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length:")))
            await asyncio.wait_for(r.readexactly(length), 10)
            # the response's end was read on this loop: its exchange is counted and its span handed on already
            assert tap.counters.requests.get("ok") == i + 1
            assert not tap._finished
            tel.processor.force_flush()
            assert [s.attributes[Attr.REQUEST_ID] for s in exporter.get_finished_spans()] == [f"rid-{k}" for k in range(i + 1)]
        w.close()
    finally:
        await running.close(1)
        await upstream.runner.cleanup()
        tel.shutdown()


async def test_close_exports_what_just_ended():
    exporter = InMemorySpanExporter()
    tel = setup_telemetry("deltatap-test-finish-close", exporter=exporter)
    upstream = await start_upstream()
    running = await start_tap(TapOptions(link="edge", upstream=upstream.url, admin_port=None), tel)
    try:
        got = await asyncio.gather(*(_get(running.port, 2) for _ in range(4)))
        assert all(len(g) == 2 for g in got)
        # one exchange still in flight when the tap closes: the close itself ends it (tap_shutdown), and its span must
        # be built before close() flushes
        r, w = await asyncio.open_connection("127.0.0.1", running.port)
        w.write(b"GET /slow?s=5 HTTP/1.1\r\nHost: t\r\nX-Request-Id: rid-slow\r\n\r\n")
        for _ in range(500):  # (bounded: until the tap has the exchange)
            if running.tap.in_flight:
                break
            await asyncio.sleep(0.01)
        assert running.tap.in_flight == 1
    finally:
        await running.close(0)
        await upstream.runner.cleanup()
    spans = exporter.get_finished_spans()  # (read before any other flush: what close() exported)
    w.close()
    tel.shutdown()
    assert sorted(s.attributes[Attr.REQUEST_ID] for s in spans) == sorted(["rid-slow"] + [f"rid-{k}" for k in range(2) for _ in range(4)])
    assert running.tap.counters.requests.get("ok") == 8 and not running.tap._finished
    (slow,) = [s for s in spans if s.attributes[Attr.REQUEST_ID] == "rid-slow"]
    assert slow.attributes[Attr.ERROR_TYPE] == "tap_shutdown"
    spans = [s for s in spans if s is not slow]
    for s in spans:  # (built after the round, from the record alone: a whole span)
        names = [e.name for e in s.events]
        assert names[0] == "request.received" and "response.end" in names and s.attributes[Attr.HTTP_STATUS] == 200
