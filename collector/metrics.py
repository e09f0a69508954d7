"""Prometheus metrics of the collector (``/metrics``); names are documented in docs/collector.md.

Counters are read from the pipeline's own stats at scrape time and the delta aggregates are numpy
bucket counts and mergeable sketches updated per batch of rows, so the ingest path pays nothing per
span for metrics.

* ``deltatap_collector_spans_received_total``                  spans decoded from any receiver
* ``deltatap_collector_decode_errors_total{transport}``       rejected requests (grpc, http)
* ``deltatap_collector_traces_opened_total`` / ``_closed_total`` / ``_evicted_total``
* ``deltatap_collector_late_spans_total``                      spans for an already closed trace
* ``deltatap_collector_open_traces``                           gauge
* ``deltatap_collector_traces_joined_total{method}``           rows by join method (trace_id, correlation, fingerprint, unjoined)
* ``deltatap_collector_join_ambiguous_total``                  fingerprint matches refused as ambiguous
* ``deltatap_collector_rows_total{outcome}``                   decomposition rows emitted (outcome as the stack names it: a gateway timeout is ``timeout``)
* ``deltatap_collector_forward_dropped_total``                 spans not forwarded (queue full / target down)
* ``deltatap_collector_delta_seconds{delta,component}``        histogram of every *duration* delta (never negative)
* ``deltatap_collector_delta_sum_seconds{delta,component}``    gauge: the sum of every delta, signed ones included
* ``deltatap_collector_delta_observations_total{delta,component}`` counter: how many values that sum holds
* ``deltatap_collector_delta_quantile_seconds{delta,component,quantile}`` gauge: the collector's own
  quantiles (0.5, 0.9, 0.95, 0.99) of every delta since it started, from the sketches its reports use

What the dashboard can trust, and why it is built this way:

* A value goes in only where it describes its request (:mod:`deltatap.collector.applies`): no
  last-token delay of a stream cut by a timeout, no block latency of a request that was let through.
* A histogram's ``_sum`` must never fall: ``rate()`` reads a fall as a counter reset and makes up an
  increase (a −0.5 ms mean read as −70 ms). Signed deltas (the residual, the inter-chunk gap a
  component adds) therefore have no histogram; their mean over a window is
  ``delta(..._delta_sum_seconds[w]) / increase(..._delta_observations_total[w])``.
* The buckets are at most 10 % apart (:data:`BUCKETS_S`, 1, 1.1, 1.2 ... per decade from 50 µs to
  60 s), so ``histogram_quantile``'s interpolation inside a bucket is off by less than 10 % — the
  old 25 / 50 ms buckets read a 27 ms median as 37 ms. Every delta's buckets exist (at zero) from the
  start, so ``rate()`` over a run counts its first rows too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from deltatap.collector.applies import applicable_keys, is_complete, is_refused, is_signed
from deltatap.collector.batch import delta_keys
from deltatap.collector.deltas import METRIC_HISTOGRAM, METRIC_OBSERVATIONS, METRIC_QUANTILE, METRIC_SUM, DeltaDef
from deltatap.collector.compact import tuple_getter
from deltatap.collector.rows import DeltaColumns, Row
from deltatap.collector.sketches import QUANTILES, Aggregator
from deltatap.core.vocab import Outcome

PREFIX = "deltatap_collector"
_MANTISSAS = (1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7, 1.8, 1.9, 2.0, 2.2, 2.4, 2.5, 2.6, 2.8, 3.0, 3.3, 3.6, 3.8, 4.0, 4.4, 4.8, 5.0,
              5.5, 6.0, 6.5, 7.0, 7.5, 8.0, 8.5, 9.0, 9.5)
BUCKETS_S: tuple[float, ...] = tuple(b for b in (round(m * 10.0**e, 10) for e in range(-5, 2) for m in _MANTISSAS) if 5e-5 <= b <= 60.0)
_EDGES_NS = np.array([round(b * 1e9) for b in BUCKETS_S], dtype=np.int64)
EXPORTED_QUANTILES = {"0.5": "p50", "0.9": "p90", "0.95": "p95", "0.99": "p99"}
assert set(EXPORTED_QUANTILES.values()) <= set(QUANTILES)


class DeltaHistograms:
    """Per delta: cumulative-bucket histogram (durations only), signed sum and count, and a sketch."""

    def __init__(self, defs: Sequence[DeltaDef]) -> None:
        """``defs``: the topology's deltas (:func:`deltatap.collector.deltas.delta_defs`)."""
        self.defs = {d.name: d for d in defs}
        self.component_of = {d.name: d.metric_component for d in defs}  # the metrics' component label
        self.signed = {d.name for d in defs if is_signed(d)}
        self.counts: dict[str, np.ndarray] = {n: np.zeros(len(_EDGES_NS) + 1, dtype=np.int64) for n in self.defs if n not in self.signed}
        self.def_list = list(defs)
        self.sums: dict[str, int] = {n: 0 for n in self.defs}  # signed, every delta
        self.hist_sums: dict[str, int] = {n: 0 for n in self.counts}  # the histograms' own, never falling
        self.n: dict[str, int] = {n: 0 for n in self.defs}
        self.sketches = Aggregator()
        self._plans: dict[tuple, tuple] = {}  # (delta names, refused, complete) -> the applicable names, their getter, as a set

    def _plan(self, keys: tuple[str, ...], refused: bool, complete: bool) -> tuple:
        """(the applicable names among ``keys``, their getter, as a set) for a row with those deltas."""
        plans = self._plans
        plan = plans.get((keys, refused, complete))
        if plan is None:
            if len(plans) >= 4096:
                plans.clear()
            idx = applicable_keys(keys, refused, complete, self.defs)
            plan = plans[keys, refused, complete] = (tuple(keys[i] for i in idx), tuple_getter(idx), frozenset(keys[i] for i in idx))
        return plan

    def _kept_columns(self, rows: list[Row], columns: dict[str, Any]) -> tuple[dict[str, Any], dict[str, list[int]]] | None:
        """The applicable deltas' columns cut out of the batch's unfiltered ``columns`` (numpy masks per delta,
        nothing per value in Python), in the order :class:`DeltaColumns` would give them, and the bounds of
        bounded ones; counts the rows and outcomes. None (nothing counted) when ``columns`` are not int64
        arrays that hold exactly these rows' deltas: the caller collects them row by row."""
        if not all(v.__class__ is np.ndarray and e.__class__ is np.ndarray for v, e in columns.values()):
            return None
        which: dict[tuple, int] = {}  # (delta names, refused, complete) -> index in plans
        plans: list[tuple[tuple[str, ...], tuple]] = []
        pids: list[int] = []
        seen: dict[str, int] = {}  # outcomes in first-seen order, counted
        bounded: dict[str, list[int]] = {}
        for r in rows:
            o = r.outcome
            seen[o] = seen.get(o, 0) + 1
            key = (delta_keys(r), is_refused(r), is_complete(r))
            j = which.get(key)
            if j is None:
                j = which[key] = len(plans)
                plans.append((key[0], self._plan(*key)))
            pids.append(j)
            if r.delta_bounds:
                app = plans[j][1][2]
                for name, b in r.delta_bounds.items():
                    if name in app:
                        bounded.setdefault(name, []).append(b)
        per_plan = np.bincount(np.asarray(pids, dtype=np.intp), minlength=len(plans))
        counts: dict[str, int] = {}
        for (keys, _), n in zip(plans, per_plan.tolist(), strict=True):
            for k in keys:
                counts[k] = counts.get(k, 0) + n
        if counts.keys() != columns.keys() or any(len(columns[k][0]) != n or len(columns[k][1]) != n for k, n in counts.items()):
            return None
        sk = self.sketches
        sk.rows += len(rows)
        outcomes = sk.outcomes
        for o, n in seen.items():
            outcomes[o] = outcomes.get(o, 0) + n
        if all(len(plan[0]) == len(keys) for keys, plan in plans):  # every delta applies (the usual batch)
            return columns, bounded
        pid = np.asarray(pids, dtype=np.intp)
        found: list[tuple[int, int, str, Any]] = []  # (first row it applies to, its place in that row, name, columns)
        for name, (v, e) in columns.items():
            has = np.array([name in keys for keys, _ in plans], dtype=bool)[pid]  # rows holding the delta
            app = np.array([name in plan[2] for _, plan in plans], dtype=bool)[pid]  # rows where it applies
            first = np.flatnonzero(app)
            if not first.size:
                continue
            sel = app[has]
            row0 = int(first[0])
            found.append((row0, plans[pids[row0]][1][0].index(name), name, (v, e) if sel.all() else (v[sel], e[sel])))
        found.sort(key=lambda x: (x[0], x[1]))
        return {name: ve for _, _, name, ve in found}, bounded

    def add_rows(self, rows: Iterable[Row], columns: Any = None, shared: dict | None = None) -> None:
        """Add rows (``columns``: the batch's unfiltered delta columns (:class:`DeltaColumns`) when the caller
        holds them, else collected here; either way the values that do not describe their request are dropped
        first; ``shared``: :meth:`~deltatap.collector.sketches.Aggregator.add_columns`)."""
        rows = rows if isinstance(rows, list) else list(rows)
        sk = self.sketches
        got = None if columns is None else self._kept_columns(rows, columns)
        if got is not None:
            cols, bounded = got
        else:
            sk.rows += len(rows)
            outcomes = sk.outcomes
            kept = DeltaColumns()  # the applicable deltas only (collector.applies), without copying any row
            bounded = {}
            for r in rows:
                outcomes[r.outcome] = outcomes.get(r.outcome, 0) + 1
                d = r.deltas
                plan = self._plan(tuple(d), is_refused(r), is_complete(r))
                kept.add_values(plan[0], plan[1](tuple(d.values())))
                if r.delta_bounds:
                    for name, b in r.delta_bounds.items():
                        if name in plan[2]:
                            bounded.setdefault(name, []).append(b)
            cols = kept.columns()
        for k, (v, _) in cols.items():
            arr = np.asarray(v, dtype=np.int64)
            self.sums[k] = self.sums.get(k, 0) + int(arr.sum())
            self.n[k] = self.n.get(k, 0) + int(arr.size)
            if k in self.signed:
                continue
            c = self.counts.get(k)
            if c is None:
                c = self.counts[k] = np.zeros(len(_EDGES_NS) + 1, dtype=np.int64)
            arr = np.clip(arr, 0, None)  # a duration below 0 is clock error: in the first bucket, and _sum never falls
            c += np.bincount(np.searchsorted(_EDGES_NS, arr, side="left"), minlength=len(_EDGES_NS) + 1)  # value <= edge: that bucket
            self.hist_sums[k] = self.hist_sums.get(k, 0) + int(arr.sum())
        sk.add_columns(cols, bounded, shared)


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
        # every outcome from the start, at 0: rate() over a run then counts its first timeout too
        for o, v in {**{x.value: 0 for x in Outcome}, **s["outcomes"]}.items():
            fam.add_metric([o], v)
        yield fam
        yield c("forward_dropped", "Spans not forwarded to the next OTLP endpoint", s["forward_dropped"])
        hist = self.hist
        comp = lambda name: hist.component_of.get(name) or ""  # noqa: E731
        h = HistogramMetricFamily(METRIC_HISTOGRAM, "Per-request duration deltas (profiles draft section 6); signed deltas have none", labels=["delta", "component"])
        for name, counts in hist.counts.items():
            cum = np.cumsum(counts)
            buckets = [(repr(b), int(cum[i])) for i, b in enumerate(BUCKETS_S)] + [("+Inf", int(cum[-1]))]
            h.add_metric([name, comp(name)], buckets, hist.hist_sums.get(name, 0) / 1e9)
        yield h
        g = GaugeMetricFamily(METRIC_SUM, "Sum of every value of a delta, signed ones included (a gauge: it may fall)", labels=["delta", "component"])
        n = CounterMetricFamily(METRIC_OBSERVATIONS, f"Values summed in {METRIC_SUM}", labels=["delta", "component"])
        for name in hist.sums:
            g.add_metric([name, comp(name)], hist.sums[name] / 1e9)
            n.add_metric([name, comp(name)], hist.n.get(name, 0))
        yield g
        yield n
        q = GaugeMetricFamily(METRIC_QUANTILE, "The collector's own quantiles of a delta since it started (its reports' sketches)", labels=["delta", "component", "quantile"])
        for name in hist.sketches.deltas:
            summ = hist.sketches.summary(name) or {}
            for qs, key in EXPORTED_QUANTILES.items():
                v = summ.get(f"{key}_ms")
                if v is not None:
                    q.add_metric([name, comp(name), qs], v / 1e3)
        yield q

    def render(self) -> bytes:
        return generate_latest(self.registry)


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)
