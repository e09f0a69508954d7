"""The decomposition table (profiles draft section 6 format) and the per-delta percentile table.

Decomposition: one line per component in path order - each intermediary's inbound contribution,
the engine's TTFT as the baseline, each intermediary's outbound contribution (footnoted: it adds to
client-observed TTFT, not engine TTFT) - then the taps' overhead, the residual (network +
interaction effects), and the total. Contributions are the chosen statistic (p50 by default) of
each delta. Throughput impact needs a run without the component; it is shown when given
(``throughput_impact``: component -> fraction) and otherwise as "n/a".

Renderers (a registry): ``rich`` (a rich.Table), ``markdown``, ``csv``, ``json``.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rich.table import Table

from deltatap.collector.deltas import ENGINE_TTFT, RESIDUAL, SYSTEM_TTFT, TAP, delta_defs, intermediaries
from deltatap.collector.sketches import Aggregator
from deltatap.core.topology import Topology
from deltatap.core.vocab import ComponentKind

FOOTNOTE = "*Outbound adds to client-observed TTFT, not engine TTFT"
_DISPLAY = {ComponentKind.GATEWAY: "AI Gateway", ComponentKind.FIREWALL: "AI Firewall", ComponentKind.ENGINE: "Model Engine"}


@dataclass(frozen=True)
class DecompLine:
    component: str
    delta: str | None
    ttft_ms: float | None
    throughput_impact: float | None
    note: str = ""


def _name(topo: Topology, comp: str) -> str:
    kind = topo.component(comp).kind
    return _DISPLAY.get(kind, comp.replace("_", " ").title()) if sum(1 for c in topo.components if c.kind == kind) == 1 else comp


def decomposition(agg: Aggregator, topo: Topology, stat: str = "p50_ms", throughput_impact: dict[str, float] | None = None) -> list[DecompLine]:
    ti = throughput_impact or {}
    val = lambda d: (agg.summary(d) or {}).get(stat)  # noqa: E731
    lines: list[DecompLine] = []
    reg = delta_defs(topo)
    mids = intermediaries(topo)
    for m in mids:
        d = reg.named("inbound", m)
        lines.append(DecompLine(f"{_name(topo, m)} (in)" if topo.component(m).kind == ComponentKind.FIREWALL else _name(topo, m), d, val(d), ti.get(m)))
    eng = topo.engine.name
    d = ENGINE_TTFT
    lines.append(DecompLine(_name(topo, eng), d, val(d), ti.get(eng), "baseline"))
    for m in reversed(mids):
        d = reg.named("outbound", m)
        lines.append(DecompLine(f"{_name(topo, m)} (out)", d, val(d), ti.get(m), "outbound"))
    taps = [d.name for d in reg.of_phase(TAP) if d.name in agg.deltas]
    if taps:
        lines.append(DecompLine("deltatap taps", None, sum(v for v in (val(t) for t in taps) if v is not None), None, "tap overhead"))
    d = RESIDUAL
    lines.append(DecompLine("Residual (network + interaction)", d, val(d), None, "residual"))
    return lines


def _fmt_ms(v: float | None, plus: bool) -> str:
    if v is None:
        return "n/a"
    return f"{'+' if plus and v >= 0 else ''}{v:.2f}ms"


def _fmt_ti(v: float | None) -> str:
    return "n/a" if v is None else f"{v * 100:+.0f}%"


def table_rows(lines: list[DecompLine], agg: Aggregator, stat: str = "p50_ms") -> list[list[str]]:
    out = []
    for ln in lines:
        if ln.note == "baseline":
            ttft = f"{_fmt_ms(ln.ttft_ms, False)} (baseline)"
            ti = "baseline" if ln.throughput_impact is None else _fmt_ti(ln.throughput_impact)
        else:
            ttft = _fmt_ms(ln.ttft_ms, True) + ("*" if ln.note == "outbound" and ln.ttft_ms is not None else "")
            ti = _fmt_ti(ln.throughput_impact)
        out.append([ln.component, ttft, ti])
    total = sum(ln.ttft_ms for ln in lines if ln.ttft_ms is not None and ln.note != "residual")
    st = (agg.summary(SYSTEM_TTFT) or {}).get(stat)
    out.append(["Total", f"{total:.2f}ms" + (f" (system TTFT {st:.2f}ms)" if st is not None else ""), "n/a"])
    return out


HEADER = ["Component", "TTFT Contribution", "Throughput Impact"]


def render_rich(lines: list[DecompLine], agg: Aggregator, stat: str = "p50_ms") -> Table:
    t = Table(title=f"Delta decomposition ({stat.removesuffix('_ms')}, {agg.rows} requests)", caption=FOOTNOTE)
    for h in HEADER:
        t.add_column(h, justify="left" if h == "Component" else "right", overflow="fold")
    rows = table_rows(lines, agg, stat)
    for i, r in enumerate(rows):
        t.add_row(*r, end_section=i == len(rows) - 2)
    return t


def render_markdown(lines: list[DecompLine], agg: Aggregator, stat: str = "p50_ms") -> str:
    rows = table_rows(lines, agg, stat)
    out = ["| " + " | ".join(HEADER) + " |", "|---|---:|---:|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out) + f"\n\n{FOOTNOTE}\n"


def render_csv(lines: list[DecompLine], agg: Aggregator, stat: str = "p50_ms") -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["component", "delta", f"ttft_contribution_{stat}", "throughput_impact", "note"])
    for ln in lines:
        w.writerow([ln.component, ln.delta or "", "" if ln.ttft_ms is None else f"{ln.ttft_ms:.6f}", "" if ln.throughput_impact is None else ln.throughput_impact, ln.note])
    return buf.getvalue()


def render_json(lines: list[DecompLine], agg: Aggregator, stat: str = "p50_ms") -> str:
    doc = {"statistic": stat, "requests": agg.rows, "footnote": FOOTNOTE,
           "components": [{"component": ln.component, "delta": ln.delta, "ttft_ms": ln.ttft_ms, "throughput_impact": ln.throughput_impact, "note": ln.note} for ln in lines]}
    return json.dumps(doc, indent=2)


RENDERERS: dict[str, Callable[..., Any]] = {"rich": render_rich, "markdown": render_markdown, "csv": render_csv, "json": render_json}


# ---- the percentile table over every delta -----------------------------------------------

STAT_COLUMNS = ["p50_ms", "p90_ms", "p95_ms", "p99_ms", "p999_ms", "mean_ms", "min_ms", "max_ms", "count", "error_bound_ms"]


def summary_json(agg: Aggregator, topo: Topology) -> str:
    """delta -> {p50_ms, p90_ms, p95_ms, p99_ms, p999_ms, mean_ms, min_ms, max_ms, count, error_bound_ms}."""
    return json.dumps(agg.summaries([d.name for d in delta_defs(topo)]), indent=2)


def summary_csv(agg: Aggregator, topo: Topology) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["delta", *STAT_COLUMNS])
    for name, s in agg.summaries([d.name for d in delta_defs(topo)]).items():
        w.writerow([name, *("" if s[c] is None else s[c] for c in STAT_COLUMNS)])
    return buf.getvalue()


def summary_markdown(agg: Aggregator, topo: Topology) -> str:
    out = ["| delta | P50 | P90 | P95 | P99 | P99.9 | mean | min | max | count | ± clock |", "|---|" + "---:|" * 10]
    for name, s in agg.summaries([d.name for d in delta_defs(topo)]).items():
        cells = ["" if s[c] is None else (str(s[c]) if c == "count" else f"{s[c]:.3f}") for c in STAT_COLUMNS]
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n\nAll values in ms; quantiles from mergeable sketches (relative accuracy "+ f"{agg.alpha:.1%}).\n"


def summary_rich(agg: Aggregator, topo: Topology) -> Table:
    """Every delta's percentiles as a rich table. Cells fold onto further lines when the terminal is
    too narrow, never cropped: a cropped "1395.443" reads "139…" and puts P95 below P90."""
    t = Table(title="Per-delta latency (ms)")
    t.add_column("delta", overflow="fold")
    for c in ["P50", "P90", "P95", "P99", "P99.9", "mean", "min", "max", "count", "± clock"]:
        t.add_column(c, justify="right", overflow="fold")
    for name, s in agg.summaries([d.name for d in delta_defs(topo)]).items():
        t.add_row(name, *("" if s[c] is None else (str(s[c]) if c == "count" else f"{s[c]:.3f}") for c in STAT_COLUMNS))
    return t
