"""§5.4 Inter-token latency distribution at 25/50/75/90 % of saturation: every gap between content events, per-request
jitter and maximum pause, modality and the P99/P50 tail ratio (table 6), with the decomposition per level."""

from __future__ import annotations

import argparse

import numpy as np

from deltatap.app.bench import plots
from deltatap.app.bench.common import BenchContext, compliance_section, config_section, decomposition_by_level, levels_table, summary_notes
from deltatap.app.bench.throughput_latency import fractions
from deltatap.collector.reports.methodology import chunk_gaps_from_records
from deltatap.collector.reports.model import Column, Report, Section, Table
from deltatap.collector.reports.stats import summarize

NAME = "itl"
SECTION = "5.4"
OUTPUT_TOKENS = 64  # §5.4.2: at least 50 output tokens per request
HELP = "inter-token latency distribution: jitter, max pause, modality, tail ratio at several loads (§5.4)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--levels", default="0.25,0.5,0.75,0.9", help="load levels as fractions of saturation (default 0.25,0.5,0.75,0.9)")
    p.add_argument("--requests", type=int, default=None, metavar="N", help="requests per level (default 100, --quick 16)")


def bimodality(v: np.ndarray) -> float:
    """Sarle's bimodality coefficient (skew^2 + 1) / (excess kurtosis + 3(n-1)^2/((n-2)(n-3))); above 5/9 ~ 0.555
    suggests a bimodal or multimodal distribution."""
    n = v.size
    if n < 4 or v.std() == 0:
        return float("nan")
    z = (v - v.mean()) / v.std()
    g, k = float(np.mean(z**3)), float(np.mean(z**4) - 3)
    return (g * g + 1) / (k + 3 * (n - 1) ** 2 / ((n - 2) * (n - 3)))


def itl_figures(records: list[dict]) -> dict:
    per = [g for g in chunk_gaps_from_records(records) if g.size]  # ms
    allg = np.concatenate(per) if per else np.array([])
    s = summarize(allg)
    jitter = summarize([g.std() for g in per if g.size >= 2])
    pause = summarize([g.max() for g in per])
    bc = bimodality(allg)
    return {"samples": s.count, "summary": s, "jitter": jitter, "pause": pause, "bimodality": bc,
            "modality": "n/a" if not np.isfinite(bc) else ("multimodal" if bc > 5 / 9 else "unimodal"),
            "tail_ratio": s.p99 / s.p50 if s.p50 > 0 else float("nan"), "all": allg, "requests": len(per)}


async def run(ctx: BenchContext) -> Report:
    a = ctx.args
    fr = fractions(a.levels)
    n = a.requests or (16 if ctx.quick else 100)
    cap = await ctx.capacity_rps()
    levels, figs = [], []
    for f in fr:
        rate = f * cap
        m, runs = await ctx.level(f"{f:.0%} of saturation ({rate:.2f} req/s)", round(rate, 2), {"load": {**ctx.open_loop(rate, 1.0), "requests": n}}, offered_rps=rate)
        m.extra["itl"] = itl_figures([r for run in runs for r in run.records])
        levels.append(m)
    t6 = Table("itl", "ITL results per load level (methodology §5.4.5, table 6; ms)", [Column("metric", "Metric")] + [Column(f"l{i}", m.label, "", 2) for i, m in enumerate(levels)])
    rows = [("ITL Samples", lambda f: f["samples"]), ("ITL P50", lambda f: f["summary"].p50), ("ITL P90", lambda f: f["summary"].p90),
            ("ITL P95", lambda f: f["summary"].p95), ("ITL P99", lambda f: f["summary"].p99), ("ITL P99.9", lambda f: f["summary"].p999),
            ("ITL Mean", lambda f: f["summary"].mean), ("ITL Std Dev", lambda f: f["summary"].std), ("P99/P50 Ratio", lambda f: f["tail_ratio"])]
    for title, get in rows:
        t6.add(title, *[get(m.extra["itl"]) for m in levels])
    tr = Table("per_request", "Per-request jitter and maximum pause (methodology §5.4.4.2; ms) and shape (§5.4.4.3)",
               [Column("level", "Level"), Column("jitter_p50", "Jitter P50", "ms", 2), Column("jitter_p95", "Jitter P95", "ms", 2), Column("jitter_p99", "Jitter P99", "ms", 2),
                Column("pause_p50", "Max pause P50", "ms", 1), Column("pause_p95", "Max pause P95", "ms", 1), Column("pause_p99", "Max pause P99", "ms", 1),
                Column("bimodality", "Bimodality coeff.", "", 3), Column("modality", "Modality")])
    for m in levels:
        f = m.extra["itl"]
        tr.add(m.label, f["jitter"].p50, f["jitter"].p95, f["jitter"].p99, f["pause"].p50, f["pause"].p95, f["pause"].p99, f["bimodality"], f["modality"])
    res = Section("results", "Inter-token latency (methodology §5.4)", tables=[t6, tr, levels_table(levels, title="Load levels")])
    res.notes += ["ITL samples are every gap between consecutive content events at the client (§4.6.3 option A, chunk timing); "
                  "the interval to the first token is excluded. Modality by Sarle's bimodality coefficient (> 5/9: multimodal)."] + summary_notes(levels, ctx.slos)
    for i, m in enumerate(levels):
        fig = plots.histogram(m.extra["itl"]["all"], f"ITL distribution at {m.label}", "ITL (ms)", f"itl_hist_{i}")
        if fig:
            figs.append(fig)
    res.figures += figs
    comp = Section("components", "Per-component decomposition at every level", tables=[t for t in (decomposition_by_level(levels, "p50"),) if t])
    outs = a.output_tokens
    ctx.require("5.4.2", "output tokens per request", ">= 50", str(outs) if not a.workload else "workload's", outs >= 50 and not a.workload)
    ctx.require("5.4.2", "requests per level", ">= 100", str(min(m.sent for m in levels)), min(m.sent for m in levels) >= 100)
    ctx.require("5.4.2", "ITL samples per level", ">= 5000", str(min(m.extra["itl"]["samples"] for m in levels)), min(m.extra["itl"]["samples"] for m in levels) >= 5000)
    ctx.require("6.3", "independent runs", ">= 3", str(ctx.reps), ctx.reps >= 3)
    ctx.data["levels"] = [{**{k: v for k, v in m.extra["itl"].items() if k != "all"}, "label": m.label, "rate": m.x} for m in levels]
    return Report("deltatap bench itl", sections=[config_section(ctx, NAME, SECTION, {"Levels": a.levels, "Requests per level": n, "Output tokens": outs}), res, comp, compliance_section(ctx)])
