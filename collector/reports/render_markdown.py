"""Markdown renderer: one document, metadata first, then each section's notes and tables."""

from __future__ import annotations

import json

from deltatap.collector.reports.fmt import fmt_cell, heading
from deltatap.collector.reports.model import Report, Table


def _escape(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def table_markdown(table: Table) -> str:
    head = "| " + " | ".join(_escape(heading(c)) for c in table.columns) + " |"
    rule = "|" + "|".join("---" if i == 0 else "---:" if _numeric(table, i) else "---" for i in range(len(table.columns))) + "|"
    body = ["| " + " | ".join(_escape(fmt_cell(v, c)) for v, c in zip(row, table.columns, strict=True)) + " |" for row in table.rows]
    lines = [f"**{table.title}**", "", head, rule, *body]
    lines.extend(f"\n{_escape(n)}" for n in table.footnotes)
    return "\n".join(lines)


def _numeric(table: Table, i: int) -> bool:
    vals = [row[i] for row in table.rows if row[i] is not None]
    return bool(vals) and all(isinstance(v, int | float) and not isinstance(v, bool) for v in vals)


def render_markdown(report: Report) -> str:
    out = [f"# {report.title}", ""]
    if report.metadata:
        out += ["## Run metadata", "", "```json", json.dumps(report.metadata, indent=2, default=str), "```", ""]
    for section in report.sections:
        out += [f"## {section.title}", ""]
        for note in section.notes:
            out += [note, ""]
        if section.text:  # the same values as the section's tables: shown once
            out += ["```text", section.text.rstrip("\n"), "```", ""]
            continue
        for table in section.tables:
            out += [table_markdown(table), ""]
    return "\n".join(out).rstrip() + "\n"
