"""Exact span accounting (deltatap.telemetry.tracer): every span handed to the processor is exported, dropped with a
reason, or still queued — ``ended == exported + dropped + queued`` in every reading, while spans pile up behind a
collector that is dead, hangs, or answers 503 / 429 — and shutdown returns within its deadline."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from deltatap.telemetry.tracer import (
    DEFAULT_SHUTDOWN_DEADLINE_S,
    DROP_REASONS,
    SHUTDOWN_DEADLINE_ENV,
    SpanCounts,
    TelemetryConfigError,
    make_exporter,
    setup_telemetry,
)
from tests.conftest import free_port

N_SPANS = 4000
DEADLINE_S = 1.0
SLACK_S = 1.5  # the machine is shared: joining threads and closing sockets may take a while
EXPORT_TIMEOUT_S = 0.4


class _Answer(BaseHTTPRequestHandler):
    status = 200

    def do_POST(self) -> None:  # noqa: N802 - http.server interface
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = b"" if self.status == 200 else b"busy"
        self.send_response(self.status)
        self.send_header("Content-Type", "application/x-protobuf" if self.status == 200 else "text/plain")
        if self.status in (429, 503):
            self.send_header("Retry-After", "1")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@contextlib.contextmanager
def answering(status: int) -> Iterator[str]:
    """An OTLP/HTTP endpoint on 127.0.0.1 answering every export with ``status``."""
    handler = type(f"Answer{status}", (_Answer,), {"status": status})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@contextlib.contextmanager
def hanging() -> Iterator[int]:
    """A TCP server on 127.0.0.1 that accepts every connection, reads what comes and never answers."""
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(64)
    lsock.settimeout(0.05)
    stop = threading.Event()
    conns: list[socket.socket] = []

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = lsock.accept()
            except (TimeoutError, OSError):
                pass
            else:
                conn.setblocking(False)
                conns.append(conn)
            for c in list(conns):
                with contextlib.suppress(OSError):
                    if c.recv(65536) == b"":
                        conns.remove(c)
                        c.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield lsock.getsockname()[1]
    finally:
        stop.set()
        thread.join(5)
        for c in conns:
            c.close()
        lsock.close()


@contextlib.contextmanager
def backend(kind: str) -> Iterator[str]:
    """The ``--otlp`` value of a telemetry backend of ``kind``."""
    if kind == "dead-http":
        yield f"http://127.0.0.1:{free_port()}"  # nothing listens there
    elif kind == "dead-grpc":
        yield f"grpc://127.0.0.1:{free_port()}"
    elif kind in ("hanging-http", "hanging-grpc"):
        with hanging() as port:
            yield f"{'http' if kind == 'hanging-http' else 'grpc'}://127.0.0.1:{port}"
    else:
        with answering(int(kind)) as url:
            yield url


class Readings:
    """Snapshots of the counters taken every millisecond by a second thread while the test runs."""

    def __init__(self, stats) -> None:
        self.stats = stats
        self.got: list[SpanCounts] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.got.append(self.stats.snapshot())
            time.sleep(0.001)

    def __enter__(self) -> Readings:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(5)
        self.got.append(self.stats.snapshot())


def wait_for(pred, timeout_s: float = 15.0) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.01)
    return False


EXPECTED = {
    "dead-http": ("export_failed", "ConnectionRefusedError"),
    "dead-grpc": ("export_failed", "UNAVAILABLE"),
    "hanging-http": ("export_timeout", "TimeoutError"),
    "hanging-grpc": (None, "OTLP/gRPC export to"),  # DEADLINE_EXCEEDED, or UNAVAILABLE when the handshake times out
    "503": ("export_failed", "HTTP 503"),
    "429": ("export_failed", "HTTP 429"),
}


@pytest.mark.parametrize("kind", list(EXPECTED))
def test_every_span_accounted_for_with_a_failing_backend(kind):
    reason, error = EXPECTED[kind]
    with backend(kind) as otlp:
        exporter = make_exporter(otlp, timeout_s=EXPORT_TIMEOUT_S)
        tel = setup_telemetry("t", exporter=exporter, max_queue=2000, shutdown_deadline_s=DEADLINE_S)
        tracer = tel.tracer
        with Readings(tel.stats) as readings:
            for i in range(N_SPANS):
                tracer.start_span(f"s{i}").end()
            # the backend has refused, timed out or answered at least one batch
            assert wait_for(lambda: tel.stats.export_failures > 0), tel.stats
            t0 = time.monotonic()
            tel.shutdown()
            took = time.monotonic() - t0
    assert took < DEADLINE_S + SLACK_S, f"shutdown took {took:.2f} s"
    final = tel.stats.snapshot()
    assert final.ended == N_SPANS and final.exported == 0 and final.queued == 0 and final.dropped == N_SPANS
    bad = [r for r in readings.got if r.unaccounted]
    assert not bad, bad[:3]
    assert len(readings.got) > 20 and any(r.queued for r in readings.got)  # the identity held while spans waited
    assert set(final.dropped_by_reason) == set(DROP_REASONS)
    if reason:
        assert final.dropped_by_reason[reason] > 0, final
    else:
        assert final.dropped_by_reason["export_timeout"] + final.dropped_by_reason["export_failed"] > 0, final
    assert final.dropped_by_reason["after_shutdown"] == 0
    assert error in tel.stats.last_error, tel.stats.last_error


def test_shutdown_deadline_counts_what_is_still_queued_behind_a_hanging_collector():
    """A collector that never answers, an export timeout longer than the deadline: shutdown abandons the export
    in flight and counts it and the queue as ``shutdown_deadline``."""
    with backend("hanging-http") as otlp:
        tel = setup_telemetry("t", exporter=make_exporter(otlp, timeout_s=30.0), shutdown_deadline_s=DEADLINE_S)
        for i in range(N_SPANS):
            tel.tracer.start_span(f"s{i}").end()
        assert wait_for(lambda: tel.processor._batch is not None)  # an export is in flight (and hangs)
        t0 = time.monotonic()
        tel.shutdown()
        took = time.monotonic() - t0
    assert DEADLINE_S * 0.9 < took < DEADLINE_S + SLACK_S, f"shutdown took {took:.2f} s"
    tel.processor._thread.join(2)
    assert not tel.processor._thread.is_alive()  # the exporter's shutdown ended the hung export (socket shut down)
    c = tel.stats.snapshot()
    assert c.ended == N_SPANS and c.queued == 0 and c.exported == 0
    assert c.dropped_by_reason["shutdown_deadline"] == N_SPANS
    tel.tracer.start_span("late").end()
    c = tel.stats.snapshot()
    assert c.ended == N_SPANS + 1 and c.dropped_by_reason["after_shutdown"] == 1 and c.unaccounted == 0


class StuckExporter(SpanExporter):
    """An exporter that ignores shutdown and returns SUCCESS only when released (a misbehaving plug-in)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Event()
        self.returned = threading.Event()

    def export(self, spans):
        self.entered.set()
        self.release.wait(30)
        self.returned.set()
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def test_late_result_of_an_abandoned_export_is_not_counted_twice():
    exp = StuckExporter()
    tel = setup_telemetry("t", exporter=exp, shutdown_deadline_s=0.3)
    for i in range(1000):
        tel.tracer.start_span(f"s{i}").end()
    assert exp.entered.wait(10)
    t0 = time.monotonic()
    tel.shutdown()
    assert time.monotonic() - t0 < 0.3 + SLACK_S
    assert tel.stats.snapshot().dropped_by_reason["shutdown_deadline"] == 1000
    exp.release.set()  # the abandoned export now "succeeds"
    assert exp.returned.wait(10)
    tel.processor._thread.join(5)
    assert not tel.processor._thread.is_alive()
    c = tel.stats.snapshot()
    assert c.exported == 0 and c.dropped == 1000 and c.queued == 0 and c.unaccounted == 0


def test_healthy_collector_exports_everything_and_shutdown_is_quick():
    with answering(200) as otlp:
        tel = setup_telemetry("t", otlp=otlp, shutdown_deadline_s=10.0)
        with Readings(tel.stats) as readings:
            for i in range(N_SPANS):
                tel.tracer.start_span(f"s{i}").end()
            tel.shutdown()
    c = tel.stats.snapshot()
    assert c.ended == c.exported == N_SPANS and c.dropped == 0 and c.queued == 0
    assert not [r for r in readings.got if r.unaccounted]


def test_shutdown_deadline_setting(monkeypatch):
    monkeypatch.delenv(SHUTDOWN_DEADLINE_ENV, raising=False)
    tel = setup_telemetry("t", otlp="none")
    assert tel.processor.shutdown_deadline_s == DEFAULT_SHUTDOWN_DEADLINE_S
    tel.shutdown()
    monkeypatch.setenv(SHUTDOWN_DEADLINE_ENV, "0.25")
    tel = setup_telemetry("t", otlp="none")
    assert tel.processor.shutdown_deadline_s == 0.25
    tel.shutdown()
    tel = setup_telemetry("t", otlp="none", shutdown_deadline_s=2)  # the argument wins
    assert tel.processor.shutdown_deadline_s == 2.0
    tel.shutdown()
    monkeypatch.setenv(SHUTDOWN_DEADLINE_ENV, "soon")
    with pytest.raises(TelemetryConfigError, match=r"^DELTATAP_SPAN_SHUTDOWN_S: 'soon' is not a number of seconds"):
        setup_telemetry("t", otlp="none")
    monkeypatch.setenv(SHUTDOWN_DEADLINE_ENV, "-1")
    with pytest.raises(TelemetryConfigError, match=r"^DELTATAP_SPAN_SHUTDOWN_S: must be a finite number of seconds >= 0"):
        setup_telemetry("t", otlp="none")
