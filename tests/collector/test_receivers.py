"""Receivers over real loopback sockets: OTLP/gRPC, OTLP/HTTP protobuf and JSON, invalid input, /v1/clock, /metrics, forwarding."""

from __future__ import annotations

import asyncio
import gzip
import json

import aiohttp
import grpc
import pytest
from google.protobuf.json_format import MessageToDict
from google.rpc import status_pb2
from otlpfactory import default_stack, request

from deltatap.collector import CollectorOptions, PipelineOptions, start_collector
from deltatap.core.clocksync import estimate_offset
from deltatap.telemetry.tracer import setup_telemetry

EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


@pytest.fixture
async def running(tmp_path):
    rc = await start_collector(CollectorOptions(otlp_grpc="127.0.0.1:0", otlp_http="127.0.0.1:0", out_dir=tmp_path / "out", rows_format="jsonl",
                                                pipeline=PipelineOptions(grace_s=0.05, join_hold_s=0.05)))
    yield rc
    await rc.close()


async def wait_rows(rc, n, timeout=10.0):
    deadline = asyncio.get_running_loop().time() + timeout
    while len(rc.rows()) < n and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.05)
    return rc.rows()


async def test_grpc_http_protobuf_and_http_json_all_decompose(running):
    reqs = [request(default_stack(rid=f"r{i}")[0]) for i in range(3)]
    async with grpc.aio.insecure_channel(running.otlp_grpc_endpoint[len("grpc://"):]) as ch:
        call = ch.unary_unary(EXPORT, request_serializer=lambda b: b, response_deserializer=lambda b: b)
        await call(reqs[0].SerializeToString(), timeout=10)
    async with aiohttp.ClientSession() as s:
        url = running.otlp_http_url + "/v1/traces"
        async with s.post(url, data=gzip.compress(reqs[1].SerializeToString()), headers={"Content-Type": "application/x-protobuf", "Content-Encoding": "gzip"}) as r:
            assert r.status == 200
        # OTLP JSON as the spec writes it: hex ids, camelCase, int64 as strings
        doc = MessageToDict(reqs[2])
        for rs in doc["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                for sp in ss["spans"]:
                    for k in ("traceId", "spanId", "parentSpanId"):
                        if sp.get(k):
                            import base64

                            sp[k] = base64.b64decode(sp[k]).hex()
        async with s.post(url, data=json.dumps(doc), headers={"Content-Type": "application/json"}) as r:
            assert r.status == 200 and await r.json() == {}
    rows = await wait_rows(running, 3)
    assert sorted(r.request_id for r in rows) == ["r0", "r1", "r2"]
    assert all(r.deltas["engine_ttft"].ns == 50_000_000 for r in rows)
    assert running.stats()["spans_received"] == 12


async def test_invalid_otlp_is_refused_clearly(running):
    async with aiohttp.ClientSession() as s:
        url = running.otlp_http_url + "/v1/traces"
        async with s.post(url, data=b"\xff\x00garbage", headers={"Content-Type": "application/x-protobuf"}) as r:
            assert r.status == 400
            st = status_pb2.Status.FromString(await r.read())
            assert st.code == 3 and "not a protobuf ExportTraceServiceRequest" in st.message
        async with s.post(url, data=b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "abc", "spanId": "0102030405060708"}]}]}]}',
                          headers={"Content-Type": "application/json"}) as r:
            assert r.status == 400
            body = await r.json()
            assert "resourceSpans[0].scopeSpans[0].spans[0].traceId" in body["message"]
        async with s.post(url, data=b"{not json", headers={"Content-Type": "application/json"}) as r:
            assert r.status == 400 and "not JSON" in (await r.json())["message"]
        async with s.post(url, data=b"x", headers={"Content-Type": "text/plain"}) as r:
            assert r.status == 415
    async with grpc.aio.insecure_channel(running.otlp_grpc_endpoint[len("grpc://"):]) as ch:
        call = ch.unary_unary(EXPORT, request_serializer=lambda b: b, response_deserializer=lambda b: b)
        with pytest.raises(grpc.aio.AioRpcError) as ei:
            await call(b"\xff\xff\xffjunk", timeout=10)
        assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "invalid OTLP" in ei.value.details()
    assert running.stats()["decode_errors"] == {"grpc": 1, "http": 4}


async def test_clock_endpoint_and_metrics(running):
    est = await estimate_offset(running.otlp_http_url, samples=6)
    assert abs(est.offset_ns) <= est.uncertainty_ns + 200_000  # same host, same clock
    tel = setup_telemetry("t", otlp=running.otlp_grpc_endpoint)  # the real exporter (deltatap.otlp_export, gRPC)
    try:
        with tel.tracer.start_as_current_span("unrelated"):
            pass
    finally:
        await asyncio.to_thread(tel.shutdown)
    async with aiohttp.ClientSession() as s:
        async with s.post(running.otlp_http_url + "/v1/traces", data=request(default_stack()[0]).SerializeToString(), headers={"Content-Type": "application/x-protobuf"}) as r:
            assert r.status == 200
        await wait_rows(running, 2)
        async with s.get(running.otlp_http_url + "/metrics") as r:
            text = await r.text()
    assert "deltatap_collector_spans_received_total 5.0" in text
    assert 'deltatap_collector_traces_joined_total{method="trace_id"} 2.0' in text
    assert 'deltatap_collector_delta_seconds_bucket{component="engine",delta="engine_ttft",le="0.05"} 1.0' in text
    assert "deltatap_collector_traces_evicted_total 0.0" in text and "deltatap_collector_late_spans_total 0.0" in text


async def test_forwarding_and_reexport_reach_another_collector(tmp_path):
    sink = await start_collector(CollectorOptions(otlp_grpc="127.0.0.1:0", otlp_http="127.0.0.1:0", pipeline=PipelineOptions(grace_s=0.05, join_hold_s=0.05)))
    front = await start_collector(CollectorOptions(otlp_grpc="127.0.0.1:0", otlp_http=None, forward=sink.otlp_http_url, reexport=True, out_dir=tmp_path,
                                                   pipeline=PipelineOptions(grace_s=0.05, join_hold_s=0.05)))
    try:
        async with grpc.aio.insecure_channel(front.otlp_grpc_endpoint[len("grpc://"):]) as ch:
            call = ch.unary_unary(EXPORT, request_serializer=lambda b: b, response_deserializer=lambda b: b)
            await call(request(default_stack(rid="fwd")[0]).SerializeToString(), timeout=10)
        await wait_rows(front, 1)
        deadline = asyncio.get_running_loop().time() + 10
        while sink.stats()["spans_received"] < 4 + 2 and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        got = sink.stats()["spans_received"]
        assert got >= 6  # the 4 forwarded spans plus synthetic decomposition spans in the same trace
        files = await front.close()
        assert {"rows", "summary.json", "sketches.json", "decomposition.md"} <= set(files)
        summary = json.loads(files["summary.json"].read_text())
        assert summary["engine_ttft"]["count"] == 1 and summary["engine_ttft"]["p50_ms"] == 50.0
        assert set(summary["engine_ttft"]) == {"p50_ms", "p90_ms", "p95_ms", "p99_ms", "p999_ms", "mean_ms", "min_ms", "max_ms", "count", "error_bound_ms",
                                               "bounded_share", "bound_mean_ms", "bound_max_ms", "unbounded_share"}
    finally:
        await front.close()
        await sink.close()
