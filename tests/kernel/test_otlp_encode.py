"""deltatap.telemetry.otlp_encode against the OpenTelemetry SDK's encoder: the same ExportTraceServiceRequest from the
same spans, decoded with the generated protobuf classes and compared as bytes too."""

from __future__ import annotations

import logging
import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode

from deltatap.telemetry.otlp_encode import encode_export_request
from otlp_spans import provider, tap_spans, varied_spans


def assert_same(spans) -> ExportTraceServiceRequest:
    mine = encode_export_request(spans)
    ref = encode_spans(spans)
    decoded = ExportTraceServiceRequest.FromString(mine)
    assert decoded == ref
    assert mine == ref.SerializeToString()  # field order and proto3 defaults as the protobuf runtime writes them
    return decoded


def test_varied_real_spans_encode_as_the_sdk_does():
    spans = varied_spans()
    decoded = assert_same(spans)
    assert len(decoded.resource_spans) == 2
    assert [len(rs.scope_spans) for rs in decoded.resource_spans] == [2, 1]
    assert sum(len(ss.spans) for rs in decoded.resource_spans for ss in rs.scope_spans) == len(spans)
    root = next(s for rs in decoded.resource_spans for ss in rs.scope_spans for s in ss.spans if s.name == "root")
    assert root.trace_state == "vendor=v1,other=x" and root.flags == 0x300 and root.parent_span_id.hex() == "1112131415161718"
    over = next(s for rs in decoded.resource_spans for ss in rs.scope_spans for s in ss.spans if s.name == "over limits")
    assert over.dropped_attributes_count == 6 and over.dropped_events_count == 8


def test_spans_interleaved_across_resources_and_scopes_group_as_the_sdk_does():
    spans = varied_spans()
    mixed = [spans[i] for i in (0, len(spans) - 1, 1, len(spans) - 2, 2, 3, len(spans) - 3)]
    assert_same(mixed)
    assert_same(list(reversed(spans)))
    # equal resources held in distinct objects are one group, as in the SDK
    res_a, res_b = Resource.create({"service.name": "same"}), Resource.create({"service.name": "same"})
    assert res_a is not res_b
    scope = InstrumentationScope("deltatap", "1")
    ctx = SpanContext(1, 2, False)
    made = [ReadableSpan(name=f"s{i}", context=ctx, resource=r, instrumentation_scope=s, start_time=1, end_time=2)
            for i, (r, s) in enumerate([(res_a, scope), (res_b, InstrumentationScope("deltatap", "1")), (res_a, None), (res_b, scope)])]
    decoded = assert_same(made)
    assert len(decoded.resource_spans) == 1 and len(decoded.resource_spans[0].scope_spans) == 2


def test_spans_built_as_the_tap_builds_them():
    """proxy/spans.py builds ReadableSpans with a plain dict of attributes and attribute-less events."""
    spans = tap_spans(4)
    assert_same(spans)
    assert_same(spans[:1])
    assert encode_export_request([]) == encode_spans([]).SerializeToString() == b""


def test_unencodable_attributes_are_left_out_and_logged_as_the_sdk_does(caplog):
    ctx = SpanContext(1, 2, False)
    attrs = {"ok": 1, "too big": 1 << 64, "in a list": (1, -(1 << 64)), "object": object(),
             "key \ud800": 1, "lone surrogate": "x\udc00", "in a sequence": ("\ud800",), "after": "kept"}
    span = ReadableSpan(name="x", context=ctx, attributes=attrs, start_time=1, end_time=2)
    with caplog.at_level(logging.ERROR, logger="deltatap.telemetry.otlp_encode"):
        decoded = ExportTraceServiceRequest.FromString(encode_export_request([span]))
    assert sum("Failed to encode key" in r.getMessage() for r in caplog.records) == 6
    assert [kv.key for kv in decoded.resource_spans[0].scope_spans[0].spans[0].attributes] == ["ok", "after"]
    logging.getLogger("opentelemetry.exporter.otlp.proto.common._internal").disabled = True
    try:
        assert encode_export_request([span]) == encode_spans([span]).SerializeToString()
    finally:
        logging.getLogger("opentelemetry.exporter.otlp.proto.common._internal").disabled = False


def test_nan_is_written_bit_for_bit():
    span = ReadableSpan(name="x", context=SpanContext(1, 2, False), attributes={"nan": math.nan, "l": (math.nan, 1.0)}, start_time=1, end_time=2)
    assert encode_export_request([span]) == encode_spans([span]).SerializeToString()


_scalars = st.one_of(
    st.text(max_size=150),
    st.booleans(),
    st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1),
    st.floats(allow_nan=False),
    st.binary(max_size=40),
    st.none(),
)
_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(min_size=1, max_size=8), inner, max_size=3), max_leaves=8)
_attrs = st.dictionaries(st.text(min_size=1, max_size=30), _values, max_size=12)
_event = st.tuples(st.text(max_size=30), _attrs, st.integers(min_value=0, max_value=(1 << 64) - 1))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    spans=st.lists(
        st.tuples(
            st.text(max_size=40),
            st.sampled_from(list(SpanKind)),
            _attrs,
            st.lists(_event, max_size=4),
            st.sampled_from([Status(StatusCode.UNSET), Status(StatusCode.OK), Status(StatusCode.ERROR, ""), Status(StatusCode.ERROR, "é failed")]),
            st.booleans(),
        ),
        min_size=1,
        max_size=5,
    ),
    resource_attrs=_attrs,
)
def test_any_spans_encode_as_the_sdk_does(spans, resource_attrs):
    tp, mem = provider("prop", **{k: v for k, v in resource_attrs.items() if isinstance(v, (str, bool, int, float))})
    tracer = tp.get_tracer("prop", "0")
    parent = None
    for name, kind, attrs, events, status, child in spans:
        ctx = trace.set_span_in_context(parent) if child and parent is not None else None
        span = tracer.start_span(name, context=ctx, kind=kind, attributes=attrs)
        for ev_name, ev_attrs, ts in events:
            span.add_event(ev_name, ev_attrs, timestamp=ts)
        span.set_status(status)
        span.end()
        parent = span
    assert_same(mem.get_finished_spans())
