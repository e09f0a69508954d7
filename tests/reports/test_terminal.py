"""Terminal output people read piped (`| less`, CI logs) or in a narrow window: no cropped cell, request ids
that can be told apart, and the minimum report once."""

from __future__ import annotations

import io

from rich.console import Console

from deltatap.collector.reports.model import Column, Report, Section, Table
from deltatap.collector.reports.registry import ReportInputs, build_report
from deltatap.collector.reports.render_markdown import render_markdown
from deltatap.collector.reports.render_terminal import print_report, print_table
from tests.reports.factories import MS, S, T0, cascade, row

IDS = ["d657eaab-4c1f-m1", "d657eaab-4c1f-m2", "d657eaab-4c1f-m3"]  # one run id: a common prefix


def _console(width: int = 80, terminal: bool = False) -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, width=width, force_terminal=terminal, color_system=None), buf


def test_a_wide_table_is_split_into_column_groups_that_fit_80_columns_piped_or_not():
    t = Table("x", "wide", [Column("name", "Component"), *(Column(f"c{i}", f"Column {i}", "ms", 3) for i in range(8))])
    t.add("inbound (firewall, blocking)", *(1746.123 + i for i in range(8)))
    for terminal in (False, True):
        con, buf = _console(80, terminal=terminal)
        print_table(con, t)
        out = buf.getvalue()
        assert "…" not in out and all(f"{1746.123 + i:.3f}" in out for i in range(8))  # nothing cropped
        assert max(len(x) for x in out.splitlines()) <= 80, out
        groups = out.count("inbound (firewall, blocking)")
        assert groups >= 2 and out.count("(continued") == groups - 1  # every group repeats the row's name
    assert con.width == 80


def _cascading_rows():
    rows = []
    for i, rid in enumerate(IDS):
        r = row(i, points_ns={"client.send": T0, "client.end": T0 + 1 * S, "engine.queue": T0 + 5 * MS})
        r.request_id = rid
        r.cascade = cascade({"gateway": T0 + 500 * MS}, T0 + (900 + i) * MS, 400 * MS, 40)
        rows.append(r)
    return rows


def test_cascade_request_ids_are_shown_whole_even_in_a_narrow_terminal():
    report = build_report(ReportInputs(rows=_cascading_rows()), sections=["cascades"])
    for terminal in (False, True):
        con, buf = _console(60, terminal=terminal)
        print_report(report, con)
        out = buf.getvalue()
        for rid in IDS:
            assert rid in out, (terminal, out)


def test_minimum_report_is_shown_once():
    rows = [row(i, tokens_out=11, deltas_ms={"system_ttft": 10.0 + i, "system_ttlt": 110.0 + i},
                points_ns={"client.send": T0, "client.end": T0 + S}) for i in range(3)]
    report = build_report(ReportInputs(rows=rows, metadata={"model": "m-1"}), sections=["minimum"])
    con, buf = _console(100)
    print_report(report, con)
    out = buf.getvalue()
    assert out.count("Model: m-1") == 1 and "Minimum viable report (Appendix C.1)" not in out
    assert render_markdown(report).count("Model: m-1") == 1 and "| Model | m-1 |" not in render_markdown(report)
    assert report.section("minimum").table("minimum").row_by("field", "Model")["value"] == "m-1"  # CSV/JSON keep the table


def test_section_without_text_still_prints_its_tables():
    s = Section("s", "S", tables=[Table("t", "T", [Column("a", "A")], rows=[["x"]])])
    con, buf = _console()
    print_report(Report("r", sections=[s]), con)
    assert "│ x │" in buf.getvalue()
