"""The self-contained HTML page: metadata, every section's notes and tables, figures as data URIs.

Nothing is fetched when the page opens (no scripts, fonts or style sheets from elsewhere), so the
file can be mailed or attached to a ticket as it is.
"""

from __future__ import annotations

import base64
import json
from html import escape

from deltatap.collector.reports.fmt import fmt_cell, heading, is_missing
from deltatap.collector.reports.model import Figure, Report, Table

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;max-width:1100px;color:#222;padding:0 1rem}
h1{font-size:1.6rem}h2{font-size:1.25rem;border-bottom:1px solid #ddd;padding-bottom:.2rem;margin-top:2rem}
table{border-collapse:collapse;margin:.6rem 0 1.2rem;font-size:.9rem}
th,td{border:1px solid #ccc;padding:.25rem .6rem}th{background:#f3f3f3;text-align:left}
td.num{text-align:right;font-variant-numeric:tabular-nums}caption{text-align:left;font-weight:600;padding:.2rem 0}
figure{margin:1rem 0}figure img{max-width:100%;border:1px solid #eee}figcaption{font-size:.85rem;color:#555}
pre{background:#f7f7f7;padding:.6rem;overflow-x:auto;font-size:.8rem}p.note{margin:.3rem 0}.foot{font-size:.8rem;color:#555}
"""


def figure_html(fig: Figure) -> str:
    src = f"data:{fig.mime};base64,{base64.b64encode(fig.data).decode()}"
    cap = escape(fig.title + (f" — {fig.caption}" if fig.caption else ""))
    return f'<figure id="fig-{escape(fig.name)}"><img alt="{escape(fig.title)}" src="{src}"><figcaption>{cap}</figcaption></figure>'


def table_html(table: Table) -> str:
    head = "".join(f"<th>{escape(heading(c))}</th>" for c in table.columns)
    rows = []
    for row in table.rows:
        cells = []
        for v, c in zip(row, table.columns, strict=True):
            cls = ' class="num"' if isinstance(v, int | float) and not isinstance(v, bool) and not is_missing(v) else ""
            cells.append(f"<td{cls}>{escape(fmt_cell(v, c))}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    foot = "".join(f'<p class="foot">{escape(n)}</p>' for n in table.footnotes)
    return f'<table id="table-{escape(table.name)}"><caption>{escape(table.title)}</caption><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>{foot}'


def render_html(report: Report) -> str:
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{escape(report.title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{escape(report.title)}</h1>",
    ]
    if report.figures:
        parts.append("<h2>Plots</h2>")
        parts.extend(figure_html(f) for f in report.figures)
    for section in report.sections:
        parts.append(f'<section id="{escape(section.name)}"><h2>{escape(section.title)}</h2>')
        parts.extend(f'<p class="note">{escape(n)}</p>' for n in section.notes)
        if section.text:  # the same values as the section's tables: shown once
            parts.append(f"<pre>{escape(section.text)}</pre>")
        else:
            parts.extend(table_html(t) for t in section.tables)
        parts.extend(figure_html(f) for f in section.figures)
        parts.append("</section>")
    if report.metadata:
        meta = escape(json.dumps(report.metadata, indent=2, default=str))
        parts.append(f'<section id="metadata"><h2>Run metadata</h2><pre>{meta}</pre></section>')
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
