"""Arrival processes for open-loop load, registered by name.

An arrival process yields the *gaps* between consecutive planned sends; the scheduler places request
``k`` at the absolute time ``t_k = t_start + sum(gaps[:k+1])`` (never "sleep gap after the last send",
which would add every send's own cost to the next interval). Gaps come from a seeded numpy generator,
so the same seed gives the same timeline.

* ``poisson``  - exponential gaps with mean 1/rate (methodology 4.2.3: REQUIRED).
* ``uniform``  - constant gaps 1/rate (a metronome).
* ``bursty``   - gamma gaps with shape ``burstiness`` < 1 and mean 1/rate (as in vLLM's
  benchmark_serving): the same mean rate, more clustering; coefficient of variation 1/sqrt(shape).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

GapSampler = Callable[[np.random.Generator, float, int], np.ndarray]


@dataclass(frozen=True)
class ArrivalProcess:
    name: str
    description: str
    sample: GapSampler  # (rng, rate, n) -> n gaps in seconds


ARRIVALS: dict[str, ArrivalProcess] = {}
DEFAULT_BURSTINESS = 0.25


def register(name: str, description: str) -> Callable[[GapSampler], GapSampler]:
    def deco(fn: GapSampler) -> GapSampler:
        ARRIVALS[name] = ArrivalProcess(name, description, fn)
        return fn

    return deco


@register("poisson", "exponential inter-arrival gaps (memoryless)")
def _poisson(rng: np.random.Generator, rate: float, n: int) -> np.ndarray:
    return rng.exponential(1.0 / rate, size=n)


@register("uniform", "constant inter-arrival gaps of 1/rate")
def _uniform(rng: np.random.Generator, rate: float, n: int) -> np.ndarray:
    return np.full(n, 1.0 / rate)


@register("bursty", f"gamma gaps, shape {DEFAULT_BURSTINESS} (CV 2), same mean rate")
def _bursty(rng: np.random.Generator, rate: float, n: int) -> np.ndarray:
    k = DEFAULT_BURSTINESS
    return rng.gamma(k, 1.0 / (rate * k), size=n)


def get_arrival(name: str) -> ArrivalProcess:
    try:
        return ARRIVALS[name]
    except KeyError:
        raise ValueError(f"unknown arrival process {name!r}; choose one of: {', '.join(sorted(ARRIVALS))}") from None


def schedule_offsets_ns(name: str, rate: float, n: int, seed: int) -> np.ndarray:
    """Planned send offsets (ns from the start of the run) of ``n`` requests.

    The first request goes at offset 0; the k-th at the sum of the first k gaps. Integers, so the
    absolute timeline never accumulates float rounding.
    """
    if rate <= 0:
        raise ValueError(f"--rate must be > 0 requests/s (got {rate})")
    if n <= 0:
        return np.zeros(0, dtype=np.int64)
    proc = get_arrival(name)
    rng = np.random.default_rng([seed, 0xA771])  # stream independent of the workload's
    gaps = proc.sample(rng, rate, n - 1)
    offsets = np.concatenate(([0.0], np.cumsum(gaps)))
    return np.round(offsets * 1e9).astype(np.int64)
