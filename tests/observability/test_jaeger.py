"""A real Jaeger v2 (cmd/jaeger, built by .ci/observability) with deploy/jaeger/config.yaml: the compose
deployment's spans reach it, directly from the collector's `--forward --reexport` and through the real
OpenTelemetry Collector, and its query API shows one trace per request with the taps' spans nested under
the load generator's client span and the collector's synthetic per-component spans in the same trace."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
import yaml

from deploy.pipeline import running_pipeline
from deltatap.core.vocab import SPAN_CLIENT, SPAN_DECOMPOSITION_PREFIX, SPAN_TAP
from obs_support import ROOT, Proc, free_port, http_text, wait_http

pytestmark = pytest.mark.observability

REQUESTS = 6
LINKS = ("edge", "gw-fw", "fw-engine")


def start_jaeger(jaeger_bin: Path, tmp: Path) -> tuple[Proc, str, str]:
    """Jaeger with the repository's config, its listeners moved to free loopback ports. Returns
    (process, OTLP/gRPC endpoint, query base URL)."""
    cfg = yaml.safe_load((ROOT / "deploy" / "jaeger" / "config.yaml").read_text())
    grpc, http, query, query_grpc = (free_port() for _ in range(4))
    cfg["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"] = f"127.0.0.1:{grpc}"
    cfg["receivers"]["otlp"]["protocols"]["http"]["endpoint"] = f"127.0.0.1:{http}"
    cfg["extensions"]["jaeger_query"]["http"]["endpoint"] = f"127.0.0.1:{query}"
    cfg["extensions"]["jaeger_query"]["grpc"]["endpoint"] = f"127.0.0.1:{query_grpc}"
    # Jaeger's own telemetry would listen on fixed ports (8888 metrics): keep it off the shared machine's ports
    cfg["service"]["telemetry"]["metrics"] = {"level": "none"}
    conf = tmp / "jaeger.yaml"
    conf.write_text(yaml.safe_dump(cfg))
    p = Proc("jaeger", [str(jaeger_bin), "--config", str(conf)], tmp / "jaeger.log")
    base = f"http://127.0.0.1:{query}"
    wait_http(f"{base}/api/services", p, timeout_s=60)
    return p, f"grpc://127.0.0.1:{grpc}", base


def start_otelcol_to(otelcol_bin: Path, tmp: Path, jaeger_grpc: str) -> tuple[Proc, str]:
    """The OTel Collector of deploy/otelcol/builder-config.yaml: OTLP in, batch, OTLP out to Jaeger."""
    grpc, metrics = free_port(), free_port()
    cfg = {
        "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": f"127.0.0.1:{grpc}"}}}},
        "processors": {"batch": {"timeout": "200ms"}},
        "exporters": {"otlp_grpc/jaeger": {"endpoint": jaeger_grpc.removeprefix("grpc://"), "tls": {"insecure": True}}},
        "service": {"pipelines": {"traces": {"receivers": ["otlp"], "processors": ["batch"], "exporters": ["otlp_grpc/jaeger"]}},
                    "telemetry": {"metrics": {"readers": [{"pull": {"exporter": {"prometheus": {"host": "127.0.0.1", "port": metrics}}}}]}}},
    }
    conf = tmp / "otelcol-jaeger.yaml"
    conf.write_text(yaml.safe_dump(cfg))
    p = Proc("otelcol", [str(otelcol_bin), "--config", str(conf)], tmp / "otelcol.log")
    wait_http(f"http://127.0.0.1:{metrics}/metrics", p)
    return p, f"grpc://127.0.0.1:{grpc}"


def jaeger_traces(base: str, links: dict[str, tuple[str, ...]], deadline_s: float = 30.0) -> dict[str, dict]:
    """Each trace by id from Jaeger's query API, polled until every one holds the client span, the spans of the
    taps its request crossed (``links``: trace id -> links) and synthetic spans (Jaeger writes
    asynchronously), bounded."""
    trace_ids = set(links)
    got: dict[str, dict] = {}
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        for tid in trace_ids:
            try:
                data = json.loads(http_text(f"{base}/api/traces/{tid}"))["data"]
            except OSError:
                continue
            if data:
                got[tid] = data[0]
        if len(got) == len(trace_ids) and all(_complete(t, links[tid]) for tid, t in got.items()):
            break
        time.sleep(0.5)
    return got


def _complete(trace: dict, links: tuple[str, ...]) -> bool:
    names = [s["operationName"] for s in trace["spans"]]
    return (SPAN_CLIENT in names and all(f"{SPAN_TAP} {link}" in names for link in links)
            and any(n.startswith(SPAN_DECOMPOSITION_PREFIX) for n in names))


def check_trace(tid: str, trace: dict, links: tuple[str, ...]) -> None:
    spans = {s["spanID"]: s for s in trace["spans"]}
    service = {s["spanID"]: trace["processes"][s["processID"]]["serviceName"] for s in trace["spans"]}
    parent = {}
    for s in trace["spans"]:
        refs = [r for r in s.get("references", []) if r["refType"] == "CHILD_OF" and r["traceID"] == trace["traceID"]]
        if refs:
            parent[s["spanID"]] = refs[0]["spanID"]
    (client,) = [sid for sid, s in spans.items() if s["operationName"] == SPAN_CLIENT]
    assert service[client] == "deltatap-loadgen"
    for link in links:
        taps = [sid for sid, s in spans.items() if s["operationName"] == f"{SPAN_TAP} {link}"]
        assert len(taps) == 1, (tid, link, len(taps))
        chain, sid = [], taps[0]
        while sid in parent and len(chain) < 20:  # walk up to the root
            sid = parent[sid]
            chain.append(spans[sid]["operationName"] if sid in spans else f"missing {sid}")
        assert sid == client, (tid, link, chain)  # the tap span is nested under the client span
    synthetic = [s for s in trace["spans"] if s["operationName"].startswith(SPAN_DECOMPOSITION_PREFIX)]
    assert any(s["operationName"] == f"{SPAN_DECOMPOSITION_PREFIX} request" for s in synthetic), tid
    assert len(synthetic) >= 4, (tid, [s["operationName"] for s in synthetic])  # the request and its per-component deltas
    assert all(service[s["spanID"]] == "deltatap-collector" for s in synthetic)


@pytest.mark.parametrize("path", ["direct", "otelcol"])
def test_jaeger_shows_one_trace_per_request_with_taps_under_the_client(path: str, jaeger_bin: Path, request, tmp_path: Path) -> None:
    procs: list[Proc] = []
    try:
        jaeger, jaeger_grpc, base = start_jaeger(jaeger_bin, tmp_path)
        procs.append(jaeger)
        target = jaeger_grpc
        if path == "otelcol":
            otelcol, target = start_otelcol_to(request.getfixturevalue("otelcol_bin"), tmp_path, jaeger_grpc)
            procs.append(otelcol)

        async def run() -> list[dict]:
            async with running_pipeline(tmp_path, requests=REQUESTS, forward=target, reexport=True, unused_port=free_port()) as p:
                assert len(p.collector.rows()) >= REQUESTS  # the measured requests (and the load generator's other calls)
                return p.records  # the collector closes on leaving: its forwarder drains into Jaeger

        records = asyncio.run(run())
        # a request the firewall refuses (the demo's keyword rules) never reaches the fw-engine tap
        links = {r["trace_id"]: LINKS if r["status"] == "ok" else LINKS[:2] for r in records}
        assert len(links) == REQUESTS and sum(v == LINKS for v in links.values()) >= REQUESTS // 2, [r["status"] for r in records]
        traces = jaeger_traces(base, links)
        # one trace per request: each request's own trace id, nothing split off
        assert set(traces) == set(links), (len(traces), jaeger.tail())
        for tid, trace in traces.items():
            check_trace(tid, trace, links[tid])
        services = json.loads(http_text(f"{base}/api/services"))["data"]
        assert {"deltatap-loadgen", "deltatap-tap-edge", "deltatap-collector"} <= set(services), services
    finally:
        for p in reversed(procs):
            p.stop()
