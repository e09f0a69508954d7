"""§5.5 Concurrent request capacity: a binary search over closed-loop concurrency for the highest level meeting the
success criteria (completion >= 99 %, TTFT P99 <= the threshold, no out-of-memory errors); table 7."""

from __future__ import annotations

import argparse

from deltatap.app.bench import plots
from deltatap.app.bench.common import BenchContext, compliance_section, config_section, decomposition_by_level, knee_attribution, summary_notes
from deltatap.app.bench.measure import LevelMetrics
from deltatap.collector.reports.model import Column, Report, Section, Table

NAME = "capacity"
SECTION = "5.5"
HELP = "maximum concurrency meeting completion >= 99 percent and a TTFT P99 threshold: binary search (§5.5)"
OOM_WORDS = ("out of memory", "oom", "kv cache", "cuda error")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--initial", type=int, default=1, metavar="N", help="initial concurrency (default 1)")
    p.add_argument("--max-concurrency", type=int, default=None, metavar="N", help="upper bound of the search (default 4 x the engine's max_batch, else 64)")
    p.add_argument("--ttft-p99", type=float, default=250.0, metavar="MS", help="success criterion: TTFT P99 at most this (default 250 ms)")
    p.add_argument("--per-slot", type=int, default=None, metavar="N", help="completions per concurrency slot at each level (default 6, --quick 3; the draft asks 100)")


def _oom(runs) -> int:
    return sum(1 for run in runs for r in run.records if r["status"] != "ok" and any(w in str(r.get("server_message") or r.get("error") or "").lower() for w in OOM_WORDS))


async def search(ctx: BenchContext, lo: int, hi: int, ttft_p99: float, per_slot: int, tag: str = "") -> tuple[int | None, list[LevelMetrics]]:
    """Binary search; returns (largest passing concurrency or None, every level tried in ascending order)."""
    tried: dict[int, LevelMetrics] = {}

    async def check(c: int) -> bool:
        m, runs = await ctx.level(f"{tag}concurrency {c}", c, {"load": ctx.closed_loop(c, c * per_slot)})
        oom = _oom(runs)
        why = [w for w, bad in ((f"completion {m.success_rate:.1%} < 99 %", m.success_rate < 0.99), (f"TTFT P99 {m.ttft.p99:.0f} ms > {ttft_p99:g} ms", not m.ttft.p99 <= ttft_p99),
                                (f"{oom} out-of-memory errors", oom > 0)) if bad]
        m.extra.update(passed=not why, why="; ".join(why), errors=m.sent - m.ok, tokens_in_flight=c * (ctx.args.input_tokens + ctx.args.output_tokens / 2))
        tried[c] = m
        return not why

    if not await check(lo):
        return None, [tried[k] for k in sorted(tried)]
    if await check(hi):
        return hi, [tried[k] for k in sorted(tried)]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if await check(mid):
            lo = mid
        else:
            hi = mid
    return lo, [tried[k] for k in sorted(tried)]


def table7(levels: list[LevelMetrics]) -> Table:
    t = Table("capacity", "Capacity search results (methodology §5.5.5, table 7)", [
        Column("concurrency", "Concurrency", "", 0), Column("completion", "Completion", "%", 1), Column("ttft_p99_ms", "TTFT P99", "ms", 1),
        Column("tpot_p99_ms", "TPOT P99", "ms", 2), Column("errors", "Errors", "", 0), Column("error_rate", "Error rate", "", 3),
        Column("goodput_rps", "Goodput", "req/s", 2), Column("output_tok_s", "Throughput", "tok/s", 0), Column("status", "Status"), Column("why", "Why")])
    for m in levels:
        t.add(int(m.x), m.success_rate, m.ttft.p99, m.tpot.p99, m.extra["errors"], m.error_rate, m.goodput_rps, m.output_tok_s, "Pass" if m.extra["passed"] else "Fail", m.extra["why"])
    return t


async def run(ctx: BenchContext) -> Report:
    a = ctx.args
    model = ctx.harness.engine_model()
    hi = a.max_concurrency or (4 * model.max_batch if model is not None else 64)
    per_slot = a.per_slot or (3 if ctx.quick else 6)
    best, levels = await search(ctx, max(1, a.initial), hi, a.ttft_p99, per_slot)
    notes = [f"Maximum concurrent requests meeting criteria: {best if best is not None else f'none (even {a.initial} fails)'}"
             + (" (the upper bound of the search: raise --max-concurrency)" if best == hi else "") + "."]
    at = next((m for m in levels if m.x == best), None)
    if at is not None:
        notes.append(f"At that concurrency: {at.output_tok_s:.0f} output tok/s; ~{at.extra['tokens_in_flight']:.0f} tokens in flight (input + half the output, per request).")
    if model is not None:
        notes.append(f"Configured truth: the reference engine runs at most max_batch = {model.max_batch} sequences at once; a request beyond that waits for a slot.")
    first_fail = next((i for i, m in enumerate(levels) if not m.extra["passed"]), None)
    sentence = knee_attribution(levels, first_fail, what="First failing concurrency")
    res = Section("results", "Concurrent request capacity (methodology §5.5)", tables=[table7(levels)], notes=notes + [sentence] + summary_notes(levels, ctx.slos))
    res.figures.append(plots.curve(levels, "concurrency", first_fail, None))
    comp = Section("components", "Per-component decomposition at every concurrency tried", tables=[t for t in (decomposition_by_level(levels, "p50"), decomposition_by_level(levels, "p99")) if t], notes=[sentence])
    ctx.require("5.5.3", "completions per slot", ">= 100 (or 60 s)", str(per_slot), per_slot >= 100)
    ctx.require("6.3", "independent runs", ">= 3", str(ctx.reps), ctx.reps >= 3)
    ctx.data.update(max_concurrency=best, levels=[m.as_dict() for m in levels])
    return Report("deltatap bench capacity", sections=[config_section(ctx, NAME, SECTION, {"Search": f"{a.initial} .. {hi}", "TTFT P99 threshold": f"{a.ttft_p99:g} ms",
                                                                                         "Completions per slot": per_slot}), res, comp, compliance_section(ctx)])
