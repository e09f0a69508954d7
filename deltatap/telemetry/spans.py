"""One finished span per request as plain data, built once at its end and handed to the telemetry's processor.

``tracer.start_span`` / ``add_event`` / ``set_attributes`` / ``end`` cost a few hundred microseconds of CPU per
request in the SDK (locks, attribute cleaning per call), on the thread that stamps reads; even one finished
:class:`opentelemetry.sdk.trace.ReadableSpan` with its ``Event`` and ``SpanContext`` objects costs tens of
microseconds. An observer that knows every event and attribute only when the request is over makes one
:class:`SpanRecord` then — a tuple of the span's fields (ids as ints, attributes as the dict it built, events as
``(name, unix_ns, attributes or None)`` tuples) — and hands it to :attr:`Telemetry.processor` as is. The exporter
(its thread, or the tap's event loop for OTLP/HTTP) encodes it straight to OTLP protobuf
(:func:`deltatap.telemetry.otlp_encode.encode_export_request`, in C when the accelerator is built), the same bytes the ReadableSpan it stands for would give
(:meth:`SpanRecord.readable`; tests/kernel/test_span_record.py). Exporters written for the SDK (an
``InMemorySpanExporter`` in tests) read it through the same property names as a ReadableSpan (``name``,
``attributes``, ``events``, ``context``, ``parent``, ``status``...), built on access.

Ids: :func:`new_trace_id` / :func:`new_span_id` draw as the SDK's ``RandomIdGenerator`` does (a Mersenne
Twister, not a syscall per id) from a private generator seeded from the OS, so nobody's ``random.seed()`` can
repeat them; it is reseeded in forked children (spawned ones import it afresh).
"""

from __future__ import annotations

import os
import random
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

from deltatap import __version__
from deltatap.core.vocab import INSTRUMENTATION_SCOPE

__all__ = [
    "SAMPLED", "SCOPE", "SpanOrigin", "SpanRecord", "new_span_id", "new_trace_id", "span_record", "traceparent",
]

_rand = random.Random(os.urandom(32))
_bits = _rand.getrandbits  # (bound once: reseeding at a fork reseeds this same generator)
os.register_at_fork(after_in_child=lambda: _rand.seed(os.urandom(32)))
SCOPE = InstrumentationScope(INSTRUMENTATION_SCOPE, __version__)
SAMPLED = TraceFlags(TraceFlags.SAMPLED)

# SpanKind -> the OTLP enum (Span.kind): the API's value + 1 (0 is UNSPECIFIED)
KIND_SERVER, KIND_CLIENT = SpanKind.SERVER.value + 1, SpanKind.CLIENT.value + 1
STATUS_UNSET, STATUS_OK, STATUS_ERROR = StatusCode.UNSET.value, StatusCode.OK.value, StatusCode.ERROR.value


def new_trace_id() -> int:
    return _bits(128) or 1


def new_span_id() -> int:
    return _bits(64) or 1


def traceparent(trace_id: int, span_id: int, flags: int = SAMPLED) -> str:
    """The W3C ``traceparent`` naming this span (``%``-formatted: a 128-bit id's hex is about twice as fast so as
    through ``format()``'s spec)."""
    return "00-%032x-%016x-%02x" % (trace_id, span_id, int(flags))


class SpanOrigin:
    """Where an observer's spans come from: its resource and instrumentation scope (one per :class:`Telemetry`).
    The encoder groups spans by these, and writes each one's fields once per process (cached by identity)."""

    __slots__ = ("resource", "scope")

    def __init__(self, resource: Any, scope: InstrumentationScope | None = SCOPE) -> None:
        self.resource = resource
        self.scope = scope


class SpanRecord(tuple):
    """A finished span as plain data. Fields by position (the C encoder reads them so; :func:`span_record` names them):

    0 origin (:class:`SpanOrigin`), 1 name, 2 kind (the OTLP enum: :data:`KIND_SERVER`, :data:`KIND_CLIENT`...),
    3 trace_id, 4 span_id (ints), 5 trace_state (the W3C ``tracestate`` header value, "" for none),
    6 parent_span_id (int, None for a root), 7 parent_remote (bool), 8 trace_flags (int),
    9 attributes (a dict, in the order the span lists them), 10 events (``(name, unix_ns, attributes or None)``),
    11 start_time, 12 end_time (Unix ns), 13 status code (``StatusCode`` value), 14 status description (or None).

    The properties below read it as a :class:`ReadableSpan` reads (for exporters written for the SDK); each builds
    its objects on access.
    """

    __slots__ = ()

    # ---- the ReadableSpan view ------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self[1]

    @property
    def kind(self) -> SpanKind:
        return SpanKind(self[2] - 1)

    @property
    def _trace_state(self) -> TraceState:
        return TraceState.from_header([self[5]]) if self[5] else TraceState()

    @property
    def context(self) -> SpanContext:
        return SpanContext(self[3], self[4], is_remote=False, trace_flags=TraceFlags(self[8]), trace_state=self._trace_state)

    def get_span_context(self) -> SpanContext:
        return self.context

    @property
    def parent(self) -> SpanContext | None:
        if self[6] is None:
            return None
        return SpanContext(self[3], self[6], is_remote=bool(self[7]), trace_flags=TraceFlags(self[8]), trace_state=self._trace_state)

    @property
    def attributes(self) -> Mapping[str, Any]:
        return MappingProxyType(self[9] or {})

    @property
    def events(self) -> tuple[Event, ...]:
        return tuple(Event(n, a, t) for n, t, a in self[10])

    @property
    def links(self) -> tuple:
        return ()

    @property
    def status(self) -> Status:
        return Status(StatusCode(self[13]), self[14])

    @property
    def start_time(self) -> int:
        return self[11]

    @property
    def end_time(self) -> int:
        return self[12]

    @property
    def resource(self) -> Any:
        return self[0].resource

    @property
    def instrumentation_scope(self) -> InstrumentationScope | None:
        return self[0].scope

    dropped_attributes = dropped_events = dropped_links = 0

    def readable(self) -> ReadableSpan:
        """The SDK span this record stands for (its OTLP encoding is the record's, byte for byte)."""
        return ReadableSpan(
            name=self.name, context=self.context, parent=self.parent, resource=self.resource, attributes=self[9],
            events=self.events, kind=self.kind, status=self.status, start_time=self[11], end_time=self[12],
            instrumentation_scope=self.instrumentation_scope,
        )

    def to_json(self, indent: int | None = 4) -> str:
        return self.readable().to_json(indent)

    def __repr__(self) -> str:
        return f"SpanRecord({self[1]!r}, trace_id={self[3]:032x}, span_id={self[4]:016x})"


_new = tuple.__new__


def span_record(
    origin: SpanOrigin,
    name: str,
    kind: int,
    trace_id: int,
    span_id: int,
    attributes: dict[str, Any],
    events: Sequence[tuple[str, int, Mapping[str, Any] | None]],
    start_unix_ns: int,
    end_unix_ns: int,
    trace_state: str = "",
    parent_span_id: int | None = None,
    parent_remote: bool = False,
    trace_flags: int = TraceFlags.SAMPLED,
    status_code: int = STATUS_UNSET,
    status_description: str | None = None,
) -> SpanRecord:
    """A :class:`SpanRecord` from its named fields (``kind``: the OTLP enum value, e.g. :data:`KIND_SERVER`)."""
    return _new(SpanRecord, (origin, name, kind, trace_id, span_id, trace_state, parent_span_id, parent_remote, trace_flags,
                             attributes, events, start_unix_ns, end_unix_ns, status_code, status_description))

