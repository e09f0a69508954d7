"""Prometheus metrics of the collector (``/metrics``); names are documented in docs/collector.md.

Counters are read from the pipeline's own stats at scrape time and delta histograms are numpy
bucket counts updated per batch of rows, so the ingest path pays nothing per span for metrics.

* ``deltatap_collector_spans_received_total``                  spans decoded from any receiver
* ``deltatap_collector_decode_errors_total{transport}``       rejected requests (grpc, http)
* ``deltatap_collector_traces_opened_total`` / ``_closed_total`` / ``_evicted_total``
* ``deltatap_collector_late_spans_total``                      spans for an already closed trace
* ``deltatap_collector_open_traces``                           gauge
* ``deltatap_collector_traces_joined_total{method}``           rows by join method (trace_id, correlation, fingerprint, unjoined)
* ``deltatap_collector_join_ambiguous_total``                  fingerprint matches refused as ambiguous
* ``deltatap_collector_rows_total{outcome}``                   decomposition rows emitted
* ``deltatap_collector_forward_dropped_total``                 spans not forwarded (queue full / target down)
* ``deltatap_collector_delta_seconds{delta,component}``        histogram of every delta per request
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from deltatap.collector.rows import Row, delta_columns

PREFIX = "deltatap_collector"
BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_EDGES_NS = np.array([round(b * 1e9) for b in BUCKETS_S], dtype=np.int64)


class DeltaHistograms:
    """Cumulative-bucket histograms per delta, updated with numpy per batch."""

    def __init__(self, component_of: dict[str, str | None]) -> None:
        self.component_of = component_of
        self.counts: dict[str, np.ndarray] = {}
        self.sums: dict[str, int] = {}

    def add_rows(self, rows: Iterable[Row], columns: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] | None = None) -> None:
        """Add rows; ``columns`` is ``rows.delta_columns(rows)`` when the caller has it already."""
        for k, (v, _) in (delta_columns(rows) if columns is None else columns).items():
            arr = np.asarray(v, dtype=np.int64)
            idx = np.searchsorted(_EDGES_NS, arr, side="left")  # value <= edge goes in that bucket
            c = self.counts.get(k)
            if c is None:
                c = self.counts[k] = np.zeros(len(_EDGES_NS) + 1, dtype=np.int64)
            c += np.bincount(idx, minlength=len(_EDGES_NS) + 1)
            self.sums[k] = self.sums.get(k, 0) + int(arr.sum())


class CollectorMetrics:
    """A prometheus_client collector over a stats snapshot function and :class:`DeltaHistograms`."""

    def __init__(self, snapshot: Callable[[], dict[str, Any]], hist: DeltaHistograms) -> None:
        self.snapshot = snapshot
        self.hist = hist
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def collect(self):  # noqa: D401 - prometheus_client interface
        s = self.snapshot()
        c = lambda name, doc, v: _counter(f"{PREFIX}_{name}", doc, v)  # noqa: E731
        yield c("spans_received", "Spans decoded from any receiver", s["spans_received"])
        fam = CounterMetricFamily(f"{PREFIX}_decode_errors", "Export requests rejected as invalid OTLP", labels=["transport"])
        for t, v in s["decode_errors"].items():
            fam.add_metric([t], v)
        yield fam
        yield c("traces_opened", "Traces opened by the assembler", s["traces_opened"])
        yield c("traces_closed", "Traces closed by the assembler", s["traces_closed"])
        yield c("traces_evicted", "Traces closed early because max_open_traces was reached", s["traces_evicted"])
        yield c("late_spans", "Spans that arrived for an already closed trace (dropped)", s["late_spans"])
        yield GaugeMetricFamily(f"{PREFIX}_open_traces", "Traces being assembled", value=s["open_traces"])
        fam = CounterMetricFamily(f"{PREFIX}_traces_joined", "Requests emitted as rows, by join method", labels=["method"])
        for m, v in s["joined"].items():
            fam.add_metric([m], v)
        yield fam
        yield c("join_ambiguous", "Fingerprint joins refused because the match was ambiguous", s["ambiguous"])
        fam = CounterMetricFamily(f"{PREFIX}_rows", "Decomposition rows emitted, by outcome", labels=["outcome"])
        for o, v in s["outcomes"].items():
            fam.add_metric([o], v)
        yield fam
        yield c("forward_dropped", "Spans not forwarded to the next OTLP endpoint", s["forward_dropped"])
        h = HistogramMetricFamily(f"{PREFIX}_delta_seconds", "Per-request latency deltas (profiles draft section 6)", labels=["delta", "component"])
        for name, counts in self.hist.counts.items():
            cum = np.cumsum(counts)
            buckets = [(str(b), int(cum[i])) for i, b in enumerate(BUCKETS_S)] + [("+Inf", int(cum[-1]))]
            h.add_metric([name, self.hist.component_of.get(name) or ""], buckets, self.hist.sums[name] / 1e9)
        yield h

    def render(self) -> bytes:
        return generate_latest(self.registry)


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)
