"""Terminal tables never crop a number: in a narrow terminal a cropped P95 "1395.443" read "139…",
below its P90 "493.015", and looked like out-of-order percentiles (the ``deltatap demo`` report)."""

from __future__ import annotations

import pytest
from rich.console import Console

from deltatap.collector.reports.model import Column, Table
from deltatap.collector.reports.render_terminal import rich_table
from deltatap.collector.rows import DeltaValue, Row
from deltatap.collector.sketches import Aggregator
from deltatap.collector.table import STAT_COLUMNS, summary_rich
from deltatap.core.topology import default_topology

MS = 1_000_000
# engine_decode as in the demo: most requests ~280 ms, the cascading ones ~1.4 s
DECODE_MS = [72, 150, 200, 250, 270, 280, 283, 290, 300, 320, 400, 450, 493, 1395, 1433, 1437]


def columns_of(text: str, ncols: int) -> list[str]:
    """Each body column's text, its folded fragments joined top to bottom."""
    cols = [""] * ncols
    for line in text.splitlines():
        if line.startswith("│"):
            cells = line.split("│")[1:-1]
            assert len(cells) == ncols, line
            for i, c in enumerate(cells):
                cols[i] += c.strip()
    return cols


@pytest.mark.parametrize("width", [50, 80, 200])
def test_summary_rich_shows_every_digit(width):
    agg = Aggregator()
    agg.add_rows([Row(trace_id=f"{i:032x}", deltas={"engine_decode": DeltaValue(v * MS), "output_path_overhead_last": DeltaValue(-v * MS // 3)}) for i, v in enumerate(DECODE_MS)])
    con = Console(width=width, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    con.print(summary_rich(agg, default_topology()))
    got = columns_of(con.export_text(), 1 + len(STAT_COLUMNS))
    want = [""] * (1 + len(STAT_COLUMNS))
    for name, s in agg.summaries().items():
        cells = [name, *("" if s[c] is None else (str(s[c]) if c == "count" else f"{s[c]:.3f}") for c in STAT_COLUMNS)]
        for i, c in enumerate(cells):
            want[i] += c
    assert got == want
    assert "…" not in con.export_text()


@pytest.mark.parametrize("width", [40, 80])
def test_report_terminal_tables_show_every_digit_of_numbers(width):
    t = Table("deltas", "Every delta", [Column("delta", "Delta"), *[Column(k, k.upper(), "ms", 2) for k in ("p50", "p90", "p95", "p99", "p999", "mean", "min", "max")]])
    t.add("engine_decode", 283.66, 493.01, 1395.44, 1433.57, 1436.97, 367.79, 71.80, 1437.35)
    con = Console(width=width, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    con.print(rich_table(t))
    got = columns_of(con.export_text(), 9)
    assert got[1:] == ["283.66", "493.01", "1395.44", "1433.57", "1436.97", "367.79", "71.80", "1437.35"]
