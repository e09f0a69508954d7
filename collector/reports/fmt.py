"""Cell formatting shared by the human-facing renderers (terminal, Markdown, HTML)."""

from __future__ import annotations

import json
import math
from typing import Any

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


def flat_metadata(meta: dict[str, Any], prefix: str = "") -> list[tuple[str, str]]:
    """Run metadata as (dotted key, text) pairs, for a key/value table instead of a JSON dump."""
    out: list[tuple[str, str]] = []
    for k, v in meta.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out += flat_metadata(v, key + ".")
        elif isinstance(v, list) and v and all(isinstance(x, str | int | float) for x in v):
            out.append((key, ", ".join(str(x) for x in v)))
        else:
            out.append((key, v if isinstance(v, str) else json.dumps(v, default=str)))
    return out
