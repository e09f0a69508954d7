"""End-to-end accuracy: loadgen -> tap -> gateway -> tap -> firewall -> tap -> engine on loopback.

Every component and every tap runs in its own process, as deployed; the taps and the load generator
export to a real collector over OTLP/gRPC; the reference components' own spans (their *true*
points, stamped at the socket) go to OTLP JSON files the collector never sees. Per request, every component delta the collector reports is
compared with the same delta computed from the components' true points:
|error| p50 <= 0.3 ms and p99 <= 1 ms at 50 req/s. A second run with the firewall stripping
``traceparent`` and the correlation header must still join every request, via the body fingerprint.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from collector import CollectorOptions, PipelineOptions, start_collector
from collector.ingest import load
from collector.rows import JoinMethod
from deltatap.telemetry import setup_telemetry
from deltatap.vocab import Attr, Role, point
from loadgen import LoadOptions, run_load


pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

REQUESTS = 270
WARMUP = 20  # the first requests of fresh processes pay imports and first-call costs: not compared
RATE = 50.0
COMPONENT_DELTAS = {
    "gateway_inbound": ("gateway", Role.IN_EXIT, Role.IN_ARRIVE),
    "firewall_inbound": ("firewall", Role.IN_EXIT, Role.IN_ARRIVE),
    "engine_ttft": ("engine", Role.FIRST_TOKEN, Role.QUEUE),
    "firewall_outbound": ("firewall", Role.OUT_FIRST_OUT, Role.OUT_FIRST_IN),
    "gateway_outbound": ("gateway", Role.OUT_FIRST_OUT, Role.OUT_FIRST_IN),
}


def stack_yaml(propagate: bool) -> str:
    return f"""
engine:
  name: engine
  seed: 3
  models: ["deltatap-ref"]
  default_max_tokens: 8
  scheduler: {{prefill_base_ms: 4.0, prefill_per_token_ms: 0.01, decode_base_ms: 3.0}}
firewall:
  name: firewall
  seed: 2
  delays: {{inbound: {{fixed_ms: 3.0, jitter_ms: 0.5}}, outbound_first: {{fixed_ms: 1.5}}}}
  upstream_policy: {{propagate_trace: {str(propagate).lower()}}}
gateway:
  name: gateway
  seed: 1
  delays: {{inbound: {{fixed_ms: 2.0, jitter_ms: 0.3}}, outbound_first: {{fixed_ms: 1.0}}}}
"""


def truth_index(spans) -> dict[str, dict[str, dict[str, int]]]:
    """trace id -> component -> role -> Unix ns, from the components' own spans."""
    out: dict[str, dict[str, dict[str, int]]] = {}
    for s in spans:
        if s.attrs.get(Attr.OBSERVER) != "component":
            continue
        out.setdefault(s.trace_id, {})[str(s.attrs.get(Attr.COMPONENT))] = {name: t for name, t, _ in s.events}
    return out


async def _wait_port(port: int, procs, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for p in procs:
            if p.returncode is not None:
                raise RuntimeError(f"a stack process exited early with {p.returncode}")
        try:
            _, w = await asyncio.open_connection("127.0.0.1", port)
            w.close()
            return
        except OSError:
            await asyncio.sleep(0.2)
    raise TimeoutError(f"nothing listening on {port} after {timeout_s}s")


async def run_once(propagate: bool, tmp_path: Path):
    """Each component and each tap in its own process (as deployed); the collector and the load
    generator in this one. Components export their truth to files the collector never reads."""
    cfg = tmp_path / "stack.yaml"
    cfg.write_text(stack_yaml(propagate))
    collector = await start_collector(CollectorOptions(otlp_grpc="127.0.0.1:0", otlp_http=None, pipeline=PipelineOptions(grace_s=0.5, join_hold_s=0.5)))
    ports = {k: free_port() for k in ("engine", "fw-engine", "firewall", "gw-fw", "gateway", "edge")}
    url = lambda k: f"http://127.0.0.1:{ports[k]}"  # noqa: E731
    exe = [sys.executable, "-m", "deltatap.cli"]
    cmds = [
        [*exe, "stack", "engine", "--config", str(cfg), "--listen", f"127.0.0.1:{ports['engine']}", "--otlp", f"file:{tmp_path / 'truth-engine.jsonl'}"],
        [*exe, "tap", "--link", "fw-engine", "--listen", f"127.0.0.1:{ports['fw-engine']}", "--upstream", url("engine"), "--no-admin", "--grace-s", "0", "--otlp", collector.otlp_grpc_endpoint],
        [*exe, "stack", "firewall", "--config", str(cfg), "--listen", f"127.0.0.1:{ports['firewall']}", "--upstream", url("fw-engine"), "--otlp", f"file:{tmp_path / 'truth-firewall.jsonl'}"],
        [*exe, "tap", "--link", "gw-fw", "--listen", f"127.0.0.1:{ports['gw-fw']}", "--upstream", url("firewall"), "--no-admin", "--grace-s", "0", "--otlp", collector.otlp_grpc_endpoint],
        [*exe, "stack", "gateway", "--config", str(cfg), "--listen", f"127.0.0.1:{ports['gateway']}", "--upstream", url("gw-fw"), "--otlp", f"file:{tmp_path / 'truth-gateway.jsonl'}"],
        [*exe, "tap", "--link", "edge", "--listen", f"127.0.0.1:{ports['edge']}", "--upstream", url("gateway"), "--no-admin", "--grace-s", "0", "--otlp", collector.otlp_grpc_endpoint],
    ]
    procs = [await asyncio.create_subprocess_exec(*c, stdout=asyncio.subprocess.DEVNULL, stderr=open(tmp_path / f"proc{i}.log", "w")) for i, c in enumerate(cmds)]
    load_tel = setup_telemetry("deltatap-loadgen", otlp=collector.otlp_grpc_endpoint)
    try:
        for k in ports:
            await _wait_port(ports[k], procs)
        opts = LoadOptions(target=url("edge"), model="deltatap-ref", rate=RATE, requests=REQUESTS, seed=11, progress=False, gpu=False, write_requests=False,
                           workload={"workload": "synthetic-uniform", "params": {"input": {"dist": "uniform", "min": 16, "max": 64}, "output": {"dist": "uniform", "min": 4, "max": 8}}})
        result = await run_load(opts, load_tel)
    finally:
        for p in reversed(procs):  # the edge first, like a real shutdown
            if p.returncode is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                await asyncio.wait_for(p.wait(), 30)
            except asyncio.TimeoutError:
                p.kill()
                await p.wait()
        await asyncio.to_thread(load_tel.shutdown)
    deadline = time.monotonic() + 30  # every span exported: wait for all of them (4 per request)
    while collector.stats()["spans_received"] < 4 * REQUESTS and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    await collector.drain()
    rows = collector.rows()
    stats = collector.stats()
    await collector.close()
    truth = load([tmp_path / f"truth-{c}.jsonl" for c in ("engine", "firewall", "gateway")]).spans
    return result, rows, stats, truth_index(truth)


def errors_vs_truth(rows, truth) -> dict[str, np.ndarray]:
    errs: dict[str, list[int]] = {k: [] for k in COMPONENT_DELTAS}
    for r in rows:
        comps: dict[str, dict[str, int]] = {}
        for tid in r.trace_ids:
            comps.update(truth.get(tid, {}))
        for name, (comp, end, start) in COMPONENT_DELTAS.items():
            t = comps.get(comp, {})
            if name in r.deltas and str(end) in t and str(start) in t:
                errs[name].append(r.deltas[name].ns - (t[str(end)] - t[str(start)]))
    return {k: np.abs(np.asarray(v, dtype=np.int64)) for k, v in errs.items()}


def check_accuracy(rows, truth) -> None:
    rows = sorted(rows, key=lambda r: r.start_unix_ns or 0)[WARMUP:]
    errs = errors_vs_truth(rows, truth)
    report = {k: (len(v), np.percentile(v, 50) / 1e6 if len(v) else None, np.percentile(v, 99) / 1e6 if len(v) else None) for k, v in errs.items()}
    for name, v in errs.items():
        assert len(v) >= 0.95 * (REQUESTS - WARMUP), (name, report)
        assert np.percentile(v, 50) <= 300_000, (name, report)
        assert np.percentile(v, 99) <= 1_000_000, (name, report)
    # attribution: the injected delays land in their own deltas
    gi = np.median([r.deltas["gateway_inbound"].ns for r in rows if "gateway_inbound" in r.deltas])
    fi = np.median([r.deltas["firewall_inbound"].ns for r in rows if "firewall_inbound" in r.deltas])
    assert 1.7e6 <= gi <= 3.5e6 and 2.5e6 <= fi <= 5.0e6, (gi, fi)
    assert point("engine", Role.FIRST_TOKEN) in rows[0].points


async def test_deltas_match_component_truth_at_50_rps(tmp_path):
    result, rows, stats, truth = await run_once(True, tmp_path)
    ok = [r for r in rows if r.outcome == "ok"]
    assert len(ok) == REQUESTS, stats
    assert {r.join_method for r in rows} == {JoinMethod.TRACE_ID}, stats
    assert stats["traces_evicted"] == 0 and stats["late_spans"] == 0
    check_accuracy(ok, truth)


async def test_stripped_trace_headers_still_join_every_request(tmp_path):
    result, rows, stats, truth = await run_once(False, tmp_path)
    assert len(rows) == REQUESTS, stats
    assert all(r.join_method == JoinMethod.FINGERPRINT for r in rows), stats["joined"]
    assert stats["ambiguous"] == 0
    assert all(len(r.trace_ids) == 2 and r.outcome == "ok" for r in rows)
    check_accuracy(rows, truth)
