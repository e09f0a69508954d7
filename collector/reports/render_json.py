"""JSON renderer: every section's tables as records plus its machine-readable data; NaN -> null."""

from __future__ import annotations

import json
import math
from typing import Any

from deltatap.collector.reports.fmt import json_cell
from deltatap.collector.reports.model import Report


def _clean(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_clean(v) for v in obj]
    return obj


def report_dict(report: Report) -> dict[str, Any]:
    sections: dict[str, Any] = {}
    for s in report.sections:
        sections[s.name] = {
            "title": s.title,
            "notes": s.notes,
            "text": s.text,
            "data": _clean(s.data),
            "tables": {
                t.name: {
                    "title": t.title,
                    "columns": [{"key": c.key, "title": c.title, "unit": c.unit} for c in t.columns],
                    "rows": [{k: json_cell(v) for k, v in rec.items()} for rec in t.records()],
                    "footnotes": t.footnotes,
                }
                for t in s.tables
            },
        }
    return {"title": report.title, "metadata": _clean(report.metadata), "sections": sections}


def render_json(report: Report) -> str:
    return json.dumps(report_dict(report), indent=2, default=str, allow_nan=False) + "\n"
