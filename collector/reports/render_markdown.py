"""Markdown renderer: one document in the reading order of every format (:func:`sections.reading_order`):
the headline first, then each section's notes and tables (exclusions as footnotes beside them), and
last, folded in ``<details>`` blocks, the Appendix C.1 block and the run metadata as a key/value table."""

from __future__ import annotations

from deltatap.collector.reports.fmt import flat_metadata, fmt_cell, heading
from deltatap.collector.reports.model import Report, Section, Table
from deltatap.collector.reports.sections import reading_order


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


def _section(section: Section) -> list[str]:
    out = [f"## {section.title}", ""]
    for note in section.notes:
        out += [note, ""]
    if section.text:  # the same values as the section's tables: shown once
        return out + ["```text", section.text.rstrip("\n"), "```", ""]
    for table in section.tables:
        out += [table_markdown(table), ""]
    return out


def render_markdown(report: Report) -> str:
    out = [f"# {report.title}", ""]
    body, tail = reading_order(report.sections)
    for section in body:
        out += _section(section)
    for section in tail:
        out += [f"<details><summary>{section.title}</summary>", "", *_section(section), "</details>", ""]
    if report.metadata:
        out += ["<details><summary>Run metadata</summary>", "", "| Key | Value |", "|---|---|"]
        out += [f"| {_escape(k)} | {_escape(str(v))} |" for k, v in flat_metadata(report.metadata)]
        out += ["", "</details>", ""]
    return "\n".join(out).rstrip() + "\n"
