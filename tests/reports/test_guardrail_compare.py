"""§5.10 tables across labelled runs, exact."""

from __future__ import annotations

import pytest

from deltatap.collector.reports.registry import ReportInputs, build_report
from tests.reports.factories import S, T0, row


def run(ttft, ttlt, end_s, classes=None, blocked=()):
    rows = []
    for i, (a, b) in enumerate(zip(ttft, ttlt, strict=True)):
        dec = "block_pattern" if i in blocked else "allow"
        rows.append(row(i, tokens_out=100, firewall_decision=dec, outcome="refused" if i in blocked else "ok",
                        labels={"class": classes[i]} if classes else {},
                        deltas_ms={"system_ttft": a, "system_ttlt": b},
                        points_ns={"client.send": T0, "client.end": T0 + int(end_s * S)}))
    return rows


def test_tables_13_and_14_and_overheads():
    runs = {
        "baseline": run([100, 200], [1000, 2000], 2.0),
        "input": run([110, 230], [1010, 2030], 2.0),
        "full": run([120, 260], [1100, 2100], 2.5),
    }
    s = build_report(ReportInputs(runs=runs), sections=["guardrail_comparison"]).section("guardrail_comparison")
    lat = s.table("guardrail_latency")
    assert lat.row_by("configuration", "Baseline") == {"configuration": "Baseline", "requests": 2, "ttft_p50_ms": 150.0, "ttft_p99_ms": 199.0, "e2e_p50_ms": 1500.0, "e2e_p99_ms": 1990.0}
    assert lat.row_by("configuration", "Full Filter")["ttft_p50_ms"] == 190.0
    thr = s.table("guardrail_throughput")
    assert thr.row_by("configuration", "Baseline") == {"configuration": "Baseline", "throughput_tok_s": 100.0, "reduction": None}
    assert thr.row_by("configuration", "Full Filter")["throughput_tok_s"] == 80.0
    assert thr.row_by("configuration", "Full Filter")["reduction"] == pytest.approx(-0.2)
    over = s.table("guardrail_overhead")
    assert over.row_by("configuration", "Input Filter")["ttft_overhead_ms"] == pytest.approx(20.0)
    assert over.row_by("configuration", "Full Filter")["e2e_overhead_ms"] == pytest.approx(100.0)
    assert s.notes[0] == "Input Filter: +20.00 ms TTFT and +20.00 ms end-to-end at P50 against the baseline."


def test_accuracy_per_configuration_and_single_run_has_no_comparison():
    cls = ["benign", "adversarial", "trigger", "adversarial"]
    runs = {"baseline": run([1, 1, 1, 1], [2, 2, 2, 2], 1.0, cls), "full": run([1, 1, 1, 1], [2, 2, 2, 2], 1.0, cls, blocked={1, 2})}
    acc = build_report(ReportInputs(runs=runs), sections=["guardrail_comparison"]).section("guardrail_comparison").table("guardrail_accuracy")
    assert acc.row_by("configuration", "Baseline") == {"configuration": "Baseline", "detection": 0.0, "false_positive": 0.0, "over_defense": 0.0}
    assert acc.row_by("configuration", "Full Filter") == {"configuration": "Full Filter", "detection": 0.5, "false_positive": 0.5, "over_defense": 1.0}
    assert build_report(ReportInputs(runs={"baseline": runs["baseline"]}), sections=["guardrail_comparison"]).sections == []
