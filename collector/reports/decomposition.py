"""Where the time goes: the headline, the decomposition per percentile, the §6 table and every delta's percentiles.

* **headline** (first in every format): system TTFT P50 and P99 and, at each, the share of every
  component, of the taps' own overhead and of the residual. A share is the mean contribution of the
  requests *around* that percentile of system TTFT (a band of ranks), so the parts of one bar add
  up to the system TTFT of the requests it describes; percentiles of the parts would not (a P50 of
  each delta sums to anything). Refused requests (no first token) are left out and counted.
* **decomposition**: the profiles draft §6 table, the collector's own arithmetic
  (:mod:`deltatap.collector.table` over :class:`collector.sketches.Aggregator`).
* **percentiles**: every delta over the requests it describes (:mod:`deltatap.collector.applies`):
  a block latency over blocked requests, a last-token delay over completed streams.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from deltatap.collector.applies import REASONS, applicable_rows, exclusion_reason, is_signed, ttft_view
from deltatap.collector.reports.columns import delta_ms
from deltatap.collector.reports.colors import RESIDUAL, TAPS, component_colors
from deltatap.collector.reports.model import Column, Section, Table
from deltatap.collector.reports.registry import ReportInputs, register_section
from deltatap.collector.deltas import RESIDUAL as RESIDUAL_DELTA, SYSTEM_TTFT, TAP, delta_defs, intermediaries
from deltatap.collector.rows import Row
from deltatap.collector.sketches import Aggregator
from deltatap.collector.table import FOOTNOTE, decomposition
from deltatap.core.topology import Topology

_STATS = ("p50_ms", "p90_ms", "p95_ms", "p99_ms", "p999_ms", "mean_ms", "min_ms", "max_ms")
BAR_PERCENTILES = (50.0, 90.0, 99.0)  # the stacked bars
TABLE_PERCENTILES = (50.0, 99.0)  # the headline table (fits 80 columns; the bars add P90)
BAND = 0.05  # the requests within +-2.5 % of ranks around a percentile (at least one each side)


def component_parts(rows: Sequence[Row], topology: Topology) -> dict[str, np.ndarray]:
    """Per request, the ms each part adds to system TTFT: every intermediary (inbound + outbound), the
    engine's TTFT, the taps' own overhead and the residual: the TTFT terms of the delta registry, by the
    component they are charged to. Per request they sum to system TTFT."""
    terms = [d for d in delta_defs(topology) if d.ttft_term]
    out: dict[str, np.ndarray] = {}
    for m in intermediaries(topology):
        out[m] = sum((np.nan_to_num(delta_ms(rows, d.name)) for d in terms if d.component == m), np.zeros(len(rows)))
    engine = [delta_ms(rows, d.name) for d in terms if d.component == topology.engine.name]
    out[topology.engine.name] = sum(engine[1:], engine[0]) if engine else np.full(len(rows), np.nan)
    out[TAPS] = sum((np.nan_to_num(delta_ms(rows, d.name)) for d in terms if d.phase == TAP), np.zeros(len(rows)))
    out[RESIDUAL] = delta_ms(rows, RESIDUAL_DELTA)
    return out


@dataclass(frozen=True)
class Bar:
    """The decomposition of the requests around one percentile of system TTFT."""

    percentile: float
    system_ms: float  # the percentile of system TTFT itself
    band_ms: float  # mean system TTFT of the requests in the band (= the sum of ``parts``)
    requests: int  # requests in the band
    parts: dict[str, float]

    @property
    def label(self) -> str:
        return f"P{self.percentile:g}"

    def share(self, part: str) -> float:
        return self.parts[part] / self.band_ms if self.band_ms else float("nan")

    def largest(self) -> tuple[str, float]:
        name = max((k for k in self.parts if k not in (TAPS, RESIDUAL)), key=lambda k: self.parts[k])
        return name, self.parts[name]


@dataclass(frozen=True)
class Decomposed:
    bars: list[Bar]
    kept: int
    excluded: object  # applies.Excluded

    def bar(self, p: float) -> Bar | None:
        return next((b for b in self.bars if b.percentile == p), None)


def decompose_percentiles(rows: Sequence[Row], topology: Topology, percentiles: Sequence[float] = BAR_PERCENTILES) -> Decomposed:
    keep, excluded = ttft_view(rows)
    kept_rows = [r for r, k in zip(rows, keep, strict=True) if k]
    system = delta_ms(kept_rows, SYSTEM_TTFT)
    parts = component_parts(kept_rows, topology)
    ok = np.isfinite(system) & np.isfinite(parts[RESIDUAL]) & np.isfinite(parts[topology.engine.name])
    bars: list[Bar] = []
    n = int(ok.sum())
    if n:
        order = np.flatnonzero(ok)[np.argsort(system[ok], kind="stable")]
        half = max(1.0, BAND * n / 2)
        for p in percentiles:
            rank = p / 100 * (n - 1)
            lo, hi = int(np.floor(max(0.0, rank - half))), int(np.ceil(min(n - 1.0, rank + half)))
            band = order[lo : hi + 1]
            bars.append(Bar(p, float(np.percentile(system[ok], p)), float(system[band].mean()), int(band.size),
                            {k: float(v[band].mean()) for k, v in parts.items()}))
    return Decomposed(bars, n, excluded)


def _part_title(name: str, topology: Topology) -> str:
    if name == TAPS:
        return "taps (own overhead)"
    if name == RESIDUAL:
        return "residual (network)"
    kind = str(topology.component(name).kind)
    return name if kind == name else f"{name} ({kind})"


@register_section
class HeadlineSection:
    name = "headline"
    order = 5
    title = "Where the time goes"

    def build(self, inputs: ReportInputs) -> Section | None:
        if not inputs.rows:
            return None
        d = decompose_percentiles(inputs.rows, inputs.topology)
        if not d.bars:  # say so first, rather than open on the details
            return Section(self.name, self.title, notes=[f"No request of {len(inputs.rows)} can be decomposed (none with a first token and every delta "
                                                         f"of its path). {d.excluded.sentence('Requests')}"],
                           data={"kept": 0, "excluded": {"refused": d.excluded.refused, "cut": d.excluded.cut, "other": d.excluded.other}, "bars": []})
        shown = [b for b in d.bars if b.percentile in TABLE_PERCENTILES]
        cols = [Column("part", "Part")]
        for b in shown:
            cols += [Column(f"{b.label.lower()}_ms", b.label, "ms", 2), Column(f"{b.label.lower()}_share", "share", "%", 0)]
        t = Table("headline", "System TTFT by part, requests around each percentile", cols)
        for part in d.bars[0].parts:
            cells: list = [_part_title(part, inputs.topology)]
            for b in shown:
                cells += [b.parts[part], b.share(part)]
            t.add(*cells)
        total: list = [delta_defs(inputs.topology).by_name[SYSTEM_TTFT].titled]
        for b in shown:
            total += [b.band_ms, 1.0]
        t.add(*total)
        t.footnotes.append(
            "Each column is the mean of the requests ranked within ±2.5 % of that percentile of system TTFT "
            f"({', '.join(f'{b.label}: {b.requests}' for b in shown)} requests), so the parts add up to their system TTFT. "
            + d.excluded.sentence("Requests")
        )
        p50, p99 = d.bar(50.0), d.bar(99.0)
        sec = Section(self.name, self.title, tables=[t])
        top, ms = p50.largest()
        sec.notes.append(f"System TTFT P50 {p50.system_ms:.1f} ms, P99 {p99.system_ms:.1f} ms over {d.kept} requests with a first token.")
        sec.notes.append(f"Costs most: {_part_title(top, inputs.topology)}, {ms:.1f} ms of {p50.band_ms:.1f} ms at P50 ({p50.share(top):.0%})"
                         + (f" and {p99.parts[top]:.1f} ms of {p99.band_ms:.1f} ms at P99 ({p99.share(top):.0%})." if p99 else "."))
        rest = [k for k in p50.parts if k != top]
        sec.notes.append("Then " + "; ".join(f"{_part_title(k, inputs.topology)} {p50.parts[k]:.1f} ms ({p50.share(k):.0%})" for k in rest) + " at P50.")
        if d.excluded.total:
            sec.notes.append(d.excluded.sentence("Left out of these figures"))
        sec.data = {"colors": component_colors(inputs.topology), "kept": d.kept, "excluded": {"refused": d.excluded.refused, "cut": d.excluded.cut, "other": d.excluded.other},
                    "bars": [{"percentile": b.percentile, "system_ms": b.system_ms, "band_ms": b.band_ms, "requests": b.requests, "parts_ms": b.parts} for b in d.bars]}
        return sec


@register_section
class DecompositionSection:
    name = "decomposition"
    order = 20
    title = "Delta decomposition"

    def build(self, inputs: ReportInputs) -> Section | None:
        if not inputs.rows:
            return None
        keep, excluded = ttft_view(inputs.rows)
        rows = applicable_rows([r for r, k in zip(inputs.rows, keep, strict=True) if k], delta_defs(inputs.topology))
        if not rows:
            return None
        agg = Aggregator()
        agg.add_rows(rows)
        lines = decomposition(agg, inputs.topology)
        t = Table(
            "decomposition",
            f"Delta decomposition (P50, {agg.rows} requests)",
            [Column("component", "Component"), Column("delta", "Delta"), Column("ttft_ms", "TTFT contribution", "ms", 2), Column("note", "Note")],
            footnotes=[FOOTNOTE, excluded.sentence(f"Of {len(inputs.rows)} requests")],
        )
        for ln in lines:
            t.add(ln.component, ln.delta or "", ln.ttft_ms, ln.note)
        total = sum(ln.ttft_ms for ln in lines if ln.ttft_ms is not None and ln.note != "residual")
        system = (agg.summary(SYSTEM_TTFT) or {}).get("p50_ms")
        t.add("Total", "", total, "" if system is None else f"system TTFT P50 {system:.2f} ms")
        sec = Section(self.name, self.title, tables=[t])
        outcomes = ", ".join(f"{k} {v}" for k, v in sorted(_outcomes(inputs.rows).items()))
        sec.notes.append(f"{len(inputs.rows)} requests ({outcomes}); {agg.rows} with a first token are decomposed. Contributions are "
                         "P50s of each delta, so they need not add up to the system TTFT P50; the residual is network time plus interaction effects.")
        return sec


def _outcomes(rows: Sequence[Row]) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in rows:
        out[r.outcome] = out.get(r.outcome, 0) + 1
    return out


@register_section
class PercentilesSection:
    name = "percentiles"
    order = 25
    title = "Every delta: percentiles"

    def build(self, inputs: ReportInputs) -> Section | None:
        if not inputs.rows:
            return None
        defs = delta_defs(inputs.topology)
        agg = Aggregator()
        agg.add_rows(applicable_rows(inputs.rows, defs))
        order = [d.name for d in defs]
        pt = Table(
            "deltas",
            "Every delta: percentiles (methodology §5.1.4), error bound and the values stated as intervals",
            [Column("delta", "Delta"), Column("count", "Count", "", 0), *[Column(s, s.removesuffix("_ms").upper().replace("P999", "P99.9"), "ms", 2) for s in _STATS],
             Column("error_bound_ms", "Error bound", "ms", 3), Column("bounded_pct", "Bounded", "%", 1), Column("bound_max_ms", "Widest", "ms", 3)],
        )
        any_bounded = False
        unbounded: list[str] = []
        for name, s in agg.summaries(order).items():
            share = s.get("bounded_share")
            any_bounded = any_bounded or bool(share)
            if s.get("unbounded_share"):
                unbounded.append(f"{name} {100 * s['unbounded_share']:.1f} %")
            pt.add(name, s.get("count"), *[s.get(k) for k in _STATS], s.get("error_bound_ms"), None if share is None else 100 * share, s.get("bound_max_ms"))
        pt.footnotes.append("Error bound: the largest of any value (clock uncertainty across hosts, plus stamp intervals). Bounded: the share of "
                            "values with a point deltatap could only place in an interval (a read that may have waited in the socket without "
                            "a packet socket, a write that may have left later; docs/tap.md), Widest: that interval's largest part of the bound."
                            + ("" if any_bounded else " Every point of this run was exact."))
        if unbounded:  # (a write no later observation saw leave: its delta has no bound, counted apart from the widths)
            pt.footnotes.append("Unbounded (a point deltatap could not bound at all: a write TCP still held, never seen to leave; "
                                "docs/records.md): " + ", ".join(unbounded) + ".")
        left: dict[str, int] = {}
        for r in inputs.rows:
            for d in defs:
                if d.name in r.deltas and d.phase != TAP:
                    why = exclusion_reason(r, d)
                    if why:
                        left[why] = left.get(why, 0) + 1
        if left:
            pt.footnotes.append("Values left out (they describe no latency of their request): "
                                + "; ".join(f"{n} for {REASONS[k]}" for k, n in sorted(left.items())) + ".")
        signed = [d.name for d in defs if is_signed(d)]
        pt.footnotes.append(f"Signed by nature (may be negative): {', '.join(signed)}; every other delta is a duration.")
        return Section(self.name, self.title, tables=[pt], notes=["Quantiles from the collector's mergeable sketches (relative accuracy 0.5%)."])
