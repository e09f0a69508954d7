"""§5.7 Prefix-cache effectiveness: the same shared-prefix workload with the cache disabled, then enabled cold (empty
cache) and warm (the same requests again); TTFT per configuration (table 10), TTFT reduction, cache hit rate and
throughput improvement."""

from __future__ import annotations

import argparse

from deltatap.app.bench import plots
from deltatap.app.bench.common import BenchContext, compliance_section, config_section, decomposition_by_level, summary_notes
from deltatap.collector.reports.model import Column, Report, Section, Table

NAME = "prefix-cache"
SECTION = "5.7"
REPETITIONS = 3  # §6.3: at least 3 independent runs
HELP = "prefix-cache effectiveness: cache disabled vs cold vs warm, TTFT reduction and hit rate (§5.7)"
OUTPUT_TOKENS = 16


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prefix-tokens", type=int, default=1024, metavar="N", help="shared prefix length in tokens (default 1024)")
    p.add_argument("--sharing", type=float, default=0.9, metavar="F", help="fraction of requests sharing a prefix (default 0.9)")
    p.add_argument("--contexts", type=int, default=2, metavar="N", help="distinct shared prefixes (default 2)")
    p.add_argument("--requests", type=int, default=None, metavar="N", help="requests per configuration (default 60, --quick 16)")
    p.add_argument("--concurrency", type=int, default=2, metavar="N", help="closed-loop concurrency (default 2)")


def hit_rate(runs) -> float | None:
    """Fraction of prompt tokens served from the cache, from the engine's own per-request counts (embedded stack)."""
    pairs = [(e.get("deltatap.engine.cache_n") or 0, e.get("deltatap.engine.prompt_n") or 0) for r in runs for e in r.engine.values()]
    total = sum(p for _, p in pairs)
    return sum(c for c, _ in pairs) / total if total else None


async def run(ctx: BenchContext) -> Report:
    a = ctx.args
    n = a.requests or (16 if ctx.quick else 60)
    wl = {"workload": "code-completion", "params": {"contexts": a.contexts, "context_tokens": {"dist": "fixed", "value": a.prefix_tokens},
                                                    "shared_fraction": a.sharing, "output": {"dist": "fixed", "value": a.output_tokens}}}
    load = {"load": ctx.closed_loop(a.concurrency, n, workload=wl)}
    configs = []
    if ctx.harness.embedded:
        async with ctx.harness.variant("cache disabled", {"engine": {"scheduler": {"prefix_cache": False}}}):
            m, runs = await ctx.level("Cache Disabled", 0, load, tag="disabled")
            configs.append(("Cache Disabled", m, hit_rate(runs)))
        # the harness restarted the stack with its own config: an empty cache
        ctx.notes.append("Cache Disabled ran on the stack restarted with prefix_cache: false; Cache (Cold) on a fresh stack with the cache on; Cache (Warm) the same requests again.")
    else:
        ctx.notes.append("External target: the cache cannot be switched off from here - the Cache Disabled row is missing (run the target without its cache and compare).")
    m, runs = await ctx.level("Cache (Cold)", 1, load, reps=1, tag="cold")
    configs.append(("Cache (Cold)", m, hit_rate(runs)))
    m, runs = await ctx.level("Cache (Warm)", 2, load, tag="warm")
    configs.append(("Cache (Warm)", m, hit_rate(runs)))
    t = Table("cache", "Cache effectiveness (methodology §5.7.5, table 10)", [
        Column("configuration", "Configuration"), Column("ttft_p50_ms", "TTFT P50", "ms", 1), Column("ttft_p95_ms", "TTFT P95", "ms", 1), Column("ttft_p99_ms", "TTFT P99", "ms", 1),
        Column("hit_rate", "Cache hit rate", "%", 1), Column("output_tok_s", "Throughput", "tok/s", 1), Column("error_rate", "Error rate", "", 3), Column("requests", "Requests", "", 0)])
    for label, m, h in configs:
        t.add(label, m.ttft.p50, m.ttft.p95, m.ttft.p99, h, m.output_tok_s, m.error_rate, m.sent)
    base = configs[0][1]
    warm = configs[-1][1]
    red = (base.ttft.p50 - warm.ttft.p50) / base.ttft.p50 if base.ttft.p50 > 0 else float("nan")
    thr = (warm.output_tok_s - base.output_tok_s) / base.output_tok_s if base.output_tok_s > 0 else float("nan")
    ref = configs[0][0]
    notes = [f"TTFT reduction (P50, warm vs {ref}): {red:.1%}; throughput improvement: {thr:+.1%}.",
             f"Workload: code-completion (A.4), {a.contexts} shared prefixes of {a.prefix_tokens} tokens, {a.sharing:.0%} of requests share one; closed loop at concurrency {a.concurrency}."]
    if configs[-1][2] is not None:
        notes.append(f"Cache hit rate (prompt tokens served from the cache, the engine's own counts): cold {configs[-2][2]:.1%}, warm {configs[-1][2]:.1%}.")
    else:
        notes.append("Cache hit rate: not measurable from outside the engine (needs the engine's per-request cached-token count).")
    levels = [c[1] for c in configs]
    res = Section("results", "Prefix-cache effectiveness (methodology §5.7)", tables=[t], notes=notes + summary_notes(levels, ctx.slos),
                  data={"ttft_reduction": red, "throughput_improvement": thr, "hit_rate": {c[0]: c[2] for c in configs}})
    res.figures.append(plots.bars([c[0] for c in configs], {"TTFT P50": [c[1].ttft.p50 for c in configs], "TTFT P99": [c[1].ttft.p99 for c in configs]}, "ms", "cache", "TTFT by cache configuration"))
    comp = Section("components", "Per-component decomposition per configuration", tables=[t for t in (decomposition_by_level(levels, "p50"),) if t],
                   notes=["The cache acts inside the Model Engine line (its prefill); the other components stay where they were."])
    ctx.require("5.7.2", "comparison mode", "cache disabled and enabled", "both" if ctx.harness.embedded else "enabled only", ctx.harness.embedded)
    ctx.require("5.7.2", "workload", "Code Completion (A.4) recommended", "code-completion", True)
    ctx.require("6.3", "independent runs", ">= 3", str(ctx.reps), ctx.reps >= 3)
    ctx.data.update(res.data, levels=[m.as_dict() for m in levels])
    return Report("deltatap bench prefix-cache", sections=[config_section(ctx, NAME, SECTION, {"Requests per configuration": n}), res, comp, compliance_section(ctx)])
