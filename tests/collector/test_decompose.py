"""Decomposition against spans with known times: exact numbers."""

from __future__ import annotations

import pytest

from deltatap.collector.decompose import build_row
from deltatap.collector.rows import JoinMethod, TokenSource, delta_defs, from_record, to_record
from deltatap.collector.sinks import read_rows, write_rows
from deltatap.collector.spans import decode_request
from deltatap.core.topology import default_topology
from deltatap.core.vocab import Attr, ClientEvent, Role, TapEvent

from otlpfactory import BASE, MS, component_span, default_stack, new_trace_id, request, tap_span, vllm_span

TOPO = default_topology()


def row_of(spans):
    return build_row(decode_request(request(spans)), TOPO)


def test_every_draft_delta_from_taps_and_client():
    spans, t = default_stack()
    row = row_of(spans)
    d = {k: v.ns for k, v in row.deltas.items()}
    assert d["gateway_inbound"] == t["t2"] - t["t1"] == 2 * MS
    assert d["firewall_inbound"] == t["t5"] - t["t3"] == 5 * MS
    assert d["engine_ttft"] == t["t7"] - t["t6"] == 50 * MS
    assert d["system_ttft"] == t["t12"] - t["t0"] == 67 * MS
    assert d["output_path_overhead"] == t["t12"] - t["t7"]
    assert d["engine_decode"] == t["t8"] - t["t7"] == 100 * MS
    # outbound: the tap on gw-fw forwards the first token 0.05 ms after it received it
    assert d["firewall_outbound"] == t["t10"] - t["t9"]
    assert d["gateway_outbound"] == t["t11"] - (t["t10"] + 50_000)
    assert d["tap_edge_request"] == t["t1"] - (t["t0"] + 200_000)
    assert d["tap_fw-engine_first_token"] == t["t9"] - t["t7"]
    taps = sum(v for k, v in d.items() if k.startswith("tap_"))
    contrib = d["gateway_inbound"] + d["firewall_inbound"] + d["engine_ttft"] + d["firewall_outbound"] + d["gateway_outbound"] + taps
    assert d["residual"] == d["system_ttft"] - contrib
    # no queue/prefill split without engine telemetry: missing, never interpolated
    assert "engine_queue" not in d and "engine_prefill" not in d and "firewall_inbound_block" not in d
    assert row.t("t6a") is None and row.t("t4") is None
    assert row.t("t0").unix_ns == t["t0"] and row.t("t0").source == "client"
    assert row.request_id == "req-1" and row.http_status == 200 and row.outcome == "ok"
    assert row.labels == {"workload": "chat"} and row.join_method == JoinMethod.TRACE_ID
    assert row.cascade.attempts == {"edge": 1, "gw-fw": 1, "fw-engine": 1}


def test_clock_offsets_shift_points_and_widen_error_bounds():
    tid = new_trace_id()
    base = BASE
    # gw-fw tap's clock runs 3 ms ahead of the collector (uncertainty 40 us); edge tap is exact (10 us)
    edge = tap_span(tid, "edge", {TapEvent.REQUEST_RECEIVED: base, TapEvent.REQUEST_FORWARDED: base + MS}, {Attr.CLOCK_OFFSET_NS: 0, Attr.CLOCK_UNCERTAINTY_NS: 10_000})
    gwfw = tap_span(tid, "gw-fw", {TapEvent.REQUEST_RECEIVED: base + 5 * MS + 3 * MS, TapEvent.REQUEST_FORWARDED: base + 6 * MS + 3 * MS}, {Attr.CLOCK_OFFSET_NS: 3 * MS, Attr.CLOCK_UNCERTAINTY_NS: 40_000})
    row = row_of([edge, gwfw])
    gi = row.deltas["gateway_inbound"]
    assert gi.ns == 4 * MS and gi.error_bound_ns == 50_000 and not gi.within_observer
    assert row.deltas["tap_gw-fw_request"].ns == MS and row.deltas["tap_gw-fw_request"].error_bound_ns == 0
    assert row.points["gateway.in.exit"].unix_ns == base + 5 * MS


def test_component_truth_beats_taps_and_within_observer_is_preferred():
    spans, t = default_stack()
    tid = spans[0].trace_id
    # the firewall states its own points: arrive 0.3 ms after the tap forwarded, decision, exit
    fw = component_span(tid, "firewall", "firewall", {Role.IN_ARRIVE: t["t3"] + 300_000, Role.IN_DECISION: t["t3"] + 2 * MS, Role.IN_EXIT: t["t5"] - 200_000},
                        {Attr.CLOCK_UNCERTAINTY_NS: 7_000, Attr.FIREWALL_DECISION: "allow"})
    row = row_of(spans + [fw])
    fi = row.deltas["firewall_inbound"]
    assert fi.ns == (t["t5"] - 200_000) - (t["t3"] + 300_000) and fi.within_observer and fi.error_bound_ns == 0
    assert row.deltas["firewall_inbound_block"].ns == 2 * MS - 300_000
    assert row.points["firewall.in.arrive"].source == "component"
    assert row.firewall_decision == "allow"
    # gateway_inbound now ends at the firewall-independent tap point but starts at the edge tap: cross observer
    assert row.deltas["gateway_inbound"].ns == t["t2"] - t["t1"]


def test_vllm_llm_request_span_refines_engine_points():
    spans, t = default_stack()
    tid = spans[0].trace_id
    arrival = t["t6"] + 400_000
    v = vllm_span(tid, arrival, queue_s=0.004, ttft_s=0.045, prefill_s=0.041, decode_s=0.09)
    row = row_of(spans + [v])
    d = row.deltas
    assert row.points["engine.queue"].unix_ns == arrival and row.points["engine.queue"].source == "vllm"
    assert d["engine_queue"].ns == 4 * MS and d["engine_queue"].within_observer
    assert d["engine_prefill"].ns == 41 * MS
    assert d["engine_ttft"].ns == 45 * MS
    assert d["engine_decode"].ns == (4 + 41 + 90) * MS - 45 * MS
    assert row.tokens_in == 12 and row.tokens_out == 34 and row.tokens_source == TokenSource.USAGE


def test_llamacpp_timings_give_prefill_start():
    tid = new_trace_id()
    b = BASE
    sp = tap_span(tid, "fw-engine", {TapEvent.REQUEST_RECEIVED: b, TapEvent.REQUEST_FORWARDED: b + MS, TapEvent.FIRST_TOKEN_RECEIVED: b + 300 * MS,
                                     TapEvent.FIRST_TOKEN_FORWARDED: b + 300 * MS + 20_000, TapEvent.LAST_TOKEN_RECEIVED: b + 900 * MS},
                  {Attr.ENGINE_PROMPT_MS: 212.5, Attr.ENGINE_PREDICTED_MS: 600.0, Attr.ENGINE_PROMPT_N: 130, Attr.ENGINE_PREDICTED_N: 40})
    row = row_of([sp])
    assert row.deltas["engine_prefill"].ns == 212_500_000 and row.deltas["engine_prefill"].within_observer
    assert row.deltas["engine_queue"].ns == 299 * MS - 212_500_000
    assert row.points["engine.exec_start"].source == "llamacpp"
    assert row.tokens_in == 130 and row.tokens_out == 40
    assert "system_ttft" not in row.deltas and "residual" not in row.deltas


def test_cascade_facts_client_gave_up_engine_kept_going():
    tid = new_trace_id()
    b = BASE
    client = component_span  # noqa: F841 - readability
    from otlpfactory import client_span

    cs = client_span(tid, {ClientEvent.SEND: b, ClientEvent.CANCEL: b + 10_000 * MS, ClientEvent.END: b + 10_000 * MS}, {Attr.REQUEST_ID: "c1", Attr.OUTCOME: "client_cancel"})
    edge = tap_span(tid, "edge", {TapEvent.REQUEST_RECEIVED: b + 100_000, TapEvent.REQUEST_FORWARDED: b + 200_000, TapEvent.DOWNSTREAM_CLOSED: b + 10_000 * MS + 100_000}, {Attr.CONTENT_EVENTS: 0})
    fwe = tap_span(tid, "fw-engine", {TapEvent.REQUEST_RECEIVED: b + MS, TapEvent.REQUEST_FORWARDED: b + 2 * MS, TapEvent.FIRST_TOKEN_RECEIVED: b + 11_000 * MS,
                                      TapEvent.LAST_TOKEN_RECEIVED: b + 12_000 * MS, TapEvent.RESPONSE_END: b + 12_000 * MS + 500_000}, {Attr.CONTENT_EVENTS: 57})
    row = row_of([cs, edge, fwe])
    c = row.cascade
    assert c.gave_up_unix_ns["client"] == b + 10_000 * MS
    assert c.first_gave_up == ("client", b + 10_000 * MS)
    assert c.engine_end_unix_ns == b + 12_000 * MS + 500_000
    assert c.engine_busy_after_gave_up_ns == 2_000 * MS + 500_000
    assert c.tokens_after_gave_up == 57
    assert row.outcome == "client_cancel"


def test_missing_points_stay_missing_and_records_round_trip(tmp_path):
    spans, _ = default_stack()
    rows = [row_of(spans), row_of(spans[:2])]  # the second: client + edge tap only
    assert set(rows[1].deltas) == {"tap_edge_request", "tap_edge_first_token", "system_ttft", "system_ttlt"}
    for r in rows:
        assert from_record(to_record(r)) == r
    for suffix in ("parquet", "csv", "jsonl"):
        path = write_rows(rows, tmp_path / f"rows.{suffix}", TOPO)
        back = read_rows(path)
        assert back == rows, suffix


def test_delta_defs_follow_the_topology():
    from deltatap.core.topology import ComponentSpec, LinkModel, Topology

    topo = Topology(components=[ComponentSpec(name="c", kind="client"), ComponentSpec(name="router", kind="router"), ComponentSpec(name="e", kind="engine")],
                    links=[LinkModel(name="a", downstream="c", upstream="router"), LinkModel(name="b", downstream="router", upstream="e")])
    names = [d.name for d in delta_defs(topo)]
    assert "router_inbound" in names and "router_outbound" in names and "gateway_inbound" not in names
    assert "tap_a_request" in names and names[-1] == "residual"


@pytest.mark.parametrize("bad", [b"\x00" * 8])
def test_short_ids_are_rejected(bad):
    from deltatap.collector.spans import OtlpDecodeError

    spans, _ = default_stack()
    spans[0].trace_id = bad
    with pytest.raises(OtlpDecodeError, match="traceId must be 16 bytes"):
        decode_request(request(spans))
