"""Jaeger compatibility: the collector's `--forward` (with `--reexport`) delivers valid OTLP to a real
OTLP receiver - gRPC, as docker-compose.yml sends to Jaeger, and HTTP/protobuf - and the synthetic
per-component spans sit in the requests' own traces, parented, inside their time range."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from deltatap.core.vocab import SPAN_DECOMPOSITION_PREFIX, SPAN_TAP, TapEvent
from tests.conftest import free_port

from .pipeline import running_pipeline


class _GrpcReceiver(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self.requests: list[trace_service_pb2.ExportTraceServiceRequest] = []

    async def Export(self, request, context):  # noqa: N802 - OTLP service method name
        self.requests.append(request)
        return trace_service_pb2.ExportTraceServiceResponse()


async def _start_grpc_receiver():
    receiver = _GrpcReceiver()
    server = grpc.aio.server()
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(receiver, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return f"grpc://127.0.0.1:{port}", receiver, server.stop


async def _start_http_receiver():
    requests: list[trace_service_pb2.ExportTraceServiceRequest] = []

    async def traces(request: web.Request) -> web.Response:
        assert request.content_type == "application/x-protobuf"
        requests.append(trace_service_pb2.ExportTraceServiceRequest.FromString(await request.read()))
        return web.Response(body=trace_service_pb2.ExportTraceServiceResponse().SerializeToString(),
                            content_type="application/x-protobuf")

    app = web.Application()
    app.router.add_post("/v1/traces", traces)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    receiver = type("R", (), {"requests": requests})()
    return f"http://127.0.0.1:{port}", receiver, lambda grace=None: runner.cleanup()


RECEIVERS = {"grpc": _start_grpc_receiver, "http": _start_http_receiver}


def _spans(requests) -> list[tuple[dict, Span]]:
    out = []
    for req in requests:
        for rs in req.resource_spans:
            resource = {kv.key: kv.value.string_value for kv in rs.resource.attributes}
            for ss in rs.scope_spans:
                out.extend((resource, sp) for sp in ss.spans)
    return out


def _assert_valid_otlp_span(resource: dict, sp: Span) -> None:
    assert resource.get("service.name"), "resource without service.name"
    assert len(sp.trace_id) == 16 and any(sp.trace_id), sp.name
    assert len(sp.span_id) == 8 and any(sp.span_id), sp.name
    assert sp.parent_span_id == b"" or len(sp.parent_span_id) == 8, sp.name
    assert sp.name
    assert 0 < sp.start_time_unix_nano <= sp.end_time_unix_nano, sp.name
    assert sp.kind in Span.SpanKind.values(), sp.kind
    for ev in sp.events:
        assert ev.name and ev.time_unix_nano > 0
    # round-trips through the wire format unchanged
    assert Span.FromString(sp.SerializeToString()) == sp


@pytest.mark.parametrize("transport", sorted(RECEIVERS))
async def test_forwarded_and_reexported_spans_are_valid_otlp(tmp_path: Path, transport: str):
    url, receiver, stop = await RECEIVERS[transport]()
    try:
        async with running_pipeline(tmp_path, requests=4, forward=url, reexport=True, unused_port=free_port()) as p:
            await p.collector.drain()
            assert p.collector.rows(), "no decomposition rows"
            deadline = asyncio.get_running_loop().time() + 10
            while asyncio.get_running_loop().time() < deadline and not any(
                sp.name.startswith(SPAN_DECOMPOSITION_PREFIX) for _r, sp in _spans(receiver.requests)
            ):
                await asyncio.sleep(0.1)
            dropped = p.collector.stats()["forward_dropped"]
    finally:
        await stop(None)
    assert dropped == 0
    spans = _spans(receiver.requests)
    for resource, sp in spans:
        _assert_valid_otlp_span(resource, sp)

    # everything the taps exported was forwarded, with the timeline events
    tap_spans = [sp for _r, sp in spans if sp.name.startswith(SPAN_TAP)]
    # three taps per request; a request the firewall refuses never reaches the fw-engine tap
    expected = sum(2 if r["status"] == "refused" else 3 for r in p.records)
    assert len(tap_spans) >= expected
    tap_events = {e.value for e in TapEvent}
    assert all({ev.name for ev in sp.events} <= tap_events for sp in tap_spans)
    refused = {r["trace_id"] for r in p.records if r["status"] == "refused"}
    answered = [sp for sp in tap_spans if sp.trace_id.hex() not in refused]
    assert answered and all(any(ev.name == TapEvent.FIRST_TOKEN_RECEIVED for ev in sp.events) for sp in answered)

    # the synthetic decomposition spans: in the requests' own traces, each child under its request span
    synth = [sp for _r, sp in spans if sp.name.startswith(SPAN_DECOMPOSITION_PREFIX)]
    roots = {sp.span_id: sp for sp in synth if sp.name == f"{SPAN_DECOMPOSITION_PREFIX} request"}
    children = [sp for sp in synth if sp.span_id not in roots]
    assert roots and children
    request_traces = {sp.trace_id for sp in tap_spans}
    for root in roots.values():
        assert root.trace_id in request_traces
    names = set()
    for ch in children:
        root = roots[ch.parent_span_id]
        assert ch.trace_id == root.trace_id
        assert root.start_time_unix_nano <= ch.start_time_unix_nano <= ch.end_time_unix_nano <= root.end_time_unix_nano
        attrs = {kv.key: kv.value for kv in ch.attributes}
        assert abs(attrs["deltatap.delta.ms"].double_value - (ch.end_time_unix_nano - ch.start_time_unix_nano) / 1e6) < 1e-3
        names.add(ch.name.removeprefix(SPAN_DECOMPOSITION_PREFIX + " "))
    # the per-component deltas a Jaeger user looks for are there
    assert {"gateway_inbound", "firewall_inbound", "engine_ttft", "system_ttft"} <= names
