"""The decomposition section wraps the collector's table: its numbers are the collector's sketches' P50s."""

from __future__ import annotations

import pytest

from deltatap.collector.reports.registry import ReportInputs, build_report
from tests.reports.factories import row


def test_decomposition_and_percentiles_sections():
    rows = [
        row(i, deltas_ms={"gateway_inbound": 1.0, "firewall_inbound": 4.0, "engine_ttft": 20.0 + i, "firewall_outbound": 2.0,
                          "gateway_outbound": 0.5, "system_ttft": 30.0 + i, "residual": 1.0})
        for i in range(5)
    ]
    rep = build_report(ReportInputs(rows=rows), sections=["decomposition", "percentiles"])
    t = rep.section("decomposition").table("decomposition")
    got = {r["component"]: r["ttft_ms"] for r in t.records()}
    assert got["AI Gateway"] == pytest.approx(1.0, rel=0.01) and got["AI Firewall (in)"] == pytest.approx(4.0, rel=0.01)
    assert got["Model Engine"] == pytest.approx(22.0, rel=0.01) and got["AI Firewall (out)"] == pytest.approx(2.0, rel=0.01)
    assert got["Total"] == pytest.approx(29.5, rel=0.01)
    assert t.row_by("component", "Total")["note"].startswith("system TTFT P50 32.")
    assert "*Outbound adds to client-observed TTFT, not engine TTFT" in t.footnotes
    pct = rep.section("percentiles").table("deltas").row_by("delta", "engine_ttft")
    assert pct["count"] == 5 and pct["min_ms"] == pytest.approx(20.0, rel=0.01) and pct["max_ms"] == pytest.approx(24.0, rel=0.01)
