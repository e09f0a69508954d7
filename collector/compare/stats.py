"""The statistics of a run-vs-run comparison: pure functions over numpy arrays.

* :func:`bootstrap_percentile_diff`: the percentile bootstrap of ``pct(B, q) - pct(A, q)`` for several q at
  once: A and B are resampled independently with replacement (each run's requests are its sample), ``resamples``
  times, seeded (``numpy.random.default_rng(seed)``), vectorised in chunks of at most :data:`CHUNK_CELLS`
  values so memory stays bounded; the interval is the (1-level)/2 and (1+level)/2 quantiles of the resampled
  differences. Percentiles use numpy's default linear interpolation, as the reports
  (:func:`deltatap.collector.reports.stats.pct`).
* :func:`mann_whitney`: the two-sided Mann-Whitney U test of "the per-request values of A and B come from one
  distribution", normal approximation with the tie correction and a continuity correction (fine from ~8 values
  a side; the comparison says when a side has fewer), and the common-language effect size P(B > A).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from deltatap.collector.reports.stats import finite

CHUNK_CELLS = 4_000_000  # resampled values held at once (float64: 32 MB)


@dataclass(frozen=True)
class DiffCI:
    q: float
    a: float  # the percentile of A
    b: float
    diff: float  # b - a
    lo: float
    hi: float


def _resampled_percentiles(v: np.ndarray, qs: Sequence[float], resamples: int, rng: np.random.Generator) -> np.ndarray:
    """(len(qs), resamples): the percentiles of ``resamples`` bootstrap resamples of ``v``."""
    n = v.size
    out = np.empty((len(qs), resamples))
    step = max(1, CHUNK_CELLS // max(n, 1))
    for start in range(0, resamples, step):
        k = min(step, resamples - start)
        idx = rng.integers(0, n, size=(k, n))
        out[:, start : start + k] = np.percentile(v[idx], qs, axis=1)
    return out


def bootstrap_percentile_diff(a: np.ndarray, b: np.ndarray, qs: Sequence[float], resamples: int = 2000, level: float = 0.95,
                              seed: int = 0) -> tuple[list[DiffCI], np.ndarray]:
    """Per q: the difference of the q-th percentiles (B - A) and its bootstrap interval; also the resampled
    differences, (len(qs), resamples), for plots. NaN everywhere when either side has no value."""
    a, b = finite(a), finite(b)
    nan = float("nan")
    if not a.size or not b.size:
        return [DiffCI(q, nan, nan, nan, nan, nan) for q in qs], np.full((len(qs), 0), nan)
    rng = np.random.default_rng(seed)
    ra = _resampled_percentiles(a, qs, resamples, rng)
    rb = _resampled_percentiles(b, qs, resamples, rng)
    diffs = rb - ra
    pa, pb = np.percentile(a, qs), np.percentile(b, qs)
    tail = (1.0 - level) / 2.0
    lo, hi = np.quantile(diffs, [tail, 1.0 - tail], axis=1)
    return [DiffCI(float(q), float(pa[i]), float(pb[i]), float(pb[i] - pa[i]), float(lo[i]), float(hi[i])) for i, q in enumerate(qs)], diffs


@dataclass(frozen=True)
class MannWhitney:
    u: float  # U of B (how often a B value exceeds an A value, ties counting half)
    p: float  # two-sided p-value
    prob_b_greater: float  # U / (n_a n_b): P(a random B request is slower than a random A one)


def mann_whitney(a: np.ndarray, b: np.ndarray) -> MannWhitney:
    a, b = finite(a), finite(b)
    n1, n2 = a.size, b.size
    if not n1 or not n2:
        return MannWhitney(float("nan"), float("nan"), float("nan"))
    x = np.concatenate([a, b])
    order = np.argsort(x, kind="mergesort")
    _, inv, counts = np.unique(x[order], return_inverse=True, return_counts=True)
    avg_rank = np.cumsum(counts) - (counts - 1) / 2.0  # 1-based average rank of each run of ties
    ranks = np.empty(x.size)
    ranks[order] = avg_rank[inv]
    u_b = float(ranks[n1:].sum() - n2 * (n2 + 1) / 2.0)
    n = n1 + n2
    mu = n1 * n2 / 2.0
    tie = float(((counts.astype(float) ** 3) - counts).sum())
    var = n1 * n2 / 12.0 * ((n + 1) - tie / (n * (n - 1))) if n > 1 else 0.0
    if var <= 0:
        p = 1.0
    else:
        z = (abs(u_b - mu) - 0.5) / math.sqrt(var)
        p = min(1.0, math.erfc(max(z, 0.0) / math.sqrt(2.0)))
    return MannWhitney(u_b, p, u_b / (n1 * n2))


@dataclass(frozen=True)
class Threshold:
    """A change that matters: ``value`` ms, or ``value`` percent of the baseline's figure (``relative``)."""

    value: float
    relative: bool

    @classmethod
    def parse(cls, text: str) -> Threshold:
        t = text.strip().lower()
        try:
            if t.endswith("%"):
                v, rel = float(t[:-1]), True
            else:
                v, rel = float(t[:-2] if t.endswith("ms") else t), False
        except ValueError:
            raise ValueError(f"--threshold {text!r}: expected a percentage of the baseline (5%) or milliseconds (0.5ms)") from None
        if not math.isfinite(v) or v < 0:
            raise ValueError(f"--threshold {text!r}: must be a finite number >= 0")
        return cls(v, rel)

    def ms(self, baseline: float) -> float:
        return abs(baseline) * self.value / 100.0 if self.relative else self.value

    def __str__(self) -> str:
        return f"{self.value:g}%" if self.relative else f"{self.value:g} ms"


REGRESSION, IMPROVEMENT, SMALL, SAME, UNKNOWN = "regression", "improvement", "changed, within threshold", "no significant change", "not enough data"


def verdict(ci: DiffCI, threshold: Threshold) -> str:
    """Latency: larger is worse. A regression is an interval wholly above 0 with a difference beyond the
    threshold; an improvement the mirror image; an interval that excludes 0 with a smaller difference is a
    change within the threshold; an interval that holds 0 is no significant change."""
    if not all(math.isfinite(v) for v in (ci.diff, ci.lo, ci.hi)):
        return UNKNOWN
    thr = threshold.ms(ci.a)
    if ci.lo > 0:
        return REGRESSION if ci.diff > thr else SMALL
    if ci.hi < 0:
        return IMPROVEMENT if -ci.diff > thr else SMALL
    return SAME
