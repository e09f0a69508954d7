"""Stamp intervals (issue 14, item 4): a tap or client span that states ``deltatap.stamp.bounds`` widens every delta
its point takes part in by exactly that interval, on the live (compact) and offline paths alike; the row keeps the
intervals through its files, and the aggregate says how many values were bounded and how wide."""

from __future__ import annotations

import pytest

from deltatap.collector.compact import decode_compact
from deltatap.collector.decompose import build_row
from deltatap.collector.rows import from_record, to_record
from deltatap.collector.sketches import Aggregator
from deltatap.collector.spans import decode_request
from deltatap.core.topology import default_topology
from deltatap.core.vocab import STAMP_EXACT_NS, Attr, ClientEvent, TapEvent, delta_bound, format_stamp_bounds, parse_stamp_bounds
from otlpfactory import MS, default_stack, request

TOPO = default_topology()


def _with_bounds(spans, link_bounds: dict[str, dict[str, tuple[int, int]]]):
    """Add ``deltatap.stamp.bounds`` to the spans of the named observers ("client" or a link)."""
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

    for sp in spans:
        attrs = {kv.key: kv.value.string_value for kv in sp.attributes}
        who = "client" if attrs.get(Attr.OBSERVER) == "client" else attrs.get(Attr.LINK)
        if who in link_bounds:
            sp.attributes.append(KeyValue(key=Attr.STAMP_BOUNDS, value=AnyValue(string_value=format_stamp_bounds(link_bounds[who]))))
    return spans


def test_the_attribute_round_trips_and_leaves_out_what_is_exact():
    b = {TapEvent.FIRST_TOKEN_RECEIVED: (2 * MS, 0), TapEvent.REQUEST_FORWARDED: (0, 70_000), TapEvent.REQUEST_RECEIVED: (10_000, 0)}
    text = format_stamp_bounds(b)
    assert parse_stamp_bounds(text) == {"first_token.received": (2 * MS, 0), "request.forwarded": (0, 70_000)}
    assert format_stamp_bounds({TapEvent.REQUEST_RECEIVED: (STAMP_EXACT_NS, 0)}) is None  # exact enough: not stated
    assert parse_stamp_bounds("garbage,x=1/y") == {}
    # a delta end - start: the truth lies in [d - (end.before + start.after), d + (end.after + start.before)]
    assert delta_bound((2 * MS, 0), (0, 70_000)) == 2 * MS + 70_000 and delta_bound((0, 5), (7, 0)) == 12


@pytest.mark.parametrize("path", ["offline", "live"])
def test_bounded_points_widen_exactly_their_deltas(path):
    spans, _t = default_stack()
    # the engine-side tap read the first token late and could not place it; the edge tap's request write took long
    _with_bounds(spans, {"fw-engine": {TapEvent.FIRST_TOKEN_RECEIVED: (3 * MS, 0)},
                         "client": {ClientEvent.SEND: (0, 80_000)}})
    plain, _ = default_stack()
    data = request(spans).SerializeToString()
    if path == "live":
        build_row(decode_compact(data), TOPO)  # (layouts seen before are planned: a plan must not lose the intervals)
        build_row(decode_compact(data), TOPO)
        got = build_row(decode_compact(data), TOPO)
    else:
        got = build_row(decode_request(request(spans)), TOPO)
    ref = build_row(decode_request(request(plain)), TOPO)
    assert {k: v.ns for k, v in got.deltas.items()} == {k: v.ns for k, v in ref.deltas.items()}  # same values
    widened = {k for k in got.deltas if got.deltas[k].error_bound_ns != ref.deltas[k].error_bound_ns}
    # t7 is the end of engine TTFT and the start of firewall inbound-to-first-token paths; t0 starts system TTFT
    assert got.delta_bounds["engine_ttft"] == 3 * MS
    assert got.deltas["engine_ttft"].error_bound_ns == ref.deltas["engine_ttft"].error_bound_ns + 3 * MS
    assert got.delta_bounds["system_ttft"] == 80_000
    assert got.deltas["tap_fw-engine_first_token"].error_bound_ns == 3 * MS  # the tap's own overhead, too
    assert "gateway_inbound" not in widened and "gateway_inbound" not in got.delta_bounds
    assert widened == set(got.delta_bounds)
    assert got.point_bounds == {"engine.first_token": (3 * MS, 0), "client.send": (0, 80_000)}
    assert from_record(to_record(got, TOPO)) == got  # through the row files


def test_the_aggregate_counts_bounded_values_and_merges():
    rows = []
    for i in range(4):
        spans, _t = default_stack(rid=f"r{i}")
        if i < 3:
            _with_bounds(spans, {"fw-engine": {TapEvent.FIRST_TOKEN_RECEIVED: ((i + 1) * MS, 0)}})
        rows.append(build_row(decode_request(request(spans)), TOPO))
    a, b = Aggregator(), Aggregator()
    a.add_rows(rows[:2])
    b.add_rows(rows[2:])
    a.merge(Aggregator.from_dict(b.to_dict()))
    s = a.summary("engine_ttft")
    assert s["bounded_share"] == 0.75 and s["bound_max_ms"] == 3.0 and s["bound_mean_ms"] == 2.0
    assert a.summary("gateway_inbound")["bounded_share"] == 0.0
