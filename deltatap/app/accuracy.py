"""End-to-end accuracy harness: loadgen -> tap -> gateway -> tap -> firewall -> tap -> engine on loopback.

Shared by ``deltatap selftest`` (deltatap/app/selftest.py), ``tests/integration/test_accuracy.py`` (robust
checks: joins, coverage, attribution), ``tests/compare`` (two runs with different injected delays) and
``benchmarks/accuracy.py`` (the precise |error| figures): :func:`summarize` is the one computation of the
figures both the benchmark and the self-test print. Every reference component and every tap runs
in its own process, as deployed; the taps and the load generator export to a real collector over
OTLP/gRPC; the components' own spans (their *true* points, stamped at the socket) go over OTLP/gRPC to
a separate sink in this process that keeps the requests as received (the collector never sees them;
writing them as OTLP JSON files cost the components CPU beside the very stamps being checked).
``errors_vs_truth`` compares each component delta the collector reports with the same delta computed
from the components' true points.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from deltatap.collector import CollectorOptions, PipelineOptions, start_collector
from deltatap.collector.receivers import start_grpc
from deltatap.collector.deltas import registry
from deltatap.collector.spans import decode_request
from deltatap.telemetry.tracer import setup_telemetry
from deltatap.core.vocab import Attr, Role
from deltatap.loadgen import LoadOptions, run_load

REQUESTS = 270
WARMUP = 20  # the first requests of fresh processes pay imports and first-call costs: not compared
RATE = 50.0
SPANS_PER_REQUEST = 4  # the client span and one per tap
_DELTAS = registry()  # the default stack's (collector/deltas.py)
INJECTED_MS = {_DELTAS.named("inbound", "gateway"): 2.0, _DELTAS.named("inbound", "firewall"): 3.0}  # fixed parts of the delays in stack_yaml
# the components' TTFT terms, checked against their own true points: name -> (component, end role, start role)
COMPONENT_DELTAS = {d.name: (d.component, Role(d.end.partition(".")[2]), Role(d.start.partition(".")[2]))
                    for d in _DELTAS if d.ttft_term and d.end and d.component}


@dataclass
class RunResult:
    load: object  # loadgen's result
    rows: list  # the collector's decomposition rows
    stats: dict  # the collector's counters after draining
    truth: dict[str, dict[str, dict[str, int]]]  # truth_index of the components' own spans


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stack_yaml(propagate: bool, injected: dict[str, float] | None = None, jitter: dict[str, float] | None = None) -> str:
    """The reference stack's config; ``injected`` / ``jitter`` override the fixed / random parts (ms) of the
    gateway's and firewall's inbound delays (keys of :data:`INJECTED_MS`)."""
    inj = {**INJECTED_MS, **(injected or {})}
    jit = {"gateway_inbound": 0.3, "firewall_inbound": 0.5, **(jitter or {})}
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
  delays: {{inbound: {{fixed_ms: {inj['firewall_inbound']}, jitter_ms: {jit['firewall_inbound']}}}, outbound_first: {{fixed_ms: 1.5}}}}
  upstream_policy: {{propagate_trace: {str(propagate).lower()}}}
gateway:
  name: gateway
  seed: 1
  delays: {{inbound: {{fixed_ms: {inj['gateway_inbound']}, jitter_ms: {jit['gateway_inbound']}}}, outbound_first: {{fixed_ms: 1.0}}}}
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


class TruthSink:
    """An OTLP/gRPC endpoint that keeps the components' export requests as received."""

    def __init__(self) -> None:
        self.requests: list[bytes] = []
        self.errors = 0
        self._server = None
        self.endpoint = ""

    async def start(self) -> None:
        def on_error(_transport: str) -> None:
            self.errors += 1

        self._server, port = await start_grpc(("127.0.0.1", 0), lambda spans, raw: self.requests.append(raw), on_error)
        self.endpoint = f"grpc://127.0.0.1:{port}"

    async def close(self) -> None:
        if self._server is not None:
            await self._server.stop(grace=0.5)
            self._server = None

    def spans(self) -> list:
        if self.errors:
            raise RuntimeError(f"{self.errors} invalid export requests reached the truth sink")
        return [s for raw in self.requests for s in decode_request(ExportTraceServiceRequest.FromString(raw))]


def _commands(cfg: Path, workdir: Path, ports: dict[str, int], otlp: str, truth_otlp: str) -> list[list[str]]:
    url = lambda k: f"http://127.0.0.1:{ports[k]}"  # noqa: E731
    exe = [sys.executable, "-m", "deltatap.app.cli"]
    tap = lambda link, up: [*exe, "tap", "--link", link, "--listen", f"127.0.0.1:{ports[link]}", "--upstream", url(up), "--no-admin", "--grace-s", "0", "--otlp", otlp]  # noqa: E731
    comp = lambda c: [*exe, "stack", c, "--config", str(cfg), "--listen", f"127.0.0.1:{ports[c]}", "--otlp", truth_otlp]  # noqa: E731
    return [
        comp("engine"),
        tap("fw-engine", "engine"),
        [*comp("firewall"), "--upstream", url("fw-engine")],
        tap("gw-fw", "firewall"),
        [*comp("gateway"), "--upstream", url("gw-fw")],
        tap("edge", "gateway"),
    ]


async def run_once(propagate: bool, workdir: Path, requests: int = REQUESTS, rate: float = RATE,
                   injected: dict[str, float] | None = None, jitter: dict[str, float] | None = None) -> RunResult:
    """Each component and each tap in its own process (as deployed); the collector and the load
    generator in this one. Components export their truth to a sink the collector never reads."""
    workdir.mkdir(parents=True, exist_ok=True)
    cfg = workdir / "stack.yaml"
    cfg.write_text(stack_yaml(propagate, injected, jitter))
    # traces stay open 5 s after their last span (every span is in before the drain below closes them all): a busy
    # machine can hold a tap's export past a short grace, and a span that came late would be counted, not joined
    collector = await start_collector(CollectorOptions(otlp_grpc="127.0.0.1:0", otlp_http=None, pipeline=PipelineOptions(grace_s=5.0, join_hold_s=5.0)))
    sink = TruthSink()
    await sink.start()
    ports = {k: free_port() for k in ("engine", "fw-engine", "firewall", "gw-fw", "gateway", "edge")}
    procs = []
    logs = []
    load_tel = None
    try:
        for i, c in enumerate(_commands(cfg, workdir, ports, collector.otlp_grpc_endpoint, sink.endpoint)):
            logs.append(open(workdir / f"proc{i}.log", "w"))
            procs.append(await asyncio.create_subprocess_exec(*c, stdout=asyncio.subprocess.DEVNULL, stderr=logs[-1]))
        load_tel = setup_telemetry("deltatap-loadgen", otlp=collector.otlp_grpc_endpoint)
        for k in ports:
            await _wait_port(ports[k], procs)
        opts = LoadOptions(target=f"http://127.0.0.1:{ports['edge']}", model="deltatap-ref", rate=rate, requests=requests, seed=11, progress=False, gpu=False, write_requests=False,
                           workload={"workload": "synthetic-uniform", "params": {"input": {"dist": "uniform", "min": 16, "max": 64}, "output": {"dist": "uniform", "min": 4, "max": 8}}})
        result = await run_load(opts, load_tel)
    except BaseException:
        await collector.close()
        await sink.close()
        raise
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
        for f in logs:
            f.close()
        if load_tel is not None:
            await asyncio.to_thread(load_tel.shutdown)
    deadline = time.monotonic() + 30  # wait for every span to arrive, bounded
    while collector.stats()["spans_received"] < SPANS_PER_REQUEST * requests and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    await collector.drain()
    rows = collector.rows()
    stats = collector.stats()
    await collector.close()
    await sink.close()  # the components flushed their spans when they exited
    truth = sink.spans()
    return RunResult(result, rows, stats, truth_index(truth))


def after_warmup(rows, warmup: int = WARMUP) -> list:
    """Rows in start order without the first ``warmup`` (fresh processes' first-call costs)."""
    return sorted(rows, key=lambda r: r.start_unix_ns or 0)[warmup:]


def errors_vs_truth(rows, truth) -> dict[str, np.ndarray]:
    """Per component delta, |reported - true| in ns for every row where both sides have it."""
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


def delta_median_ns(rows, name: str) -> float | None:
    """Median of a reported delta over the rows that have it."""
    v = [r.deltas[name].ns for r in rows if name in r.deltas]
    return float(np.median(v)) if v else None


def true_median_ms(rows, truth, name: str) -> float | None:
    """Median of a component delta computed from the components' own (true) points."""
    comp, end, start = COMPONENT_DELTAS[name]
    v = []
    for r in rows:
        t: dict[str, int] = {}
        for tid in r.trace_ids:
            t.update(truth.get(tid, {}).get(comp, {}))
        if str(end) in t and str(start) in t:
            v.append(t[str(end)] - t[str(start)])
    return float(np.median(v)) / 1e6 if v else None


# Each tap's link, crossed through the tap: (link, direction) -> ((component, role) sending, (component, role) receiving).
# "client" means the load generator's own stamp on the row (the client sends no truth spans).
TAP_TRANSIT = {
    ("edge", "request"): (("client", Role.SEND), ("gateway", Role.IN_ARRIVE)),
    ("gw-fw", "request"): (("gateway", Role.IN_EXIT), ("firewall", Role.IN_ARRIVE)),
    ("fw-engine", "request"): (("firewall", Role.IN_EXIT), ("engine", Role.QUEUE)),
    ("fw-engine", "first_token"): (("engine", Role.FIRST_TOKEN), ("firewall", Role.OUT_FIRST_IN)),
    ("gw-fw", "first_token"): (("firewall", Role.OUT_FIRST_OUT), ("gateway", Role.OUT_FIRST_IN)),
    ("edge", "first_token"): (("gateway", Role.OUT_FIRST_OUT), ("client", Role.FIRST_TOKEN_RECEIVED)),
}


def tap_transit_ns(rows, truth) -> dict[str, np.ndarray]:
    """Per link and direction, the time from the sending side's stamp to the receiving side's, through the tap
    (two loopback hops plus the tap itself): what the tap costs a request at most, from the components' clocks."""
    out: dict[str, list[int]] = {f"{link} {d}": [] for link, d in TAP_TRANSIT}
    for r in rows:
        comps: dict[str, dict[str, int]] = {}
        for tid in r.trace_ids:
            comps.update(truth.get(tid, {}))
        for (link, d), ((c0, r0), (c1, r1)) in TAP_TRANSIT.items():
            t0 = r.points[f"client.{r0}"].unix_ns if c0 == "client" and f"client.{r0}" in r.points else comps.get(c0, {}).get(str(r0))
            t1 = r.points[f"client.{r1}"].unix_ns if c1 == "client" and f"client.{r1}" in r.points else comps.get(c1, {}).get(str(r1))
            if t0 is not None and t1 is not None:
                out[f"{link} {d}"].append(t1 - t0)
    return {k: np.asarray(v, dtype=np.int64) for k, v in out.items()}


def _ms_stats(ns: np.ndarray) -> dict:
    ms = ns / 1e6
    return {"count": int(len(ns)), "p50_ms": float(np.percentile(ms, 50)) if len(ns) else None,
            "p99_ms": float(np.percentile(ms, 99)) if len(ns) else None, "max_ms": float(ms.max()) if len(ns) else None}


def summarize(run_result: RunResult, requests: int, warmup: int = WARMUP) -> dict:
    """The accuracy figures of one run: per component delta |reported - true| p50/p99/max over the ok requests
    after the warm-up, the reported and true medians; the taps' transit; joins and the collector's counters."""
    rows = run_result.rows
    kept = after_warmup([r for r in rows if r.outcome == "ok"], warmup)
    errs = errors_vs_truth(kept, run_result.truth)
    deltas = {}
    for name, v in errs.items():
        deltas[name] = {**_ms_stats(v),
                        "reported_median_ms": (lambda m: m / 1e6 if m is not None else None)(delta_median_ns(kept, name)),
                        "true_median_ms": true_median_ms(kept, run_result.truth, name)}
    taps = {k: _ms_stats(v) for k, v in tap_transit_ns(kept, run_result.truth).items()}
    joins: dict[str, int] = {}
    for r in rows:
        joins[str(r.join_method)] = joins.get(str(r.join_method), 0) + 1
    s = run_result.stats
    return {
        "requests": requests, "rows": len(rows), "ok": sum(r.outcome == "ok" for r in rows), "compared": len(kept),
        "join_methods": joins, "ambiguous": s.get("ambiguous"), "traces_evicted": s.get("traces_evicted"), "late_spans": s.get("late_spans"),
        "deltas": deltas, "tap_transit": taps,
    }
