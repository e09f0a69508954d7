"""What every ``deltatap bench <test>`` shares: its options, the target, load levels with repetitions and
progress lines, the capacity pre-run, the methodology-compliance checks, and writing the results.

A test module defines ``NAME``, ``SECTION`` (the draft's section), ``HELP``, ``add_arguments(p)`` for its own
flags and ``async run(ctx) -> Report``; :mod:`deltatap.app.bench.cli` registers them.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from deltatap.app.bench.measure import LevelMetrics, fmt_ci, level_metrics
from deltatap.app.bench.target import Harness, LevelData
from deltatap.collector.reports.model import Column, Report, Section, Table
from deltatap.core.config import ConfigError
from deltatap.core.provenance import provenance

DEFAULT_INPUT_TOKENS = 128
DEFAULT_OUTPUT_TOKENS = 32


def fixed_workload(input_tokens: int, output_tokens: int, name: str = "synthetic-uniform") -> dict[str, Any]:
    """A fully specified custom workload (§4.3): random tokens, fixed input and output lengths."""
    return {"workload": name, "params": {"input": {"dist": "fixed", "value": int(input_tokens)}, "output": {"dist": "fixed", "value": int(output_tokens)}}}


@dataclass
class Requirement:
    """One statistical or procedural requirement of the draft, checked against what the run did."""

    section: str
    what: str
    required: str
    actual: str
    met: bool


@dataclass
class BenchContext:
    args: argparse.Namespace
    harness: Harness
    console: Console
    out: Path
    slos: dict[str, float]
    reps: int
    quick: bool
    requirements: list[Requirement] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    levels_done: int = 0
    data: dict[str, Any] = field(default_factory=dict)  # machine-readable results the test adds (JSON)

    def say(self, text: str) -> None:
        self.console.print(text, highlight=False)

    def require(self, section: str, what: str, required: str, actual: str, met: bool) -> None:
        self.requirements.append(Requirement(section, what, required, actual, bool(met)))

    def workload(self, input_tokens: int | None = None, output_tokens: int | None = None) -> str | dict[str, Any]:
        if getattr(self.args, "workload", None):
            return self.args.workload
        return fixed_workload(input_tokens or self.args.input_tokens, output_tokens or self.args.output_tokens)

    async def level(self, label: str, x: float, streams: dict[str, dict[str, Any]], offered_rps: float | None = None,
                    reps: int | None = None, tag: str = "") -> tuple[LevelMetrics, list[LevelData]]:
        """Run one load level ``reps`` times (default ``--repetitions``), print a progress line, measure."""
        n = reps or self.reps
        runs: list[LevelData] = []
        self.levels_done += 1
        name = f"{self.levels_done:02d}-{_slug(tag or label)}"
        for i in range(n):
            t0 = time.monotonic()
            seeded = {k: {**v, "seed": int(v.get("seed", self.args.seed)) + 1000 * i} for k, v in streams.items()}
            runs.append(await self.harness.run_level(seeded, f"{name}/rep{i + 1}"))
            if n > 1:
                self.say(f"  [{name}] {label}: repetition {i + 1}/{n} done ({len(runs[-1].records)} requests, {time.monotonic() - t0:.1f} s)")
        m = level_metrics(label, x, runs, self.slos, offered_rps, self.harness.topology)
        self.say(f"  [{name}] {label}: {m.sent} requests, success {m.success_rate:.1%}, {m.output_tok_s:.0f} tok/s, "
                 f"TTFT P50 {m.ttft.p50:.1f} / P99 {m.ttft.p99:.1f} ms, TPOT P50 {m.tpot.p50:.2f} ms, goodput {m.goodput_rps:.2f} req/s, queue {m.queue}")
        return m, runs

    def open_loop(self, rate: float, duration_s: float, workload: Any = None, **extra: Any) -> dict[str, Any]:
        return {"rate": rate, "requests": max(self.args.min_requests, math.ceil(rate * duration_s)), "workload": workload or self.workload(),
                "arrival": "poisson", "seed": self.args.seed, **extra}

    def closed_loop(self, concurrency: int, requests: int, workload: Any = None, **extra: Any) -> dict[str, Any]:
        return {"concurrency": concurrency, "requests": max(requests, concurrency), "workload": workload or self.workload(), "seed": self.args.seed, **extra}

    async def capacity_rps(self, mix: dict[str, tuple[float, Any]] | None = None) -> float:
        """§5.3.3 step 1: the capacity estimate (req/s) - ``--capacity-rps``, else a closed-loop pre-run at a
        concurrency well past the engine's batch (what it completes per second when never idle). ``mix``: name ->
        (share, workload) streams run side by side instead of the test's workload (the fairness classes)."""
        if self.args.capacity_rps:
            self.notes.append(f"Capacity estimate: {self.args.capacity_rps:g} req/s (given with --capacity-rps).")
            return float(self.args.capacity_rps)
        model = self.harness.engine_model()
        conc = 2 * model.max_batch if model is not None else self.args.probe_concurrency
        requests = conc * (3 if self.quick else 6)
        self.say(f"capacity pre-run: closed loop at concurrency {conc}, {requests} requests")
        if mix:
            streams = {n: self.closed_loop(max(1, round(conc * share)), max(1, round(requests * share)), workload=wl) for n, (share, wl) in mix.items()}
        else:
            streams = {"probe": self.closed_loop(conc, requests)}
        m, _ = await self.level(f"capacity pre-run (concurrency {conc})", conc, streams, reps=1, tag="capacity-probe")
        if not (m.request_rps > 0):
            raise ConfigError(f"the capacity pre-run completed no request ({m.sent} sent, error rate {m.error_rate:.0%}); check the target")
        self.notes.append(f"Capacity estimate: {m.request_rps:.2f} req/s ({m.output_tok_s:.0f} tok/s), measured by a closed-loop pre-run at "
                          f"concurrency {conc} (§5.3.3 step 1); load levels are fractions of it.")
        self.data["capacity_estimate_rps"] = m.request_rps
        return m.request_rps


def _slug(s: str) -> str:
    return "".join(c if c.isalnum() or c in ".-" else "-" for c in s).strip("-")[:40] or "level"


# ------------------------------------------------------------------------------------------ tables


def levels_table(levels: list[LevelMetrics], name: str = "levels", title: str = "", x_title: str = "Offered (r/s)") -> Table:
    """The §5.3.5 table (offered, achieved, TTFT, TPOT, success) plus E2E, goodput, error rate and the queue."""
    t = Table(name, title or "Throughput-latency per load level (methodology §5.3.5, table 5)", [
        Column("offered", x_title, "", 2), Column("achieved_tok_s", "Achieved", "tok/s", 0), Column("request_rps", "Requests", "req/s", 2),
        Column("ttft_p50_ms", "TTFT P50", "ms", 1), Column("ttft_p99_ms", "TTFT P99", "ms", 1),
        Column("tpot_p50_ms", "TPOT P50", "ms", 2), Column("tpot_p99_ms", "TPOT P99", "ms", 2),
        Column("e2e_p50_ms", "E2E P50", "ms", 0), Column("e2e_p99_ms", "E2E P99", "ms", 0),
        Column("success", "Success", "%", 1), Column("error_rate", "Error rate", "", 3), Column("goodput_rps", "Goodput", "req/s", 2),
        Column("queue", "Queue"), Column("requests", "Samples", "", 0),
    ])
    for m in levels:
        t.add(m.x, m.output_tok_s, m.request_rps, m.ttft.p50, m.ttft.p99, m.tpot.p50, m.tpot.p99, m.e2e.p50, m.e2e.p99,
              m.success_rate, m.error_rate, m.goodput_rps, m.queue, m.sent)
    return t


def ci_table(levels: list[LevelMetrics], x_title: str = "Load") -> Table | None:
    if not any(m.reps > 1 for m in levels):
        return None
    t = Table("confidence", "95 % confidence intervals over the repetitions (Student t, methodology §6.3)", [
        Column("load", x_title), Column("reps", "Repetitions", "", 0), Column("output_tok_s", "Throughput CI (tok/s)"),
        Column("ttft_p50", "TTFT P50 CI (ms)"), Column("ttft_p99", "TTFT P99 CI (ms)")])
    for m in levels:
        t.add(m.label, m.reps, fmt_ci(m.ci.get("output_tok_s"), 0), fmt_ci(m.ci.get("ttft_p50_ms")), fmt_ci(m.ci.get("ttft_p99_ms")))
    return t


def decomposition_by_level(levels: list[LevelMetrics], stat: str = "p50") -> Table | None:
    """The profiles draft's decomposition (each component's TTFT contribution) at every level, side by side."""
    comps: list[str] = []
    for m in levels:
        comps += [c for c in m.deltas if c not in comps]
    if not comps:
        return None
    cols = [Column("component", "Component"), Column("delta", "Delta")] + [Column(f"l{i}", m.label, "ms", 2) for i, m in enumerate(levels)]
    t = Table(f"decomposition_{stat}", f"Per-component TTFT contribution by load level ({stat.upper()}, ms; profiles draft §6 decomposition)", cols)
    for c in comps:
        delta = next((m.deltas[c]["delta"] for m in levels if c in m.deltas), "")
        t.add(c, delta, *[(m.deltas.get(c) or {}).get(stat) for m in levels])
    t.footnotes.append("Each cell is the collector's decomposition at that level (the deltas between the taps' points on every link); "
                       "the residual is network time plus interaction effects.")
    return t


def knee_attribution(levels: list[LevelMetrics], knee: int | None, stat: str = "p99", what: str = "Knee") -> str:
    """Which component's delta grows first on the way to the knee, and by how much (one sentence).

    A component's growth counts when it is at least 1 ms, half its value at the lowest level and a fifth of the
    largest component's growth at the knee (a few ms of noise beside hundreds is not where the knee comes from), and
    holds from some level up to the knee; among those, the one that grew first (ties: the largest growth) is named,
    with its growth at the knee."""
    if knee is None:
        return f"No {what.lower()} in the measured range: no component's delta is attributed."
    if knee <= 0:
        return f"{what} at the lowest level measured: no lower level to compare components against."
    if not levels[0].deltas:
        return (f"{what} at {levels[knee].label}; no per-component deltas to attribute it (no taps reported to this bench's collector: "
                "use the embedded stack, or --collect with taps on the links).")
    base = levels[0]
    growth: dict[str, float] = {}
    for comp, d0 in base.deltas.items():
        kv = (levels[knee].deltas.get(comp) or {}).get(stat)
        if d0.get(stat) is not None and kv is not None and not comp.startswith("Residual"):
            growth[comp] = kv - d0[stat]
    if not growth:
        return "The decomposition has no component deltas at the knee."
    top = max(growth.values())
    first: dict[str, int] = {}
    for comp in growth:
        b = base.deltas[comp][stat]
        need = max(1.0, 0.5 * abs(b), 0.2 * top)
        grown = [((levels[i].deltas.get(comp) or {}).get(stat) or b) - b >= need for i in range(knee + 1)]
        # the first level from which it stays grown up to the knee: one noisy level is not growth
        start = next((i for i in range(1, knee + 1) if all(grown[i:])), None)
        if start is not None:
            first[comp] = start
    if first:
        earliest = min(first.values())
        comp = max((c for c, i in first.items() if i == earliest), key=lambda c: growth[c])
    else:
        comp, earliest = max(growth, key=lambda c: growth[c]), knee
    b, k = base.deltas[comp][stat], levels[knee].deltas[comp][stat]
    others = sorted(((c, g) for c, g in growth.items() if c != comp), key=lambda cg: -cg[1])[:2]
    rest = "; ".join(f"{c} {g:+.1f} ms" for c, g in others)
    ratio = f", x{k / b:.1f}" if b and b > 0 else ""
    return (f"{what} at {levels[knee].label}: the {comp} delta ({base.deltas[comp]['delta'] or comp}) grows first - "
            f"{stat.upper()} from {b:.1f} ms at {base.label} to {k:.1f} ms there ({k - b:+.1f} ms{ratio}), "
            f"first grown at {levels[earliest].label}" + (f"; the others there: {rest}." if rest else "."))


def compliance_section(ctx: BenchContext) -> Section:
    t = Table("compliance", "Methodology compliance: what the draft requires, what this run did", [
        Column("section", "Section"), Column("requirement", "Requirement"), Column("required", "Required"), Column("actual", "This run"), Column("met", "Met")])
    for r in ctx.requirements:
        t.add(r.section, r.what, r.required, r.actual, "yes" if r.met else "NO")
    unmet = [r for r in ctx.requirements if not r.met]
    notes = [f"{len(ctx.requirements) - len(unmet)} of {len(ctx.requirements)} requirements met."]
    if unmet:
        notes.append("Deviations (this run is not a conforming measurement for them): " + "; ".join(f"{r.what} ({r.actual}, required {r.required})" for r in unmet) + ".")
    if ctx.quick:
        notes.append("--quick: CI-sized run; the figures show the shape, not conforming values.")
    return Section("compliance", "Methodology compliance", tables=[t], notes=notes)


def summary_notes(levels: list[LevelMetrics], slos: dict[str, float]) -> list[str]:
    slo = ", ".join(f"{k} <= {v:g} ms" for k, v in slos.items()) or "none given: every successful request counts"
    total = sum(m.sent for m in levels)
    ok = sum(m.ok for m in levels)
    return [f"Goodput (AIPerf): requests meeting every SLO ({slo}) per second of the benchmark. "
            f"Error rate: failed / sent = {(total - ok) / total if total else float('nan'):.4f} over all levels ({total - ok} of {total})."]


# ---------------------------------------------------------------------------------------- output


def config_section(ctx: BenchContext, test: str, section: str, extra: dict[str, Any]) -> Section:
    """§5.1.5.1 configuration summary."""
    h = ctx.harness
    t = Table("configuration", "Configuration summary (methodology §5.1.5.1)", [Column("item", "Item"), Column("value", "Value")])
    boundary = ("compound: client -> gateway -> firewall -> engine (deltatap reference stack, loopback, a tap on every link)" if h.embedded
                else f"external target {h.target}" + (" (taps report to this bench's collector)" if h.collect else " (client view only)"))
    items = {"Test": f"{test} (methodology §{section})", "SUT boundary": boundary, "Model": h.model or "(first listed by the target)",
             "Stack config": getattr(h, "stack_src", "") or "-", "Repetitions per level": ctx.reps, "Seed": ctx.args.seed,
             "Warm-up": f"{ctx.args.warmup} requests before the first level (§4.5)" if ctx.args.warmup else "none (cold start, §4.5.3)",
             "SLOs (goodput)": ", ".join(f"{k} <= {v:g} ms" for k, v in ctx.slos.items()) or "none", **extra}
    if h.embedded:
        m = h.engine_model()
        items["Engine knobs"] = (f"max_batch {m.max_batch}, decode {m.decode_base_ms:g} ms + {m.decode_per_seq_ms:g} ms/seq, prefill "
                                 f"{m.prefill_base_ms:g} ms + {m.prefill_per_token_ms:g} ms/token, KV {m.kv_capacity_tokens} tokens, prefix cache "
                                 f"{'on' if m.prefix_cache else 'off'}, policy {m.policy}")
    for k, v in items.items():
        t.add(k, str(v))
    return Section("configuration", "Configuration", tables=[t], notes=list(ctx.notes))


def write_results(ctx: BenchContext, report: Report, formats: list[str] | None) -> dict[str, Path]:
    from deltatap.collector.reports.render_terminal import print_report
    from deltatap.collector.reports.renderers import write_report

    files = write_report(report, ctx.out, formats)
    h = ctx.harness
    prov = provenance(tool="bench", seed=ctx.args.seed, topology=getattr(h, "topology", None),
                      extra={"test": report.title, "target": h.target if not h.embedded else "embedded reference stack",
                             "stack_config": getattr(h, "stack_src", "") or None})
    data = {"report": report.title, "results": ctx.data, "requirements": [r.__dict__ for r in ctx.requirements], "provenance": prov}
    (ctx.out / "bench.json").write_text(json.dumps(data, indent=2, default=_json_default) + "\n", encoding="utf-8")
    files["bench.json"] = ctx.out / "bench.json"
    print_report(report, ctx.console)
    ctx.console.rule("[bold]Results")
    for k, p in files.items():
        ctx.say(f"  {k}: {p}")
    ctx.say(f"  per-level load-generator records: {ctx.out / 'levels'}")
    return files


def _json_default(o: Any) -> Any:
    if hasattr(o, "as_dict"):
        return o.as_dict()
    if isinstance(o, float) and not math.isfinite(o):
        return None
    return str(o)
