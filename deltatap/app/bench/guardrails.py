"""§5.10 Guardrail overhead: the same benign load through four firewall configurations - baseline (no filtering),
input filter, output filter, full - at 25/50/75 % of capacity; tables 13 and 14 per level and the overheads."""

from __future__ import annotations

import argparse

from deltatap.app.bench.common import BenchContext, compliance_section, config_section, decomposition_by_level, summary_notes
from deltatap.app.bench.throughput_latency import fractions
from deltatap.collector.reports.guardrail_compare import latency_table, overhead_table, throughput_table
from deltatap.collector.reports.model import Report, Section

NAME = "guardrails"
SECTION = "5.10"
HELP = "guardrail overhead: baseline, input, output and full filtering at 25, 50 and 75 percent of capacity (§5.10)"
CONFIGS = {  # label -> firewall overrides (the labels are deltatap guardrails' run labels)
    "baseline": {"inbound": {"enabled": False}, "outbound": {"enabled": False}},
    "input": {"inbound": {"enabled": True}, "outbound": {"enabled": False}},
    "output": {"inbound": {"enabled": False}, "outbound": {"enabled": True}},
    "full": {"inbound": {"enabled": True}, "outbound": {"enabled": True}},
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--levels", default=None, help="load levels as fractions of capacity (default 0.25,0.5,0.75; --quick 0.5)")
    p.add_argument("--duration", type=float, default=None, metavar="S", help="seconds of arrivals per level and configuration (default 6, --quick 2)")


async def run(ctx: BenchContext) -> Report:
    a = ctx.args
    fr = fractions(a.levels or ("0.5" if ctx.quick else "0.25,0.5,0.75"))
    duration = a.duration or (2.0 if ctx.quick else 6.0)
    cap = await ctx.capacity_rps()  # of the stack as configured (full filtering)
    wl = {"workload": "firewall", "params": {"mix": {"benign": 1.0, "adversarial": 0.0, "trigger": 0.0}, "output": {"dist": "fixed", "value": a.output_tokens}}}
    rows: dict[float, dict[str, list]] = {f: {} for f in fr}
    metrics: dict[str, list] = {}
    for label, fw in CONFIGS.items():
        async with ctx.harness.variant(label, {"firewall": fw}):
            for f in fr:
                rate = f * cap
                m, runs = await ctx.level(f"{label} at {f:.0%} ({rate:.2f} req/s)", rate, {"load": ctx.open_loop(rate, duration, workload=wl)}, offered_rps=rate, tag=f"{label}-{f:g}")
                rows[f][label] = [row for r in runs for row in r.rows]
                metrics.setdefault(label, []).append(m)
    topo = ctx.harness.topology
    res = Section("results", "Guardrail overhead (methodology §5.10)")
    for f in fr:
        res.tables.append(_retitle(latency_table(rows[f], topo), f))
        res.tables.append(_retitle(throughput_table(rows[f], topo, "baseline"), f))
        ov = overhead_table(rows[f], topo, "baseline")
        if ov is not None:
            res.tables.append(_retitle(ov, f))
    mid = fr[len(fr) // 2]
    ov = overhead_table(rows[mid], topo, "baseline")
    data = {}
    if ov is not None:
        data = {r["configuration"]: r for r in ov.records()}
    fwc = ctx.harness._configs()[1] if ctx.harness.embedded else None
    notes = ["Benign traffic only (the firewall workload with every prompt benign): the overhead is inspection cost, not blocking."]
    if fwc is not None:
        notes.append(f"Configured truth: inbound inspection {fwc.inbound.cost.fixed.fixed_ms:g} ms per request, outbound {fwc.outbound.cost.fixed.fixed_ms:g} ms per "
                     f"{fwc.outbound.window_tokens}-token window ({fwc.outbound.mode}).")
    all_levels = [m for ms in metrics.values() for m in ms]
    res.notes += notes + summary_notes(all_levels, ctx.slos)
    res.data = {"overhead_at_mid_level": data}
    comp = Section("components", "Per-component decomposition per configuration and level", tables=[t for t in (decomposition_by_level(all_levels, "p50"),) if t],
                   notes=["The AI Firewall lines carry the inspection cost; the other lines should not move between configurations."])
    ctx.require("5.10.2", "load levels", "25 %, 50 %, 75 % of capacity", ", ".join(f"{f:.0%}" for f in fr), fr == [0.25, 0.5, 0.75])
    ctx.require("5.10.2", "configurations", "baseline, input, output, full", ", ".join(CONFIGS), True)
    ctx.require("6.3", "independent runs", ">= 3", str(ctx.reps), ctx.reps >= 3)
    ctx.data.update(res.data, levels=[m.as_dict() for m in all_levels])
    return Report("deltatap bench guardrails", sections=[config_section(ctx, NAME, SECTION, {"Levels": ", ".join(f"{f:.0%}" for f in fr), "Duration": f"{duration:g} s"}),
                                                    res, comp, compliance_section(ctx)])


def _retitle(t, f: float):
    t.name = f"{t.name}_{int(round(f * 100))}"
    t.title = f"{t.title} - at {f:.0%} of capacity"
    return t
