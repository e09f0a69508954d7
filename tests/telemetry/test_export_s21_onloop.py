"""OTLP/HTTP export on the event loop (deltatap.telemetry.otlp_loop.LoopSpanProcessor) against real sinks on 127.0.0.1:
the same requests, byte for byte, as the export thread's http.client; retries of 503 / 429; a dead endpoint and a
hanging one counted with their reasons while the loop keeps running; a full queue; force_flush from another thread;
shutdown after the loop is gone; TLS verified with the exporter's context."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import inspect
import ssl
import threading
import time

import pytest
import uvloop
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource

from deltatap.telemetry.otlp_export import OtlpHttpExporter, ssl_context
from deltatap.telemetry.otlp_loop import LoopSpanProcessor
from deltatap.telemetry.spans import KIND_CLIENT, KIND_SERVER, STATUS_ERROR, SpanOrigin, span_record
from deltatap.telemetry.tracer import BoundedSpanProcessor, make_exporter, setup_telemetry
from tests.conftest import free_port

def both_loops(fn):
    """The coroutine test ``fn`` run on asyncio's loop and on uvloop's (the tap's), as a test parametrized by loop."""

    def test(loop_kind, *args, **kwargs):
        return (uvloop.run if loop_kind == "uvloop" else asyncio.run)(fn(*args, **kwargs))

    sig = inspect.signature(fn)
    test.__signature__ = sig.replace(parameters=[inspect.Parameter("loop_kind", inspect.Parameter.POSITIONAL_OR_KEYWORD),
                                                 *sig.parameters.values()])
    test.__name__, test.__qualname__, test.__doc__ = fn.__name__, fn.__qualname__, fn.__doc__
    return pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])(test)


ORIGIN = SpanOrigin(Resource.create({"service.name": "deltatap-tap-s21", "deltatap.link": "edge"}))


def records(n: int, first: int = 1) -> list:
    """Tap-like span records: every attribute value type, events with and without attributes, an error status."""
    out = []
    for i in range(first, first + n):
        attrs = {"deltatap.link": "edge", "http.response.status_code": 200 + i % 3, "deltatap.ttft_ms": i / 7,
                 "deltatap.stream": bool(i % 2), "deltatap.gaps_ms": [1.5, 2.25, float(i)], "url.path": "/v1/chat/" + "é" * (i % 5)}
        events = [("request.received", 1_700_000_000_000_000_000 + i, None),
                  ("first_token.received", 1_700_000_000_001_000_000 + i, {"deltatap.chunk": i}),
                  ("response.end", 1_700_000_000_002_000_000 + i, None)]
        out.append(span_record(ORIGIN, "deltatap.tap edge", KIND_SERVER if i % 2 else KIND_CLIENT, (i << 64) | 7, i, attrs,
                               events, 1_700_000_000_000_000_000 + i, 1_700_000_000_003_000_000 + i,
                               parent_span_id=i + 1 if i % 3 else None, parent_remote=bool(i % 3 == 1),
                               status_code=STATUS_ERROR if i % 5 == 0 else 0, status_description="boom" if i % 5 == 0 else None))
    return out


class RawSink:
    """An HTTP/1.1 endpoint on 127.0.0.1 (on the running loop) keeping every request's raw head and body and its
    connection; ``answers`` scripts the first statuses (then 200); ``hang``: read requests, answer none."""

    def __init__(self, answers: list[int] | None = None, hang: bool = False, ssl_ctx: ssl.SSLContext | None = None,
                 framing: str = "length") -> None:
        self.answers = list(answers or [])
        self.hang = hang
        self.framing = framing  # of the answers: "length" (Content-Length), "chunked", "close" (the body ends at the close)
        self.ssl_ctx = ssl_ctx
        self.requests: list[tuple[int, bytes, bytes]] = []  # (connection number, head, body)
        self.connections = 0

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        conn = self.connections
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:"))
                body = await reader.readexactly(length)
                self.requests.append((conn, head, body))
                if self.hang:
                    continue
                status = self.answers.pop(0) if self.answers else 200
                text = b"" if status == 200 else b"busy"
                head = b"HTTP/1.1 %d X\r\nContent-Type: text/plain\r\n" % status
                if self.framing == "chunked":
                    chunks = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in (text[:2], text[2:]) if c)
                    writer.write(head + b"Transfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n")
                elif self.framing == "close":
                    writer.write(head + b"Connection: close\r\n\r\n" + text)
                    await writer.drain()
                    break
                else:
                    writer.write(head + b"Content-Length: %d\r\n\r\n%s" % (len(text), text))
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def __aenter__(self) -> RawSink:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.ssl_ctx)
        self.port = self.server.sockets[0].getsockname()[1]
        self.url = f"{'https' if self.ssl_ctx else 'http'}://127.0.0.1:{self.port}/v1/traces"
        return self

    async def __aexit__(self, *exc) -> None:
        self.server.close()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.server.wait_closed(), 1)


def on_loop(exporter: OtlpHttpExporter, **kw):
    tel = setup_telemetry("t", exporter=exporter, on_loop=True, **kw)
    assert isinstance(tel.processor, LoopSpanProcessor)
    return tel


async def until(cond, timeout_s: float = 5.0) -> None:
    end = time.monotonic() + timeout_s
    while not cond() and time.monotonic() < end:
        await asyncio.sleep(0.01)


def counts_add_up(tel) -> None:
    c = tel.stats.snapshot()
    assert c.unaccounted == 0 and c.ended == c.exported + c.dropped + c.queued, c


@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_the_loop_sends_the_threads_requests_byte_for_byte(compression, monkeypatch):
    """The same records, in batches of 64 + 36, through the thread's http.client exporter and the loop's (uvloop)."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer%20s21,x-tenant=a")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_COMPRESSION", compression)
    recs = records(100)

    async def main() -> tuple[list, list]:
        async with RawSink() as thread_sink, RawSink() as loop_sink:
            exp = make_exporter(thread_sink.url)
            for batch in (recs[:64], recs[64:]):
                assert (await asyncio.to_thread(exp.export, batch)).name == "SUCCESS"
            exp.shutdown()
            tel = setup_telemetry("t", otlp=loop_sink.url, on_loop=True)
            assert isinstance(tel.processor, LoopSpanProcessor)
            tel.processor.schedule_delay_s = 0.05  # (the second, partial batch)
            for r in recs:
                tel.processor.on_end(r)
            await until(lambda: tel.stats.spans_exported == 100)
            assert tel.stats.spans_exported == 100 and tel.stats.export_failures == 0
            await asyncio.to_thread(tel.shutdown)
            counts_add_up(tel)
            return thread_sink.requests, loop_sink.requests, (thread_sink.port, loop_sink.port)

    got_thread, got_loop, ports = uvloop.run(main())
    assert len(got_thread) == len(got_loop) == 2
    got_thread = [(c, h.replace(b"Host: 127.0.0.1:%d" % ports[0], b"Host: 127.0.0.1:%d" % ports[1]), b) for c, h, b in got_thread]
    assert {c for c, _, _ in got_loop} == {1}  # one kept-alive connection
    for (_, th, tb), (_, lh, lb) in zip(got_thread, got_loop):
        assert b"authorization: Bearer s21" in lh and b"Content-Type: application/x-protobuf" in lh
        if compression == "none":
            assert lh == th and lb == tb  # the whole request, byte for byte
        else:  # gzip's header holds the time of compression: the bodies inflate to the same bytes
            assert b"Content-Encoding: gzip" in lh
            assert gzip.decompress(lb) == gzip.decompress(tb)
            assert lh.replace(b"%d" % len(lb), b"") == th.replace(b"%d" % len(tb), b"")


@both_loops
async def test_503_then_429_then_success_on_one_connection():
    async with RawSink(answers=[503, 429]) as sink:
        tel = on_loop(OtlpHttpExporter(sink.url, timeout_s=5))
        for r in records(10):
            tel.processor.on_end(r)
        assert await asyncio.to_thread(tel.processor.force_flush, 5000)
        assert tel.stats.spans_exported == 10 and tel.stats.export_failures == 0
        assert len(sink.requests) == 3 and {c for c, _, _ in sink.requests} == {1}
        assert len({b for _, _, b in sink.requests}) == 1  # the same body retried
        counts_add_up(tel)
        await asyncio.to_thread(tel.shutdown)


@both_loops
async def test_every_reading_adds_up_while_batches_fail_and_succeed():
    """A second thread reads the counters every millisecond while 5 batches go out, 503 (retried to failure) and 200 mixed."""
    readings, stop = [], threading.Event()

    def read(stats) -> None:
        while not stop.is_set():
            readings.append(stats.snapshot())
            time.sleep(0.001)

    async with RawSink(answers=[503] * 3 + [200] + [503] * 3) as sink:
        exp = OtlpHttpExporter(sink.url, timeout_s=5, backoff_s=0.01)
        tel = on_loop(exp)
        reader = threading.Thread(target=read, args=(tel.stats,), daemon=True)
        reader.start()
        try:
            for r in records(300):
                tel.processor.on_end(r)
                await asyncio.sleep(0)
            assert await asyncio.to_thread(tel.processor.force_flush, 5000)
        finally:
            stop.set()
            reader.join(5)
    c = tel.stats.snapshot()
    assert c.ended == 300 and c.queued == 0 and c.dropped_by_reason["export_failed"] == 128 and c.exported == 172, c
    assert len(readings) > 1 and all(r.unaccounted == 0 for r in readings)
    assert any(0 < r.queued for r in readings)
    await asyncio.to_thread(tel.shutdown)


@both_loops
async def test_dead_endpoint_is_export_failed_after_the_retries():
    port = free_port()  # nothing listens there
    tel = on_loop(OtlpHttpExporter(f"http://127.0.0.1:{port}/v1/traces", timeout_s=5))
    for r in records(7):
        tel.processor.on_end(r)
    assert await asyncio.to_thread(tel.processor.force_flush, 5000)
    c = tel.stats.snapshot()
    assert c.dropped_by_reason["export_failed"] == 7 and c.exported == 0 and c.queued == 0, c
    assert "ConnectionRefusedError" in tel.stats.last_error and "attempt 3" in tel.stats.last_error  # two retries
    assert str(port) in tel.stats.last_error
    counts_add_up(tel)
    await asyncio.to_thread(tel.shutdown)


@both_loops
async def test_hanging_endpoint_is_export_timeout_and_the_loop_keeps_running():
    ticks = []  # per tick of a loop timer: whether the export was in flight then (sent, not yet counted)

    def tick() -> None:
        ticks.append(len(sink.requests) == 1 and tel.stats.spans_dropped == 0)
        handle[0] = asyncio.get_running_loop().call_later(0.01, tick)

    async with RawSink(hang=True) as sink:
        tel = on_loop(OtlpHttpExporter(sink.url, timeout_s=0.4))
        handle = [asyncio.get_running_loop().call_later(0.01, tick)]
        try:
            for r in records(64):  # a whole batch: exported at once
                tel.processor.on_end(r)
            await until(lambda: tel.stats.spans_dropped == 64)
        finally:
            handle[0].cancel()
        c = tel.stats.snapshot()
        assert c.dropped_by_reason["export_timeout"] == 64 and c.queued == 0, c
        assert "TimeoutError: timed out, attempt 1" in tel.stats.last_error
        assert len(sink.requests) == 1
        assert any(ticks)  # the loop ran its timer while the export waited (a loop blocked by the export: never then)
        counts_add_up(tel)
        await asyncio.to_thread(tel.shutdown, 0.5)


@both_loops
async def test_shutdown_deadline_behind_a_hanging_endpoint_from_another_thread():
    async with RawSink(hang=True) as sink:
        tel = on_loop(OtlpHttpExporter(sink.url, timeout_s=30))
        for r in records(100):
            tel.processor.on_end(r)
        await until(lambda: len(sink.requests) == 1)
        t0 = time.monotonic()
        await asyncio.to_thread(tel.shutdown, 0.3)
        assert time.monotonic() - t0 < 5
        c = tel.stats.snapshot()
        assert c.dropped_by_reason["shutdown_deadline"] == 100 and c.queued == 0 and c.exported == 0, c
        tel.processor.on_end(records(1)[0])
        assert tel.stats.snapshot().dropped_by_reason["after_shutdown"] == 1
        counts_add_up(tel)


@both_loops
async def test_full_queue_drops_and_counts():
    async with RawSink() as sink:
        tel = on_loop(OtlpHttpExporter(sink.url), max_queue=10)
        for r in records(15):  # in one callback: the loop exports nothing meanwhile
            tel.processor.on_end(r)
        assert tel.stats.snapshot().dropped_by_reason["queue_full"] == 5
        assert await asyncio.to_thread(tel.processor.force_flush, 5000)
        c = tel.stats.snapshot()
        assert c.exported == 10 and c.ended == 15 and c.queued == 0, c
        await asyncio.to_thread(tel.shutdown)


@both_loops
async def test_force_flush_from_a_thread_sends_a_partial_batch_at_once():
    async with RawSink() as sink:
        tel = on_loop(OtlpHttpExporter(sink.url))
        tel.processor.schedule_delay_s = 60  # no timer would send these 5 in the test's time
        for r in records(5):
            tel.processor.on_end(r)
        await asyncio.sleep(0.05)
        assert sink.requests == [] and tel.stats.spans_queued == 5
        assert await asyncio.to_thread(tel.processor.force_flush, 5000)
        assert tel.stats.spans_exported == 5 and len(sink.requests) == 1
        await asyncio.to_thread(tel.shutdown)


@pytest.mark.parametrize("framing", ["chunked", "close"])
@both_loops
async def test_answers_chunked_or_ended_by_the_close_are_read(framing):
    """A 503 and a 400 framed either way: retried / not retried with the body's text kept; closed connections reopened."""
    async with RawSink(answers=[503, 400], framing=framing) as sink:
        tel = on_loop(OtlpHttpExporter(sink.url))
        for r in records(3):
            tel.processor.on_end(r)
        assert await asyncio.to_thread(tel.processor.force_flush, 5000)
        c = tel.stats.snapshot()
        assert c.dropped_by_reason["export_failed"] == 3 and c.queued == 0, c
        assert tel.stats.last_error == f"OTLP/HTTP export to {sink.url}: HTTP 400 X: busy, attempt 2"
        for r in records(2, first=10):
            tel.processor.on_end(r)
        assert await asyncio.to_thread(tel.processor.force_flush, 5000)
        assert tel.stats.spans_exported == 2
        assert len(sink.requests) == 3 and sink.connections == (3 if framing == "close" else 1)
        await asyncio.to_thread(tel.shutdown)


@contextlib.contextmanager
def sink_in_a_thread():
    """A :class:`RawSink` served by its own event loop in a thread (for a test whose own loop is blocked or gone)."""
    box: list = []
    ready, stop = threading.Event(), threading.Event()

    async def main() -> None:
        async with RawSink() as sink:
            box.append(sink)
            ready.set()
            while not stop.is_set():
                await asyncio.sleep(0.01)

    thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
    thread.start()
    assert ready.wait(5)
    try:
        yield box[0]
    finally:
        stop.set()
        thread.join(5)


@both_loops
async def test_shutdown_called_on_the_loops_own_thread_exports_there():
    with sink_in_a_thread() as sink:
        tel = setup_telemetry("t", otlp=sink.url, on_loop=True)
        for r in records(70):  # a batch in flight (not answered yet: this loop is busy) and 6 waiting
            tel.processor.on_end(r)
        await asyncio.sleep(0)
        tel.shutdown(3.0)  # blocks this loop: the exporter's http.client sends what is left
        c = tel.stats.snapshot()
        assert c.exported == 70 and c.queued == 0 and c.dropped == 0, c
    got = set()
    for _, _, body in sink.requests:
        for rs in ExportTraceServiceRequest.FromString(body).resource_spans:
            got.update(int.from_bytes(sp.span_id, "big") for ss in rs.scope_spans for sp in ss.spans)
    assert got == {r[4] for r in records(70)}  # (the batch the loop had sent may arrive twice: documented)


def test_shutdown_after_the_loop_is_gone_exports_in_the_calling_thread():
    """Spans queued on a loop that then ends are exported by shutdown, synchronously, to a sink served by a thread."""
    with sink_in_a_thread() as sink:

        async def tap() -> object:
            tel = setup_telemetry("t", otlp=sink.url, on_loop=True)
            for r in records(20):  # less than a batch: waiting for its timer when the loop ends
                tel.processor.on_end(r)
            return tel

        tel = uvloop.run(tap())
        assert tel.stats.spans_queued == 20
        tel.shutdown(2.0)
        c = tel.stats.snapshot()
        assert c.exported == 20 and c.queued == 0 and c.dropped == 0, c
        assert [b for _, _, b in sink.requests] == [make_exporter(sink.url).encode_body(records(20))]


@both_loops
async def test_https_verified_with_the_exporters_context(self_signed):
    cert, key = self_signed
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)
    async with RawSink(ssl_ctx=server_ctx) as sink:
        trusted = on_loop(OtlpHttpExporter(sink.url, context=ssl_context(str(cert))))
        for r in records(3):
            trusted.processor.on_end(r)
        assert await asyncio.to_thread(trusted.processor.force_flush, 5000)
        assert trusted.stats.spans_exported == 3
        await asyncio.to_thread(trusted.shutdown)
        untrusted = on_loop(OtlpHttpExporter(sink.url, context=ssl_context()))  # the system's CAs: refused
        for r in records(3):
            untrusted.processor.on_end(r)
        assert await asyncio.to_thread(untrusted.processor.force_flush, 5000)
        assert untrusted.stats.snapshot().dropped_by_reason["export_failed"] == 3
        assert "CERTIFICATE_VERIFY_FAILED" in untrusted.stats.last_error
        await asyncio.to_thread(untrusted.shutdown)
    assert len(sink.requests) == 1


def test_only_otlp_http_goes_on_the_loop(tmp_path, monkeypatch):
    async def main() -> None:
        for otlp in (f"file:{tmp_path}/s.jsonl", f"grpc://127.0.0.1:{free_port()}"):
            tel = setup_telemetry("t", otlp=otlp, on_loop=True)
            assert type(tel.processor) is BoundedSpanProcessor
            tel.shutdown(0.5)
        monkeypatch.setenv("DELTATAP_EXPORT_ON_LOOP", "0")  # the thread, on request
        tel = setup_telemetry("t", otlp=f"http://127.0.0.1:{free_port()}", on_loop=True)
        assert type(tel.processor) is BoundedSpanProcessor
        tel.shutdown(0.5)

    asyncio.run(main())
