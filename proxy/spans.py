"""The tap's span, built cheaply: ids at request start, one finished span handed to the processor at the end.

Going through ``tracer.start_span`` / ``add_event`` / ``set_attributes`` costs about half a
millisecond of CPU per request in the SDK (locks, attribute cleaning per call), on the same thread
that forwards other streams. A tap knows every event and attribute only when the request is over,
so it builds one :class:`opentelemetry.sdk.trace.ReadableSpan` then and hands it to the telemetry's
span processor directly — the same object the SDK would have produced, exported the same way.

Context: W3C ``traceparent``/``tracestate`` are extracted from the request, and the ``traceparent``
sent upstream names the tap's span as the parent, with the incoming sampled flag unchanged. The tap
records every request by default, also under an unsampled parent (a gateway such as Envoy may mark
traces unsampled); with ``respect_sampling`` it follows parent-based sampling and records none for those.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from deltatap import __version__
from deltatap.core.clock import to_unix_ns
from deltatap.telemetry.tracer import Telemetry
from deltatap.core.vocab import INSTRUMENTATION_SCOPE, Outcome
from deltatap.proxy.record import TapRecord, events

_W3C = TraceContextTextMapPropagator()
# Ids as the SDK's RandomIdGenerator makes them (a Mersenne Twister, not a syscall per id:
# SystemRandom's os.urandom cost ~100 us a call on this machine), but from a private generator
# seeded from the OS, so nobody's random.seed() can repeat them; reseeded in forked children.
_rand = random.Random(os.urandom(32))
os.register_at_fork(after_in_child=lambda: _rand.seed(os.urandom(32)))
_SCOPE = InstrumentationScope(INSTRUMENTATION_SCOPE, __version__)


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
        trace_id, flags, state = _rand.getrandbits(128) or 1, TraceFlags(TraceFlags.SAMPLED), TraceState()
    span_id = _rand.getrandbits(64) or 1
    ctx = SpanContext(trace_id, span_id, is_remote=False, trace_flags=flags, trace_state=state)
    out = {"traceparent": f"00-{trace_id:032x}-{span_id:016x}-{int(flags):02x}"}
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
    span = ReadableSpan(
        name=name,
        context=start.context,
        parent=start.parent,
        resource=telemetry.provider.resource,
        attributes=attrs,
        events=tuple(Event(n, None, to_unix_ns(t)) for n, t in evs),
        kind=SpanKind.SERVER,
        status=status,
        start_time=to_unix_ns(rec.received),
        end_time=to_unix_ns(end),
        instrumentation_scope=_SCOPE,
    )
    telemetry.processor.on_end(span)
