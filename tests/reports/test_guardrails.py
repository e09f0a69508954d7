"""Guardrail overhead of one run, over hand-made rows with exact expected numbers."""

from __future__ import annotations

import math

import pytest

from deltatap.collector.reports.guardrails import firewall_section
from deltatap.collector.reports.registry import ReportInputs, ReportOptions, build_report
from tests.reports.factories import row


def rows():
    return [
        row(1, firewall_decision="allow", labels={"class": "benign"},
            deltas_ms={"firewall_inbound": 2, "firewall_inbound_block": 1.5, "firewall_outbound": 1, "firewall_outbound_last": 3, "firewall_itl_added_mean": 0.5, "firewall_itl_added_p99": 1, "firewall_max_pause_added": 2}),
        row(2, firewall_decision="allow", labels={"class": "benign"},
            deltas_ms={"firewall_inbound": 4, "firewall_outbound": 3, "firewall_outbound_last": 1, "firewall_itl_added_mean": 1.5, "firewall_itl_added_p99": 3, "firewall_max_pause_added": 8}),
        row(3, firewall_decision="allow_after_analysis", labels={"class": "adversarial"},
            deltas_ms={"firewall_inbound": 10, "firewall_outbound": 1, "firewall_outbound_last": 5, "firewall_itl_added_mean": 1.0, "firewall_itl_added_p99": 2, "firewall_max_pause_added": 5}),
        row(4, firewall_decision="block_pattern", outcome="refused", labels={"class": "adversarial"}, deltas_ms={"firewall_inbound_block": 1}),
        row(5, firewall_decision="block_analysis", outcome="refused", labels={"class": "trigger"}, deltas_ms={"firewall_inbound_block": 30}),
    ]


def test_inspection_latency_table_is_exact():
    t = firewall_section(rows(), "firewall", ReportOptions()).table("firewall_latency")
    inbound = t.row_by("metric", "inbound, passing")
    assert inbound["count"] == 3 and inbound["p50_ms"] == 4.0 and inbound["max_ms"] == 10.0
    assert inbound["p90_ms"] == pytest.approx(8.8) and inbound["p99_ms"] == pytest.approx(9.88) and inbound["mean_ms"] == pytest.approx(16 / 3)
    block = t.row_by("metric", "inbound, blocking")
    assert block["count"] == 2 and block["p50_ms"] == pytest.approx(15.5) and block["max_ms"] == 30.0
    out = t.row_by("metric", "outbound, first token")
    assert out["count"] == 3 and out["p50_ms"] == 1.0 and out["mean_ms"] == pytest.approx(5 / 3)
    last = t.row_by("metric", "outbound, last token")
    assert last["count"] == 3 and last["p50_ms"] == 3.0


def test_latency_by_decision_uses_block_time_for_blocks():
    t = firewall_section(rows(), "firewall", ReportOptions()).table("firewall_by_decision")
    assert [r["decision"] for r in t.records()] == ["allow", "allow (flagged, deep analysis)", "block (pattern match)", "block (semantic analysis)"]
    allow = t.row_by("decision", "allow")
    assert allow["requests"] == 2 and allow["share"] == pytest.approx(0.4) and allow["inspection_p50_ms"] == 3.0 and allow["outbound_p50_ms"] == 2.0
    assert allow["decision_p50_ms"] == 1.5  # only request 1 states its decision time (t4)
    assert t.row_by("decision", "block (semantic analysis)")["decision_p50_ms"] == 30.0
    assert t.row_by("decision", "block (semantic analysis)")["inspection_mean_ms"] == 30.0
    assert t.row_by("decision", "block (pattern match)")["inspection_p99_ms"] == 1.0


def test_streaming_inspection_delay_pause_and_jitter():
    t = firewall_section(rows(), "firewall", ReportOptions(pause_threshold_ms=5)).table("firewall_streaming")
    v = {r["metric"]: r["value"] for r in t.records()}
    assert v["completed streams measured"] == 3
    # per-token delay = (first + last outbound) / 2 per request: 2, 2, 3 ms
    assert v["per-token inspection delay, P50 over requests"] == 2.0
    assert v["per-token inspection delay, P99 over requests"] == pytest.approx(2.98)
    assert v["jitter contribution (std dev of per-token delay across requests)"] == pytest.approx(math.sqrt(2 / 9))
    assert v["inter-chunk gap added (mean gap released - received), P50"] == pytest.approx(1.0)
    assert v["tail gap added (P99 gap released - received), P50"] == 2.0
    assert v["maximum pause added, worst request"] == 8.0
    assert v["maximum pause added, P50 over requests"] == 5.0
    assert v["pause frequency (requests with a pause >= 5 ms added)"] == pytest.approx(2 / 3)


def test_accuracy_rates_from_labels():
    t = firewall_section(rows(), "firewall", ReportOptions()).table("firewall_accuracy")
    det = t.row_by("metric", "detection rate")
    assert (det["requests"], det["hits"], det["rate"]) == (2, 1, 0.5)
    fp = t.row_by("metric", "false positive rate")
    assert (fp["requests"], fp["hits"]) == (3, 1) and fp["rate"] == pytest.approx(1 / 3)
    od = t.row_by("metric", "over-defense rate")
    assert (od["requests"], od["hits"], od["rate"]) == (1, 1, 1.0)


def test_section_notes_and_disclosure():
    s = firewall_section(rows(), "firewall", ReportOptions())
    assert s.notes[0] == "Input filtering: observed (3 requests inspected inbound); output filtering: observed (3 first tokens inspected); requests refused during the test: 2 of 5."
    assert s.notes[1] == "firewall adds 4.00 ms inbound (t5 - t3, P50) and 1.00 ms to the first token outbound (t10 - t9, P50): 5.00 ms of client TTFT at P50."
    assert s.data["blocked"] == 2


def test_cut_streams_are_left_out_of_last_token_and_streaming_figures():
    cut = row(9, firewall_decision="allow", outcome="upstream_error",
              deltas_ms={"firewall_inbound": 2, "firewall_outbound": 1, "firewall_outbound_last": -200, "firewall_itl_added_mean": 9, "firewall_max_pause_added": 90})
    s = firewall_section([*rows(), cut], "firewall", ReportOptions())
    assert s.table("firewall_latency").row_by("metric", "outbound, last token")["count"] == 3
    v = {r["metric"]: r["value"] for r in s.table("firewall_streaming").records()}
    assert v["completed streams measured"] == 3 and v["maximum pause added, worst request"] == 8.0


def test_without_labels_or_streaming_those_tables_are_left_out():
    plain = [row(1, firewall_decision="allow", deltas_ms={"firewall_inbound": 2})]
    s = firewall_section(plain, "firewall", ReportOptions())
    assert [t.name for t in s.tables] == ["firewall_latency", "firewall_by_decision"]


def test_topology_without_firewall_has_no_guardrail_section():
    from deltatap.core.topology import ComponentSpec, LinkModel, Topology

    topo = Topology(
        components=[ComponentSpec(name="client", kind="client"), ComponentSpec(name="engine", kind="engine")],
        links=[LinkModel(name="direct", downstream="client", upstream="engine")],
    )
    report = build_report(ReportInputs(rows=rows(), topology=topo), sections=["guardrails"])
    assert report.sections == []
