"""Tiny builders of OTLP protobuf spans in deltatap's (and vLLM's) formats, with exact timestamps."""

from __future__ import annotations

import itertools
import os
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from deltatap.core.vocab import DEFAULT_LINKS, Attr, ClientEvent, Role, TapEvent, component_span_name, tap_span_name

_ids = itertools.count(1)


def new_trace_id() -> bytes:
    return os.urandom(16)


def new_span_id() -> bytes:
    return next(_ids).to_bytes(8, "big")


def any_value(v: Any) -> AnyValue:
    if isinstance(v, bool):
        return AnyValue(bool_value=v)
    if isinstance(v, int):
        return AnyValue(int_value=v)
    if isinstance(v, float):
        return AnyValue(double_value=v)
    return AnyValue(string_value=str(v))


def make_span(trace_id: bytes, name: str, start: int, end: int, events: dict[str, int], attrs: dict[str, Any], parent: bytes = b"", span_id: bytes | None = None) -> Span:
    sp = Span(trace_id=trace_id, span_id=span_id or new_span_id(), parent_span_id=parent, name=name, start_time_unix_nano=start, end_time_unix_nano=end, kind=Span.SPAN_KIND_SERVER)
    sp.attributes.extend(KeyValue(key=k, value=any_value(v)) for k, v in attrs.items())
    for ev, t in sorted(events.items(), key=lambda kv: kv[1]):
        sp.events.add(name=str(ev), time_unix_nano=t)
    return sp


def request(spans: list[Span], service: str = "deltatap-test") -> ExportTraceServiceRequest:
    rs = ResourceSpans()
    rs.resource.attributes.append(KeyValue(key="service.name", value=AnyValue(string_value=service)))
    ss = ScopeSpans()
    ss.spans.extend(spans)
    rs.scope_spans.append(ss)
    return ExportTraceServiceRequest(resource_spans=[rs])


def tap_span(trace_id: bytes, link: str, events: dict[TapEvent, int], attrs: dict[str, Any] | None = None, parent: bytes = b"", span_id: bytes | None = None) -> Span:
    spec = next(x for x in DEFAULT_LINKS if x.name == link)
    kinds = {"client": "client", "gateway": "gateway", "firewall": "firewall", "engine": "engine"}
    a = {
        Attr.OBSERVER: "tap", Attr.LINK: link, Attr.DOWNSTREAM: spec.downstream, Attr.DOWNSTREAM_KIND: kinds[spec.downstream],
        Attr.UPSTREAM: spec.upstream, Attr.UPSTREAM_KIND: kinds[spec.upstream],
    }
    a.update(attrs or {})
    ts = list(events.values())
    return make_span(trace_id, tap_span_name(link), min(ts), max(ts), {str(k): v for k, v in events.items()}, a, parent, span_id)


def client_span(trace_id: bytes, events: dict[ClientEvent, int], attrs: dict[str, Any] | None = None, span_id: bytes | None = None) -> Span:
    a = {Attr.OBSERVER: "client"}
    a.update(attrs or {})
    ts = list(events.values())
    return make_span(trace_id, "deltatap.client", min(ts), max(ts), {str(k): v for k, v in events.items()}, a, b"", span_id)


def component_span(trace_id: bytes, component: str, kind: str, events: dict[Role, int], attrs: dict[str, Any] | None = None, parent: bytes = b"") -> Span:
    a = {Attr.OBSERVER: "component", Attr.COMPONENT: component, Attr.COMPONENT_KIND: kind}
    a.update(attrs or {})
    ts = list(events.values())
    return make_span(trace_id, component_span_name(component), min(ts), max(ts), {str(k): v for k, v in events.items()}, a, parent)


def vllm_span(trace_id: bytes, arrival: int, queue_s: float, ttft_s: float, prefill_s: float, decode_s: float, parent: bytes = b"") -> Span:
    """vLLM's ``llm_request`` span: starts at the request's arrival, ``gen_ai.latency.*`` in seconds."""
    inference = prefill_s + decode_s
    attrs = {
        Attr.VLLM_TIME_IN_QUEUE: queue_s, Attr.VLLM_TTFT: ttft_s, Attr.VLLM_PREFILL: prefill_s, Attr.VLLM_DECODE: decode_s,
        Attr.VLLM_INFERENCE: inference, Attr.VLLM_E2E: queue_s + inference + 0.0005, Attr.GENAI_INPUT_TOKENS: 12, Attr.GENAI_OUTPUT_TOKENS: 34,
        "gen_ai.request.id": "cmpl-1",
    }
    return make_span(trace_id, "llm_request", arrival, arrival + round((queue_s + inference + 0.0005) * 1e9), {}, attrs, parent)


MS = 1_000_000
BASE = 1_700_000_000_000_000_000


def default_stack(base: int = BASE, rid: str = "req-1", fp: str = "fp-1", split_at: str | None = None, inner_rid: str | None = None, **over: int) -> tuple[list[Span], dict[str, int]]:
    """Spans of one request through edge, gw-fw and fw-engine taps plus a client span, with known times.

    Returns (spans, t) where ``t`` maps t0..t12 (and extras) to the Unix ns used. ``split_at`` names a
    link whose tap (and every tap inward) starts a new trace, as when a component strips ``traceparent``;
    ``inner_rid`` gives those inner taps another correlation id (the component dropped ``x-request-id`` too).
    """
    t = {"t0": base, "t1": base + 1 * MS, "t2": base + 3 * MS, "t3": base + 4 * MS, "t5": base + 9 * MS, "t6": base + 10 * MS,
         "t7": base + 60 * MS, "t9": base + 61 * MS, "t10": base + 63 * MS, "t11": base + 66 * MS, "t12": base + 67 * MS}
    t.update(over)
    t.setdefault("t8", t["t7"] + 100 * MS)
    tail = t["t8"] - t["t7"]
    tid = new_trace_id()
    root = new_span_id()
    spans = [client_span(tid, {ClientEvent.SEND: t["t0"], ClientEvent.FIRST_TOKEN: t["t12"], ClientEvent.LAST_TOKEN: t["t12"] + tail + 7 * MS}, {Attr.REQUEST_ID: rid, Attr.HTTP_STATUS: 200, "deltatap.label.workload": "chat"}, span_id=root)]
    links = [
        ("edge", {TapEvent.REQUEST_RECEIVED: t["t0"] + 200_000, TapEvent.REQUEST_FORWARDED: t["t1"], TapEvent.FIRST_TOKEN_RECEIVED: t["t11"], TapEvent.FIRST_TOKEN_FORWARDED: t["t11"] + 100_000,
                  TapEvent.LAST_TOKEN_RECEIVED: t["t11"] + tail + 5 * MS, TapEvent.LAST_TOKEN_FORWARDED: t["t11"] + tail + 5 * MS + 100_000}),
        ("gw-fw", {TapEvent.REQUEST_RECEIVED: t["t2"], TapEvent.REQUEST_FORWARDED: t["t3"], TapEvent.FIRST_TOKEN_RECEIVED: t["t10"], TapEvent.FIRST_TOKEN_FORWARDED: t["t10"] + 50_000,
                   TapEvent.LAST_TOKEN_RECEIVED: t["t10"] + tail + 3 * MS, TapEvent.LAST_TOKEN_FORWARDED: t["t10"] + tail + 3 * MS + 50_000}),
        ("fw-engine", {TapEvent.REQUEST_RECEIVED: t["t5"], TapEvent.REQUEST_FORWARDED: t["t6"], TapEvent.FIRST_TOKEN_RECEIVED: t["t7"], TapEvent.FIRST_TOKEN_FORWARDED: t["t9"],
                       TapEvent.LAST_TOKEN_RECEIVED: t["t8"], TapEvent.LAST_TOKEN_FORWARDED: t["t8"] + 1 * MS}),
    ]
    parent = root
    for link, events in links:
        if split_at == link:
            tid, parent = new_trace_id(), b""
            rid = inner_rid or rid
        req_ovh = events[TapEvent.REQUEST_FORWARDED] - events[TapEvent.REQUEST_RECEIVED]
        ft_ovh = events[TapEvent.FIRST_TOKEN_FORWARDED] - events[TapEvent.FIRST_TOKEN_RECEIVED]
        attrs = {Attr.REQUEST_ID: rid, Attr.BODY_FINGERPRINT: fp, Attr.HTTP_STATUS: 200, Attr.OVERHEAD_REQUEST_NS: req_ovh, Attr.OVERHEAD_FIRST_TOKEN_NS: ft_ovh}
        sid = new_span_id()
        spans.append(tap_span(tid, link, events, attrs, parent=parent, span_id=sid))
        parent = sid
    return spans, t
