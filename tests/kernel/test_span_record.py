"""Spans as plain records (deltatap.telemetry.spans.SpanRecord): encoded to the same OTLP bytes as the SDK span they
stand for, by the Python reference and by the C accelerator (deltatap.telemetry._otlpenc) alike, also for malformed
records (the same bytes, or the same exception); and the tap's record equal to the span the tap built before
(a ReadableSpan with Event objects)."""

from __future__ import annotations

import logging
import math
from enum import IntEnum, StrEnum
from types import MappingProxyType

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from deltatap.core.clock import to_unix_ns
from deltatap.core.vocab import Outcome
from deltatap.proxy.errors import Failure
from deltatap.proxy.record import TapRecord, events
from deltatap.proxy.spans import _incoming, begin, emit
from deltatap.telemetry import otlp_encode
from deltatap.telemetry.otlp_encode import _py_span_fields, encode_export_request
from deltatap.telemetry.spans import SCOPE, SpanOrigin, SpanRecord, span_record
from deltatap.telemetry.tracer import setup_telemetry
from otlp_spans import tap_spans, varied_spans

ACC = otlp_encode._acc
needs_acc = pytest.mark.skipif(ACC is None, reason="deltatap.telemetry._otlpenc not built or DELTATAP_NATIVE off")
ORIGIN = SpanOrigin(Resource.create({"service.name": "deltatap-tap", "deltatap.link": "edge"}))
OTHER = SpanOrigin(Resource.create({"service.name": "deltatap-loadgen"}), None)


class Color(StrEnum):
    RED = "red"


class Level(IntEnum):
    HIGH = 3


def sdk_bytes(spans) -> bytes:
    return encode_spans(spans).SerializeToString()


def outcome(fn, *args):
    """What ``fn(*args)`` gives: ("ok", bytes) or ("raised", type, message)."""
    try:
        return ("ok", fn(*args))
    except Exception as exc:  # noqa: BLE001 - compared, not hidden
        return ("raised", type(exc), str(exc))


class _Logged(logging.Handler):
    """The messages the encoder logs (hypothesis runs many inputs per test: no function-scoped caplog)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def both(spans) -> tuple:
    """The C and the Python reference on ``spans``, with the attribute errors each logged."""
    log = logging.getLogger("deltatap.telemetry.otlp_encode")
    handler = _Logged()
    log.addHandler(handler)
    log.propagate = False  # (collected here, not by pytest: thousands of inputs)
    try:
        c = outcome(ACC.span_fields, spans)
        c_logs, handler.messages = handler.messages, []
        py = outcome(_py_span_fields, spans)
        return c, c_logs, py, handler.messages
    finally:
        log.removeHandler(handler)
        log.propagate = True


# ---- well-formed records: the SDK's encoding of the span they stand for --------------------------------------

_text = st.text(max_size=40)
_scalar = st.one_of(
    _text, st.booleans(), st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1), st.floats(), st.none(),
)
_value = st.one_of(_scalar, st.lists(st.one_of(st.text(max_size=8), st.booleans(), st.integers(-(1 << 63), (1 << 63) - 1), st.floats()), max_size=4))
_key = st.text(min_size=1, max_size=30).filter(lambda k: not any(0xD800 <= ord(c) <= 0xDFFF for c in k))
_attrs = st.dictionaries(_key, _value, max_size=12)
_u64 = st.integers(min_value=0, max_value=(1 << 64) - 1)
_event = st.tuples(_text, _u64, st.one_of(st.none(), _attrs))


@st.composite
def records(draw, origin=ORIGIN) -> SpanRecord:
    parent = draw(st.one_of(st.none(), st.integers(1, (1 << 64) - 1)))
    code = draw(st.sampled_from([0, 1, 2]))
    return span_record(
        origin, draw(_text), draw(st.sampled_from([1, 2, 3, 4, 5])), draw(st.integers(1, (1 << 128) - 1)), draw(st.integers(1, (1 << 64) - 1)),
        draw(_attrs), draw(st.lists(_event, max_size=6)), draw(_u64), draw(_u64),
        trace_state=draw(st.sampled_from(["", "vendor=v1", "a=1,b=2"])), parent_span_id=parent, parent_remote=draw(st.booleans()),
        trace_flags=draw(st.sampled_from([0, 1])), status_code=code, status_description=draw(st.one_of(st.none(), _text)) if code == 2 else None,
    )


def _no_nan(spans) -> bool:
    """protobuf messages with a NaN never compare equal: such batches are compared as bytes only"""
    def nan(v):
        return isinstance(v, float) and math.isnan(v) or isinstance(v, list) and any(nan(x) for x in v)
    return not any(nan(v) for s in spans for v in (*s[9].values(), *(x for e in s[10] if e[2] for x in e[2].values())))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(records(), records(OTHER)), min_size=1, max_size=5))
def test_records_encode_as_the_sdk_encodes_the_spans_they_stand_for(spans):
    mine = encode_export_request(spans)
    assert mine == sdk_bytes([s.readable() for s in spans])  # the span the record stands for
    assert mine == sdk_bytes(spans)  # the SDK's encoder reading the record's ReadableSpan properties
    if _no_nan(spans):
        assert ExportTraceServiceRequest.FromString(mine) == encode_spans([s.readable() for s in spans])


@needs_acc
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(records(), records(OTHER)), min_size=1, max_size=30))
def test_accelerator_writes_what_the_reference_writes_for_well_formed_records(spans):
    assert ACC.span_fields(spans) == _py_span_fields(spans)


def test_a_batch_of_records_and_sdk_spans_mixed(monkeypatch):
    """The export thread's batches mix the taps' records and SDK spans (reference components): grouped by resource
    and scope as the SDK groups them, the same bytes with and without the accelerator."""
    sdk = varied_spans() + tap_spans(3)
    res = sdk[0].resource
    recs = [span_record(SpanOrigin(res, SCOPE), f"r{i}", 2, 100 + i, 200 + i, {"i": i, "l": ["x", i]}, [("e", 5 + i, None)], 1, 2) for i in range(5)]
    mixed = [recs[0], sdk[0], recs[1], *sdk[1:4], recs[2], *sdk[4:], recs[3], recs[4]]
    expected = sdk_bytes([s.readable() if isinstance(s, SpanRecord) else s for s in mixed])
    assert encode_export_request(mixed) == expected
    monkeypatch.setattr(otlp_encode, "_span_fields", _py_span_fields)
    assert encode_export_request(mixed) == expected


def test_the_record_reads_as_a_readable_span():
    rec = span_record(ORIGIN, "tap edge", 2, 0xABC, 0xDEF, {"a": 1}, [("x", 10, None), ("y", 20, {"k": "v"})], 5, 30,
                      trace_state="v=1", parent_span_id=0x77, parent_remote=True, trace_flags=0, status_code=2, status_description="HTTP 502")
    assert rec.name == "tap edge" and rec.kind is SpanKind.SERVER and rec.start_time == 5 and rec.end_time == 30
    assert rec.context.trace_id == 0xABC and rec.get_span_context().span_id == 0xDEF and not rec.context.trace_flags.sampled
    assert rec.context.trace_state.to_header() == "v=1"
    assert rec.parent.span_id == 0x77 and rec.parent.is_remote and rec.parent.trace_id == 0xABC
    assert dict(rec.attributes) == {"a": 1} and rec.links == () and rec.dropped_events == 0
    assert [(e.name, e.timestamp, e.attributes) for e in rec.events] == [("x", 10, None), ("y", 20, {"k": "v"})]
    assert rec.status.status_code is StatusCode.ERROR and rec.status.description == "HTTP 502"
    assert rec.resource is ORIGIN.resource and rec.instrumentation_scope is SCOPE
    assert '"name": "tap edge"' in rec.to_json()
    root = span_record(OTHER, "c", 3, 1, 2, {}, [], 1, 2)
    assert root.parent is None and root.instrumentation_scope is None and root.kind is SpanKind.CLIENT


# ---- malformed records and attributes: the accelerator does exactly what the reference does ------------------

_big = st.sampled_from([-1, 1 << 64, 1 << 128, -(1 << 70), True])
_odd_value = st.one_of(
    _scalar, st.text(max_size=5).map(lambda s: s + "\ud800"), st.integers(min_value=-(1 << 80), max_value=1 << 80), st.binary(max_size=6),
    st.just(Color.RED), st.just(Level.HIGH), st.just(math.nan), st.just(object()),
    st.lists(st.one_of(_scalar, st.just("\udc00"), st.just(1 << 70), st.binary(max_size=3)), max_size=4).map(lambda v: v if len(v) % 2 else tuple(v)),
    st.dictionaries(st.text(max_size=4), _scalar, max_size=3),
)
_odd_key = st.one_of(st.text(max_size=20), st.just("k\ud800"), st.just(Color.RED), st.just(7), st.just("k" * 4001))
_odd_attrs = st.one_of(
    st.dictionaries(_odd_key, _odd_value, max_size=8), st.none(), st.just({}),
    st.dictionaries(st.text(max_size=5), _scalar, max_size=3).map(MappingProxyType),
)
_odd_event = st.one_of(
    st.tuples(st.one_of(_text, st.just("e\ud800"), st.just(Color.RED)), st.one_of(_u64, _big), _odd_attrs),
    st.just(("short", 1)), st.just(["list", 1, None]), st.just(("e", 1, [("k", "v")])),
)


@st.composite
def odd_records(draw):
    def field(good, bad):
        return draw(st.one_of(good, bad) if draw(st.integers(0, 9)) == 0 else good)

    fields = [
        ORIGIN,
        field(_text, st.one_of(st.just("n\ud800"), st.just(None), st.just(5))),
        field(st.sampled_from([1, 2, 3, 4, 5]), st.sampled_from([0, 6, -1, True, "2", 1 << 70])),
        field(st.integers(0, (1 << 128) - 1), st.one_of(_big, st.just("0x1"))),
        field(_u64, st.one_of(_big, st.just(1.0))),
        field(st.sampled_from(["", "a=b"]), st.sampled_from([None, "s\ud800", 3])),
        field(st.one_of(st.none(), _u64), st.one_of(_big, st.just("p"))),
        field(st.booleans(), st.sampled_from([1, 0, None, "yes"])),
        1,
        field(st.dictionaries(_odd_key, _odd_value, max_size=8), _odd_attrs),
        field(st.lists(_odd_event, max_size=5), st.sampled_from([None, "events", (("e", 1, None),), 7])),
        field(_u64, _big),
        field(_u64, _big),
        field(st.sampled_from([0, 1, 2]), st.sampled_from([3, -1, True, 1.0])),
        field(st.one_of(st.none(), _text), st.sampled_from(["d\ud800", 5, b"x"])),
    ]
    if draw(st.integers(0, 30)) == 0:
        fields = fields[: draw(st.integers(0, 14))]
    if len(fields) > 10 and isinstance(fields[10], list) and draw(st.booleans()):
        fields[10] = tuple(fields[10])
    return tuple.__new__(SpanRecord, fields)


@needs_acc
@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])  # (~15 ms each, mostly generating)
@given(st.lists(odd_records(), min_size=1, max_size=3))
def test_accelerator_matches_the_reference_on_malformed_records(spans):
    c, c_logs, py, py_logs = both(spans)
    assert c == py
    assert c_logs == py_logs  # an attribute the Python leaves out is left out (and logged) once, as there


@needs_acc
def test_accelerator_on_items_that_are_not_records():
    sdk = tap_spans(2)
    assert ACC.span_fields(sdk) == _py_span_fields(sdk)
    assert ACC.span_fields([]) == b""
    for bad in ([object()], [("a", 1)], [None], "not spans", 5):
        c, _, py, _ = both(bad)
        assert c[:2] == py[:2] if c[0] == "raised" and py[0] == "raised" else c == py or c[0] == py[0] == "raised"


@needs_acc
def test_many_records_in_one_call_and_large_values():
    big = span_record(ORIGIN, "n" * 70_000, 2, (1 << 128) - 1, (1 << 64) - 1, {"k" * 20_000: "v" * 300_000, "x": ["y" * 20_000] * 3},
                      [("e" * 200, (1 << 64) - 1, {"a" * 130: -(1 << 63)})] * 50, (1 << 64) - 1, 1, parent_span_id=(1 << 64) - 1, parent_remote=True,
                      status_code=2, status_description="d" * 20_000)
    spans = [big, *(span_record(ORIGIN, f"s{i}", 1 + i % 5, i + 1, i + 1, {"i": i}, [("e", i, None)], i, i) for i in range(2000))]
    assert ACC.span_fields(spans) == _py_span_fields(spans)
    assert encode_export_request(spans) == sdk_bytes([s.readable() for s in spans])


# ---- the tap's records: the span the tap built before, byte for byte -------------------------------------------

_W3C = TraceContextTextMapPropagator()


def _before(name: str, start, rec: TapRecord, attrs: dict, resource) -> ReadableSpan:
    """proxy/spans.py's emit before spans were records: the ReadableSpan with Event objects it built."""
    parent = None
    ctx_parent = _W3C.extract(start._headers) if "traceparent" in start._headers else None
    if ctx_parent is not None:
        p = trace.get_current_span(ctx_parent).get_span_context()
        parent = p if p.is_valid else None
    state = parent.trace_state if parent is not None else None
    flags = parent.trace_flags if parent is not None else TraceFlags(TraceFlags.SAMPLED)
    ctx = SpanContext(start.trace_id, start.span_id, is_remote=False, trace_flags=flags, trace_state=state)
    evs = events(rec)
    status = Status(StatusCode.UNSET)
    if rec.final_outcome() in (Outcome.UPSTREAM_ERROR, Outcome.TIMEOUT) or (rec.status or 0) >= 500:
        status = Status(StatusCode.ERROR, rec.failure.cause if rec.failure else f"HTTP {rec.status}")
    last = evs[-1][1] if evs else rec.received
    end = max(rec.end if rec.end is not None else last, last)
    return ReadableSpan(name=name, context=ctx, parent=parent, resource=resource, attributes=attrs,
                        events=tuple(Event(n, None, to_unix_ns(t)) for n, t in evs), kind=SpanKind.SERVER, status=status,
                        start_time=to_unix_ns(rec.received), end_time=to_unix_ns(end), instrumentation_scope=SCOPE)


class _Start:
    def __init__(self, headers: dict) -> None:
        self._headers = headers
        s = begin(headers)
        self.trace_id, self.span_id, self.real = s.trace_id, s.span_id, s


_HEADERS = [
    {},
    {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
    {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00", "tracestate": "vendor=v1,other=x"},
    {"traceparent": "00-00000000000000000000000000000000-b7ad6b7169203331-01"},
    {"traceparent": "not a traceparent"},
]


@pytest.mark.parametrize("headers", _HEADERS)
@pytest.mark.parametrize("kind", ["ok", "http_500", "upstream_error", "cancel"])
def test_the_tap_record_is_the_span_the_tap_built_before(headers, kind):
    mem = InMemorySpanExporter()
    tel = setup_telemetry("deltatap-tap", exporter=mem)
    try:
        t = 1_000_000_000
        rec = TapRecord(received=t, method="POST", path="/v1/chat/completions", query="a=1", request_id="r1", head=t + 10,
                        body_received=t + 20, forwarded=t + 30, response_headers=t + 500, response_headers_forwarded=t + 510,
                        response_end=t + 900, end=t + 950, status=200, request_bytes=10, response_bytes=99, chunks=3)
        if kind == "http_500":
            rec.status = 500
        elif kind == "upstream_error":
            rec.status, rec.response_headers, rec.response_headers_forwarded, rec.response_end = None, None, None, None
            rec.upstream_error = t + 400
            rec.failure = Failure(Outcome.UPSTREAM_ERROR, 502, "connect", "connection refused")
        elif kind == "cancel":
            rec.downstream_closed, rec.end = t + 600, None
        attrs = {"deltatap.request_id": "r1", "n": 3, "f": 0.5, "b": True, "l": ["stop"]}
        start = _Start(headers)
        emit(tel, "deltatap.tap fw-engine", start.real, rec, attrs)
        tel.processor.force_flush()
        (got,) = mem.get_finished_spans()
        assert isinstance(got, SpanRecord)
        before = _before("deltatap.tap fw-engine", start, rec, attrs, tel.provider.resource)
        assert encode_export_request([got]) == sdk_bytes([before]) == encode_export_request([before])
        assert ExportTraceServiceRequest.FromString(encode_export_request([got])) == encode_spans([before])
    finally:
        tel.shutdown()


def test_respect_sampling_records_nothing_under_an_unsampled_parent():
    mem = InMemorySpanExporter()
    tel = setup_telemetry("deltatap-tap", exporter=mem)
    try:
        rec = TapRecord(received=1, end=2, status=200)
        emit(tel, "t", begin({"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"}), rec, {}, respect_sampling=True)
        emit(tel, "t", begin({"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}), rec, {}, respect_sampling=True)
        tel.processor.force_flush()
        assert len(mem.get_finished_spans()) == 1 and tel.stats.spans_ended == 1
    finally:
        tel.shutdown()


# ---- the incoming context: read directly in the common case, as the propagator reads it --------------------------

def _by_propagator(headers: dict):
    p = trace.get_current_span(_W3C.extract(headers)).get_span_context()
    if not p.is_valid:
        return None
    return p.trace_id, p.span_id, int(p.trace_flags), p.trace_state.to_header() if p.trace_state else ""


_hex = "0123456789abcdefABCDEF"
_traceparent = st.one_of(
    st.builds(lambda v, t, s, f, x: f"{v}-{t}-{s}-{f}{x}", st.sampled_from(["00", "01", "ff", "0"]),
              st.one_of(st.text(_hex[:16], min_size=32, max_size=32), st.just("0" * 32), st.text(_hex, min_size=31, max_size=33)),
              st.one_of(st.text(_hex[:16], min_size=16, max_size=16), st.just("0" * 16)), st.text(_hex[:16], min_size=2, max_size=2),
              st.sampled_from(["", " ", "\t", "-x", "-", "x", "  \t"])),
    st.text(max_size=60), st.just(" 00-" + "a" * 32 + "-" + "b" * 16 + "-01"), st.just("00-" + "a" * 32 + "-" + "b" * 16 + "-01" + " " * 600),
)


@settings(max_examples=1000, deadline=None)
@given(_traceparent, st.one_of(st.none(), st.sampled_from(["", "a=b", "a=b,c=d", "bad state", "x=" + "y" * 600])))
def test_incoming_context_as_the_propagator_reads_it(tp, state):
    headers = {"traceparent": tp}
    if state is not None:
        headers["tracestate"] = state
    assert _incoming(headers) == _by_propagator(headers)
