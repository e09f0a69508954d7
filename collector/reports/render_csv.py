"""CSV renderer: one file per table (``<section>.<table>.csv``), full precision, empty cell = missing."""

from __future__ import annotations

import csv
import io

from deltatap.collector.reports.fmt import json_cell
from deltatap.collector.reports.model import Report, Table


def table_csv(table: Table) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([c.key + (f"_{c.unit}" if c.unit and c.unit != "%" else "") for c in table.columns])
    for row in table.rows:
        w.writerow(["" if json_cell(v) is None else v for v in row])
    return buf.getvalue()


def render_csv(report: Report) -> dict[str, str]:
    return {f"{s.name}.{t.name}.csv": table_csv(t) for s in report.sections for t in s.tables}
