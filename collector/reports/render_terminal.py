"""Terminal renderer (rich): the sections in reading order (:func:`sections.reading_order`), notes as
text, tables as rich tables that fit the console's width, piped or not.

A table is never cropped (rich would crop cells to ``inboun…`` and ``1,746…`` or show three request
ids as the same ``d657eaab…``) and never wider than the console (80 columns when piped, unless
``$COLUMNS`` says otherwise): a table too wide for it is split into column groups, printed one under
the other, each repeating the first column (the row's name) so every part reads on its own. Within a
group numbers fold onto a second line rather than being cut; a column marked :attr:`Column.whole`
(ids) is never shortened.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table as RichTable

from deltatap.collector.reports.fmt import fmt_cell, heading
from deltatap.collector.reports.model import Report, Section, Table
from deltatap.collector.reports.sections import reading_order

MEASURE_WIDTH = 1000


def rich_table(table: Table, columns: list[int] | None = None, title: str | None = None, caption: bool = True) -> RichTable:
    """``table`` as a rich table; ``columns`` picks some of its columns (by index), in order."""
    idx = list(range(len(table.columns))) if columns is None else columns
    rt = RichTable(title=table.title if title is None else title, title_justify="left",
                   caption=("\n".join(table.footnotes) or None) if caption else None, caption_justify="left")
    cells = [[fmt_cell(v, c) for v, c in zip(row, table.columns, strict=True)] for row in table.rows]
    for i in idx:
        col = table.columns[i]
        numeric = any(isinstance(r[i], int | float) and not isinstance(r[i], bool) for r in table.rows)
        if col.whole:  # an id: shown in full, or it is no id at all
            rt.add_column(heading(col), no_wrap=True, min_width=max([len(r[i]) for r in cells] + [1]))
        else:  # folded onto further lines when narrow, never cropped ("139…" for 1395.44)
            rt.add_column(heading(col), justify="right" if numeric else "left", overflow="fold")
    for row in cells:
        rt.add_row(*(row[i] for i in idx))
    return rt


def _natural(console: Console, rt: Any) -> int:
    return Measurement.get(console, console.options.update_width(MEASURE_WIDTH), rt).maximum


def column_groups(console: Console, table: Table, width: int) -> list[list[int]]:
    """Column indices per printed group: the first column, then as many as fit ``width``, in order."""
    n = len(table.columns)
    if n <= 2 or _natural(console, rich_table(table, caption=False)) <= width:
        return [list(range(n))]
    groups: list[list[int]] = []
    cur = [0]
    for i in range(1, n):
        trial = cur + [i]
        if len(cur) > 1 and _natural(console, rich_table(table, trial, caption=False)) > width:
            groups.append(cur)
            cur = [0, i]
        else:
            cur = trial
    groups.append(cur)
    return groups


def print_table(console: Console, table: Table | Any) -> None:
    """Print ``table`` within the console's width, split into column groups where it does not fit
    (a rich renderable of another module: :func:`_print_foreign`)."""
    if not isinstance(table, Table):
        _print_foreign(console, table)
        return
    groups = column_groups(console, table, console.width)
    for k, g in enumerate(groups):
        title = table.title if k == 0 else f"{table.title} (continued, {k + 1}/{len(groups)})"
        console.print(rich_table(table, g, title=title, caption=k == len(groups) - 1))


def _print_foreign(console: Console, renderable: Any) -> None:
    """A rich table of another module (``deltatap report``'s collector tables): in a terminal at its width,
    piped at its natural width (up to 1000 columns), so no cell is folded or cropped."""
    if console.is_terminal:
        console.print(renderable)
        return
    need = min(_natural(console, renderable), MEASURE_WIDTH)
    if need <= console.width:
        console.print(renderable)
        return
    saved = console.__dict__.get("_width")
    console.width = need
    try:
        console.print(renderable)
    finally:
        console.__dict__["_width"] = saved


def print_section(section: Section, console: Console) -> None:
    console.rule(f"[bold]{section.title}")
    for note in section.notes:
        console.print(note, highlight=False)
    if section.text:
        # the preformatted block holds the same values as the section's tables (kept for CSV/JSON): once is enough
        console.print(section.text, highlight=False, markup=False)
        return
    for table in section.tables:
        print_table(console, table)


def print_report(report: Report, console: Console | None = None, sections: list[str] | None = None) -> None:
    """Every section (or those named in ``sections``) in reading order: the headline first, reference material last."""
    console = console or Console()
    body, tail = reading_order(report.sections)
    for section in body + tail:
        if sections is None or section.name in sections:
            print_section(section, console)
