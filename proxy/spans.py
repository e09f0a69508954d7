"""The tap's span, built cheaply: ids at request start, one plain record handed to the processor at the end.

Going through ``tracer.start_span`` / ``add_event`` / ``set_attributes`` costs about half a
millisecond of CPU per request in the SDK (locks, attribute cleaning per call), on the same thread
that forwards other streams; even one finished SDK span object costs tens of microseconds. A tap knows every
event and attribute only when the request is over, so it makes one
:class:`deltatap.telemetry.spans.SpanRecord` then (ids, the attribute dict, ``(event, unix_ns)`` pairs) and the
span processor encodes it straight to OTLP (:mod:`deltatap.telemetry.otlp_encode`; on the tap's own loop for an
OTLP/HTTP export, :mod:`deltatap.telemetry.otlp_loop`, in the export thread otherwise): no ``SpanContext``,
``Event`` or ``ReadableSpan`` per request.

Context: W3C ``traceparent``/``tracestate`` are extracted from the request (as the SDK's
``TraceContextTextMapPropagator`` extracts them; a plain version-00 ``traceparent`` without ``tracestate`` is read
here directly, the rest goes through the propagator), and the ``traceparent`` sent upstream names the tap's span
as the parent, with the incoming sampled flag unchanged. The tap records every request by default, also under
an unsampled parent (a gateway such as Envoy may mark traces unsampled); with ``respect_sampling`` it follows
parent-based sampling and records none for those.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from opentelemetry import trace
from opentelemetry.trace import TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from deltatap.core.clock import to_unix_ns
from deltatap.core.vocab import Outcome
from deltatap.proxy.headers import trace_lines
from deltatap.proxy.record import TapRecord, span_events
from deltatap.telemetry.spans import KIND_SERVER, STATUS_ERROR, STATUS_UNSET, SpanRecord, new_span_id, new_trace_id, traceparent
from deltatap.telemetry.tracer import Telemetry

_W3C = TraceContextTextMapPropagator()
_TRACEPARENT_RE = TraceContextTextMapPropagator._TRACEPARENT_HEADER_FORMAT_RE  # the propagator's own pattern
_MAX_TRACEPARENT = TraceContextTextMapPropagator._TRACEPARENT_MAXIMUM_LENGTH
_ZERO_TRACE, _ZERO_SPAN = "0" * 32, "0" * 16
_SAMPLED = int(TraceFlags.SAMPLED)
_ERRORS = (Outcome.UPSTREAM_ERROR, Outcome.TIMEOUT)
_new = tuple.__new__


class SpanStart(NamedTuple):
    """A tap span's ids and context, known when its request begins (made with ``tuple.__new__``: no Python-level
    ``__init__`` per request; its fields read as C-level getters)."""

    trace_id: int
    span_id: int
    trace_flags: int
    trace_state: str  # the W3C tracestate header value of the incoming context ("" for none)
    parent_span_id: int | None  # the incoming (remote) parent's span id; None for a new trace
    trace_headers: dict[str, str]  # traceparent (+ tracestate) to send upstream
    # the same as the head's lines (deltatap.proxy.headers.trace_lines), encoded with the ids: a spare made ahead
    # (relay.Downstream.spare) leaves the request path nothing to encode
    trace_lines: list[tuple[bytes, bytes]]


def _incoming(headers: Any) -> tuple[int, int, int, str] | None:
    """``(trace_id, parent span_id, flags, tracestate)`` of a valid incoming W3C context, else None."""
    tp = headers.get("traceparent")
    if isinstance(tp, str) and "tracestate" not in headers and len(tp) <= _MAX_TRACEPARENT:
        m = _TRACEPARENT_RE.search(tp)
        if m is not None and m.group(1) == "00" and not m.group(5):  # the common case, read as the propagator reads it
            tid, sid, flags = m.group(2, 3, 4)
            if tid == _ZERO_TRACE or sid == _ZERO_SPAN:
                return None
            return int(tid, 16), int(sid, 16), int(flags, 16), ""
    # anything else (tracestate, other versions, malformed): the propagator decides
    parent = trace.get_current_span(_W3C.extract(headers)).get_span_context()
    if not parent.is_valid:
        return None
    state = parent.trace_state
    return parent.trace_id, parent.span_id, int(parent.trace_flags), state.to_header() if state else ""


def begin(headers: Any) -> SpanStart:
    """New span ids under the incoming W3C context (a new trace when there is none)."""
    parent = _incoming(headers) if "traceparent" in headers else None
    span_id = new_span_id()
    if parent is None:
        trace_id, flags, state, parent_id = new_trace_id(), _SAMPLED, "", None
    else:
        trace_id, parent_id, flags, state = parent
    out = {"traceparent": traceparent(trace_id, span_id, flags)}
    if state:
        out["tracestate"] = state
    return _new(SpanStart, (trace_id, span_id, flags, state, parent_id, out, trace_lines(out)))


def emit(
    telemetry: Telemetry, name: str, start: SpanStart, rec: TapRecord, attrs: dict[str, Any], respect_sampling: bool = False
) -> None:
    """Hand the finished SERVER span for ``rec`` to the span processor as a plain record (never blocks)."""
    if respect_sampling and not start.trace_flags & _SAMPLED:
        return
    off = to_unix_ns(0)  # to_unix_ns(t) == t + off
    evs = span_events(rec, off)  # (never empty: request.received is always there)
    code, desc = STATUS_UNSET, None
    outcome = rec.outcome  # (Tap.finish settled it)
    if (outcome if outcome is not None else rec.final_outcome()) in _ERRORS or (rec.status or 0) >= 500:
        code, desc = STATUS_ERROR, rec.failure.cause if rec.failure else f"HTTP {rec.status}"
    last = evs[-1][1]
    end = rec.end
    end = last if end is None or end + off < last else end + off
    parent_id = start.parent_span_id
    telemetry.processor.on_end(_new(SpanRecord, (
        telemetry.origin, name, KIND_SERVER, start.trace_id, start.span_id, start.trace_state, parent_id, parent_id is not None,
        start.trace_flags, attrs, evs, rec.received + off, end, code, desc,
    )))
