"""A reference component's own SERVER span for one request.

The hot path only records ``(role, mono_ns)`` pairs; the span's events are added with their exact
Unix-ns timestamps when the request ends (:meth:`ComponentSpan.end`). The span itself is started
when the request arrives (with the socket-level arrival stamp as its start time) so that its
context can be injected upstream as the parent of the next hop.

Event names are the generic point roles of :class:`deltatap.vocab.Role` (``in.arrive``,
``in.exit``, ``out.first_out``, ``queue``, ``first_token`` ...).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, MutableMapping
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from deltatap.core.clock import mono_ns, to_unix_ns
from deltatap.telemetry.tracer import Telemetry
from deltatap.core.vocab import Attr, Observer, Outcome, Role, component_span_name

W3C = TraceContextTextMapPropagator()
TRACE_HEADERS = ("traceparent", "tracestate")


def request_id(headers: Mapping[str, str], header: str) -> str:
    """The incoming correlation id, or a fresh one when the request carries none."""
    return headers.get(header) or uuid.uuid4().hex


class ComponentSpan:
    def __init__(
        self,
        telemetry: Telemetry,
        component: str,
        kind: str,
        headers: Mapping[str, str],
        start_mono: int,
        attributes: dict[str, Any],
    ) -> None:
        parent = W3C.extract(carrier=dict(headers.items()))
        attrs = {Attr.OBSERVER: Observer.COMPONENT.value, Attr.COMPONENT: component, Attr.COMPONENT_KIND: kind}
        attrs.update({k: v for k, v in attributes.items() if v is not None})
        self.span = telemetry.tracer.start_span(
            component_span_name(component),
            context=parent,
            kind=SpanKind.SERVER,
            start_time=to_unix_ns(start_mono),
            attributes=attrs,
        )
        self.start_mono = start_mono
        self.stamps: dict[str, int] = {}
        self.ended = False

    def stamp(self, role: Role | str, t_mono: int, *, overwrite: bool = False) -> None:
        """Record the time of a point (first stamp wins unless ``overwrite``)."""
        if overwrite or role not in self.stamps:
            self.stamps[str(role)] = t_mono

    def set(self, key: str, value: Any) -> None:
        if value is not None:
            self.span.set_attribute(key, value)

    def inject(self, headers: MutableMapping[str, str]) -> None:
        """Add ``traceparent``/``tracestate`` naming this span as the parent of the next hop."""
        W3C.inject(headers, context=trace.set_span_in_context(self.span))

    def end(self, outcome: Outcome | str, status: int | None, end_mono: int | None = None, error: str | None = None) -> None:
        if self.ended:
            return
        self.ended = True
        end_mono = end_mono or mono_ns()
        for role, t in sorted(self.stamps.items(), key=lambda kv: kv[1]):
            self.span.add_event(role, timestamp=to_unix_ns(t))
        self.span.set_attribute(Attr.OUTCOME, str(outcome))
        if status is not None:
            self.span.set_attribute(Attr.HTTP_STATUS, status)
        if error:
            self.span.set_attribute(Attr.ERROR_CAUSE, error)
            self.span.set_attribute(Attr.ERROR_TYPE, error.split(":", 1)[0])
        if outcome not in (Outcome.OK, Outcome.REFUSED) or (status is not None and status >= 500):
            self.span.set_status(Status(StatusCode.ERROR, error or str(outcome)))
        self.span.end(end_time=to_unix_ns(max(end_mono, self.start_mono)))
