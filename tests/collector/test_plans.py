"""The compiled readers of the span kinds (collector.kinds, one per compact span layout) and the row plans
(collector.decompose, per sequence of span Shapes) give exactly the rows a plain SpanRecord gives; a span kind
registered later takes the compiled path too."""

from __future__ import annotations

import pytest

from deltatap.collector import kinds
from deltatap.collector.compact import decode_compact
from deltatap.collector.decompose import Decomposer, build_row
from deltatap.collector.kinds.model import RANK_COMPONENT, Emit, Fact, Into, Match, Site, SpanKind
from deltatap.collector.rows import DeltaValue, Row, delta_columns, to_record
from deltatap.collector.spans import decode_request
from deltatap.core.topology import default_topology
from deltatap.core.vocab import Attr, ClientEvent, Role, TapEvent

from otlpfactory import BASE, MS, client_span, component_span, default_stack, new_trace_id, request, tap_span

TOPO = default_topology()


def _retries():
    """Two attempts on fw-engine (the later one wins ties) and a second edge span at the same start."""
    spans, t = default_stack()
    tid = spans[0].trace_id
    ev = {TapEvent.REQUEST_RECEIVED: t["t5"] + 2 * MS, TapEvent.REQUEST_FORWARDED: t["t6"] + 2 * MS, TapEvent.FIRST_TOKEN_RECEIVED: t["t7"] + 1 * MS,
          TapEvent.FIRST_TOKEN_FORWARDED: t["t9"] + 1 * MS, TapEvent.UPSTREAM_ERROR: t["t7"] + 5 * MS}
    spans.append(tap_span(tid, "fw-engine", ev, {Attr.REQUEST_ID: "req-1", Attr.HTTP_STATUS: 502, Attr.OUTCOME: "upstream_error"}))
    spans.append(tap_span(tid, "edge", {TapEvent.REQUEST_RECEIVED: t["t0"] + 200_000, TapEvent.REQUEST_FORWARDED: t["t1"] + 7}, {Attr.REQUEST_ID: "req-1"}))
    return spans


def _clocks():
    """Taps with their own clock offset and uncertainty (per span), a client with a fixed string one."""
    spans, t = default_stack()
    for i, sp in enumerate(spans[1:], start=1):
        sp.attributes.add(key=Attr.CLOCK_OFFSET_NS).value.int_value = i * 123_457 - 200_000
        sp.attributes.add(key=Attr.CLOCK_UNCERTAINTY_NS).value.int_value = 10_000 * i
    spans[0].attributes.add(key=Attr.CLOCK_UNCERTAINTY_NS).value.string_value = "2500"
    return spans


def _disconnect():
    """The client cancels; the edge tap sees the client leave; the engine keeps going (llama.cpp timings)."""
    tid = new_trace_id()
    c = client_span(tid, {ClientEvent.SEND: BASE, ClientEvent.FIRST_TOKEN: BASE + 60 * MS, ClientEvent.CANCEL: BASE + 500 * MS},
                    {Attr.REQUEST_ID: "r", Attr.OUTCOME: "client_cancel", "deltatap.label.phase": "cascade"})
    edge = tap_span(tid, "edge", {TapEvent.REQUEST_RECEIVED: BASE + 100, TapEvent.REQUEST_FORWARDED: BASE + 200_000, TapEvent.FIRST_TOKEN_RECEIVED: BASE + 59 * MS,
                                  TapEvent.FIRST_TOKEN_FORWARDED: BASE + 59 * MS + 50_000, TapEvent.DOWNSTREAM_CLOSED: BASE + 501 * MS},
                    {Attr.REQUEST_ID: "r", Attr.CONTENT_EVENTS: 40, Attr.GAP_COUNT: 39, Attr.GAP_MEAN_MS: 10.5, Attr.GAP_P99_MS: 20.25, Attr.GAP_MAX_MS: 30.0,
                     Attr.GAP_FWD_MEAN_MS: 10.75, Attr.GAP_FWD_MAX_MS: 31})
    eng = tap_span(tid, "fw-engine", {TapEvent.REQUEST_RECEIVED: BASE + 1 * MS, TapEvent.REQUEST_BODY_RECEIVED: BASE + 1 * MS + 10, TapEvent.REQUEST_FORWARDED: BASE + 2 * MS,
                                      TapEvent.FIRST_TOKEN_RECEIVED: BASE + 50 * MS, TapEvent.FIRST_TOKEN_FORWARDED: BASE + 50 * MS + 10,
                                      TapEvent.LAST_TOKEN_RECEIVED: BASE + 900 * MS, TapEvent.RESPONSE_END: BASE + 901 * MS},
                   {Attr.REQUEST_ID: "r", Attr.CONTENT_EVENTS: 90, Attr.ENGINE_PROMPT_MS: 12.5, Attr.ENGINE_PROMPT_N: 33, Attr.ENGINE_PREDICTED_N: 90,
                    Attr.GAP_COUNT: 89, Attr.GAP_MEAN_MS: 10.0, Attr.GAP_P99_MS: 11.5, Attr.GAP_MAX_MS: 12.0, Attr.GAP_FWD_MEAN_MS: 10.5,
                    Attr.GAP_FWD_P99_MS: 12.0, Attr.GAP_FWD_MAX_MS: 14.0})
    return [c, edge, eng]


def _components():
    """The reference stack's own spans (true points, a timeout, the engine's count after the disconnect) beside the taps."""
    spans, t = default_stack()
    tid = spans[0].trace_id
    spans.append(component_span(tid, "firewall", "firewall", {Role.IN_ARRIVE: t["t3"] + 10, Role.IN_DECISION: t["t3"] + 2 * MS, Role.IN_EXIT: t["t5"] - 10},
                                {Attr.FIREWALL_DECISION: "block_pattern", Attr.CLOCK_OFFSET_NS: 5_000, Attr.CLOCK_UNCERTAINTY_NS: 3_000}))
    spans.append(component_span(tid, "gateway", "gateway", {Role.IN_ARRIVE: t["t1"] + 5, TapEvent.TIMEOUT: t["t1"] + 80 * MS}))
    spans.append(component_span(tid, "engine", "engine", {Role.QUEUE: t["t6"] + 1, Role.EXEC_START: t["t6"] + 2 * MS, Role.FIRST_TOKEN: t["t7"] - 5,
                                                          Role.LAST_TOKEN: t["t8"] - 5}, {Attr.ENGINE_TOKENS_AFTER_DISCONNECT: 17}))
    return spans


def _aiperf_client_and_missing_points():
    """An AIPerf-style client (tokenizer counts), taps that saw no first token, duplicate events."""
    tid = new_trace_id()
    c = client_span(tid, {ClientEvent.SEND: BASE, ClientEvent.ERROR: BASE + 30 * MS}, {Attr.REQUEST_ID: "a", Attr.GENAI_INPUT_TOKENS: 5, Attr.GENAI_OUTPUT_TOKENS: 0})
    edge = tap_span(tid, "edge", {TapEvent.REQUEST_RECEIVED: BASE + 10, TapEvent.REQUEST_FORWARDED: BASE + 300_000, TapEvent.RESPONSE_HEADERS: BASE + 20 * MS},
                    {Attr.REQUEST_ID: "a", Attr.HTTP_STATUS: 504, Attr.OVERHEAD_REQUEST_NS: "not a number"})
    edge.events.add(name=TapEvent.REQUEST_RECEIVED.value, time_unix_nano=BASE + 20)
    return [c, edge]


SCENARIOS = {
    "default stack": lambda: default_stack()[0],
    "split trace": lambda: default_stack(rid="r2", fp="fp-2", split_at="gw-fw", inner_rid="r2-inner")[0],
    "retries": _retries,
    "clock offsets": _clocks,
    "disconnect, llama.cpp, gaps": _disconnect,
    "component spans": _components,
    "aiperf client, missing points": _aiperf_client_and_missing_points,
}


@pytest.mark.parametrize("name", list(SCENARIOS))
@pytest.mark.parametrize("service", ["deltatap-test", "aiperf"])
def test_compiled_rows_equal_plain_rows(name, service):
    req = request(SCENARIOS[name](), service=service)
    data = req.SerializeToString()
    dec = Decomposer(TOPO)
    plain, live = decode_request(req), decode_compact(data)
    assert dec.extract(live) == dec.extract(plain)
    assert all(dec._by_layout[s.layout] is not None for s in live)  # every span here is read by its layout's reader
    by_trace: dict[str, tuple[list, list]] = {}
    for p, c in zip(plain, live, strict=True):
        by_trace.setdefault(p.trace_id, ([], []))[0].append(p)
        by_trace[p.trace_id][1].append(c)
    for ps, cs in by_trace.values():
        want, got = build_row(ps, TOPO), dec.build_row(cs)
        assert got == want == dec.build_row(cs)  # (the second time through the row plan)
        assert list(to_record(got, TOPO).items()) == list(to_record(want, TOPO).items())
        assert (list(got.points), list(got.deltas)) == (list(want.points), list(want.deltas))


def test_a_layout_is_compiled_once_per_decomposer():
    spans, _ = default_stack()
    data = request(spans).SerializeToString()
    dec = Decomposer(TOPO)
    first, again = decode_compact(data), decode_compact(data)
    progs = [dec.program(s)[0] for s in first]
    assert [dec.program(s)[0] for s in again] == progs and len({id(p) for p in progs}) == 4
    assert "vals +=" in progs[1].source  # a tap's reader: its event times read by position
    assert Decomposer(TOPO).program(first[1])[0] is not progs[1]  # nothing shared between decomposers


def test_a_span_whose_observer_varies_per_span_is_read_the_plain_way():
    spans, _ = default_stack()
    spans[1].attributes.add(key=Attr.OBSERVER).value.int_value = 7  # an observer the layout cannot hold: the last key wins
    live = decode_compact(request(spans).SerializeToString())
    dec = Decomposer(TOPO)
    assert dec.build_row(live) == build_row(decode_request(request(spans)), TOPO)
    assert dec._by_layout[live[1].layout] is None


def _my_site(view, topo):
    return Site("component:engine", "mine", RANK_COMPONENT, {"my.first": Emit("engine.first_token")}, component="engine")


def test_a_newly_registered_kind_keeps_the_compiled_path():
    tid = new_trace_id()
    spans, t = default_stack()
    tid = spans[0].trace_id
    from otlpfactory import make_span

    mine = make_span(tid, "my.span", BASE + 5 * MS, BASE + 90 * MS, {"my.first": t["t7"] - 1_000}, {"my.request_id": "req-1", "my.ignored": "x"})
    kinds.register(SpanKind("mine", (Match(name="my.span"),), _my_site, facts=(Fact("my.request_id", Into.REQUEST_ID),), common=False), before="vllm")
    try:
        data = request([*spans, mine]).SerializeToString()
        live = decode_compact(data)
        assert "my.request_id" in live[-1].attrs and "my.ignored" not in live[-1].attrs  # the decoder keeps what the kind reads
        dec = Decomposer(TOPO)
        row = dec.build_row(live)
        assert dec.program(live[-1])[0].kind == "mine" and dec._by_layout[live[-1].layout] is not None
        assert row.points["engine.first_token"] == (t["t7"] - 1_000, 0, "component:engine", "mine")  # a component's own stamp beats the tap's
        assert row == dec.build_row(decode_compact(data)) == build_row(decode_request(request([*spans, mine])), TOPO)
    finally:
        kinds.unregister("mine")
    assert "my.request_id" not in decode_compact(data)[-1].attrs


def test_delta_columns_hold_every_value_in_row_order():
    rows = [Row(trace_id="a", deltas={"x": DeltaValue(1, 2), "y": DeltaValue(-3, 0, False)}),
            Row(trace_id="b", deltas={"x": DeltaValue(4, 5), "y": DeltaValue(6)}),
            Row(trace_id="c", deltas={"z": DeltaValue(7, 1), "x": DeltaValue(8)}),
            Row(trace_id="d")]
    cols = delta_columns(rows)
    assert list(cols) == ["x", "y", "z"]
    assert {k: (list(v), list(e)) for k, (v, e) in cols.items()} == {"x": ([1, 4, 8], [2, 5, 0]), "y": ([-3, 6], [0, 0]), "z": ([7], [1])}
    big = delta_columns([Row(trace_id="e", deltas={"x": DeltaValue(2**63)})])  # beyond int64: plain ints, numpy raises later
    assert big == {"x": ((2**63,), (0,))}
