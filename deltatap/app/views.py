"""What the taps measured next to what the components say, per delta (the demo's first table).

The collector's rows prefer the reference components' own points (they outrank the taps), so its
decomposition never shows what the taps alone measured. :class:`SpanCapture` keeps every finished span of
the observers it is attached to (at each telemetry's processor); :func:`taps_vs_components` then joins
two views of the same requests offline, each with the collector's own pipeline
(:class:`deltatap.collector.pipeline.Pipeline`): the taps' (tap and client spans only) and the components'
(component and client spans only), and compares them per delta, request by request (matched on the
correlation id every observer records).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor

from deltatap.core.topology import Topology
from deltatap.core.vocab import Attr, Observer


class SpanCapture(SpanProcessor):
    """Every finished span, kept in memory (the demo's few hundred spans); attach with :meth:`observer`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.spans: list[ReadableSpan] = []

    def on_end(self, span: ReadableSpan) -> None:
        with self._lock:
            self.spans.append(span)

    def observer(self, inner: Callable[[str, Any], None] | None = None) -> Callable[[str, Any], None]:
        """An ``observe(name, telemetry)`` hook (``deltatap demo``'s) that attaches this capture, then calls ``inner``."""

        def observe(name: str, telemetry: Any) -> None:
            # at the telemetry's own processor: the taps hand it finished spans directly (proxy/spans.py), the SDK's
            # spans reach it through the provider, so every span passes here once
            processor = telemetry.processor
            forward = processor.on_end

            def on_end(span: ReadableSpan) -> None:
                self.on_end(span)
                forward(span)

            processor.on_end = on_end
            if inner is not None:
                inner(name, telemetry)

        return observe

    def records(self) -> list:
        """The captured spans as the collector decodes them (through the OTLP encoding the exporters send)."""
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        from deltatap.collector.spans import decode_request
        from deltatap.telemetry.otlp_encode import encode_export_request

        with self._lock:
            spans = list(self.spans)
        if not spans:
            return []
        return decode_request(ExportTraceServiceRequest.FromString(encode_export_request(spans)))


def _rows(spans: Sequence[Any], topo: Topology) -> list:
    from deltatap.collector.pipeline import Pipeline, PipelineOptions

    if not spans:
        return []
    pipe = Pipeline(topo, PipelineOptions(max_open_traces=len(spans) + 1, keep_rows=0))
    pipe.ingest(spans, 0.0)
    return pipe.flush(0.0)


COMPARED_PHASES = ("first", "last")  # point-to-point deltas both views can hold (tap and residual deltas are the taps' own)


def taps_vs_components(spans: Sequence[Any], topo: Topology):
    """A table: per delta, the taps' median, the components' median, and the per-request difference (taps -
    components) at P50 and P99 of its absolute value, over the ok requests both views have."""
    from deltatap.collector.reports.model import Column, Table
    from deltatap.collector.rows import delta_defs

    taps = _rows([s for s in spans if s.attrs.get(Attr.OBSERVER) in (Observer.TAP.value, Observer.CLIENT.value)], topo)
    comps = _rows([s for s in spans if s.attrs.get(Attr.OBSERVER) in (Observer.COMPONENT.value, Observer.CLIENT.value)], topo)
    by_id = {r.request_id: r for r in comps if r.request_id and r.outcome == "ok"}
    pairs = [(t, by_id[t.request_id]) for t in taps if t.outcome == "ok" and t.request_id in by_id]
    table = Table("taps_vs_components", "What the taps measured vs what the components say (per request, ok requests)",
                  [Column("delta", "Delta"), Column("n", "Requests", "", 0), Column("taps_p50_ms", "Taps P50", "ms", 3),
                   Column("components_p50_ms", "Components P50", "ms", 3), Column("diff_p50_ms", "Difference P50", "ms", 3),
                   Column("absdiff_p99_ms", "|Difference| P99", "ms", 3)])
    for d in delta_defs(topo):
        if d.phase not in COMPARED_PHASES:
            continue
        tv = [(t.deltas[d.name].ns, c.deltas[d.name].ns) for t, c in pairs if d.name in t.deltas and d.name in c.deltas]
        if not tv:
            continue
        a = np.asarray(tv, dtype=np.int64)
        diff = (a[:, 0] - a[:, 1]) / 1e6
        table.add(d.name, len(tv), float(np.median(a[:, 0])) / 1e6, float(np.median(a[:, 1])) / 1e6, float(np.median(diff)),
                  float(np.percentile(np.abs(diff), 99)))
    table.footnotes.append("Taps: from the tap and load-generator spans alone; components: from the reference components' own spans "
                           "(stamped at their sockets) and the load generator's. Difference = taps - components, request by request: "
                           "deltatap's error where the components are right.")
    return table
