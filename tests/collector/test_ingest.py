"""Offline ingest: OTLP JSON (deltatap's file exporter and the Collector's hex form), Jaeger JSON, AIPerf, rows, sketches; the CLI."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf.json_format import MessageToDict
from otlpfactory import BASE, MS, default_stack, request

from deltatap.collector.ingest import load
from deltatap.collector.pipeline import Pipeline
from deltatap.collector.rows import JoinMethod, TokenSource
from deltatap.collector.sinks import read_rows
from deltatap.core.clock import mono_ns, to_unix_ns
from deltatap.core.config import ConfigError
from deltatap.telemetry.tracer import OtlpJsonFileExporter, setup_telemetry
from deltatap.core.vocab import Attr, TapEvent, tap_span_name

ROOT = Path(__file__).resolve().parents[2]


def rows_of(paths):
    loaded = load(paths)
    p = Pipeline()
    p.ingest(loaded.spans, 0.0)
    return p.flush(), p


def hex_json(req) -> dict:
    doc = MessageToDict(req)
    for rs in doc["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for sp in ss["spans"]:
                for k in ("traceId", "spanId", "parentSpanId"):
                    if sp.get(k):
                        sp[k] = base64.b64decode(sp[k]).hex()
    return doc


def test_deltatap_file_exporter_output_round_trips(tmp_path):
    path = tmp_path / "spans.jsonl"
    tel = setup_telemetry("deltatap-tap", exporter=OtlpJsonFileExporter(path))
    t = mono_ns()
    ev = {TapEvent.REQUEST_RECEIVED: t, TapEvent.REQUEST_FORWARDED: t + 150_000, TapEvent.FIRST_TOKEN_RECEIVED: t + 30 * MS, TapEvent.FIRST_TOKEN_FORWARDED: t + 30 * MS + 40_000}
    span = tel.tracer.start_span(tap_span_name("fw-engine"), start_time=to_unix_ns(t), attributes={Attr.OBSERVER: "tap", Attr.LINK: "fw-engine", Attr.REQUEST_ID: "f1"})
    for name, ts in ev.items():
        span.add_event(name.value, timestamp=to_unix_ns(ts))
    span.end(end_time=to_unix_ns(t + 31 * MS))
    tel.shutdown()
    rows, _ = rows_of([path])
    assert len(rows) == 1
    assert rows[0].deltas["engine_ttft"].ns == 30 * MS - 150_000
    assert rows[0].deltas["tap_fw-engine_first_token"].ns == 40_000


def test_collector_file_exporter_hex_ids_and_split_traces(tmp_path):
    path = tmp_path / "otelcol.json"
    spans, _ = default_stack(rid="x", split_at="fw-engine")
    with path.open("w") as fh:
        for sp in spans:  # one export per line, as the file exporter writes them
            fh.write(json.dumps(hex_json(request([sp]))) + "\n")
    rows, p = rows_of([path])
    assert len(rows) == 1 and rows[0].join_method == JoinMethod.CORRELATION and "residual" in rows[0].deltas


def jaeger_doc(req) -> dict:
    spans = []
    for rs in req.resource_spans:
        for ss in rs.scope_spans:
            for sp in ss.spans:
                tags = []
                for kv in sp.attributes:
                    which = kv.value.WhichOneof("value")
                    typ = {"string_value": "string", "int_value": "int64", "double_value": "float64", "bool_value": "bool"}[which]
                    tags.append({"key": kv.key, "type": typ, "value": getattr(kv.value, which)})
                spans.append({
                    "traceID": sp.trace_id.hex(), "spanID": sp.span_id.hex(), "operationName": sp.name,
                    "references": [{"refType": "CHILD_OF", "traceID": sp.trace_id.hex(), "spanID": sp.parent_span_id.hex()}] if sp.parent_span_id else [],
                    "startTime": sp.start_time_unix_nano // 1000, "duration": (sp.end_time_unix_nano - sp.start_time_unix_nano) // 1000, "tags": tags,
                    "logs": [{"timestamp": e.time_unix_nano // 1000, "fields": [{"key": "event", "type": "string", "value": e.name}]} for e in sp.events],
                    "processID": "p1",
                })
    return {"data": [{"traceID": spans[0]["traceID"], "spans": spans, "processes": {"p1": {"serviceName": "deltatap-tap", "tags": []}}}]}


def test_jaeger_json(tmp_path):
    spans, t = default_stack(rid="j")
    path = tmp_path / "jaeger.json"
    path.write_text(json.dumps(jaeger_doc(request(spans)), indent=1))
    rows, _ = rows_of([path])
    assert len(rows) == 1 and rows[0].request_id == "j"
    assert rows[0].deltas["engine_ttft"].ns == 50 * MS  # microsecond times: exact here since the inputs are whole us
    assert rows[0].deltas["system_ttft"].ns == 67 * MS


def aiperf_record(rid: str, start: int, ttft_ms: float, end: int, error=None) -> dict:
    return {
        "metadata": {"session_num": 0, "x_request_id": rid, "x_correlation_id": "c", "conversation_id": "cv", "turn_index": 0, "request_start_ns": start,
                     "request_ack_ns": start + 1000, "request_end_ns": end, "worker_id": "w", "record_processor_id": "p", "benchmark_phase": "profiling",
                     "was_cancelled": False, "cancellation_time_ns": None},
        "metrics": {"input_sequence_length": {"value": 550, "unit": "tokens"}, "time_to_first_token": {"value": ttft_ms, "unit": "ms"},
                    "request_latency": {"value": (end - start) / 1e6, "unit": "ms"}, "output_sequence_length": {"value": 9, "unit": "tokens"}},
        "error": error,
    }


def test_aiperf_records_join_tap_spans_on_x_request_id(tmp_path):
    # the taps saw the request; AIPerf (no spans of its own) recorded its side
    spans, t = default_stack(rid="aiperf-1")
    taps = request(spans[1:])
    otlp = tmp_path / "taps.jsonl"
    otlp.write_text(json.dumps(hex_json(taps)) + "\n")
    ap = tmp_path / "profile_export.jsonl"
    ap.write_text(json.dumps(aiperf_record("aiperf-1", t["t0"] - 300_000, 68.123456, t["t12"] + 120 * MS)) + "\n"
                  + json.dumps(aiperf_record("lonely", BASE + 10**10, 5.0, BASE + 10**10 + 9 * MS)) + "\n")
    rows, p = rows_of([otlp, ap])
    by = {r.request_id: r for r in rows}
    r = by["aiperf-1"]
    assert r.join_method == JoinMethod.CORRELATION and len(r.trace_ids) == 2
    assert r.points["client.send"].source == "aiperf"
    assert r.deltas["system_ttft"].ns == 68_123_456
    assert r.tokens_in == 550 and r.tokens_out == 9 and r.tokens_source == TokenSource.TOKENIZER  # AIPerf's tokenizer counts
    lone = by["lonely"]
    assert lone.deltas["system_ttft"].ns == 5 * MS and lone.tokens_source == TokenSource.TOKENIZER and lone.tokens_in == 550


def test_unknown_and_broken_inputs_are_clear_errors(tmp_path):
    bad = tmp_path / "what.json"
    bad.write_text('{"hello": 1}')
    with pytest.raises(ConfigError, match="unrecognised input"):
        load([bad])
    with pytest.raises(ConfigError, match="file not found"):
        load([tmp_path / "missing.jsonl"])
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "zz", "spanId": "01"}]}]}]}\n{"resourceSpans": []}\n')
    with pytest.raises(ConfigError, match=r"broken.jsonl:1: .*traceId"):
        load([broken])


def deltatap(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "deltatap.app.cli", *args], capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_report_cli_writes_files_and_merges_sketches(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    for path, offset in ((a, 0), (b, 100)):
        with path.open("w") as fh:
            for i in range(5):
                spans, _ = default_stack(BASE + (offset + i) * 10**9, rid=f"r{offset + i}", t7=BASE + (offset + i) * 10**9 + (20 + 3 * (offset + i)) * MS)
                fh.write(json.dumps(hex_json(request(spans))) + "\n")
    for path, out in ((a, "ra"), (b, "rb")):
        res = deltatap("report", "--from", str(path), "--out", str(tmp_path / out), "--format", "json")
        assert res.returncode == 0, res.stderr
    both = deltatap("report", "--from", str(a), str(b), "--format", "json", "--out", str(tmp_path / "both"), "--rows-format", "csv")
    merged = deltatap("report", "--from", str(tmp_path / "ra" / "sketches.json"), str(tmp_path / "rb" / "sketches.json"), "--format", "json")
    assert both.returncode == 0 and merged.returncode == 0, both.stderr + merged.stderr
    assert json.loads(both.stdout) == json.loads(merged.stdout)
    assert json.loads(both.stdout)["engine_ttft"]["count"] == 10
    assert len(read_rows(tmp_path / "both" / "rows.csv")) == 10
    md = deltatap("report", "--from", str(tmp_path / "ra" / "rows.parquet"), "--format", "markdown")
    assert md.returncode == 0 and "| AI Firewall (out) |" in md.stdout and "*Outbound adds to client-observed TTFT" in md.stdout
    bad = deltatap("report", "--from", str(tmp_path / "nope.json"))
    assert bad.returncode == 2 and "file not found" in bad.stderr
