import json
import threading
import time

import pytest
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from deltatap.core.clock import ANCHOR, mono_ns, now_unix_ns, to_unix_ns
from deltatap.telemetry.otlp_export import OtlpGrpcExporter, OtlpHttpExporter
from deltatap.telemetry.tracer import OtlpJsonFileExporter, make_exporter, setup_telemetry, NullExporter, TelemetryConfigError


class BlockingExporter(SpanExporter):
    """An exporter stuck like a dead collector until released."""

    def __init__(self):
        self.release = threading.Event()
        self.exported = 0

    def export(self, spans):
        self.release.wait(10)
        self.exported += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self):
        self.release.set()


class FailingExporter(SpanExporter):
    def export(self, spans):
        raise ConnectionRefusedError("collector down")

    def shutdown(self):
        pass


def test_anchor_maps_monotonic_to_wall_clock():
    assert ANCHOR.uncertainty_ns < 1_000_000
    assert abs(now_unix_ns() - time.time_ns()) < 5_000_000
    a = mono_ns()
    assert to_unix_ns(a + 1234) - to_unix_ns(a) == 1234


def test_stuck_exporter_never_blocks_and_drops_are_counted():
    exp = BlockingExporter()
    tel = setup_telemetry("t", exporter=exp, max_queue=100)
    tracer = tel.tracer
    t0 = time.perf_counter()
    for i in range(1000):
        tracer.start_span(f"s{i}").end()
    elapsed = time.perf_counter() - t0
    assert elapsed < 2.0  # 1000 span ends with a stuck exporter complete at once
    assert tel.stats.spans_ended == 1000
    assert tel.stats.spans_dropped_queue_full >= 1000 - 100 - 512
    exp.release.set()
    tel.shutdown()
    assert exp.exported + tel.stats.spans_dropped == 1000


def test_failing_exporter_is_counted_not_raised():
    tel = setup_telemetry("t", exporter=FailingExporter())
    for _ in range(10):
        tel.tracer.start_span("x").end()
    tel.processor.force_flush(5000)
    assert tel.stats.export_failures >= 1
    assert tel.stats.spans_dropped_export_failed == 10
    assert "collector down" in tel.stats.last_error
    tel.shutdown()


def test_file_exporter_writes_otlp_json(tmp_path):
    path = tmp_path / "spans.jsonl"
    tel = setup_telemetry("t", exporter=OtlpJsonFileExporter(path))
    span = tel.tracer.start_span("hello", start_time=1_000)
    span.add_event("e", timestamp=1_500)
    span.end(end_time=2_000)
    tel.shutdown()
    line = json.loads(path.read_text().splitlines()[0])
    s = line["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    assert s["name"] == "hello" and s["startTimeUnixNano"] == "1000" and s["events"][0]["timeUnixNano"] == "1500"


def test_exporter_selection(monkeypatch):
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    assert isinstance(make_exporter(None), NullExporter)
    grpc_exp = make_exporter("grpc://127.0.0.1:4317")
    assert isinstance(grpc_exp, OtlpGrpcExporter) and grpc_exp.target == "127.0.0.1:4317" and not grpc_exp.secure
    http_exp = make_exporter("http://127.0.0.1:4318")
    assert isinstance(http_exp, OtlpHttpExporter) and http_exp.url == "http://127.0.0.1:4318/v1/traces"
    assert make_exporter("http://127.0.0.1:4318/v1/traces").url == "http://127.0.0.1:4318/v1/traces"
    assert make_exporter("https://collector.example:4317").secure
    assert make_exporter("https://collector.example", protocol="http/protobuf").url == "https://collector.example/v1/traces"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317")
    assert isinstance(make_exporter(None), OtlpGrpcExporter)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    assert isinstance(make_exporter(None), OtlpHttpExporter)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
    with pytest.raises(TelemetryConfigError, match="'http/json' is not supported; use grpc or http/protobuf"):
        make_exporter(None)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_PROTOCOL")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_COMPRESSION", "zstd")
    with pytest.raises(TelemetryConfigError, match="OTEL_EXPORTER_OTLP_COMPRESSION: 'zstd'"):
        make_exporter(None)
    try:
        make_exporter("127.0.0.1:4317")
    except TelemetryConfigError as exc:
        assert "grpc://HOST:4317" in str(exc)
    else:
        raise AssertionError("bare host:port must be rejected")
