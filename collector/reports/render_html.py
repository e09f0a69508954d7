"""The self-contained HTML page, in reading order: the answer first, reference material last.

1. the headline: system TTFT P50/P99, which part costs most and by how much, the stacked bar of the
   decomposition per percentile, the headline table and the median request's waterfall;
2. every other section (its notes, its tables, each table's exclusions beside it, its plots);
3. collapsed at the end: the Appendix C.1 block and the run metadata (as a key/value table, never a
   raw JSON dump).

Plots are full width, each in the section it illustrates (``Figure.section``). Component colours come
from :mod:`deltatap.collector.reports.colors`; the page's legend swatches use the same ones. Nothing
is fetched when the page opens (no scripts, fonts or style sheets from elsewhere), so the file can be
mailed or attached to a ticket as it is.
"""

from __future__ import annotations

import base64
from html import escape
from typing import Any

from deltatap.collector.reports.fmt import flat_metadata, fmt_cell, heading, is_missing
from deltatap.collector.reports.model import Figure, Report, Section, Table
from deltatap.collector.reports.sections import reading_order

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:1rem auto;max-width:1100px;color:#222;padding:0 1rem}
h1{font-size:1.4rem;margin:.2rem 0 .6rem}h2{font-size:1.2rem;border-bottom:1px solid #ddd;padding-bottom:.2rem;margin-top:2rem}
#headline h2{display:none}#headline p.lead{font-size:1.25rem;margin:.2rem 0}#headline p.lead:first-of-type{font-weight:600}
table{border-collapse:collapse;margin:.6rem 0 .4rem;font-size:.9rem}
th,td{border:1px solid #ccc;padding:.25rem .6rem}th{background:#f3f3f3;text-align:left}
td.num{text-align:right;font-variant-numeric:tabular-nums}td.id{white-space:nowrap}caption{text-align:left;font-weight:600;padding:.2rem 0}
figure{margin:.6rem 0 1rem}figure img{width:100%;height:auto;border:1px solid #eee}figcaption{font-size:.85rem;color:#555}
pre{background:#f7f7f7;padding:.6rem;overflow-x:auto;font-size:.8rem}p.note{margin:.3rem 0}p.foot{font-size:.8rem;color:#555;margin:.1rem 0 1rem}
details{margin:1.5rem 0}summary{font-size:1.1rem;font-weight:600;cursor:pointer}
span.sw{display:inline-block;width:.8em;height:.8em;margin-right:.35em;vertical-align:-.05em;border:1px solid #0003}
"""


def figure_html(fig: Figure) -> str:
    src = f"data:{fig.mime};base64,{base64.b64encode(fig.data).decode()}"
    cap = escape(fig.title + (f" — {fig.caption}" if fig.caption else ""))
    return f'<figure id="fig-{escape(fig.name)}"><img alt="{escape(fig.title)}" src="{src}"><figcaption>{cap}</figcaption></figure>'


def table_html(table: Table, swatches: dict[str, str] | None = None) -> str:
    head = "".join(f"<th>{escape(heading(c))}</th>" for c in table.columns)
    rows = []
    for row in table.rows:
        cells = []
        for i, (v, c) in enumerate(zip(row, table.columns, strict=True)):
            cls = ' class="num"' if isinstance(v, int | float) and not isinstance(v, bool) and not is_missing(v) else ' class="id"' if c.whole else ""
            text = escape(fmt_cell(v, c))
            if i == 0 and swatches and isinstance(v, str):
                color = swatches.get(v.split(" ")[0])
                if color:
                    text = f'<span class="sw" style="background:{color}" data-part="{escape(v.split(" ")[0])}"></span>{text}'
            cells.append(f"<td{cls}>{text}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    foot = "".join(f'<p class="foot">{escape(n)}</p>' for n in table.footnotes)
    return f'<table id="table-{escape(table.name)}"><caption>{escape(table.title)}</caption><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>{foot}'


def _section_html(section: Section, figures: list[Figure], swatches: dict[str, str]) -> list[str]:
    out = [f'<section id="{escape(section.name)}"><h2>{escape(section.title)}</h2>']
    lead = section.name == "headline"
    out.extend(f'<p class="{"lead" if lead else "note"}">{escape(n)}</p>' for n in section.notes)
    if lead:  # the answer, drawn, straight under the sentence that states it; then the table, then the waterfall
        out.extend(figure_html(f) for f in figures if f.name == "decomposition_bars")
        out.extend(table_html(t, swatches) for t in section.tables)
        out.extend(figure_html(f) for f in figures if f.name != "decomposition_bars")
    elif section.text:  # the same values as the section's tables: shown once
        out.append(f"<pre>{escape(section.text)}</pre>")
    else:
        out.extend(table_html(t) for t in section.tables)
        out.extend(figure_html(f) for f in figures)
    out.extend(figure_html(f) for f in section.figures)
    out.append("</section>")
    return out


def metadata_html(meta: dict[str, Any]) -> str:
    rows = "".join(f"<tr><td>{escape(k)}</td><td>{escape(str(v))}</td></tr>" for k, v in flat_metadata(meta))
    return f'<table id="table-metadata"><thead><tr><th>Key</th><th>Value</th></tr></thead><tbody>{rows}</tbody></table>'


def render_html(report: Report) -> str:
    from deltatap.collector.reports.colors import KIND_COLORS, PART_COLORS

    head = next((s for s in report.sections if s.name == "headline"), None)
    swatches = {**KIND_COLORS, **PART_COLORS, **((head.data.get("colors") if head else None) or {})}
    body, tail = reading_order(report.sections)
    placed = {s.name for s in report.sections}
    by_section: dict[str, list[Figure]] = {}
    for f in report.figures:
        by_section.setdefault(f.section if f.section in placed else "", []).append(f)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{escape(report.title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{escape(report.title)}</h1>",
    ]
    for section in body:
        parts.extend(_section_html(section, by_section.get(section.name, []), swatches))
    if by_section.get(""):
        parts.append('<section id="plots"><h2>More plots</h2>')
        parts.extend(figure_html(f) for f in by_section[""])
        parts.append("</section>")
    for section in tail:
        parts.append(f'<details id="details-{escape(section.name)}"><summary>{escape(section.title)}</summary>')
        parts.extend(_section_html(section, by_section.get(section.name, []), swatches))
        parts.append("</details>")
    if report.metadata:
        parts.append(f'<details id="metadata"><summary>Run metadata</summary>{metadata_html(report.metadata)}</details>')
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
