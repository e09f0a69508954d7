"""Terminal renderer (rich): notes as text, tables as rich tables."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table as RichTable

from deltatap.collector.reports.fmt import fmt_cell, heading
from deltatap.collector.reports.model import Report, Section, Table


def rich_table(table: Table) -> RichTable:
    rt = RichTable(title=table.title, title_justify="left", caption="\n".join(table.footnotes) or None, caption_justify="left")
    for i, col in enumerate(table.columns):
        numeric = any(isinstance(r[i], int | float) and not isinstance(r[i], bool) for r in table.rows)
        # a number is folded onto a second line when the terminal is narrow, never cropped ("139…" for 1395.44)
        rt.add_column(heading(col), justify="right" if numeric else "left", overflow="fold" if numeric else "ellipsis")
    for row in table.rows:
        rt.add_row(*(fmt_cell(v, c) for v, c in zip(row, table.columns, strict=True)))
    return rt


def print_section(section: Section, console: Console) -> None:
    console.rule(f"[bold]{section.title}")
    for note in section.notes:
        console.print(note, highlight=False)
    if section.text:
        console.print(section.text, highlight=False, markup=False)
    for table in section.tables:
        console.print(rich_table(table))


def print_report(report: Report, console: Console | None = None, sections: list[str] | None = None) -> None:
    console = console or Console()
    for section in report.sections:
        if sections is None or section.name in sections:
            print_section(section, console)
