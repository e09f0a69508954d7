"""GPU metrics: trapezoidal energy over a request's window; without a GPU the run says so and goes on."""

from __future__ import annotations

import pytest

from deltatap.loadgen.gpu import GpuSampler, GpuSeries

S = 1_000_000_000


def series() -> GpuSeries:
    s = GpuSeries(0, "test")
    for t, p in ((0, 100.0), (1, 200.0), (2, 200.0), (3, 100.0)):
        s.t_mono_ns.append(t * S)
        s.power_w.append(p)
        s.util_pct.append(50.0)
        s.mem_used_mib.append(1000.0)
        s.temp_c.append(60.0)
    return s


def test_energy_interpolates_at_the_window_edges():
    s = series()
    # 0.5 s -> 1 s: (150 + 200) / 2 * 0.5; 1 -> 2 s: 200; 2 -> 2.5 s: (200 + 150) / 2 * 0.5
    assert s.energy_j(S // 2, 5 * S // 2) == pytest.approx(375.0)
    assert s.energy_j(0, 3 * S) == pytest.approx(150 + 200 + 150)
    # a window inside one sample interval: power interpolated at both edges
    assert s.energy_j(S // 4, S // 2) == pytest.approx(0.25 * (125 + 150) / 2)


def test_report_gives_tokens_per_joule_and_per_request_energy():
    sampler = GpuSampler.__new__(GpuSampler)
    sampler.available, sampler.reason, sampler.series, sampler.interval_s = True, "", [series()], 1.0
    rep = sampler.report([(0, S), (S, 3 * S)], output_tokens=900, requests=2)
    assert rep["energy_run_j"] == pytest.approx(500.0)
    assert rep["tokens_per_joule"] == pytest.approx(1.8)
    assert rep["energy_per_request_j"]["mean"] == pytest.approx((150 + 350) / 2)
    assert rep["gpus"][0]["power_w"] == {"mean": 150.0, "max": 200.0}


def test_without_a_gpu_the_sampler_says_why():
    sampler = GpuSampler()
    if sampler.available:
        sampler.stop()
        pytest.skip("this machine has an NVIDIA GPU")
    sampler.start()  # a no-op
    sampler.stop()
    rep = sampler.report([], 0, 0)
    assert rep["available"] is False and rep["reason"]


def counter_series() -> GpuSeries:
    """A GPU with NVML's energy counter: samples at 0, 1, 2, 3 s, the counter (mJ) rising 100, 300, 150 J."""
    s = series()
    s.energy_mj.extend([5_000_000.0, 5_100_000.0, 5_400_000.0, 5_550_000.0])
    return s


def test_energy_comes_from_the_counter_where_the_gpu_has_one():
    s = counter_series()
    assert s.energy_method == "nvml_energy_counter"
    # whole samples: the counter's own differences, not the power integral (which would say 150 + 200 + 150)
    assert s.energy_j(0, 3 * S) == pytest.approx(550.0)
    assert s.energy_j(S, 2 * S) == pytest.approx(300.0)
    # edges inside a sample interval: the counter interpolated there
    assert s.energy_j(S // 2, 5 * S // 2) == pytest.approx(50 + 300 + 75)
    assert series().energy_method == "power_trapezoid"


def test_the_counter_bounds_a_window_between_samples():
    s = counter_series()
    # [0.5 s, 2.5 s]: at least the counter from 1 s to 2 s, at most from 0 s to 3 s
    assert s.energy_bounds_j(S // 2, 5 * S // 2) == pytest.approx((300.0, 550.0))
    # a window within one interval: at least nothing, at most that interval's energy
    assert s.energy_bounds_j(S + S // 4, S + S // 2) == pytest.approx((0.0, 300.0))
    # a window on samples: exact
    assert s.energy_bounds_j(S, 3 * S) == pytest.approx((450.0, 450.0))
    # a window past the last sample: no upper end
    assert s.energy_bounds_j(2 * S, 4 * S) == (pytest.approx(150.0), None)
    # without a counter power between samples is unknown: no bound
    assert series().energy_bounds_j(0, S) is None


def test_report_names_the_method_and_the_run_bounds():
    sampler = GpuSampler.__new__(GpuSampler)
    sampler.available, sampler.reason, sampler.series, sampler.interval_s = True, "", [counter_series(), counter_series()], 1.0
    rep = sampler.report([(S // 2, S), (S, 5 * S // 2)], output_tokens=850, requests=2)
    assert rep["energy_method"] == "nvml_energy_counter"
    assert rep["energy_run_j"] == pytest.approx(2 * 425.0)
    assert rep["energy_run_bounds_j"] == pytest.approx([600.0, 1100.0])
    assert rep["tokens_per_joule"] == pytest.approx(1.0)
    sampler.series = [counter_series(), series()]
    rep = sampler.report([(0, 3 * S)], output_tokens=1, requests=1)
    assert rep["energy_method"] == "mixed: nvml_energy_counter, power_trapezoid"
    assert rep["energy_run_bounds_j"] is None
