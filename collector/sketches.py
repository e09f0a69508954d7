"""Mergeable aggregates per delta: DDSketch quantiles plus exact count, min, max, mean, error bound.

Each delta gets one :class:`ddsketch.DDSketch` (relative accuracy ``alpha``, default 0.5 %) over its
values in ns; count, min, max and sum are exact. While a delta has at most ``exact_cap`` values
(default 50,000) they are also kept, and quantiles are exact (numpy, linear interpolation); beyond
that, quantiles come from the sketch. The choice depends only on the total count, so merged and
single-collector aggregates still agree. Sketches merge bucket by bucket, so the
aggregate of several collectors (each seeing some traces, e.g. behind the OpenTelemetry
Collector's trace-id load-balancing exporter) equals the aggregate one collector would have built
from all rows: :meth:`Aggregator.merge`, :meth:`Aggregator.to_dict` / :meth:`Aggregator.from_dict`
(the ``sketches.json`` file ``deltatap report --from`` merges). ``error_bound_ms`` is the largest
error bound of any row's value (clock uncertainties and stamp intervals; quantiles carry the sketch's relative
accuracy on top); ``bounded_share``, ``bound_mean_ms`` and ``bound_max_ms`` say how many values had a point that
was an interval rather than an exact stamp (``Row.delta_bounds``), and how wide; ``unbounded_share`` how many had
no bound at all (a write no later observation saw leave: ``deltatap.core.vocab.BOUND_UNKNOWN``; not in the widths).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np
from ddsketch import DDSketch
from ddsketch.mapping import LogarithmicMapping

from deltatap.collector.rows import Row, delta_columns

QUANTILES: dict[str, float] = {"p50": 0.50, "p90": 0.90, "p95": 0.95, "p99": 0.99, "p999": 0.999}
SKETCH_FORMAT = "deltatap-sketches/1"


def _store_to_dict(store: Any) -> dict[str, float]:
    return {str(store.offset + i): c for i, c in enumerate(store.bins) if c}


def _store_from_dict(store: Any, bins: dict[str, float]) -> None:
    for k, c in bins.items():
        store.add(int(k), float(c))


EXACT_CAP = 50_000


class DeltaSketch:
    __slots__ = ("sketch", "err_max_ns", "exact", "cap", "bounded", "bound_sum_ns", "bound_max_ns", "unbounded")

    def __init__(self, alpha: float, cap: int = EXACT_CAP) -> None:
        self.sketch = DDSketch(relative_accuracy=alpha)
        self.err_max_ns = 0
        # values whose points were intervals, not exact (Row.delta_bounds): how many, and their widths
        self.bounded = 0
        self.bound_sum_ns = 0
        self.bound_max_ns = 0
        self.unbounded = 0  # of those, the values with no bound at all (a point's side unknown: BOUND_UNKNOWN)
        self.cap = cap
        self.exact: list[np.ndarray] | None = []

    def _keep(self, values: np.ndarray) -> None:
        if self.exact is None:
            return
        if self.sketch.count > self.cap:
            self.exact = None
        else:
            self.exact.append(values)

    def add_many(self, values: np.ndarray, errors: np.ndarray, digest: tuple | None = None) -> None:
        """Add int64 ns values: bucket keys computed with numpy for the whole batch, then one
        store update per distinct bucket (what ``DDSketch.add`` does per value, batched). ``digest``: what
        :meth:`digest` gave for these values and a sketch of the same accuracy (worked out once for several)."""
        d = self.digest(values, errors) if digest is None else digest
        if d is None:
            return
        s = self.sketch
        values, stores, zero, total, lo, hi, err = d
        if stores is None:  # pragma: no cover - DDSketch's default mapping is logarithmic
            for v in values.tolist():
                s.add(float(v))
        else:
            for store, (uniq, counts) in zip((s._store, s._negative_store), stores, strict=True):
                for k, c in zip(uniq, counts, strict=True):
                    store.add(k, float(c))
            s._zero_count += zero
            s._count += float(values.size)
            s._sum += total  # an exact integer sum (ns totals stay far below 2**63)
            s._min = min(s._min, lo)
            s._max = max(s._max, hi)
        self._keep(values)  # (one array may be kept by several sketches: nobody changes it)
        if err is not None:
            self.err_max_ns = max(self.err_max_ns, err)

    def digest(self, values: np.ndarray, errors: np.ndarray) -> tuple | None:
        """What :meth:`add_many` adds for ``values`` to a sketch of this one's accuracy: (the values as a compact int64
        copy, per store the distinct bucket keys and their counts, zeros, sum, min, max, largest error bound), or None
        for no values."""
        mp = self.sketch._mapping
        values = np.array(values, dtype=np.int64)  # a copy: the exact values are kept
        if not values.size:
            return None
        err = int(errors.max()) if errors.size else None
        if not isinstance(mp, LogarithmicMapping):  # pragma: no cover - DDSketch's default mapping is logarithmic
            return values, None, 0.0, 0.0, 0.0, 0.0, err
        v = values.astype(np.float64)
        lim = mp.min_possible
        pos, neg = v > lim, v < -lim
        stores = []
        for arr in (v[pos], -v[neg]):
            if arr.size:
                keys = np.ceil(np.log2(arr) * mp._multiplier) + mp._offset  # LogarithmicMapping.key, vectorised
                uniq, counts = np.unique(keys.astype(np.int64), return_counts=True)
                stores.append((uniq.tolist(), counts.tolist()))
            else:
                stores.append(((), ()))
        zero = float(values.size - int(pos.sum()) - int(neg.sum()))
        return values, stores, zero, float(values.sum()), float(values.min()), float(values.max()), err

    def add_bounds(self, bounds: list[int]) -> None:
        """Values (already added) whose stamps were bounded, by the part of their error bound that makes
        (:data:`~deltatap.core.vocab.BOUND_UNKNOWN`, negative: no bound; counted in :attr:`unbounded`, not in the widths)."""
        self.bounded += len(bounds)
        known = [b for b in bounds if b >= 0]
        self.unbounded += len(bounds) - len(known)
        if known:
            self.bound_sum_ns += sum(known)
            self.bound_max_ns = max(self.bound_max_ns, max(known))

    def merge(self, other: DeltaSketch) -> None:
        self.sketch.merge(other.sketch)
        self.err_max_ns = max(self.err_max_ns, other.err_max_ns)
        self.bounded += other.bounded
        self.bound_sum_ns += other.bound_sum_ns
        self.bound_max_ns = max(self.bound_max_ns, other.bound_max_ns)
        self.unbounded += other.unbounded
        if other.exact is None:
            self.exact = None
        else:
            self._keep(np.concatenate(other.exact) if other.exact else np.zeros(0, np.int64))

    def values(self) -> np.ndarray | None:
        """Every value (int64 ns) while the delta is under the exact cap, else None."""
        if self.exact is None:
            return None
        return np.concatenate(self.exact) if self.exact else np.zeros(0, np.int64)

    def quantiles_ns(self, qs: Iterable[float] = QUANTILES.values()) -> list[float | None]:
        """The quantiles ``qs`` (ascending) in ns: exact while under the cap, else from the sketch.

        A sketch quantile is a bucket's representative value, which can lie up to the relative
        accuracy outside the data (a P99.9 above the maximum); each is clamped to the exact
        [min, max] and the list made non-decreasing, so P50 <= P90 <= ... <= max always holds and
        every value stays within the sketch's accuracy of the true quantile."""
        qs = list(qs)
        s = self.sketch
        if s.count == 0:
            return [None] * len(qs)
        vals = self.values()
        if vals is not None:
            return [float(v) for v in np.quantile(vals, qs)]
        out: list[float | None] = []
        lo, hi = float(s._min), float(s._max)
        prev = lo
        for q in qs:
            v = min(max(float(s.get_quantile_value(q)), lo, prev), hi)
            out.append(v)
            prev = v
        return out

    def summary(self) -> dict[str, float | int | None]:
        s = self.sketch
        n = int(s.count)
        out: dict[str, float | int | None] = {}
        for name, v in zip(QUANTILES, self.quantiles_ns(), strict=True):
            out[f"{name}_ms"] = None if v is None else v / 1e6
        out["mean_ms"] = None if n == 0 else s.sum / n / 1e6
        out["min_ms"] = None if n == 0 else s._min / 1e6
        out["max_ms"] = None if n == 0 else s._max / 1e6
        out["count"] = n
        out["error_bound_ms"] = self.err_max_ns / 1e6
        out["bounded_share"] = None if n == 0 else self.bounded / n  # values with a stamp interval (not exact)
        known = self.bounded - self.unbounded
        out["bound_mean_ms"] = self.bound_sum_ns / known / 1e6 if known else None
        out["bound_max_ms"] = self.bound_max_ns / 1e6 if known else None
        out["unbounded_share"] = None if n == 0 else self.unbounded / n  # values with no bound (a write never seen to leave)
        return out

    def to_dict(self) -> dict[str, Any]:
        s = self.sketch
        return {
            "count": s._count, "sum": s._sum, "min": s._min if s._count else None, "max": s._max if s._count else None,
            "zero": s._zero_count, "pos": _store_to_dict(s._store), "neg": _store_to_dict(s._negative_store), "err_max_ns": self.err_max_ns,
            "bounded": self.bounded, "bound_sum_ns": self.bound_sum_ns, "bound_max_ns": self.bound_max_ns, "unbounded": self.unbounded,
            "values": None if self.values() is None else self.values().tolist(),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any], alpha: float) -> DeltaSketch:
        out = cls(alpha)
        s = out.sketch
        _store_from_dict(s._store, d.get("pos", {}))
        _store_from_dict(s._negative_store, d.get("neg", {}))
        s._zero_count = float(d.get("zero", 0))
        s._count = float(d["count"])
        s._sum = float(d["sum"])
        s._min = float(d["min"]) if d.get("min") is not None else math.inf
        s._max = float(d["max"]) if d.get("max") is not None else -math.inf
        out.err_max_ns = int(d.get("err_max_ns", 0))
        out.bounded, out.bound_sum_ns, out.bound_max_ns = int(d.get("bounded", 0)), int(d.get("bound_sum_ns", 0)), int(d.get("bound_max_ns", 0))
        out.unbounded = int(d.get("unbounded", 0))
        vals = d.get("values")
        out.exact = None if vals is None else [np.asarray(vals, dtype=np.int64)]
        return out


class Aggregator:
    """Per-delta sketches over rows; mergeable across collectors."""

    def __init__(self, alpha: float = 0.005) -> None:
        if not 0 < alpha < 1:
            raise ValueError("relative accuracy must be in (0, 1)")
        self.alpha = alpha
        self.deltas: dict[str, DeltaSketch] = {}
        self.rows = 0
        self.outcomes: dict[str, int] = {}

    def add_rows(self, rows: Iterable[Row], columns: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] | None = None,
                 shared: dict | None = None) -> None:
        """Add rows; ``columns`` is ``rows.delta_columns(rows)`` when the caller has it already (``shared``:
        :meth:`add_columns`)."""
        rows = rows if isinstance(rows, list) else list(rows)
        self.rows += len(rows)
        outcomes = self.outcomes
        for r in rows:
            outcomes[r.outcome] = outcomes.get(r.outcome, 0) + 1
        bounded: dict[str, list[int]] = {}
        for r in rows:
            if r.delta_bounds:
                for name, b in r.delta_bounds.items():
                    if name in r.deltas:
                        bounded.setdefault(name, []).append(b)
        self.add_columns(delta_columns(rows) if columns is None else columns, bounded, shared)

    def add_columns(self, columns: dict[str, tuple[Any, Any]], bounded: dict[str, list[int]], shared: dict | None = None) -> None:
        """The deltas of rows already counted in :attr:`rows` and :attr:`outcomes`: their columns
        (``rows.delta_columns``) and, per delta, the bounds of its bounded values. ``shared``: a dict kept by a caller
        that adds the same column arrays to several aggregators: each column's digest (:meth:`DeltaSketch.digest`) is
        then worked out once."""
        for name, (v, e) in columns.items():
            sk = self.deltas.get(name)
            if sk is None:
                sk = self.deltas[name] = DeltaSketch(self.alpha)
            if shared is None:
                sk.add_many(np.asarray(v, dtype=np.int64), np.asarray(e, dtype=np.int64))
                continue
            got = shared.get(name)
            if got is None or got[0] is not v or got[1] is not e or got[2] != self.alpha:
                got = shared[name] = (v, e, self.alpha, sk.digest(np.asarray(v, dtype=np.int64), np.asarray(e, dtype=np.int64)))
            sk.add_many(v, e, got[3])
        for name, bs in bounded.items():
            if name in self.deltas:
                self.deltas[name].add_bounds(bs)

    def merge(self, other: Aggregator) -> None:
        if not math.isclose(other.alpha, self.alpha):
            raise ValueError(f"cannot merge sketches of relative accuracy {other.alpha} into {self.alpha}")
        self.rows += other.rows
        for k, v in other.outcomes.items():
            self.outcomes[k] = self.outcomes.get(k, 0) + v
        for name, sk in other.deltas.items():
            mine = self.deltas.get(name)
            if mine is None:
                mine = self.deltas[name] = DeltaSketch(self.alpha)
            mine.merge(sk)

    def summary(self, name: str) -> dict[str, float | int | None] | None:
        sk = self.deltas.get(name)
        return None if sk is None else sk.summary()

    def summaries(self, order: Iterable[str] = ()) -> dict[str, dict[str, float | int | None]]:
        """delta -> {p50_ms, p90_ms, p95_ms, p99_ms, p999_ms, mean_ms, min_ms, max_ms, count, error_bound_ms}."""
        names = [n for n in order if n in self.deltas] + sorted(n for n in self.deltas if n not in set(order))
        return {n: self.deltas[n].summary() for n in names}

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": SKETCH_FORMAT, "relative_accuracy": self.alpha, "rows": self.rows, "outcomes": dict(self.outcomes),
            "deltas": {n: sk.to_dict() for n, sk in self.deltas.items()},
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Aggregator:
        if d.get("format") != SKETCH_FORMAT:
            raise ValueError(f"not a deltatap sketch file (format {d.get('format')!r}, expected {SKETCH_FORMAT!r})")
        agg = cls(float(d["relative_accuracy"]))
        agg.rows = int(d.get("rows", 0))
        agg.outcomes = {k: int(v) for k, v in d.get("outcomes", {}).items()}
        for n, sd in d.get("deltas", {}).items():
            agg.deltas[n] = DeltaSketch.from_dict(sd, agg.alpha)
        return agg
