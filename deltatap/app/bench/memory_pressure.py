"""§5.8 Memory-pressure degradation: closed-loop concurrency at and above the capacity found by §5.5 (or given); per
level the completion, preemption and failure rates, TTFT P99 and the preemption recovery rate (table 11)."""

from __future__ import annotations

import argparse

from deltatap.app.bench import plots
from deltatap.app.bench.capacity import search
from deltatap.app.bench.common import BenchContext, compliance_section, config_section, decomposition_by_level, knee_attribution, summary_notes
from deltatap.app.bench.throughput_latency import fractions
from deltatap.collector.reports.model import Column, Report, Section, Table

NAME = "memory-pressure"
SECTION = "5.8"
HELP = "memory-pressure degradation: oversubscribed concurrency, preemption and failure rates (§5.8)"
INPUT_TOKENS = 32  # short prompts, long answers: the KV cache fills while sequences decode, which is what preempts
OUTPUT_TOKENS = 96


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--capacity", type=int, default=None, metavar="N", help="maximum concurrent capacity (default: found by the §5.5 search first)")
    p.add_argument("--levels", default="1.0,1.1,1.25,1.5,2.0", help="concurrency as multiples of the capacity (default 1.0,1.1,1.25,1.5,2.0)")
    p.add_argument("--kv-sequences", type=float, default=6.0, metavar="N",
                   help="embedded stack: KV cache sized for N requests of the workload and max_batch 4N, so memory, not the batch, limits (default 6; 0 keeps the stack's own)")
    p.add_argument("--requests-per-slot", type=int, default=None, metavar="N", help="requests per concurrency slot at each level (default 3, --quick 2)")
    p.add_argument("--ttft-p99", type=float, default=2000.0, metavar="MS", help="TTFT P99 criterion of the capacity search (default 2000 ms)")


def preemption(runs) -> dict[str, float | None]:
    per = [(e.get("deltatap.engine.preemptions") or 0) for r in runs for e in r.engine.values()]
    if not per:
        return {"rate": None, "recovery": None, "events": None}
    ok = {r["trace_id"] for run in runs for r in run.records if r["status"] == "ok"}
    pre = [t for run in runs for t, e in run.engine.items() if (e.get("deltatap.engine.preemptions") or 0) > 0]
    return {"rate": len(pre) / len(per), "recovery": (sum(1 for t in pre if t in ok) / len(pre)) if pre else None, "events": float(sum(per))}


async def _levels(ctx: BenchContext, a: argparse.Namespace) -> tuple[int, list]:
    per_slot = a.requests_per_slot or (2 if ctx.quick else 3)
    cap = a.capacity
    if cap is None:
        model = ctx.harness.engine_model()
        hi = model.max_batch if model is not None else 64  # memory, not the batch, limits before max_batch
        ctx.say(f"capacity search first (§5.8.3 step 1, TTFT P99 <= {a.ttft_p99:g} ms)")
        found, _tried = await search(ctx, 1, hi, a.ttft_p99, per_slot, tag="capacity search: ")
        cap = found or 1
        ctx.notes.append(f"Capacity {cap} concurrent requests, found by the §5.5 search (completion >= 99 %, TTFT P99 <= {a.ttft_p99:g} ms).")
    else:
        ctx.notes.append(f"Capacity {cap} concurrent requests (given with --capacity).")
    levels = []
    for f in fractions(a.levels):
        c = max(1, round(cap * f))
        m, runs = await ctx.level(f"{f:.0%} ({c} concurrent)", c, {"load": ctx.closed_loop(c, c * per_slot)}, tag=f"over-{f:g}")
        m.extra.update(preemption(runs), oversubscription=f)
        levels.append(m)
    return cap, levels


async def run(ctx: BenchContext) -> Report:
    a = ctx.args
    h = ctx.harness
    per_req = a.input_tokens + a.output_tokens
    if h.embedded and a.kv_sequences > 0:
        kv = int(a.kv_sequences * per_req) + 1
        over = {"engine": {"scheduler": {"kv_capacity_tokens": kv, "max_batch": max(4, int(4 * a.kv_sequences))}}}
        ctx.notes.append(f"Memory-limited variant of the stack: KV cache {kv} tokens (room for {a.kv_sequences:g} requests of {per_req} tokens), "
                         f"max_batch {over['engine']['scheduler']['max_batch']}: running out of KV preempts the newest sequence, which recomputes later.")
        async with h.variant("memory-limited", over):
            cap, levels = await _levels(ctx, a)
            model = h.engine_model()
    else:
        cap, levels = await _levels(ctx, a)
        model = h.engine_model()
    t = Table("degradation", "Memory pressure degradation (methodology §5.8.5, table 11)", [
        Column("level", "Oversubscription"), Column("concurrency", "Concurrency", "", 0), Column("complete", "Complete", "%", 1), Column("preempt", "Preempt", "%", 1),
        Column("fail", "Fail Rate", "%", 1), Column("ttft_p99_ms", "TTFT P99", "ms", 0), Column("recovery", "Preemption recovery", "%", 1),
        Column("events", "Preemption events", "", 0), Column("goodput_rps", "Goodput", "req/s", 2)])
    for m in levels:
        t.add(f"{m.extra['oversubscription']:.0%}", int(m.x), m.success_rate, m.extra["rate"], m.error_rate, m.ttft.p99, m.extra["recovery"], m.extra["events"], m.goodput_rps)
    notes = ["Preemption rate: requests preempted at least once / requests (the engine's per-request count, embedded stack); "
             "recovery: preempted requests that still completed. Preemption loss (tokens discarded per preemption) is not measured."]
    if levels[0].extra["rate"] is None:
        notes[0] = "Preemptions are not visible from outside the engine: the Preempt and recovery columns are empty for an external target."
    if model is not None and h.embedded:
        notes.append(f"Configured truth: KV capacity {model.kv_capacity_tokens} tokens = {model.kv_capacity_tokens / per_req:.1f} requests of {per_req} tokens at their full length.")
    first = next((i for i, m in enumerate(levels) if (m.extra["rate"] or 0) > 0 or m.success_rate < 0.99), None)
    sentence = knee_attribution(levels, first, what="First degraded level")
    res = Section("results", "Memory pressure (methodology §5.8)", tables=[t], notes=notes + [sentence] + summary_notes(levels, ctx.slos))
    res.figures.append(plots.curve(levels, "concurrency", first, None))
    comp = Section("components", "Per-component decomposition at every level", tables=[x for x in (decomposition_by_level(levels, "p50"), decomposition_by_level(levels, "p99")) if x], notes=[sentence])
    ctx.require("5.8.3", "run per level", ">= 120 s", f"{max(m.duration_s for m in levels):.0f} s", min(m.duration_s for m in levels) >= 120)
    ctx.require("5.8.3", "capacity from §5.5", "measured", "given" if a.capacity else "measured", True)
    ctx.require("6.3", "independent runs", ">= 3", str(ctx.reps), ctx.reps >= 3)
    ctx.data.update(capacity=cap, levels=[m.as_dict() for m in levels])
    return Report("deltatap bench memory-pressure", sections=[config_section(ctx, NAME, SECTION, {"Levels": a.levels, "Capacity": cap}), res, comp, compliance_section(ctx)])
