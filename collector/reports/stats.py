"""Distribution statistics over numpy arrays (methodology §5.1.4, §5.4.4): pure functions, NaN-aware.

Percentiles use numpy's default linear interpolation between order statistics, so a test can
compute the expected value by hand. Missing values are NaN and are dropped, never imputed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

PERCENTILES: tuple[tuple[str, float], ...] = (("p50", 50.0), ("p90", 90.0), ("p95", 95.0), ("p99", 99.0), ("p999", 99.9))
PERCENTILE_TITLES = {"p50": "P50", "p90": "P90", "p95": "P95", "p99": "P99", "p999": "P99.9"}


def finite(values: Iterable[float] | np.ndarray) -> np.ndarray:
    arr = np.asarray(values if isinstance(values, np.ndarray) else list(values), dtype=float)
    return arr[np.isfinite(arr)]


def pct(values: np.ndarray, q: float) -> float:
    """The q-th percentile of the finite values, NaN when there are none."""
    v = finite(values)
    return float(np.percentile(v, q)) if v.size else float("nan")


@dataclass(frozen=True)
class Summary:
    count: int
    mean: float
    std: float
    min: float
    max: float
    p50: float
    p90: float
    p95: float
    p99: float
    p999: float

    def get(self, key: str) -> float:
        return float(getattr(self, key))

    def as_dict(self, scale: float = 1.0, suffix: str = "") -> dict[str, float | int]:
        out: dict[str, float | int] = {"count": self.count}
        for key in ("p50", "p90", "p95", "p99", "p999", "mean", "std", "min", "max"):
            out[key + suffix] = self.get(key) * scale
        return out


def summarize(values: Iterable[float] | np.ndarray) -> Summary:
    v = finite(values)
    if not v.size:
        nan = float("nan")
        return Summary(0, nan, nan, nan, nan, nan, nan, nan, nan, nan)
    qs = np.percentile(v, [q for _, q in PERCENTILES])
    return Summary(
        count=int(v.size),
        mean=float(v.mean()),
        std=float(v.std()),  # population standard deviation (ddof=0), as jitter is defined over all samples
        min=float(v.min()),
        max=float(v.max()),
        p50=float(qs[0]),
        p90=float(qs[1]),
        p95=float(qs[2]),
        p99=float(qs[3]),
        p999=float(qs[4]),
    )


def ns_to_ms(values: np.ndarray) -> np.ndarray:
    return np.asarray(values, dtype=float) / 1e6


def rate(numerator: int, denominator: int) -> float:
    """A fraction, NaN when the denominator is zero (an undefined rate is not 0%)."""
    return numerator / denominator if denominator else float("nan")
