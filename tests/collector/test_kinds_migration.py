"""Migration guard (issue 16): the span kinds of collector/kinds give the rows the old extractors gave.

Hypothesis generates requests over random topologies (a chain of 2-5 components, links tapped or not)
with missing points, retries, clock offsets, stripped trace headers (the inner taps in a trace of their own),
stripped link attributes, stamp bounds, component spans,
vLLM's ``gen_ai.latency.*``, LiteLLM's guardrail and upstream-call spans (also under a renamed service)
and llama.cpp timings. Every request is built three ways: plain ``SpanRecord``s, and compact spans decoded
from the wire three times over (the first span of a layout, then the compiled fast path). Every one must
equal the frozen old path's row (tests/collector/kinds_reference.py, the extraction as it was at a53e57f).
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kinds_reference as old
from deltatap.collector.compact import decode_compact
from deltatap.collector.decompose import Decomposer
from deltatap.collector.spans import decode_request
from deltatap.core.topology import ComponentSpec, LinkModel, Topology
from deltatap.core.vocab import Attr, ClientEvent, Role, TapEvent, component_span_name, format_stamp_bounds, tap_span_name

from otlpfactory import MS, make_span, request

BASE = 1_700_000_000_000_000_000
MIDS = ("gateway", "firewall", "router", "cache", "proxy")


@st.composite
def topologies(draw) -> Topology:
    mids = draw(st.lists(st.sampled_from(MIDS), min_size=0, max_size=3))
    names = ["client"] + [f"{k}{i}" for i, k in enumerate(mids)] + ["engine"]
    if draw(st.booleans()) and mids:
        names[1] = "litellm"  # LiteLLM's spans belong to the component of that name
    kinds = ["client", *mids, "engine"]
    comps = [ComponentSpec(name=n, kind=k) for n, k in zip(names, kinds)]
    links = [LinkModel(name=f"l{i}", downstream=names[i], upstream=names[i + 1]) for i in range(len(names) - 1)]
    return Topology(name="gen", components=comps, links=links)


TAP_EVENTS = [TapEvent.REQUEST_RECEIVED, TapEvent.REQUEST_BODY_RECEIVED, TapEvent.REQUEST_FORWARDED, TapEvent.RESPONSE_HEADERS,
              TapEvent.FIRST_TOKEN_RECEIVED, TapEvent.FIRST_TOKEN_FORWARDED, TapEvent.LAST_TOKEN_RECEIVED, TapEvent.LAST_TOKEN_FORWARDED,
              TapEvent.RESPONSE_END, TapEvent.DOWNSTREAM_CLOSED, TapEvent.UPSTREAM_ERROR, TapEvent.UPSTREAM_CLOSED]
ms = st.integers(min_value=0, max_value=400)  # milliseconds after the request's start


def _clock(draw, a: dict) -> None:
    """A clock offset and uncertainty, sometimes, in the types senders use."""
    if draw(st.booleans()):
        a[Attr.CLOCK_OFFSET_NS] = draw(st.integers(-5 * MS, 5 * MS))
    if draw(st.booleans()):
        a[Attr.CLOCK_UNCERTAINTY_NS] = draw(st.sampled_from([0, 2500, 40_000, "2500", -3]))


@st.composite
def tap_spans(draw, topo: Topology, link: LinkModel, tid: bytes, rid: str) -> list:
    out = []
    for _attempt in range(draw(st.integers(1, 2))):  # a second span on one link: a retry
        evs = draw(st.lists(st.sampled_from(TAP_EVENTS), min_size=1, max_size=8, unique=True))
        events = {e: BASE + draw(ms) * MS + draw(st.integers(0, 999)) for e in evs}
        a: dict = {Attr.OBSERVER: "tap", Attr.REQUEST_ID: rid}
        if draw(st.booleans()):  # a tap that states its link; else the collector reads it from the topology
            a.update({Attr.LINK: link.name, Attr.DOWNSTREAM: link.downstream, Attr.UPSTREAM: link.upstream,
                      Attr.DOWNSTREAM_KIND: topo.component(link.downstream).kind.value, Attr.UPSTREAM_KIND: topo.component(link.upstream).kind.value})
        elif draw(st.booleans()):
            a[Attr.LINK] = link.name
        for key, strat in ((Attr.HTTP_STATUS, st.sampled_from([200, 502, 504, "200"])), (Attr.OUTCOME, st.sampled_from(["ok", "timeout", "upstream_error", "http_error"])),
                           (Attr.OVERHEAD_REQUEST_NS, st.integers(0, 900_000)), (Attr.OVERHEAD_FIRST_TOKEN_NS, st.integers(0, 900_000)),
                           (Attr.CONTENT_EVENTS, st.integers(0, 300)), (Attr.FIREWALL_DECISION, st.sampled_from(["allow", "block_pattern"])),
                           (Attr.GENAI_INPUT_TOKENS, st.integers(1, 500)), (Attr.GENAI_OUTPUT_TOKENS, st.integers(0, 500)),
                           (Attr.ENGINE_PROMPT_MS, st.floats(0.5, 90.0)), (Attr.ENGINE_PROMPT_N, st.integers(1, 500)), (Attr.ENGINE_PREDICTED_N, st.integers(0, 500)),
                           (Attr.BODY_FINGERPRINT, st.just("fp"))):
            if draw(st.integers(0, 2)) == 0:
                a[key] = draw(strat)
        if draw(st.booleans()):
            a[Attr.GAP_COUNT] = draw(st.integers(0, 300))
            for key in (Attr.GAP_MEAN_MS, Attr.GAP_P99_MS, Attr.GAP_MAX_MS, Attr.GAP_FWD_MEAN_MS, Attr.GAP_FWD_P99_MS, Attr.GAP_FWD_MAX_MS):
                if draw(st.integers(0, 3)):
                    a[key] = draw(st.sampled_from([draw(st.floats(0.1, 80.0)), draw(st.integers(1, 80))]))
        if draw(st.integers(0, 4)) == 0:
            bounds = {str(e): (draw(st.integers(0, 90_000)), draw(st.integers(0, 90_000))) for e in draw(st.lists(st.sampled_from(evs), max_size=3))}
            text = format_stamp_bounds(bounds)
            if text:
                a[Attr.STAMP_BOUNDS] = text
        _clock(draw, a)
        ts = list(events.values())
        out.append(make_span(tid, tap_span_name(link.name), min(ts), max(ts), {str(k): v for k, v in events.items()}, a))
    return out


@st.composite
def requests(draw) -> tuple[Topology, list]:
    topo = draw(topologies())
    tid = os.urandom(16)
    rid = draw(st.sampled_from(["req-1", "req-2"]))
    spans = []
    if draw(st.booleans()):  # the client (or AIPerf) span, or none
        evs = draw(st.lists(st.sampled_from(list(ClientEvent)), min_size=1, max_size=5, unique=True))
        a = {Attr.OBSERVER: "client", Attr.REQUEST_ID: rid, "deltatap.label.workload": draw(st.sampled_from(["chat", "rag"]))}
        if draw(st.booleans()):
            a.update({Attr.GENAI_INPUT_TOKENS: draw(st.integers(1, 500)), Attr.GENAI_OUTPUT_TOKENS: draw(st.integers(1, 500)), Attr.RUN_ID: "run-7"})
        if draw(st.booleans()):
            a[Attr.OUTCOME] = draw(st.sampled_from(["ok", "client_cancel", "timeout"]))
            a[Attr.HTTP_STATUS] = draw(st.sampled_from([200, 504]))
        _clock(draw, a)
        events = {e: BASE + draw(ms) * MS for e in evs}
        ts = list(events.values())
        sp = make_span(tid, "deltatap.client", min(ts), max(ts), {str(k): v for k, v in events.items()}, a)
        spans.append((draw(st.sampled_from(["loadgen", "aiperf"])), sp))
    split = draw(st.integers(0, len(topo.links)))  # a component that strips traceparent: the taps inward start a new trace
    for i, link in enumerate(topo.links):
        if i == split:
            tid = os.urandom(16)
        if draw(st.integers(0, 3)):  # most links tapped
            spans += [("deltatap-tap", s) for s in draw(tap_spans(topo, link, tid, rid))]
    for comp in topo.components[1:]:
        if draw(st.integers(0, 3)) == 0:  # a component stating its own points
            roles = draw(st.lists(st.sampled_from(list(Role)), min_size=1, max_size=4, unique=True))
            events = {str(r): BASE + draw(ms) * MS for r in roles}
            if draw(st.booleans()):
                events[str(TapEvent.TIMEOUT)] = BASE + draw(ms) * MS
            a = {Attr.OBSERVER: "component", Attr.COMPONENT: comp.name, Attr.COMPONENT_KIND: comp.kind.value, Attr.REQUEST_ID: rid}
            if draw(st.booleans()):
                a[Attr.FIREWALL_DECISION] = draw(st.sampled_from(["allow", "block_pattern", "modify"]))
            if comp.kind == "engine" and draw(st.booleans()):
                a[Attr.ENGINE_TOKENS_AFTER_DISCONNECT] = draw(st.integers(0, 50))
            _clock(draw, a)
            ts = list(events.values())
            spans.append(("deltatap-stack", make_span(tid, component_span_name(comp.name), min(ts), max(ts) + MS, events, a)))
    if draw(st.integers(0, 3)) == 0:  # vLLM's llm_request span, some gen_ai.latency.* left out
        a = {}
        for key in (Attr.VLLM_TIME_IN_QUEUE, Attr.VLLM_TTFT, Attr.VLLM_PREFILL, Attr.VLLM_DECODE, Attr.VLLM_INFERENCE):
            if draw(st.integers(0, 3)):
                a[key] = draw(st.floats(0.0, 0.5))
        if draw(st.booleans()):
            a[Attr.GENAI_OUTPUT_TOKENS] = draw(st.integers(1, 99))
        start = BASE + draw(ms) * MS
        spans.append(("vllm", make_span(tid, "llm_request", start, start + 300 * MS, {}, a)))
    for _ in range(draw(st.integers(0, 2))):  # LiteLLM: guardrails, the upstream call
        start = BASE + draw(ms) * MS
        end = start + draw(st.integers(0, 50)) * MS + 7
        if draw(st.booleans()):
            a = {"guardrail_mode": draw(st.sampled_from(["pre_call", "during_call", "post_call"])),
                 "guardrail_status": draw(st.sampled_from(["success", "guardrail_intervened", "not_run"]))}
            if draw(st.booleans()):
                a["masked_entity_count"] = draw(st.sampled_from(["{}", "{'EMAIL': 1}"]))
            name = "guardrail"
        else:
            a, name = {"call_type": draw(st.sampled_from(["acompletion <- track_llm_api_timing", "other"]))}, "self"
        spans.append(("litellm", make_span(tid, name, start, end, {}, a)))
    return topo, spans


def _wire(spans: list) -> bytes:
    """One export per service (a span's service is its resource's), in one request."""
    req = None
    for svc, sp in spans:
        r = request([sp], service=svc)
        if req is None:
            req = r
        else:
            req.resource_spans.extend(r.resource_spans)
    return req.SerializeToString()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(requests())
def test_new_rows_equal_the_old_paths(case):
    topo, spans = case
    if not spans:
        return
    data = _wire(spans)
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    plain = decode_request(ExportTraceServiceRequest.FromString(data))
    want = old.build_row(plain, topo)
    dec = Decomposer(topo)
    assert dec.build_row(plain) == want
    for _ in range(3):  # the first span of each layout, then the compiled readers
        assert dec.build_row(decode_compact(data)) == want
