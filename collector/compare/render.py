"""A comparison as tables (terminal, Markdown), JSON and a self-contained HTML page with plots.

The tables use the reports' document model (:class:`deltatap.collector.reports.model.Table`) and cell
formatting; the HTML page embeds its plots as PNG (matplotlib, Agg), fetches nothing, and can be mailed as is.
"""

from __future__ import annotations

import base64
import io
import json
import math
from html import escape
from typing import Any

from deltatap.collector.compare.build import Comparison, Pair
from deltatap.collector.compare.stats import IMPROVEMENT, REGRESSION
from deltatap.collector.reports.fmt import fmt_cell, heading, is_missing, json_cell
from deltatap.collector.reports.model import Column, Table


def _pct_name(q: float) -> str:
    return f"P{q:g}"


def pair_table(c: Comparison, pair: Pair) -> Table:
    lvl = f"{c.level * 100:g}%"
    t = Table(
        f"compare_{pair.candidate}",
        f"{pair.candidate} vs {pair.baseline} (difference = {pair.candidate} - {pair.baseline}; {lvl} bootstrap interval, "
        f"{c.resamples} resamples, seed {c.seed}; threshold {c.threshold})",
        [Column("delta", "Delta"), Column("stat", "Stat"), Column("a_ms", pair.baseline, "ms", 3), Column("b_ms", pair.candidate, "ms", 3),
         Column("diff_ms", "Diff", "ms", 3), Column("ci_lo_ms", f"{lvl} low", "ms", 3), Column("ci_hi_ms", f"{lvl} high", "ms", 3),
         Column("mw_p", "MW p", "", 4), Column("verdict", "Verdict")],
    )
    for d in pair.deltas:
        for i, (ci, v) in enumerate(zip(d.cis, d.verdicts, strict=True)):
            t.add(d.name if i == 0 else "", _pct_name(ci.q), ci.a, ci.b, ci.diff, ci.lo, ci.hi, d.mw.p if i == 0 else None, v)
    t.footnotes.append(f"Per delta, successful requests only; MW p: two-sided Mann-Whitney U test on the per-request values "
                       f"(one p per delta). {REGRESSION}: interval wholly above 0 and the difference beyond {c.threshold}; "
                       f"{IMPROVEMENT}: the mirror image.")
    return t


def runs_table(c: Comparison) -> Table:
    t = Table("compare_runs", "Runs", [Column("label", "Run"), Column("requests", "Requests", "", 0), Column("ok", "OK", "", 0),
                                       Column("seed", "Seed"), Column("workload", "Workload bytes"), Column("hardware", "Hardware"),
                                       Column("path", "Path", whole=True)])
    for s in c.run_summaries:
        wl = s.get("workload_sha256")
        t.add(s["label"] + (" (baseline)" if s["label"] == c.baseline else ""), s["requests"], s["ok"],
              "–" if s.get("seed") is None else str(s["seed"]), wl[:12] if wl else "–", s.get("hardware") or "–", s["path"])
    return t


def headline(c: Comparison) -> list[str]:
    lines = []
    for p in c.pairs:
        regs = p.regressions()
        imps = [(d.name, ci.q) for d in p.deltas for ci, v in zip(d.cis, d.verdicts, strict=True) if v == IMPROVEMENT]
        if regs:
            lines.append(f"{p.candidate} vs {p.baseline}: {len(regs)} regression(s) beyond {c.threshold}: "
                         + ", ".join(f"{n} {_pct_name(q)}" for n, q in regs[:8]) + (" ..." if len(regs) > 8 else ""))
        else:
            lines.append(f"{p.candidate} vs {p.baseline}: no regression beyond {c.threshold}.")
        if imps:
            lines.append(f"{p.candidate} vs {p.baseline}: {len(imps)} improvement(s): " + ", ".join(f"{n} {_pct_name(q)}" for n, q in imps[:8])
                         + (" ..." if len(imps) > 8 else ""))
    for o in c.outliers:
        lines.append(f"Outlier (flagged, kept): run {o['run']}'s median {o['delta']} {o['p50_ms']:.3f} ms is beyond 3 sigma of the other runs of its cluster.")
    return lines + c.notes


def tables(c: Comparison) -> list[Table]:
    return [runs_table(c)] + [pair_table(c, p) for p in c.pairs]


def to_json(c: Comparison) -> dict[str, Any]:
    return {
        "kind": "deltatap.compare",
        "baseline": c.baseline,
        "options": {"percentiles": c.percentiles, "threshold": str(c.threshold), "confidence": c.level, "resamples": c.resamples, "seed": c.seed,
                    "method": "percentile bootstrap of the difference of percentiles (runs resampled independently); two-sided Mann-Whitney U"},
        "runs": c.run_summaries,
        "comparisons": [
            {"baseline": p.baseline, "candidate": p.candidate, "deltas": [
                {"delta": d.name, "component": d.component, "n_baseline": d.n_a, "n_candidate": d.n_b,
                 "mann_whitney": {"u": json_cell(d.mw.u), "p": json_cell(d.mw.p), "prob_candidate_slower": json_cell(d.mw.prob_b_greater)},
                 "percentiles": [{"stat": _pct_name(ci.q), "q": ci.q, "baseline_ms": json_cell(ci.a), "candidate_ms": json_cell(ci.b),
                                  "diff_ms": json_cell(ci.diff), "ci_low_ms": json_cell(ci.lo), "ci_high_ms": json_cell(ci.hi), "verdict": v}
                                 for ci, v in zip(d.cis, d.verdicts, strict=True)]}
                for d in p.deltas]}
            for p in c.pairs],
        "regressions": [{"candidate": p.candidate, "delta": n, "stat": _pct_name(q)} for p in c.pairs for n, q in p.regressions()],
        "outliers": c.outliers,
        "notes": c.notes,
    }


def render_json(c: Comparison) -> str:
    return json.dumps(to_json(c), indent=2, allow_nan=False) + "\n"


def _md_table(t: Table) -> str:
    esc = lambda s: str(s).replace("|", "\\|")  # noqa: E731
    head = "| " + " | ".join(esc(heading(col)) for col in t.columns) + " |"
    rule = "|" + "|".join("---" for _ in t.columns) + "|"
    body = ["| " + " | ".join(esc(fmt_cell(v, col)) for v, col in zip(row, t.columns, strict=True)) + " |" for row in t.rows]
    return "\n".join([f"**{t.title}**", "", head, rule, *body, *[f"\n{esc(n)}" for n in t.footnotes]])


def render_markdown(c: Comparison) -> str:
    out = ["# deltatap compare", ""]
    out += [f"- {line}" for line in headline(c)] + [""]
    for t in tables(c):
        out += [_md_table(t), ""]
    return "\n".join(out)


def print_terminal(c: Comparison, console) -> None:
    from deltatap.collector.reports.render_terminal import print_table

    for line in headline(c):
        style = "bold red" if "regression(s)" in line else "bold"
        console.print(line, style=style, highlight=False)
    for t in tables(c):
        console.print()
        print_table(console, t)


# ---- HTML -----------------------------------------------------------------------------------------


def _png(fig) -> bytes:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def forest_plot(c: Comparison, pair: Pair) -> bytes | None:
    """Every delta x percentile: the difference with its interval, the threshold band shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    items = [(f"{d.name} {_pct_name(ci.q)}", ci, v) for d in pair.deltas for ci, v in zip(d.cis, d.verdicts, strict=True) if math.isfinite(ci.diff)]
    if not items:
        return None
    fig, ax = plt.subplots(figsize=(9, 0.28 * len(items) + 1.2))
    colors = {REGRESSION: "#c0392b", IMPROVEMENT: "#27ae60"}
    for i, (_name, ci, v) in enumerate(items):
        y = len(items) - 1 - i
        col = colors.get(v, "#34495e")
        ax.plot([ci.lo, ci.hi], [y, y], color=col, lw=2)
        ax.plot([ci.diff], [y], "o", color=col, ms=4)
    ax.axvline(0, color="#888", lw=1)
    if not c.threshold.relative:
        ax.axvspan(-c.threshold.value, c.threshold.value, color="#f1c40f", alpha=0.15, lw=0, label=f"threshold ±{c.threshold}")
        ax.legend(loc="lower right", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)  # above the plot, clear of the points
    ax.set_yticks(range(len(items)))
    ax.set_yticklabels([n for n, _, _ in reversed(items)], fontsize=7)
    ax.set_xlabel(f"{pair.candidate} - {pair.baseline} (ms), {c.level * 100:g}% bootstrap interval")
    ax.set_title(f"{pair.candidate} vs {pair.baseline}")
    ax.grid(axis="x", alpha=0.3)
    return _png(fig)


def ecdf_plot(c: Comparison, pair: Pair, max_deltas: int = 12) -> bytes | None:
    """Per delta, the two runs' empirical distributions (per-request values)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    ds = [d for d in pair.deltas if d.a_ms.size and d.b_ms.size][:max_deltas]
    if not ds:
        return None
    cols = 3
    rows = (len(ds) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(10, 2.4 * rows), squeeze=False)
    for ax, d in zip(axes.flat, ds, strict=False):
        for vals, label, color in ((d.a_ms, pair.baseline, "#2980b9"), (d.b_ms, pair.candidate, "#e67e22")):
            v = np.sort(vals)
            ax.step(v, np.arange(1, v.size + 1) / v.size, where="post", label=label, color=color, lw=1.2)
        ax.set_title(d.name, fontsize=8)
        ax.tick_params(labelsize=7)
        ax.set_xlabel("ms", fontsize=7)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(ds):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.suptitle(f"Per-request distributions: {pair.candidate} vs {pair.baseline}", fontsize=10)
    fig.tight_layout()
    return _png(fig)


_CSS = """body{font-family:system-ui,sans-serif;margin:1rem auto;max-width:1100px;color:#222;padding:0 1rem}
table{border-collapse:collapse;margin:.6rem 0;font-size:.85rem}th,td{border:1px solid #ccc;padding:.2rem .5rem}
th{background:#f3f3f3}td.num{text-align:right;font-variant-numeric:tabular-nums}caption{text-align:left;font-weight:600}
tr.regression td{background:#fdecea}tr.improvement td{background:#eafaf1}p.foot{font-size:.8rem;color:#555}
figure{margin:.6rem 0}figure img{max-width:100%;border:1px solid #eee}li.reg{color:#c0392b;font-weight:600}"""


def _html_table(t: Table) -> str:
    head = "".join(f"<th>{escape(heading(col))}</th>" for col in t.columns)
    body = []
    vi = [col.key for col in t.columns].index("verdict") if "verdict" in [col.key for col in t.columns] else None
    for row in t.rows:
        cls = f' class="{row[vi]}"' if vi is not None and row[vi] in (REGRESSION, IMPROVEMENT) else ""
        cells = "".join(f'<td{" class=num" if isinstance(v, int | float) and not isinstance(v, bool) and not is_missing(v) else ""}>{escape(fmt_cell(v, col))}</td>'
                        for v, col in zip(row, t.columns, strict=True))
        body.append(f"<tr{cls}>{cells}</tr>")
    foot = "".join(f'<p class="foot">{escape(n)}</p>' for n in t.footnotes)
    return f'<table id="table-{escape(t.name)}"><caption>{escape(t.title)}</caption><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>{foot}'


def _img(png: bytes | None, alt: str) -> str:
    if not png:
        return ""
    return f'<figure><img alt="{escape(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode()}"><figcaption>{escape(alt)}</figcaption></figure>'


def render_html(c: Comparison) -> str:
    parts = [f"<!doctype html><html><head><meta charset=utf-8><title>deltatap compare</title><style>{_CSS}</style></head><body>",
             "<h1>deltatap compare</h1><ul>"]
    parts += [f'<li{" class=reg" if "regression(s)" in line else ""}>{escape(line)}</li>' for line in headline(c)]
    parts.append("</ul>")
    parts.append(_html_table(runs_table(c)))
    for p in c.pairs:
        parts.append(f"<h2>{escape(p.candidate)} vs {escape(p.baseline)}</h2>")
        parts.append(_img(forest_plot(c, p), f"Differences with {c.level * 100:g}% intervals, {p.candidate} - {p.baseline}"))
        parts.append(_html_table(pair_table(c, p)))
        parts.append(_img(ecdf_plot(c, p), f"Per-request distributions per delta, {p.candidate} and {p.baseline}"))
    parts.append("</body></html>\n")
    return "".join(parts)
