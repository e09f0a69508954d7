"""The report document model every renderer consumes: a report is sections of tables, notes and figures.

Sections are pure functions of their inputs (rows, topology, run metadata) and produce these plain
objects; renderers (terminal, Markdown, CSV, JSON, HTML) turn them into text without computing
anything themselves. Cell values stay numbers until a renderer formats them, so the JSON and CSV
outputs carry full precision and the terminal/Markdown ones round for people.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

Cell = str | int | float | None


@dataclass
class Column:
    key: str  # machine name (CSV/JSON)
    title: str  # human heading
    unit: str = ""  # "ms", "s", "%", "tok/s", "" ...
    digits: int = 1  # decimals when a renderer rounds for people
    whole: bool = False  # an identifier: the terminal never shortens it (three ids cropped to one prefix read as one)


@dataclass
class Table:
    name: str
    title: str
    columns: list[Column]
    rows: list[list[Cell]] = field(default_factory=list)
    footnotes: list[str] = field(default_factory=list)

    def add(self, *cells: Cell) -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"table {self.name}: row has {len(cells)} cells, expected {len(self.columns)}")
        self.rows.append(list(cells))

    def records(self) -> list[dict[str, Cell]]:
        """Rows as dicts keyed by column key (JSON, CSV and tests read them this way)."""
        keys = [c.key for c in self.columns]
        return [dict(zip(keys, row, strict=True)) for row in self.rows]

    def column(self, key: str) -> list[Cell]:
        i = [c.key for c in self.columns].index(key)
        return [row[i] for row in self.rows]

    def row_by(self, key: str, value: Cell) -> dict[str, Cell]:
        for rec in self.records():
            if rec.get(key) == value:
                return rec
        raise KeyError(f"table {self.name}: no row with {key}={value!r}")


@dataclass
class Figure:
    name: str
    title: str
    mime: str  # image/png or image/svg+xml
    data: bytes
    caption: str = ""
    section: str = ""  # the section the HTML page shows it in (empty: after the sections)


@dataclass
class Section:
    name: str
    title: str
    tables: list[Table] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # sentences a person reads first
    data: dict[str, Any] = field(default_factory=dict)  # machine-readable figures for JSON (totals, counts)
    figures: list[Figure] = field(default_factory=list)
    # a preformatted block (the Appendix C.1 minimum viable report), shown verbatim; the human renderers
    # (terminal, Markdown, HTML) show it instead of the section's tables, which hold the same values for CSV/JSON
    text: str = ""

    def table(self, name: str) -> Table:
        for t in self.tables:
            if t.name == name:
                return t
        raise KeyError(f"section {self.name}: no table {name!r}; tables: {[t.name for t in self.tables]}")


@dataclass
class Report:
    title: str
    metadata: dict[str, Any] = field(default_factory=dict)
    sections: list[Section] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)

    def section(self, name: str) -> Section:
        for s in self.sections:
            if s.name == name:
                return s
        raise KeyError(f"report has no section {name!r}; sections: {[s.name for s in self.sections]}")

    def has(self, name: str) -> bool:
        return any(s.name == name for s in self.sections)
