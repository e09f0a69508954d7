"""Arrival processes: Poisson gaps pass a Kolmogorov-Smirnov test; the timeline is absolute and seeded."""

from __future__ import annotations

import math

import numpy as np
import pytest

from deltatap.loadgen.arrivals import ARRIVALS, schedule_offsets_ns


def ks_pvalue_exponential(gaps: np.ndarray, rate: float) -> float:
    """One-sample KS test of ``gaps`` against Exponential(rate) (asymptotic Kolmogorov distribution)."""
    x = np.sort(gaps)
    n = x.size
    cdf = 1.0 - np.exp(-rate * x)
    i = np.arange(1, n + 1)
    d = max(np.max(i / n - cdf), np.max(cdf - (i - 1) / n))
    lam = (math.sqrt(n) + 0.12 + 0.11 / math.sqrt(n)) * d
    p = 2 * sum((-1) ** (k - 1) * math.exp(-2 * k * k * lam * lam) for k in range(1, 101))
    return float(min(1.0, max(0.0, p)))


def test_registry_has_the_three_processes():
    assert {"poisson", "uniform", "bursty"} <= set(ARRIVALS)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_poisson_gaps_pass_ks(seed):
    rate = 250.0
    off = schedule_offsets_ns("poisson", rate, 5001, seed)
    gaps = np.diff(off) / 1e9
    assert ks_pvalue_exponential(gaps, rate) > 0.01
    assert abs(gaps.mean() - 1 / rate) < 0.05 / rate


def test_ks_rejects_non_poisson():
    # the test itself must be able to fail: uniform gaps at the same mean rate are rejected
    gaps = np.diff(schedule_offsets_ns("uniform", 250.0, 2001, 1)) / 1e9
    assert ks_pvalue_exponential(gaps, 250.0) < 1e-6


def test_uniform_is_a_metronome_on_an_absolute_timeline():
    off = schedule_offsets_ns("uniform", 300.0, 3001, 7)
    assert off[0] == 0
    # t_k = k / rate exactly (integer ns, no accumulated drift)
    assert abs(int(off[-1]) - 10 * 1_000_000_000) <= 1


def test_bursty_keeps_the_mean_rate_and_clusters():
    gaps = np.diff(schedule_offsets_ns("bursty", 100.0, 20001, 3)) / 1e9
    assert abs(gaps.mean() - 0.01) < 0.001
    cv = gaps.std() / gaps.mean()
    assert cv > 1.6  # Poisson has CV 1; shape 0.25 gives CV 2


def test_seed_reproduces_and_changes_the_timeline():
    a = schedule_offsets_ns("poisson", 50.0, 100, 42)
    b = schedule_offsets_ns("poisson", 50.0, 100, 42)
    c = schedule_offsets_ns("poisson", 50.0, 100, 43)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)


def test_bad_arguments_are_explained():
    with pytest.raises(ValueError, match="unknown arrival process"):
        schedule_offsets_ns("gaussian", 10.0, 10, 1)
    with pytest.raises(ValueError, match="rate must be > 0"):
        schedule_offsets_ns("poisson", 0.0, 10, 1)
