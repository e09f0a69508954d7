"""§5.2 Maximum output-token throughput: a binary search over the open-loop rate for the highest sustainable level
- not saturated by §5.2.3.1 (queue growth, completion < 90 % of arrivals, P99 > 10x the low-load P50) and, with
--slo, meeting every SLO at P99 - with steady-state checks at each level; tables 3 and 4."""

from __future__ import annotations

import argparse

import numpy as np

from deltatap.app.bench import plots
from deltatap.app.bench.common import BenchContext, compliance_section, config_section, decomposition_by_level, knee_attribution, levels_table, summary_notes
from deltatap.app.bench.sweep import meets_slos, reference_capacity_rps, saturated
from deltatap.collector.reports.model import Column, Report, Section, Table

NAME = "max-throughput"
SECTION = "5.2"
HELP = "maximum sustainable throughput (optionally under --slo): binary search with saturation detection (§5.2)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--min-rate", type=float, metavar="R", help="lowest rate searched (default 0.25 x the capacity estimate)")
    p.add_argument("--max-rate", type=float, metavar="R", help="highest rate searched (default 1.6 x the capacity estimate)")
    p.add_argument("--iterations", type=int, default=None, metavar="N", help="binary-search steps (default 6, --quick 4)")
    p.add_argument("--duration", type=float, default=None, metavar="S", help="seconds of arrivals per level (default 8, --quick 3; the draft asks >= 60)")


async def run(ctx: BenchContext) -> Report:
    a = ctx.args
    duration = a.duration or (3.0 if ctx.quick else 8.0)
    iters = a.iterations or (4 if ctx.quick else 6)
    cap = await ctx.capacity_rps() if not (a.min_rate and a.max_rate) else 0.0
    lo, hi = a.min_rate or 0.25 * cap, a.max_rate or 1.6 * cap
    probes = []
    base_p50: float | None = None

    async def probe(rate: float) -> tuple[bool, list[str]]:
        nonlocal base_p50
        m, runs = await ctx.level(f"{rate:.2f} req/s", round(rate, 2), {"load": ctx.open_loop(rate, duration)}, offered_rps=rate)
        if base_p50 is None:
            base_p50 = m.e2e.p50
        why = saturated(m, base_p50)
        if ctx.slos and not meets_slos(m, ctx.slos):
            why.append("SLO missed at P99")
        batch = [e.get("deltatap.engine.batch_size") for r in runs for e in r.engine.values() if e.get("deltatap.engine.batch_size")]
        m.extra.update(sustainable=not why, why="; ".join(why), batch_mean=float(np.mean(batch)) if batch else None)
        probes.append(m)
        return not why, why

    ok_lo, _ = await probe(lo)
    best = probes[-1] if ok_lo else None
    if ok_lo:
        for _ in range(iters):
            mid = (lo + hi) / 2
            ok, _why = await probe(mid)
            if ok:
                lo, best = mid, probes[-1]
            else:
                hi = mid
    order = sorted(probes, key=lambda m: m.x)
    t3 = Table("summary", "Throughput summary (methodology §5.2.5.1, table 3)", [Column("metric", "Metric"), Column("value", "Value", "", 2), Column("unit", "Unit")])
    t4 = Table("latency_at_max", "Latency at maximum throughput (methodology §5.2.5.2, table 4)",
               [Column("metric", "Metric"), Column("p50", "P50", "ms", 1), Column("p95", "P95", "ms", 1), Column("p99", "P99", "ms", 1)])
    notes = []
    if best is not None:
        t3.add("Max Output Throughput", best.output_tok_s, "tok/s")
        t3.add("Max Request Throughput", best.request_rps, "req/s")
        t3.add("Max Input Throughput", best.input_tok_s, "tok/s")
        t3.add("Sustainable Load", best.x, "req/s")
        t3.add("Goodput at that load", best.goodput_rps, "req/s")
        t3.add("Error rate at that load", best.error_rate, "ratio")
        t3.add("Tokens per GPU-second", None, "n/a: no GPU in the SUT" if ctx.harness.embedded else "n/a: GPU count unknown")
        model = ctx.harness.engine_model()
        if model is not None and best.extra.get("batch_mean"):
            t3.add("Batch utilization", best.extra["batch_mean"] / model.max_batch, "mean batch / max_batch")
        for key, title in (("ttft", "TTFT"), ("tpot", "TPOT"), ("e2e", "End-to-End")):
            s = getattr(best, key)
            t4.add(title, s.p50, s.p95, s.p99)
        notes.append(f"Maximum sustainable load: {best.x:.2f} req/s -> {best.output_tok_s:.0f} output tok/s ({'under the SLOs' if ctx.slos else 'no latency constraint'}); "
                     f"searched {len(probes)} levels between {order[0].x:.2f} and {order[-1].x:.2f} req/s.")
        if model is not None and not a.workload:
            truth = reference_capacity_rps(model, a.input_tokens, a.output_tokens)
            notes.append(f"Configured truth: the reference engine's knobs give a capacity of {truth:.2f} req/s for {a.input_tokens}/{a.output_tokens}-token requests.")
            ctx.data["configured_capacity_rps"] = truth
    else:
        notes.append(f"Even the lowest rate searched ({order[0].x:.2f} req/s) is not sustainable: {order[0].extra['why']}. Lower --min-rate.")
    search = levels_table(order, "search", "Search levels (every rate tried, ascending)")
    search.columns.append(Column("verdict", "Verdict"))
    for row, m in zip(search.rows, order, strict=True):
        row.append("sustainable" if m.extra["sustainable"] else f"saturated: {m.extra['why']}")
    sat = next((i for i, m in enumerate(order) if not m.extra["sustainable"]), None)
    sentence = knee_attribution(order, sat, what="First saturated level")
    res = Section("results", "Maximum throughput (methodology §5.2)", tables=[t3, t4, search], notes=notes + [sentence] + summary_notes(order, ctx.slos))
    res.figures.append(plots.curve(order, "offered load (req/s)", None, sat))
    comp = Section("components", "Per-component decomposition at every level searched", tables=[t for t in (decomposition_by_level(order, "p50"), decomposition_by_level(order, "p99")) if t], notes=[sentence])
    ctx.require("5.2.2.1", "test duration per level", ">= 60 s (300 s recommended)", f"{duration:g} s", duration >= 60)
    ctx.require("5.2.3.2", "steady state: ramp-up excluded", "first 10 % of the duration", "first 10 % excluded from the queue check", True)
    ctx.require("6.3", "independent runs", ">= 3", str(ctx.reps), ctx.reps >= 3)
    ctx.data.update(max_output_tok_s=best.output_tok_s if best else None, sustainable_rps=best.x if best else None, levels=[m.as_dict() for m in order])
    return Report("deltatap bench max-throughput", sections=[config_section(ctx, NAME, SECTION, {"Duration per level": f"{duration:g} s", "Search steps": iters}),
                                                        res, comp, compliance_section(ctx)])
