"""Terminal renderer (rich): notes as text, tables as rich tables.

Piped output (not a terminal: ``| less``, ``> report.txt``, CI logs) is never cropped: rich would
lay a table out at 80 columns (or ``$COLUMNS``) and crop cells to ``inboun…`` and ``1,746…``, or
show three different request ids as the same ``d657eaab…``. :func:`print_table` widens the console
to the table's natural width for that table instead; prose and rules keep the console's width. In a
terminal tables still fit the window: numbers fold onto a second line, never cropped, and a column
marked :attr:`Column.whole` (ids) is never shortened.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table as RichTable

from deltatap.collector.reports.fmt import fmt_cell, heading
from deltatap.collector.reports.model import Report, Section, Table

MAX_PIPED_WIDTH = 1000  # a table wider than this is laid out at this width (cells fold)


def rich_table(table: Table) -> RichTable:
    rt = RichTable(title=table.title, title_justify="left", caption="\n".join(table.footnotes) or None, caption_justify="left")
    cells = [[fmt_cell(v, c) for v, c in zip(row, table.columns, strict=True)] for row in table.rows]
    for i, col in enumerate(table.columns):
        numeric = any(isinstance(r[i], int | float) and not isinstance(r[i], bool) for r in table.rows)
        if col.whole:  # an id: shown in full, or it is no id at all
            rt.add_column(heading(col), no_wrap=True, min_width=max([len(r[i]) for r in cells] + [1]))
        else:
            # a number is folded onto a second line when the terminal is narrow, never cropped ("139…" for 1395.44)
            rt.add_column(heading(col), justify="right" if numeric else "left", overflow="fold" if numeric else "ellipsis")
    for row in cells:
        rt.add_row(*row)
    return rt


@contextmanager
def _width(console: Console, width: int) -> Iterator[None]:
    saved = console.__dict__.get("_width")
    console.width = width
    try:
        yield
    finally:
        console.__dict__["_width"] = saved


def print_table(console: Console, renderable: Any) -> None:
    """Print a table; when the console is not a terminal, at the table's natural width (never cropped)."""
    if console.is_terminal:
        console.print(renderable)
        return
    need = Measurement.get(console, console.options.update_width(MAX_PIPED_WIDTH), renderable).maximum
    if need <= console.width:
        console.print(renderable)
        return
    with _width(console, min(need, MAX_PIPED_WIDTH)):
        console.print(renderable)


def print_section(section: Section, console: Console) -> None:
    console.rule(f"[bold]{section.title}")
    for note in section.notes:
        console.print(note, highlight=False)
    if section.text:
        # the preformatted block holds the same values as the section's tables (kept for CSV/JSON): once is enough
        console.print(section.text, highlight=False, markup=False)
        return
    for table in section.tables:
        print_table(console, rich_table(table))


def print_report(report: Report, console: Console | None = None, sections: list[str] | None = None) -> None:
    console = console or Console()
    for section in report.sections:
        if sections is None or section.name in sections:
            print_section(section, console)
