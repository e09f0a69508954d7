"""§5.9 Long-context scaling: TTFT at each context length (closed loop, low concurrency), ms per 1K input tokens,
and the fits - a power law TTFT ~ length^k (exponent and R^2) and a linear one (ms per token and R^2); table 12."""

from __future__ import annotations

import argparse

import numpy as np

from deltatap.app.bench import plots
from deltatap.app.bench.common import BenchContext, compliance_section, config_section, decomposition_by_level, summary_notes
from deltatap.app.bench.measure import per_request
from deltatap.collector.reports.model import Column, Report, Section, Table
from deltatap.core.config import ConfigError

NAME = "long-context"
SECTION = "5.9"
HELP = "long-context scaling: TTFT per context length, power-law exponent and linear fit with R^2 (§5.9)"
OUTPUT_TOKENS = 16


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--lengths", default=None, help="context lengths in tokens (default 256,512,1024,2048,4096,8192; --quick 256,1024,4096)")
    p.add_argument("--per-length", type=int, default=None, metavar="N", help="requests per length (default 20, --quick 5; the draft asks >= 20)")
    p.add_argument("--concurrency", type=int, default=1, metavar="N", help="closed-loop concurrency (default 1; the draft asks 1-4)")


def fit(lengths: np.ndarray, ttft: np.ndarray) -> dict[str, float]:
    """Power law (least squares in log-log) and linear fits with their R^2 (in the space each was fitted in)."""
    ok = np.isfinite(ttft) & (ttft > 0)
    x, y = lengths[ok].astype(float), ttft[ok]

    def r2(obs: np.ndarray, pred: np.ndarray) -> float:
        ss = float(((obs - obs.mean()) ** 2).sum())
        return 1 - float(((obs - pred) ** 2).sum()) / ss if ss > 0 else float("nan")

    k, c = np.polyfit(np.log(x), np.log(y), 1)
    b, a = np.polyfit(x, y, 1)
    return {"exponent": float(k), "power_coeff_ms": float(np.exp(c)), "power_r2": r2(np.log(y), k * np.log(x) + c),
            "slope_ms_per_token": float(b), "intercept_ms": float(a), "linear_r2": r2(y, a + b * x)}


async def run(ctx: BenchContext) -> Report:
    a = ctx.args
    text = a.lengths or ("256,1024,4096" if ctx.quick else "256,512,1024,2048,4096,8192")
    try:
        lengths = sorted(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise ConfigError(f"--lengths {text!r}: give comma-separated token counts such as 1024,4096,16384") from None
    if not lengths or lengths[0] < 128:
        raise ConfigError(f"--lengths {text!r}: lengths start at 128 tokens (the long-context workload's question alone is ~100)")
    n = a.per_length or (5 if ctx.quick else 20)
    levels, xs, ys = [], [], []
    for L in lengths:
        wl = {"workload": "long-context", "params": {"input": {"dist": "fixed", "value": L}, "output": {"dist": "fixed", "value": a.output_tokens}}}
        m, runs = await ctx.level(f"{L} tokens", L, {"load": ctx.closed_loop(a.concurrency, n, workload=wl)})
        for r in runs:
            p = per_request(r.records)
            xs += p.input_tokens.tolist()
            ys += p.ttft.tolist()
        levels.append(m)
    f = fit(np.asarray(xs), np.asarray(ys))
    t = Table("scaling", "Long-context scaling (methodology §5.9.5, table 12)", [
        Column("context", "Context (tokens)", "", 0), Column("ttft_mean_ms", "TTFT Mean", "ms", 1), Column("ttft_p50_ms", "TTFT P50", "ms", 1),
        Column("ttft_p95_ms", "TTFT P95", "ms", 1), Column("ms_per_1k", "ms/1K tokens", "", 1), Column("output_tok_s", "Throughput", "tok/s", 1),
        Column("error_rate", "Error rate", "", 3), Column("requests", "Requests", "", 0)])
    for m in levels:
        t.add(int(m.x), m.ttft.mean, m.ttft.p50, m.ttft.p95, m.ttft.mean / m.x * 1000, m.output_tok_s, m.error_rate, m.sent)
    best = "linear" if f["linear_r2"] >= f["power_r2"] else "power law"
    notes = [f"Best fit: {best}. Linear: TTFT = {f['intercept_ms']:.1f} ms + {f['slope_ms_per_token'] * 1000:.1f} us/token x length (R^2 = {f['linear_r2']:.4f}); "
             f"power law: TTFT ~ length^{f['exponent']:.3f} (R^2 = {f['power_r2']:.4f}, in log-log).",
             f"Throughput at each length is at closed-loop concurrency {a.concurrency}, not the maximum the length allows."]
    model = ctx.harness.engine_model()
    if model is not None:
        notes.append(f"Configured truth: the reference engine prefills at {model.prefill_per_token_ms:g} ms/token ({model.prefill_per_token_ms * 1000:.0f} us/token) "
                     f"+ {model.prefill_base_ms:g} ms per step, linear in the context.")
    res = Section("results", "Long-context scaling (methodology §5.9)", tables=[t], notes=notes + summary_notes(levels, ctx.slos), data=f)
    xx = np.linspace(min(xs), max(xs), 50)
    res.figures.append(plots.scatter_fit(np.asarray(xs), np.asarray(ys), xx, f["intercept_ms"] + f["slope_ms_per_token"] * xx, "input tokens", "TTFT (ms)", "fit", "TTFT against context length (linear fit)"))
    comp = Section("components", "Per-component decomposition at every length", tables=[t for t in (decomposition_by_level(levels, "p50"),) if t],
                   notes=["The Model Engine line carries the prefill: it is the one that grows with the context."])
    ctx.require("5.9.2", "requests per length", ">= 20", str(n), n >= 20)
    ctx.require("5.9.2", "load model", "closed loop, concurrency 1-4", f"closed loop, concurrency {a.concurrency}", 1 <= a.concurrency <= 4)
    ctx.require("5.9.2", "workload", "Long Context (A.5)", "long-context", True)
    ctx.require("6.3", "independent runs", ">= 3", str(ctx.reps), ctx.reps >= 3)
    ctx.data.update(fit=f, levels=[m.as_dict() for m in levels])
    return Report("deltatap bench long-context", sections=[config_section(ctx, NAME, SECTION, {"Lengths": text, "Requests per length": n, "Output tokens": a.output_tokens}),
                                                      res, comp, compliance_section(ctx)])
