"""The tap's span, built cheaply: ids at request start, one finished span handed to the processor at the end.

Going through ``tracer.start_span`` / ``add_event`` / ``set_attributes`` costs about half a
millisecond of CPU per request in the SDK (locks, attribute cleaning per call), on the same thread
that forwards other streams. A tap knows every event and attribute only when the request is over,
so it builds one finished span then (:func:`deltatap.telemetry.spans.emit_span`) — the same object the SDK
would have produced, exported the same way.

Context: W3C ``traceparent``/``tracestate`` are extracted from the request, and the ``traceparent``
sent upstream names the tap's span as the parent, with the incoming sampled flag unchanged. The tap
records every request by default, also under an unsampled parent (a gateway such as Envoy may mark
traces unsampled); with ``respect_sampling`` it follows parent-based sampling and records none for those.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from deltatap.core.clock import to_unix_ns
from deltatap.core.vocab import Outcome
from deltatap.proxy.record import TapRecord, events
from deltatap.telemetry.spans import emit_span, new_span_id, new_trace_id, traceparent
from deltatap.telemetry.tracer import Telemetry

_W3C = TraceContextTextMapPropagator()


@dataclass(slots=True)
class SpanStart:
    context: SpanContext
    parent: SpanContext | None
    trace_headers: dict[str, str]  # traceparent (+ tracestate) to send upstream


def begin(headers: Any) -> SpanStart:
    """New span ids under the incoming W3C context (a new trace when there is none)."""
    parent = trace.get_current_span(_W3C.extract(headers)).get_span_context() if "traceparent" in headers else None
    if parent is not None and parent.is_valid:
        trace_id, flags, state = parent.trace_id, parent.trace_flags, parent.trace_state
    else:
        parent = None
        trace_id, flags, state = new_trace_id(), TraceFlags(TraceFlags.SAMPLED), TraceState()
    span_id = new_span_id()
    ctx = SpanContext(trace_id, span_id, is_remote=False, trace_flags=flags, trace_state=state)
    out = {"traceparent": traceparent(trace_id, span_id, flags)}
    if state:
        out["tracestate"] = state.to_header()
    return SpanStart(ctx, parent, out)


def emit(
    telemetry: Telemetry, name: str, start: SpanStart, rec: TapRecord, attrs: dict[str, Any], respect_sampling: bool = False
) -> None:
    """Build the finished SERVER span for ``rec`` and hand it to the span processor (never blocks)."""
    if respect_sampling and not start.context.trace_flags.sampled:
        return
    evs = events(rec)
    status = Status(StatusCode.UNSET)
    outcome = rec.final_outcome()
    if outcome in (Outcome.UPSTREAM_ERROR, Outcome.TIMEOUT) or (rec.status or 0) >= 500:
        status = Status(StatusCode.ERROR, rec.failure.cause if rec.failure else f"HTTP {rec.status}")
    last = evs[-1][1] if evs else rec.received
    end = max(rec.end if rec.end is not None else last, last)
    emit_span(telemetry, name, SpanKind.SERVER, start.context, attrs, ((n, to_unix_ns(t), None) for n, t in evs),
              to_unix_ns(rec.received), to_unix_ns(end), parent=start.parent, status=status)
