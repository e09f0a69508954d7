"""Real spans for the OTLP encoder and exporter tests: varied ones from a real TracerProvider, and spans built
the way the tap builds them (proxy/spans.py: a ReadableSpan with a plain dict of attributes)."""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

from deltatap.core.vocab import Attr, TapEvent


def provider(service: str, **extra) -> tuple[TracerProvider, InMemorySpanExporter]:
    mem = InMemorySpanExporter()
    tp = TracerProvider(resource=Resource.create({"service.name": service, **extra}), span_limits=SpanLimits(max_attributes=64, max_events=32, max_links=4))
    tp.add_span_processor(SimpleSpanProcessor(mem))
    return tp, mem


ALL_TYPES = {
    "s": "plain",
    "unicode": "héllo wörld — 日本語 🚀",
    "empty": "",
    "long": "x" * 200,  # lengths past one varint byte
    "huge": "y" * 20_000,  # past the varint table
    "t": True,
    "f": False,
    "zero": 0,
    "small": 127,
    "medium": 16_383,
    "large": 16_384,
    "ns": 1_700_000_000_123_456_789,
    "neg": -1,
    "min": -(1 << 63),
    "max": (1 << 63) - 1,
    "float": 3.25,
    "negzero": -0.0,
    "inf": float("inf"),
    "strs": ("a", "", "ü"),
    "bools": (True, False),
    "ints": (1, -2, 1 << 40),
    "floats": (0.5, -1e300),
    "empty_seq": (),
    "bytes": b"\x00\xffraw",
    "nested": {"inner": [1, "two", None], "k": {"deep": 1.5}},
    "none_in_seq": (None, "x"),
    "k" * 5000: "a very long key",
    "ключ": "unicode key",
}


def varied_spans() -> list[ReadableSpan]:
    spans = []
    for service, scopes in (("deltatap-tap", ("deltatap", "other")), ("deltatap-loadgen", ("deltatap",))):
        tp, mem = provider(service, **{"deltatap.link": "edge", "list": ["a", "b"]})
        for scope in scopes:
            tracer = tp.get_tracer(scope, "1.2.3" if scope == "deltatap" else None, schema_url="https://opentelemetry.io/schemas/1.26.0" if scope == "other" else None,
                                   attributes={"scope.attr": 1} if scope == "other" else None)
            remote = SpanContext(0x0102030405060708090A0B0C0D0E0F10, 0x1112131415161718, is_remote=True, trace_flags=TraceFlags(1),
                                 trace_state=TraceState([("vendor", "v1"), ("other", "x")]))
            with tracer.start_as_current_span("root", context=trace.set_span_in_context(NonRecordingSpan(remote)), kind=SpanKind.SERVER, attributes=ALL_TYPES) as root:
                root.add_event("with attributes", {"a": 1, "b": "two", "c": [1.5, 2.5]}, timestamp=1_000)
                root.add_event("", timestamp=2_000)
                root.add_event("no attributes")
                root.set_status(Status(StatusCode.OK))
                with tracer.start_as_current_span("child ✓", kind=SpanKind.CLIENT, links=[Link(remote, {"link.attr": "x"}), Link(root.get_span_context())]) as child:
                    child.set_status(Status(StatusCode.ERROR, "upstream said no"))
                    child.record_exception(ValueError("boom"))
                tracer.start_span("", kind=SpanKind.PRODUCER, start_time=0).end(end_time=5)  # empty name, zero start
                over = tracer.start_span("over limits", kind=SpanKind.CONSUMER)
                for i in range(70):
                    over.set_attribute(f"a{i}", i)
                for i in range(40):
                    over.add_event(f"e{i}", {"i": i})
                over.end()
            with tracer.start_as_current_span("new trace", context=trace.set_span_in_context(trace.INVALID_SPAN)):
                pass
        tp.shutdown()
        spans += mem.get_finished_spans()
    return spans


def tap_spans(n: int, first_id: int = 1) -> list[ReadableSpan]:
    """``n`` SERVER spans as a tap emits them: ~20 attributes of every scalar type and a list, 14 events."""
    res = Resource.create({"service.name": "deltatap-tap"})
    scope = InstrumentationScope("deltatap", "0.1.0")
    parent = SpanContext(7, 8, is_remote=True, trace_flags=TraceFlags(0))
    spans = []
    for i in range(n):
        base = 1_700_000_000_000_000_000 + i * 1_000_000
        attrs = {Attr.OBSERVER: "tap", Attr.LINK: "edge", Attr.DOWNSTREAM: "client", Attr.UPSTREAM: "gateway", Attr.REQUEST_ID: f"req-{i}",
                 Attr.BODY_BYTES_IN: 812 + i, Attr.BODY_BYTES_OUT: 20_412 * (i + 1), Attr.STREAMING: i % 2 == 0, Attr.GAP_MEAN_MS: 20.125 + i,
                 Attr.GENAI_FINISH_REASONS: ["stop"], Attr.CLOCK_OFFSET_NS: -12_345 * (i + 1), Attr.HTTP_STATUS: 200 if i != 2 else 502,
                 Attr.OUTCOME: "ok" if i != 2 else "upstream_error", Attr.HTTP_METHOD: "POST", Attr.URL_PATH: "/v1/chat/completions",
                 Attr.SERVER_PORT: 8080, Attr.GENAI_REQUEST_MODEL: "llama-3.1-8b-instruct", "deltatap.label.workload": "chat ✓"}
        spans.append(ReadableSpan(
            name="tap edge", context=SpanContext(7 + i, first_id + i, False, TraceFlags(1)), parent=parent if i % 2 else None, resource=res,
            attributes=attrs, events=tuple(Event(str(name), None, base + k * 1_000) for k, name in enumerate(TapEvent)), kind=SpanKind.SERVER,
            status=Status(StatusCode.ERROR, "HTTP 502") if i == 2 else Status(StatusCode.UNSET), start_time=base, end_time=base + 50_000_000,
            instrumentation_scope=scope,
        ))
    return spans
