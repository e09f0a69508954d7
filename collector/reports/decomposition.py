"""The decomposition table (profiles draft §6 format) and per-delta percentiles, as report sections.

The arithmetic is the collector's own (:mod:`deltatap.collector.table` over :class:`collector.sketches.Aggregator`);
this module only turns it into the report document so it renders in every format beside the rest.
"""

from __future__ import annotations

from deltatap.collector.reports.model import Column, Section, Table
from deltatap.collector.reports.registry import ReportInputs, register_section
from deltatap.collector.rows import delta_defs
from deltatap.collector.sketches import Aggregator
from deltatap.collector.table import FOOTNOTE, decomposition

_STATS = ("p50_ms", "p90_ms", "p95_ms", "p99_ms", "p999_ms", "mean_ms", "min_ms", "max_ms")


@register_section
class DecompositionSection:
    name = "decomposition"
    order = 20
    title = "Delta decomposition"

    def build(self, inputs: ReportInputs) -> Section | None:
        if not inputs.rows:
            return None
        agg = Aggregator()
        agg.add_rows(inputs.rows)
        lines = decomposition(agg, inputs.topology)
        t = Table(
            "decomposition",
            f"Delta decomposition (P50, {agg.rows} requests)",
            [Column("component", "Component"), Column("delta", "Delta"), Column("ttft_ms", "TTFT contribution", "ms", 2), Column("note", "Note")],
            footnotes=[FOOTNOTE],
        )
        for ln in lines:
            t.add(ln.component, ln.delta or "", ln.ttft_ms, ln.note)
        total = sum(ln.ttft_ms for ln in lines if ln.ttft_ms is not None and ln.note != "residual")
        system = (agg.summary("system_ttft") or {}).get("p50_ms")
        t.add("Total", "", total, "" if system is None else f"system TTFT P50 {system:.2f} ms")
        sec = Section(self.name, self.title, tables=[t])
        outcomes = ", ".join(f"{k} {v}" for k, v in sorted(agg.outcomes.items()))
        sec.notes.append(f"{agg.rows} requests ({outcomes}). Contributions are P50s of each delta; the residual is network time plus interaction effects.")
        return sec


@register_section
class PercentilesSection:
    name = "percentiles"
    order = 25
    title = "Every delta: percentiles"

    def build(self, inputs: ReportInputs) -> Section | None:
        if not inputs.rows:
            return None
        agg = Aggregator()
        agg.add_rows(inputs.rows)
        order = [d.name for d in delta_defs(inputs.topology)]
        pt = Table(
            "deltas",
            "Every delta: percentiles (methodology §5.1.4) and clock error bound",
            [Column("delta", "Delta"), Column("count", "Count", "", 0), *[Column(s, s.removesuffix("_ms").upper().replace("P999", "P99.9"), "ms", 2) for s in _STATS], Column("error_bound_ms", "Error bound", "ms", 3)],
        )
        for name, s in agg.summaries(order).items():
            pt.add(name, s.get("count"), *[s.get(k) for k in _STATS], s.get("error_bound_ms"))
        return Section(self.name, self.title, tables=[pt], notes=["Quantiles from the collector's mergeable sketches (relative accuracy 0.5%)."])
