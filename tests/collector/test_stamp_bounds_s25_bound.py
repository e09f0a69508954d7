"""Session 25 ("bound"): a write whose departure nothing observed (TCP still held its bytes when it was stamped, and
no later observation saw them leave) is stated *unknown* (``?`` in ``deltatap.stamp.bounds``, -1 in memory), never
exact and never a number: the format round-trips it (old values parse as before), every delta it takes part in has an
unknown bound (``Row.delta_bounds`` -1, JSON null in the row files; the delta's ``err_ns`` keeps only its clock part),
the residual too, and the aggregate counts those values apart from the widths."""

from __future__ import annotations

import json

from deltatap.collector.decompose import build_row
from deltatap.collector.rows import from_record, to_record
from deltatap.collector.sketches import Aggregator
from deltatap.collector.spans import decode_request
from deltatap.core.topology import default_topology
from deltatap.core.vocab import (
    BOUND_UNKNOWN, STAMP_EXACT_NS, ClientEvent, TapEvent, add_bounds, delta_bound, format_stamp_bounds, parse_stamp_bounds,
)
from otlpfactory import MS, default_stack, request
from test_stamp_bounds import _with_bounds

TOPO = default_topology()


def test_unknown_round_trips_and_old_values_parse_as_before():
    b = {TapEvent.FIRST_TOKEN_FORWARDED: (0, BOUND_UNKNOWN), TapEvent.REQUEST_FORWARDED: (0, 70_000),
         TapEvent.RESPONSE_HEADERS_FORWARDED: (0, 10)}
    text = format_stamp_bounds(b)
    assert text == "first_token.forwarded=0/?,request.forwarded=0/70000"  # unknown is stated, however small it looks
    assert parse_stamp_bounds(text) == {"first_token.forwarded": (0, BOUND_UNKNOWN), "request.forwarded": (0, 70_000)}
    assert format_stamp_bounds({TapEvent.REQUEST_FORWARDED: (0, -5)}) == "request.forwarded=0/?"  # any negative: unknown
    assert format_stamp_bounds({TapEvent.REQUEST_FORWARDED: (0, STAMP_EXACT_NS)}) is None
    # what spans of earlier versions carry reads as it did
    assert parse_stamp_bounds("first_token.received=2000000/0,request.forwarded=0/70000") == {
        "first_token.received": (2 * MS, 0), "request.forwarded": (0, 70_000)}
    assert parse_stamp_bounds("a=?/?,b=1/x,c=?") == {"a": (BOUND_UNKNOWN, BOUND_UNKNOWN)}
    # a delta with an unknown side that enters it has no bound; one whose unknown side does not enter it is unchanged
    assert delta_bound((0, BOUND_UNKNOWN), (5, 0)) == BOUND_UNKNOWN
    assert delta_bound((5, 0), (0, BOUND_UNKNOWN)) == BOUND_UNKNOWN
    assert delta_bound(None, None) == 0 and delta_bound((2, 3), (4, 5)) == 7
    assert add_bounds(1, 2, 3) == 6 and add_bounds(1, BOUND_UNKNOWN, 3) == BOUND_UNKNOWN and add_bounds() == 0


def test_a_write_never_seen_to_leave_makes_its_deltas_unbounded():
    spans, _t = default_stack()
    _with_bounds(spans, {"fw-engine": {TapEvent.FIRST_TOKEN_FORWARDED: (0, BOUND_UNKNOWN)},
                         "client": {ClientEvent.SEND: (0, BOUND_UNKNOWN)}})
    plain, _ = default_stack()
    got = build_row(decode_request(request(spans)), TOPO)
    ref = build_row(decode_request(request(plain)), TOPO)
    assert {k: v.ns for k, v in got.deltas.items()} == {k: v.ns for k, v in ref.deltas.items()}  # same values
    # the tap's first-token overhead ends at that write; system TTFT starts at the client's send; the residual sums it
    for name in ("tap_fw-engine_first_token", "system_ttft", "residual"):
        assert got.delta_bounds[name] == BOUND_UNKNOWN, name
        assert got.deltas[name].error_bound_ns == ref.deltas[name].error_bound_ns  # no number that reads as a bound
    assert "engine_ttft" not in got.delta_bounds and "gateway_inbound" not in got.delta_bounds
    assert got.point_bounds["client.send"] == (0, BOUND_UNKNOWN)
    rec = to_record(got, TOPO)
    doc = json.loads(rec["stamp_bounds"])
    assert doc["deltas"]["system_ttft"] is None and doc["points"]["client.send"] == [0, None]
    assert from_record(rec) == got  # through the row files


def test_the_aggregate_counts_unbounded_values_apart():
    rows = []
    for i in range(4):
        spans, _t = default_stack(rid=f"u{i}")
        if i == 0:
            _with_bounds(spans, {"client": {ClientEvent.SEND: (0, BOUND_UNKNOWN)}})
        elif i == 1:
            _with_bounds(spans, {"client": {ClientEvent.SEND: (0, 2 * MS)}})
        rows.append(build_row(decode_request(request(spans)), TOPO))
    a, b = Aggregator(), Aggregator()
    a.add_rows(rows[:1])
    b.add_rows(rows[1:])
    a.merge(Aggregator.from_dict(b.to_dict()))
    s = a.summary("system_ttft")
    assert s["bounded_share"] == 0.5 and s["unbounded_share"] == 0.25
    assert s["bound_max_ms"] == 2.0 and s["bound_mean_ms"] == 2.0  # the widths are the known bounds' only


def test_the_percentiles_report_names_the_unbounded_values():
    from deltatap.collector.reports.registry import ReportInputs, build_report

    rows = []
    for i in range(4):
        spans, _t = default_stack(rid=f"p{i}")
        if i == 0:
            _with_bounds(spans, {"client": {ClientEvent.SEND: (0, BOUND_UNKNOWN)}})
        rows.append(build_row(decode_request(request(spans)), TOPO))
    table = build_report(ReportInputs(rows=rows), sections=["percentiles"]).section("percentiles").table("deltas")
    note = next(f for f in table.footnotes if f.startswith("Unbounded"))
    assert "system_ttft 25.0 %" in note and "engine_ttft" not in note
    plain = build_report(ReportInputs(rows=rows[1:]), sections=["percentiles"]).section("percentiles").table("deltas")
    assert not any(f.startswith("Unbounded") for f in plain.footnotes)
