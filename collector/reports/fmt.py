"""Cell formatting shared by the human-facing renderers (terminal, Markdown, HTML)."""

from __future__ import annotations

import math

from deltatap.collector.reports.model import Cell, Column

MISSING = "–"  # a value nobody observed: shown as a dash, never as 0


def is_missing(v: Cell) -> bool:
    return v is None or (isinstance(v, float) and not math.isfinite(v))


def fmt_cell(v: Cell, col: Column) -> str:
    if is_missing(v):
        return MISSING
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}" if abs(v) >= 10_000 else str(v)
    if isinstance(v, float):
        if col.unit == "%":
            return f"{v * 100:.{col.digits}f}"
        return f"{v:.{col.digits}f}"
    return str(v)


def heading(col: Column) -> str:
    return f"{col.title} ({col.unit})" if col.unit else col.title


def json_cell(v: Cell) -> Cell:
    """NaN/inf become null in JSON (missing, not a number)."""
    return None if is_missing(v) else v
