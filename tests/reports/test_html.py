"""The HTML page: every plot drawn, embedded as a data URI and decodable; the waterfall's segments exact."""

from __future__ import annotations

import pytest

from deltatap.collector.reports.plots import boundary_ttfts, median_row, report_figures, waterfall_segments
from deltatap.collector.reports.registry import ReportInputs, build_report
from deltatap.collector.reports.render_html import render_html
from deltatap.core.topology import default_topology
from deltatap.core.vocab import DEFAULT_POINT_ALIASES
from tests.reports.factories import MS, S, T0, row
from tests.reports.htmlcheck import parse_page

# t-point offsets (ms) of a request whose system TTFT is 20 + k ms
OFFSETS = {"t0": 0, "t1": 0.2, "t2": 1.2, "t3": 1.4, "t4": 2.0, "t5": 3.4, "t6": 3.6, "t6a": 4.0, "t7": 14.0, "t9": 14.2, "t10": 15.2, "t11": 15.7, "t12": 16.0}


def full_row(i: int, extra_ms: float, start_s: float):
    base = T0 + int(start_s * S)
    pts = {DEFAULT_POINT_ALIASES[a]: base + int(round((ms + (extra_ms if a in ("t7", "t9", "t10", "t11", "t12") else 0)) * MS)) for a, ms in OFFSETS.items()}
    ttft = 16.0 + extra_ms
    return row(i, tokens_in=100, tokens_out=10, points_ns=pts,
               deltas_ms={"system_ttft": ttft, "system_ttlt": ttft + 90, "engine_ttft": 10.4 + extra_ms, "gateway_inbound": 1.0,
                          "gateway_outbound": 0.5, "firewall_inbound": 2.0, "firewall_outbound": 1.0, "residual": 1.5})


def rows():
    return [full_row(i, float(i), i * 0.1) for i in range(9)]


def test_waterfall_of_the_median_request_is_exact():
    r = median_row(rows())
    assert r.request_id == "req-4"
    segs = waterfall_segments(r, default_topology())
    assert [s[0] for s in segs][:4] == ["client.send -> gateway.in.arrive", "gateway inbound", "gateway.in.exit -> firewall.in.arrive", "firewall inbound"]
    assert segs[1][1:] == ("gateway", pytest.approx(0.2), pytest.approx(1.0))
    prefill = next(s for s in segs if s[0] == "engine prefill")
    assert prefill[3] == pytest.approx(14.0)  # 10 ms + the request's 4 ms extra
    assert sum(s[3] for s in segs) == pytest.approx(20.0)  # the segments tile t0 -> t12


def test_boundary_ttfts():
    b = boundary_ttfts(rows(), default_topology())
    assert list(b) == ["client (t12 - t0)", "gateway", "firewall", "engine (t7 - t6)"]
    assert b["gateway"][0] == pytest.approx(15.5) and b["firewall"][0] == pytest.approx(13.8)


def test_page_embeds_every_plot_and_parses():
    recs = [{"phase": "measure", "chunk_unix_ns": [T0 + k * 10 * MS for k in range(10)]} for _ in range(3)]
    inputs = ReportInputs(rows=rows(), records=recs, metadata={"seed": 1})
    report = build_report(inputs, figures=report_figures)
    names = ["decomposition_bars", "waterfall", "ttft_cdf", "itl_histogram", "contribution_over_time"]
    assert [f.name for f in report.figures] == names  # no cascade in these rows: no cascade timeline
    page = parse_page(render_html(report))
    assert len(page.images) == len(names) and all(img.startswith(b"\x89PNG\r\n\x1a\n") for img in page.images)
    assert all(m == "image/png" for m in page.image_mimes)
    assert page.external_refs == []
    assert {*(f"fig-{n}" for n in names), "headline", "minimum", "ttft", "itl", "guardrails", "timeouts", "cascades", "metadata"} <= page.ids
