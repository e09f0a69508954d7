"""Synthetic per-component spans, so Jaeger shows the decomposition itself as a waterfall.

For each row, one span per point-to-point delta that has both points (gateway inbound from t1 to
t2, firewall inbound, engine queue, prefill, firewall outbound, ...), named
``deltatap.delta <delta>`` (:data:`deltatap.vocab.SPAN_DECOMPOSITION_PREFIX`), all children of one
``deltatap.delta request`` span over the request, in the request's own trace id (so they sit beside
the observers' spans in the same trace), with attributes ``deltatap.delta.ms``,
``deltatap.delta.error_bound_ms``, ``deltatap.component``, ``deltatap.request_id``. Also encodes
:class:`~collector.spans.SpanRecord` back to protobuf for forwarding JSON input.
"""

from __future__ import annotations

import os
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from deltatap.collector.deltas import delta_defs
from deltatap.collector.rows import Row
from deltatap.collector.spans import SpanRecord
from deltatap import __version__
from deltatap.core.topology import Topology
from deltatap.core.vocab import INSTRUMENTATION_SCOPE, SPAN_DECOMPOSITION_PREFIX, Attr

SERVICE_NAME = "deltatap-collector"


def _value(v: Any) -> AnyValue:
    if isinstance(v, bool):
        return AnyValue(bool_value=v)
    if isinstance(v, int):
        return AnyValue(int_value=v)
    if isinstance(v, float):
        return AnyValue(double_value=v)
    if isinstance(v, (list, tuple)):
        out = AnyValue()
        out.array_value.values.extend(_value(x) for x in v)
        return out
    if isinstance(v, bytes):
        return AnyValue(bytes_value=v)
    return AnyValue(string_value=str(v))


def _kvs(attrs: dict[str, Any]) -> list[KeyValue]:
    return [KeyValue(key=k, value=_value(v)) for k, v in attrs.items() if v is not None and not isinstance(v, dict)]


def _wrap(spans: list[Span], service: str) -> ExportTraceServiceRequest:
    rs = ResourceSpans()
    rs.resource.attributes.extend(_kvs({"service.name": service}))
    ss = ScopeSpans()
    ss.scope.name, ss.scope.version = INSTRUMENTATION_SCOPE, __version__
    ss.spans.extend(spans)
    rs.scope_spans.append(ss)
    return ExportTraceServiceRequest(resource_spans=[rs])


def decomposition_spans(rows: list[Row], topo: Topology) -> ExportTraceServiceRequest:
    defs = [d for d in delta_defs(topo) if d.end]
    spans: list[Span] = []
    for r in rows:
        if not r.points or len(r.trace_id) != 32:
            continue
        tid = bytes.fromhex(r.trace_id)
        root_id = os.urandom(8)
        children = []
        for d in defs:
            e, s = r.points.get(d.end), r.points.get(d.start)
            dv = r.deltas.get(d.name)
            if e is None or s is None or dv is None or dv.ns < 0:
                continue
            sp = Span(trace_id=tid, span_id=os.urandom(8), parent_span_id=root_id, name=d.span_name,
                      start_time_unix_nano=s.unix_ns, end_time_unix_nano=s.unix_ns + dv.ns, kind=Span.SPAN_KIND_INTERNAL)
            sp.attributes.extend(_kvs({"deltatap.delta.name": d.name, "deltatap.delta.ms": dv.ns / 1e6, "deltatap.delta.error_bound_ms": dv.error_bound_ns / 1e6,
                                       Attr.COMPONENT: d.component or "", Attr.REQUEST_ID: r.request_id}))
            children.append(sp)
        if not children:
            continue
        start = min(p.unix_ns for p in r.points.values())
        end = max(p.unix_ns for p in r.points.values())
        root = Span(trace_id=tid, span_id=root_id, name=f"{SPAN_DECOMPOSITION_PREFIX} request", start_time_unix_nano=start, end_time_unix_nano=end, kind=Span.SPAN_KIND_INTERNAL)
        root.attributes.extend(_kvs({Attr.REQUEST_ID: r.request_id, Attr.OUTCOME: r.outcome, "deltatap.join_method": str(r.join_method)}))
        spans.append(root)
        spans.extend(children)
    return _wrap(spans, SERVICE_NAME)


def encode_records(records: list[SpanRecord]) -> ExportTraceServiceRequest:
    """SpanRecords back to one protobuf request (resource attributes stay merged into the spans)."""
    spans = []
    for r in records:
        sp = Span(trace_id=bytes.fromhex(r.trace_id), span_id=bytes.fromhex(r.span_id), parent_span_id=bytes.fromhex(r.parent_span_id) if r.parent_span_id else b"",
                  name=r.name, start_time_unix_nano=r.start_unix_ns, end_time_unix_nano=r.end_unix_ns, kind=r.kind)
        sp.attributes.extend(_kvs(r.attrs))
        for name, t, ea in r.events:
            ev = sp.events.add(name=name, time_unix_nano=t)
            if ea:
                ev.attributes.extend(_kvs(ea))
        sp.status.code = r.status_code
        spans.append(sp)
    return _wrap(spans, records[0].service if records else SERVICE_NAME)
