"""§5.1 Time to first token at one load level: the draft's tables 1 and 2, the TTFT distribution, the queue-wait
and prefill components, and the per-component decomposition."""

from __future__ import annotations

import argparse

import numpy as np

from deltatap.app.bench import plots
from deltatap.app.bench.common import BenchContext, compliance_section, config_section, decomposition_by_level, levels_table, summary_notes
from deltatap.app.bench.measure import per_request
from deltatap.collector.reports.methodology import sample_count_notes, ttft_by_input_table, ttft_table
from deltatap.collector.deltas import ENGINE_TTFT, registry
from deltatap.collector.reports.model import Report, Section

NAME = "ttft"
SECTION = "5.1"
HELP = "time to first token at one load level: tables 1-2, distribution, per-component decomposition (§5.1)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rate", type=float, default=None, metavar="R", help="open loop: requests/s (default: half the estimated capacity)")
    p.add_argument("--concurrency", type=int, default=None, metavar="N", help="closed loop instead: requests in flight")
    p.add_argument("--requests", type=int, default=None, metavar="N", help="measured requests (default 300, --quick 40; the draft asks >= 1000 for P99)")


async def run(ctx: BenchContext) -> Report:
    a = ctx.args
    n = a.requests or (40 if ctx.quick else 300)
    if a.concurrency:
        load, label, x, offered = ctx.closed_loop(a.concurrency, n), f"closed loop, concurrency {a.concurrency}", float(a.concurrency), None
    else:
        rate = a.rate or 0.5 * await ctx.capacity_rps()
        load = {**ctx.open_loop(rate, 1.0), "requests": n}
        label, x, offered = f"open loop, Poisson {rate:.2f} req/s", round(rate, 2), rate
    m, runs = await ctx.level(label, x, {"load": load}, offered_rps=offered)
    p = [per_request(r.records) for r in runs]
    ttft = np.concatenate([q.ttft for q in p])
    isl = np.concatenate([q.input_tokens for q in p])
    res = Section("results", "Time to first token (methodology §5.1)", tables=[ttft_table(ttft), ttft_by_input_table(ttft, isl), levels_table([m], title="Load level summary")])
    res.notes += sample_count_notes(int(np.isfinite(ttft).sum()), "TTFT") + summary_notes([m], ctx.slos)
    res.notes.append("TTFT: from the request's last byte written (T_submit) to the first content token (§5.1.3.1: empty and whitespace-only events excluded).")
    fig = plots.histogram(ttft, "TTFT distribution (§5.1.5.4)", "TTFT (ms)", "ttft_hist")
    if fig:
        res.figures.append(fig)
    comp = Section("components", "Per-component decomposition (queue wait and prefill inside the engine's delta)", tables=[t for t in (decomposition_by_level([m], "p50"), decomposition_by_level([m], "p99")) if t])
    eng = [r.engine for r in runs]
    if not comp.tables:
        comp.notes.append("No per-component deltas: no taps reported to this bench (use the embedded stack, or --collect with taps on the links).")
    if any(eng):
        reg = registry()
        comp.notes.append(f"The Model Engine line is the engine's own TTFT ({reg.by_name[ENGINE_TTFT].formula}): its queue wait "
                          f"({reg.of('engine_queue').formula}) and prefill ({reg.of('engine_prefill').formula}) are in the engine's span "
                          "as gen_ai.latency.time_in_queue and time_in_model_prefill.")
    n_ok = int(np.isfinite(ttft).sum())
    ctx.require("5.1.2.1", "request count for P99", ">= 1000", str(n_ok), n_ok >= 1000)
    ctx.require("5.1.2.1", "request count for P99.9", ">= 10000", str(n_ok), n_ok >= 10000)
    ctx.require("6.3", "independent runs", ">= 3", str(ctx.reps), ctx.reps >= 3)
    ctx.data["level"] = m.as_dict()
    return Report("deltatap bench ttft", sections=[config_section(ctx, NAME, SECTION, {"Load": label, "Requests": n}), res, comp, compliance_section(ctx)])
