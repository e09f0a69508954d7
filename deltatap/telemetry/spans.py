"""One finished span per request, built once at its end and handed to the telemetry's processor.

``tracer.start_span`` / ``add_event`` / ``set_attributes`` / ``end`` cost a few hundred microseconds of CPU per
request in the SDK (locks, attribute cleaning per call), on the thread that stamps reads. An observer that knows
every event and attribute only when the request is over builds one :class:`opentelemetry.sdk.trace.ReadableSpan`
then — the object the SDK would have produced — and hands it to :attr:`Telemetry.processor` directly; the
exporters (deltatap.telemetry.otlp_encode) see no difference.

Ids: :func:`new_trace_id` / :func:`new_span_id` draw as the SDK's ``RandomIdGenerator`` does (a Mersenne
Twister, not a syscall per id) from a private generator seeded from the OS, so nobody's ``random.seed()`` can
repeat them; it is reseeded in forked children (spawned ones import it afresh).
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterable, Mapping
from typing import Any

from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from deltatap import __version__
from deltatap.core.vocab import INSTRUMENTATION_SCOPE
from deltatap.telemetry.tracer import Telemetry

__all__ = ["SAMPLED", "emit_span", "new_span_id", "new_trace_id", "traceparent"]

_rand = random.Random(os.urandom(32))
os.register_at_fork(after_in_child=lambda: _rand.seed(os.urandom(32)))
SCOPE = InstrumentationScope(INSTRUMENTATION_SCOPE, __version__)
SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_UNSET = Status(StatusCode.UNSET)


def new_trace_id() -> int:
    return _rand.getrandbits(128) or 1


def new_span_id() -> int:
    return _rand.getrandbits(64) or 1


def traceparent(trace_id: int, span_id: int, flags: int = SAMPLED) -> str:
    """The W3C ``traceparent`` naming this span."""
    return f"00-{trace_id:032x}-{span_id:016x}-{int(flags):02x}"


def emit_span(
    telemetry: Telemetry,
    name: str,
    kind: SpanKind,
    context: SpanContext,
    attributes: Mapping[str, Any],
    events: Iterable[tuple[str, int, Mapping[str, Any] | None]],
    start_unix_ns: int,
    end_unix_ns: int,
    parent: SpanContext | None = None,
    status: Status = _UNSET,
) -> None:
    """Build the finished span (events as ``(name, unix_ns, attributes or None)``) and hand it to the telemetry's
    span processor (never blocks: a full export queue drops it and counts it)."""
    span = ReadableSpan(
        name=name,
        context=context,
        parent=parent,
        resource=telemetry.provider.resource,
        attributes=attributes,
        events=tuple(Event(n, a, t) for n, t, a in events),
        kind=kind,
        status=status,
        start_time=start_unix_ns,
        end_time=end_unix_ns,
        instrumentation_scope=SCOPE,
    )
    telemetry.processor.on_end(span)
