"""§5.6 Scheduling fairness: short and long request classes, each first alone (its own share of the load) and then
mixed; per-class latency (table 8), latency inflation, Jain's fairness index and starvation rates (table 9)."""

from __future__ import annotations

import argparse

import numpy as np

from deltatap.app.bench import plots
from deltatap.app.bench.common import BenchContext, compliance_section, config_section, decomposition_by_level, summary_notes
from deltatap.app.bench.measure import per_request
from deltatap.collector.reports.model import Column, Report, Section, Table
from deltatap.core.config import ConfigError

NAME = "fairness"
SECTION = "5.6"
HELP = "scheduling fairness across short and long request classes: inflation, Jain's index, starvation (§5.6)"
STARVATION_X_MEDIAN = 5.0  # §5.6.4: waiting longer than 5x the class's median wait


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mix", type=float, default=0.8, metavar="F", help="fraction of short requests (default 0.8)")
    p.add_argument("--load", type=float, default=0.8, metavar="F", help="total load as a fraction of the capacity estimate (default 0.8; the draft asks 0.7-0.9)")
    p.add_argument("--duration", type=float, default=None, metavar="S", help="seconds of arrivals per phase (default 20, --quick 4; the draft asks >= 300)")
    p.add_argument("--priority", action="append", metavar="CLASS=N", help="send header x-priority: N with class short or long (engines with priority scheduling)")
    p.add_argument("--priority-header", default="x-priority", help="header name for --priority (default x-priority)")


def classes(short_share: float) -> dict[str, dict]:
    """The two classes of §5.6.2, lengths scaled to the reference stack (the draft: short input 64-256 / output 32-128,
    long input 1024-4096 / output 256-1024); the report states the scaling."""
    return {
        "short": {"share": short_share, "workload": {"workload": "synthetic-uniform", "params": {"input": {"dist": "uniform", "min": 64, "max": 256},
                                                                                               "output": {"dist": "uniform", "min": 8, "max": 32}}}},
        "long": {"share": 1 - short_share, "workload": {"workload": "synthetic-uniform", "params": {"input": {"dist": "uniform", "min": 1024, "max": 4096},
                                                                                                  "output": {"dist": "uniform", "min": 64, "max": 128}}}},
    }


def jain(x: list[float]) -> float:
    """Jain's fairness index (sum x)^2 / (n sum x^2); 1.0 is perfectly fair."""
    v = np.asarray([a for a in x if np.isfinite(a)], dtype=float)
    return float(v.sum() ** 2 / (v.size * (v * v).sum())) if v.size and (v * v).sum() > 0 else float("nan")


def starvation(ttft: np.ndarray) -> float:
    v = ttft[np.isfinite(ttft)]
    return float(np.mean(v > STARVATION_X_MEDIAN * np.median(v))) if v.size else float("nan")


async def run(ctx: BenchContext) -> Report:
    a = ctx.args
    if not 0 < a.mix < 1:
        raise ConfigError(f"--mix {a.mix}: give the short class's fraction, between 0 and 1 (e.g. 0.8)")
    prio: dict[str, str] = {}
    for spec in a.priority or ():
        k, sep, v = spec.partition("=")
        if not sep or k not in ("short", "long") or not v.lstrip("-").isdigit():
            raise ConfigError(f"--priority {spec!r}: write short=N or long=N with an integer N (lower runs first on priority schedulers)")
        prio[k] = v
    duration = a.duration or (4.0 if ctx.quick else 20.0)
    cls = classes(a.mix)
    cap = await ctx.capacity_rps({n: (c["share"], c["workload"]) for n, c in cls.items()})  # of the class mix, not of one class
    total = a.load * cap

    def stream(name: str) -> dict:
        c = cls[name]
        extra = {"headers": {a.priority_header: prio[name]}} if name in prio else {}
        return ctx.open_loop(total * c["share"], duration, workload=c["workload"], labels={"class": name}, **extra)

    iso = {}
    for name in cls:
        m, runs = await ctx.level(f"{name} alone ({total * cls[name]['share']:.2f} req/s)", total * cls[name]["share"], {name: stream(name)}, tag=f"isolated-{name}")
        iso[name] = (m, runs)
    mixed, mruns = await ctx.level(f"mixed ({total:.2f} req/s, {a.mix:.0%} short)", total, {n: stream(n) for n in cls}, offered_rps=total, tag="mixed")
    per: dict[str, dict] = {}
    for name in cls:
        recs = [r for run in mruns for r in run.records if r.get("labels", {}).get("bench_stream") == name]
        p = per_request(recs)
        pi = per_request([r for run in iso[name][1] for r in run.records])
        per[name] = {"count": p.ok, "sent": p.sent, "ttft": p.ttft, "tpot": p.tpot, "iso_ttft_p50": float(np.nanmedian(pi.ttft)) if pi.ok else float("nan")}
    t8 = Table("classes", "Per-class results, mixed workload (methodology §5.6.5, table 8)", [
        Column("class", "Class"), Column("count", "Count", "", 0), Column("ttft_p50_ms", "TTFT P50", "ms", 1), Column("ttft_p99_ms", "TTFT P99", "ms", 1),
        Column("tpot_p50_ms", "TPOT P50", "ms", 2), Column("tpot_p99_ms", "TPOT P99", "ms", 2), Column("isolated_ttft_p50_ms", "Isolated TTFT P50", "ms", 1),
        Column("inflation", "Latency inflation", "x", 2), Column("starvation", "Starvation", "%", 2), Column("error_rate", "Error rate", "", 3)])
    infl = {}
    for name, d in per.items():
        p50 = float(np.nanpercentile(d["ttft"], 50)) if d["count"] else float("nan")
        infl[name] = p50 / d["iso_ttft_p50"] if d["iso_ttft_p50"] > 0 else float("nan")
        d["starvation"] = starvation(d["ttft"])
        t8.add(name.title(), d["count"], p50, float(np.nanpercentile(d["ttft"], 99)) if d["count"] else None,
               float(np.nanpercentile(d["tpot"], 50)) if d["count"] else None, float(np.nanpercentile(d["tpot"], 99)) if d["count"] else None,
               d["iso_ttft_p50"], infl[name], d["starvation"], (d["sent"] - d["count"]) / d["sent"] if d["sent"] else None)
    j = jain(list(infl.values()))
    t9 = Table("fairness", "Fairness metrics (methodology §5.6.5, table 9)", [Column("metric", "Metric"), Column("value", "Value", "", 3)])
    t9.add("Jain's Fairness Index", j)
    for name, d in per.items():
        t9.add(f"{name.title()} Class Starvation", d["starvation"])
    notes = [f"Jain's index over the classes' latency inflation (mixed TTFT P50 / isolated TTFT P50): {j:.3f} "
             f"({'significant unfairness, J < 0.9' if j < 0.9 else 'fair by the draft, J >= 0.9'}).",
             f"Starvation: fraction of a class's requests whose TTFT exceeds {STARVATION_X_MEDIAN:g}x the class's median TTFT (the client sees the wait as TTFT).",
             "Isolation baseline: each class alone at its own share of the mixed rate (the draft's 'same total load' read as the same arrivals of that class).",
             "Classes scaled to the reference stack: short input 64-256 / output 8-32 tokens, long input 1024-4096 / output 64-128 (the draft: output 32-128 and 256-1024)."]
    if prio:
        notes.append("Priorities sent: " + ", ".join(f"{k} {a.priority_header}: {v}" for k, v in prio.items()) + ".")
    model = ctx.harness.engine_model()
    if model is not None:
        notes.append(f"Configured truth: the reference engine's scheduling policy is {model.policy}" + (f" (header {model.priority_header}, lower first)." if model.policy == "priority" else " (arrival order)."))
    res = Section("results", "Scheduling fairness (methodology §5.6)", tables=[t8, t9], notes=notes + summary_notes([mixed], ctx.slos),
                  data={"jain": j, "inflation": infl, "starvation": {k: d["starvation"] for k, d in per.items()}})
    res.figures.append(plots.bars([n.title() for n in per], {"isolated TTFT P50": [d["iso_ttft_p50"] for d in per.values()],
                                                            "mixed TTFT P50": [float(np.nanpercentile(d["ttft"], 50)) if d["count"] else 0 for d in per.values()]},
                                  "ms", "classes", "TTFT per class, alone and mixed"))
    levels = [iso[n][0] for n in cls] + [mixed]
    comp = Section("components", "Per-component decomposition: each class alone, then mixed", tables=[t for t in (decomposition_by_level(levels, "p50"), decomposition_by_level(levels, "p99")) if t])
    ctx.require("5.6.2", "requests per class", ">= 500", str(min(d["count"] for d in per.values())), min(d["count"] for d in per.values()) >= 500)
    ctx.require("5.6.3", "mixed run duration", ">= 300 s", f"{duration:g} s", duration >= 300)
    ctx.require("5.6.2", "workload", "Synthetic-Skewed", "two synthetic-uniform classes (short, long), scaled", False)
    ctx.require("5.6.2", "load level", "70-90 % of saturation", f"{a.load:.0%}", 0.7 <= a.load <= 0.9)
    ctx.require("6.3", "independent runs", ">= 3", str(ctx.reps), ctx.reps >= 3)
    ctx.data.update(res.data, levels=[m.as_dict() for m in levels])
    return Report("deltatap bench fairness", sections=[config_section(ctx, NAME, SECTION, {"Mix": f"{a.mix:.0%} short", "Load": f"{a.load:.0%} of capacity ({total:.2f} req/s)",
                                                                                         "Duration per phase": f"{duration:g} s"}), res, comp, compliance_section(ctx)])
