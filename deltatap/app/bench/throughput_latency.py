"""§5.3 Throughput-latency tradeoff: at least 10 open-loop levels from 10 % to 120 % of the estimated
capacity, the table of §5.3.5, the knee and saturation points, and which component makes the knee."""

from __future__ import annotations

import argparse

from deltatap.app.bench import plots
from deltatap.app.bench.common import BenchContext, ci_table, compliance_section, config_section, decomposition_by_level, knee_attribution, levels_table, summary_notes
from deltatap.app.bench.sweep import knee_index, meets_slos, saturation_index, saturated
from deltatap.collector.reports.model import Report, Section
from deltatap.core.config import ConfigError

NAME = "throughput-latency"
SECTION = "5.3"
REPETITIONS = 3  # §6.3: at least 3 independent runs
HELP = "throughput-latency curve: >= 10 open-loop levels, knee and saturation points, per-component attribution (§5.3)"
DEFAULT_LEVELS = "0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9,1.0,1.1,1.2"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--levels", default=DEFAULT_LEVELS, help=f"load levels as fractions of the estimated capacity (default {DEFAULT_LEVELS})")
    p.add_argument("--duration", type=float, default=None, metavar="S", help="seconds of arrivals per level (default 4, --quick 1.5; the draft asks 60)")


def fractions(text: str) -> list[float]:
    try:
        out = sorted(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise ConfigError(f"--levels {text!r}: give comma-separated fractions of capacity such as 0.1,0.5,1.0") from None
    if not out or out[0] <= 0:
        raise ConfigError(f"--levels {text!r}: fractions must be above 0")
    return out


async def sweep(ctx: BenchContext, fr: list[float], duration: float) -> tuple[float, list]:
    cap = await ctx.capacity_rps()
    levels = []
    for f in fr:
        rate = f * cap
        m, _ = await ctx.level(f"{rate:.2f} req/s ({f:.0%})", round(rate, 2), {"load": ctx.open_loop(rate, duration)}, offered_rps=rate)
        levels.append(m)
    return cap, levels


async def run(ctx: BenchContext) -> Report:
    a = ctx.args
    fr = fractions(a.levels)
    duration = a.duration or (1.5 if ctx.quick else 4.0)
    cap, levels = await sweep(ctx, fr, duration)
    knee, sat = knee_index(levels), saturation_index(levels)
    mknee = knee_index(levels, "p50")
    first_sat = next((i for i, m in enumerate(levels) if saturated(m, levels[0].e2e.p50)), None)
    ok_slo = [i for i, m in enumerate(levels) if ctx.slos and meets_slos(m, ctx.slos)]
    optimal = max(ok_slo, key=lambda i: levels[i].output_tok_s) if ok_slo else None
    sentence = knee_attribution(levels, knee)
    msentence = knee_attribution(levels, mknee, "p50", what="Median knee")
    res = Section("results", "Throughput-latency (methodology §5.3)", tables=[levels_table(levels)])
    t = ci_table(levels)
    if t:
        res.tables.append(t)
    res.notes += [
        f"Knee point: {levels[knee].label} (TTFT P99 {levels[knee].ttft.p99:.1f} ms > 2x the minimum {min(m.ttft.p99 for m in levels):.1f} ms, "
        "and above it at every higher level)." if knee is not None
        else "Knee point: not reached (no level's TTFT P99 exceeds 2x the minimum).",
        f"Saturation point: {levels[sat].label} (achieved throughput first decreases: {levels[sat - 1].output_tok_s:.0f} -> {levels[sat].output_tok_s:.0f} tok/s)." if sat is not None
        else "Saturation point: throughput never decreased from one level to the next in the measured range.",
        f"First saturated level by §5.2.3.1: {levels[first_sat].label} ({'; '.join(saturated(levels[first_sat], levels[0].e2e.p50))})." if first_sat is not None
        else "No level saturated by §5.2.3.1 (queue stable, completion >= 90 % of arrivals).",
        (f"Optimal operating point: {levels[optimal].label} ({levels[optimal].output_tok_s:.0f} tok/s meeting the SLOs at P99)." if optimal is not None
         else "Optimal operating point: no level meets the SLOs at P99." if ctx.slos else "Optimal operating point: give --slo to find it."),
        sentence,
        msentence + " (The median knee: TTFT P50 above 2x its minimum there and at every higher level; a busy machine's tail noise does not move it.)",
    ] + summary_notes(levels, ctx.slos)
    res.data = {"knee_index": knee, "saturation_index": sat, "first_saturated_index": first_sat, "capacity_rps": cap,
                "knee_rps": levels[knee].x if knee is not None else None, "knee_attribution": sentence,
                "median_knee_index": mknee, "median_knee_rps": levels[mknee].x if mknee is not None else None, "median_knee_attribution": msentence}
    res.figures.append(plots.curve(levels, "offered load (req/s)", knee, sat))
    decomp = [t for t in (decomposition_by_level(levels, "p50"), decomposition_by_level(levels, "p99")) if t]
    comp = Section("components", "Per-component decomposition at every level", tables=decomp, notes=[sentence, msentence])
    fig = plots.components(levels, "p99")
    if fig:
        comp.figures.append(fig)
    ctx.require("5.3.2", "load levels", ">= 10", str(len(levels)), len(levels) >= 10)
    ctx.require("5.3.2", "levels span low load to saturation", "10 % .. >= 100 % of capacity", f"{fr[0]:.0%} .. {fr[-1]:.0%}", fr[0] <= 0.1 and fr[-1] >= 1.0)
    ctx.require("5.3.2", "duration per level", ">= 60 s", f"{duration:g} s", duration >= 60)
    ctx.require("5.3.2", "load model", "open loop", "open loop (Poisson)", True)
    ctx.require("6.3", "independent runs", ">= 3", str(ctx.reps), ctx.reps >= 3)
    ctx.data.update(res.data, levels=[m.as_dict() for m in levels])
    return Report("deltatap bench throughput-latency", sections=[config_section(ctx, NAME, SECTION, {"Load levels": a.levels, "Duration per level": f"{duration:g} s"}),
                                                           res, comp, compliance_section(ctx)])
