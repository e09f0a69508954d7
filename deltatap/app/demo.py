"""``deltatap demo``: the whole of deltatap on the embedded reference stack, on loopback, in one command.

It starts, in this process and on ephemeral 127.0.0.1 ports: the collector (OTLP/HTTP), the
reference engine, firewall and gateway, and a tap on every link (edge, gw-fw, fw-engine); then it
runs the load generator through the edge tap, phase by phase (a labelled firewall mix with some
blocked requests, then a few long generations that outlast the gateway's timeout: a timeout
cascade); waits for the collector to join every trace; prints the decomposition table, the
guardrail overhead and the timeout-cascade summary; and writes the full report (Markdown, CSV,
JSON and a self-contained HTML page with plots) plus the rows and the load generator's records
into the output directory. The stack, the timeouts and the load are in the packaged ``configs/demo.yaml`` (``--config demo``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field
from rich.console import Console

from deltatap.core.config import ConfigError, StrictModel, check_output_dir, find_config, load_yaml, validate
from deltatap.core.topology import Topology

DEFAULT_CONFIG = "demo"  # the packaged configs/demo.yaml, also what `deltatap stack all --config demo` runs
DEFAULT_OUT = "deltatap-demo"
SHOWN_SECTIONS = ["taps_vs_components", "headline", "decomposition", "guardrails", "timeouts", "cascades"]


def _stack_models() -> tuple[type, type, type]:
    from deltatap.stack.config import EngineConfig, FirewallConfig, GatewayConfig

    return GatewayConfig, FirewallConfig, EngineConfig


class DemoConfig(StrictModel):
    """``configs/demo.yaml``: topology (with declared timeouts), component configs, load phases."""

    topology: Topology
    gateway: dict[str, Any] = Field(default_factory=dict)
    firewall: dict[str, Any] = Field(default_factory=dict)
    engine: dict[str, Any] = Field(default_factory=dict)
    load: dict[str, dict[str, Any]] = Field(min_length=1, description="phase name -> LoadOptions fields (target, model, out are filled in)")


@dataclass
class DemoResult:
    out_dir: Path
    files: dict[str, Path]
    rows: list
    records: list[dict[str, Any]]
    report: Any
    elapsed_s: float
    addresses: dict[str, str] = field(default_factory=dict)


def load_demo_config(path: str | Path | None) -> tuple[DemoConfig, Any, Any, Any, dict[str, Any]]:
    """The demo config validated strictly: the component sections against the stack's models."""
    src = find_config(path or DEFAULT_CONFIG)
    cfg = load_yaml(src, DemoConfig)
    gw_m, fw_m, en_m = _stack_models()
    gateway = validate(gw_m, cfg.gateway, f"{src} [gateway]")
    firewall = validate(fw_m, cfg.firewall, f"{src} [firewall]")
    engine = validate(en_m, cfg.engine, f"{src} [engine]")
    raw = yaml.safe_load(src.read_text(encoding="utf-8"))
    return cfg, gateway, firewall, engine, raw


def _load_options(name: str, phase: dict[str, Any], target: str, model: str, out: Path, client_timeout_s: float | None, src: str):
    from deltatap.loadgen.options import LoadOptions

    data = {"progress": False, "gpu": False, **phase, "target": target, "model": model, "out": str(out / f"load-{name}")}
    if client_timeout_s is not None:
        data.setdefault("request_timeout_s", client_timeout_s)
    return validate(LoadOptions, data, f"{src} [load.{name}]")



@dataclass
class ReferenceStack:
    """What :func:`launch_reference_stack` started: the edge URL to send load to, the collector, one
    telemetry per observer, the running components (``components["engine"]``...) and their addresses."""

    edge_url: str
    engine_url: str
    collector: Any
    tels: dict[str, Any]
    components: dict[str, Any]
    addresses: dict[str, str]
    grace_s: float
    collector_files: dict[str, Path] = field(default_factory=dict)

    async def settle(self, expected_rows: int, wait_rows_s: float, engine_idle_s: float = 5.0) -> list:
        """Let the engine finish what it still generates (up to ``engine_idle_s``), flush every exporter,
        and wait until the collector has a row for ``expected_rows`` requests (in all); returns its rows."""
        await _wait_engine_idle(self.engine_url, engine_idle_s)
        # flush from worker threads: the exporters post to the collector, which runs on this loop
        await asyncio.gather(*(asyncio.to_thread(t.processor.force_flush, 5_000) for t in self.tels.values()))
        return await _wait_rows(self.collector, expected_rows, wait_rows_s, self.grace_s)


@contextlib.asynccontextmanager
async def launch_reference_stack(topo: Topology, gw_cfg: Any, fw_cfg: Any, en_cfg: Any, out: Path, grace_s: float, src: str = "",
                                 observe: Callable[[str, Any], None] | None = None,
                                 console: Console | None = None) -> AsyncIterator[ReferenceStack]:
    """Start, in this process on ephemeral 127.0.0.1 ports, the collector (OTLP/HTTP, rows under ``out``),
    the reference engine, firewall and gateway of ``topo`` and a tap on every link; close them all on exit
    (the collector last: ``stack.collector_files`` then holds what it wrote). ``observe(name, telemetry)``
    is called for each observer's telemetry before anything starts."""
    from deltatap.collector.pipeline import PipelineOptions
    from deltatap.collector.service import CollectorOptions, start_collector
    from deltatap.proxy import TapOptions, start_tap
    from deltatap.proxy.options import require_http_tap
    from deltatap.stack.engine.app import start_engine
    from deltatap.stack.firewall.app import start_firewall
    from deltatap.stack.gateway.app import start_gateway
    from deltatap.telemetry.tracer import setup_telemetry

    for link in topo.links:  # (before anything starts)
        require_http_tap(topo, link.name, "the reference stack")
    collector = await start_collector(CollectorOptions(otlp_grpc=None, otlp_http="127.0.0.1:0", topology=topo, out_dir=out, rows_format="parquet",
                                                       pipeline=PipelineOptions(grace_s=grace_s)))
    otlp = collector.otlp_http_url
    tels = {n: setup_telemetry(f"deltatap-{n}", otlp=otlp) for n in ("client", "taps", "gateway", "firewall", "engine")}
    for n, t in tels.items():
        if observe is not None:
            observe(n, t)
    started: list[Any] = []
    components: dict[str, Any] = {}
    addresses: dict[str, str] = {"collector (OTLP/HTTP, /metrics, /v1/clock)": str(otlp)}
    stack: ReferenceStack | None = None
    try:
        engine = await start_engine(en_cfg, tels["engine"], listen="127.0.0.1:0")
        started.append(engine)
        components["engine"] = engine
        upstream = engine.url
        edge_url = engine.url
        names = [c.name for c in topo.components]
        for link in reversed(topo.links):
            tap = await start_tap(TapOptions(link=link.name, upstream=upstream, listen_port=0, admin_port=0, downstream=link.downstream,
                                             upstream_name=link.upstream, downstream_kind=str(topo.component(link.downstream).kind),
                                             upstream_kind=str(topo.component(link.upstream).kind), correlation_header=topo.correlation_header), tels["taps"])
            started.append(tap)
            addresses[f"tap {link.name} ({link.downstream} -> {link.upstream})"] = f"{tap.url}  admin {tap.admin_url}"
            comp = topo.component(link.downstream)
            if comp.kind == "firewall":
                fw_cfg.upstream = tap.url
                fw = await start_firewall(fw_cfg, tels["firewall"], listen="127.0.0.1:0")
                started.append(fw)
                components["firewall"] = fw
                upstream = fw.url
                addresses["firewall"] = fw.url
            elif comp.kind == "gateway":
                gw_cfg.routes[0].upstreams = [tap.url]
                gw = await start_gateway(gw_cfg, tels["gateway"], listen="127.0.0.1:0")
                started.append(gw)
                components["gateway"] = gw
                upstream = gw.url
                addresses["gateway"] = gw.url
            elif comp.kind != "client":
                raise ConfigError(f"{src}: the reference stack runs gateway, firewall and engine only; topology has {comp.kind} {comp.name!r} ({names})")
            else:
                edge_url = tap.url
        addresses["engine"] = engine.url
        stack = ReferenceStack(edge_url, engine.url, collector, tels, components, addresses, grace_s)
        yield stack
    finally:
        for comp in reversed(started):
            try:
                await comp.close()
            except Exception as exc:  # keep closing the others
                (console or Console(stderr=True)).print(f"[yellow]closing {comp}: {exc}[/]")
        await asyncio.gather(*(asyncio.to_thread(t.shutdown) for t in tels.values()))
        files = await collector.close()
        if stack is not None:
            stack.collector_files = files


async def run_demo(out_dir: str | Path = DEFAULT_OUT, config: str | Path | None = None, console: Console | None = None,
                   formats: list[str] | None = None, wait_rows_s: float = 20.0,
                   observe: Callable[[str, Any], None] | None = None) -> DemoResult:
    """Run the demo; ``observe(name, telemetry)`` is called for each observer's telemetry (client, taps,
    gateway, firewall, engine) before anything starts, e.g. to add a span processor of one's own."""
    from deltatap.collector.reports.cli import summary_report
    from deltatap.app.views import SpanCapture, taps_vs_components
    from deltatap.collector.reports.model import Section
    from deltatap.collector.reports.metadata import config_hash, run_metadata
    from deltatap.collector.reports.render_terminal import print_report
    from deltatap.collector.reports.renderers import write_report
    from deltatap.collector.reports.runs import RunData
    from deltatap.loadgen.run import run_load

    t_start = time.monotonic()
    capture = SpanCapture()  # every observer's spans, for the taps-vs-components table
    observe = capture.observer(observe)
    console = console or Console()
    src = str(find_config(config or DEFAULT_CONFIG))
    cfg, gw_cfg, fw_cfg, en_cfg, raw = load_demo_config(config)
    topo = cfg.topology
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model = en_cfg.models[0]
    # the trace of a cascading request closes a grace period after the client's span ends, and the
    # engine's span ends later than that (it keeps generating): give it the engine's declared timeout
    grace = max(2.5, (topo.engine.timeout_s or 0) - (topo.client.timeout_s or 0) + 1.0)
    async with launch_reference_stack(topo, gw_cfg, fw_cfg, en_cfg, out, grace, src, observe, console) as stack:
        names = [c.name for c in topo.components]
        console.print(f"[bold]deltatap demo[/] - reference stack on loopback ({' -> '.join(names)}), taps on every link", highlight=False)
        for k, v in stack.addresses.items():
            console.print(f"  {k}: {v}", highlight=False)

        records: list[dict[str, Any]] = []
        phases: dict[str, Any] = {}
        for name, phase in cfg.load.items():
            opts = _load_options(name, phase, stack.edge_url, model, out, topo.client.timeout_s, src)
            console.print(f"load phase [bold]{name}[/]: {opts.requests or '-'} requests, {opts.mode} loop, workload {_workload_name(opts.workload)}", highlight=False)
            result = await run_load(opts, stack.tels["client"])
            records += result.records
            phases[name] = {"summary_requests": len(result.records), "options": opts.model_dump(mode="json", exclude={"target", "out"})}
        # let the engine finish what it still generates for nobody before the spans are flushed
        await stack.settle(len(records), wait_rows_s, (topo.engine.timeout_s or 5.0) + 1.0)
    collector, collector_files, addresses = stack.collector, stack.collector_files, stack.addresses
    rows = collector.rows()

    (out / "records.jsonl").write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records), encoding="utf-8")
    (out / "topology.yaml").write_text(yaml.safe_dump(topo.model_dump(mode="json"), sort_keys=False), encoding="utf-8")
    meta = run_metadata(
        seed=next(iter(cfg.load.values())).get("seed"),
        workload={name: p["options"]["workload"] for name, p in phases.items()},
        config=raw,
        boundary="compound: client -> gateway -> firewall -> engine (reference stack, loopback)",
        extra={"model": model, "software": "deltatap reference stack (stack/)", "load_model": "; ".join(f"{n}: {_load_model(p['options'])}" for n, p in phases.items()),
               "config_file": src, "phases": phases, "guardrails": _guardrail_disclosure(fw_cfg)},
    )
    meta["config_hash"] = config_hash(raw)
    (out / "run.json").write_text(json.dumps(meta, indent=2, default=str), encoding="utf-8")
    run = RunData("demo", out, rows, records, meta, topo)
    report = summary_report(run, topo, title="deltatap demo report")
    at = next((i + 1 for i, sec in enumerate(report.sections) if sec.name == "headline"), 0)  # right after the headline
    report.sections.insert(at, Section("taps_vs_components", "What the taps measured vs what the components say",
                                      tables=[taps_vs_components(capture.records(), topo)],
                                      notes=["The decomposition below prefers the components' own points (they outrank the taps); "
                                             "this table is the taps alone next to the components alone, per delta."]))
    files = {k: v for k, v in collector_files.items()}
    files.update({f"report.{k}": v for k, v in write_report(report, out, formats).items()})
    files["records"] = out / "records.jsonl"
    files["run metadata"] = out / "run.json"
    print_report(report, console, sections=SHOWN_SECTIONS)
    elapsed = time.monotonic() - t_start
    _where(console, out, files, len(rows), len(records), elapsed)
    return DemoResult(out, files, rows, records, report, elapsed, addresses)


async def _wait_engine_idle(engine_url: str, timeout_s: float) -> None:
    """Poll the engine's Prometheus /metrics until no sequence is running or waiting."""
    import aiohttp

    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as s:
        while time.monotonic() < deadline:
            async with s.get(f"{engine_url}/metrics") as r:
                text = await r.text()
            busy = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                       if line.startswith(("deltatap_stack_engine_running", "deltatap_stack_engine_waiting")))
            if busy == 0:
                return
            await asyncio.sleep(0.05)


async def _wait_rows(collector, expected: int, timeout_s: float, grace_s: float) -> list:
    """Wait until the collector has emitted a row per request (each trace closes ``grace_s`` after
    its client span ends), then drain whatever is still open."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and len(collector.rows()) < expected:
        await asyncio.sleep(0.1)
    return await collector.drain()


def _workload_name(w: Any) -> str:
    return w.get("workload", "custom") if isinstance(w, dict) else str(w)


def _load_model(o: dict[str, Any]) -> str:
    if o.get("rate"):
        return f"open-loop {o.get('arrival', 'poisson')} {o['rate']} req/s"
    if o.get("batch"):
        return f"barrier batches of {o['batch']}"
    return f"closed-loop concurrency {o.get('concurrency') or 1}"


def _guardrail_disclosure(fw: Any) -> str:
    return (f"reference firewall: inbound filtering {'on' if fw.inbound.enabled else 'off'} ({len(fw.inbound.rules)} rules), "
            f"outbound filtering {'on' if fw.outbound.enabled else 'off'} ({fw.outbound.mode})")


def _where(console: Console, out: Path, files: dict[str, Path], rows: int, requests: int, elapsed: float) -> None:
    console.rule("[bold]Where everything is")
    console.print(f"{requests} requests, {rows} decomposition rows, {elapsed:.1f} s. Output directory: {out.resolve()}", highlight=False)
    show = [("HTML report (open in a browser)", files.get("report.html")), ("Markdown report", files.get("report.markdown")),
            ("JSON report", files.get("report.json")), ("CSV tables", files.get("report.csv")), ("decomposition rows", files.get("rows")),
            ("load generator records", files.get("records")), ("run metadata", files.get("run metadata")),
            ("collector summary", files.get("summary.md")), ("mergeable sketches", files.get("sketches.json"))]
    for label, p in show:
        if p is not None:
            console.print(f"  {label}: {p}", highlight=False)
    console.print(f"Re-render later: deltatap summary {out}   |   deltatap cascade --rows {out}   |   deltatap guardrails --runs demo={out}", highlight=False)


def cmd_demo(args: argparse.Namespace) -> int:
    from deltatap.collector.reports.renderers import parse_formats
    from deltatap.net.aio import run

    formats = parse_formats(args.formats)
    check_output_dir(args.out, "--out")  # (refused before the stack starts, not after the run)
    result = run(run_demo(args.out, args.config, formats=formats))
    return 0 if result.rows else 1


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "demo",
        help="run the reference stack with taps, the collector and the load generator on loopback, and report",
        description="Start the reference gateway, firewall and engine with a tap on every link, the collector and the load "
        "generator on 127.0.0.1; run a short mixed workload (blocked requests, a timeout cascade); print the decomposition, "
        "guardrail overhead and cascade summary; write the HTML report and the other formats.",
    )
    p.add_argument("--out", default=DEFAULT_OUT, metavar="DIR", help=f"output directory (default: ./{DEFAULT_OUT})")
    p.add_argument("--config", metavar="FILE", help="demo config, a file or a packaged name (default: demo, the packaged configs/demo.yaml)")
    p.add_argument("--formats", default="all", help="report formats: markdown,csv,json,html or all (default: all)")
    p.set_defaults(func=cmd_demo)
