"""GPU system metrics (exo-bench seed): utilisation, memory, temperature, power and energy at 1 Hz via NVML.

A daemon thread samples every NVIDIA GPU. Energy for a time window comes from NVML's total-energy counter
(``nvmlDeviceGetTotalEnergyConsumption``, millijoules since the driver loaded; Volta and later) where the GPU has
one: the counter's difference over the window, the counter linearly interpolated at the window's edges, with a bound
(:meth:`GpuSeries.energy_bounds_j`: the counter between the samples just inside and just outside the window). Where
the GPU has no counter it is the trapezoidal integral of the sampled power (NVML's power reading, itself an average
over about a second on recent GPUs), linearly interpolated at the edges, with no bound: power between two samples is
not known. Summed over GPUs. Per request that gives energy per request (overlapping requests share the same joules);
over the run, tokens per joule. With no NVIDIA GPU / driver the sampler says so once, at INFO (that is normal), and the
run goes on without it; NVML failing on a machine that does have an NVIDIA GPU (``/dev/nvidia0``,
``/proc/driver/nvidia/gpus``) is a WARNING.
"""

from __future__ import annotations

import glob
import logging
import os
import threading
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from deltatap.core.clock import mono_ns, to_unix_ns

log = logging.getLogger("deltatap.loadgen.gpu")


def nvidia_gpu_present() -> bool:
    """An NVIDIA GPU with its kernel driver loaded is visible on this machine (Linux device nodes or
    the driver's /proc entries) - whether or not NVML works."""
    if glob.glob("/dev/nvidia[0-9]*"):
        return True
    try:
        return bool(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return False


def no_gpu_log_level(gpu_present: bool) -> int:
    """How loud "no GPU metrics" is: INFO where there is no NVIDIA GPU / driver (normal on a laptop or a
    CI runner), WARNING where there is one and NVML still failed (a real problem: metrics are missing)."""
    return logging.WARNING if gpu_present else logging.INFO


@dataclass
class GpuSeries:
    index: int
    name: str
    t_mono_ns: list[int] = field(default_factory=list)
    util_pct: list[float] = field(default_factory=list)
    mem_used_mib: list[float] = field(default_factory=list)
    temp_c: list[float] = field(default_factory=list)
    power_w: list[float] = field(default_factory=list)
    # NVML's total-energy counter at each sample (mJ), where the GPU has one (else this stays empty)
    energy_mj: list[float] = field(default_factory=list)

    @property
    def energy_method(self) -> str:
        return "nvml_energy_counter" if self._counter() else "power_trapezoid"

    def _counter(self) -> bool:
        return len(self.energy_mj) == len(self.t_mono_ns) >= 2

    def energy_j(self, t0: int, t1: int) -> float | None:
        """Energy over [t0, t1] (mono ns): the energy counter's difference (interpolated at the edges) where the GPU
        has one, else the trapezoidal integral of power; None without two samples."""
        if len(self.t_mono_ns) < 2 or t1 <= t0:
            return None if len(self.t_mono_ns) < 2 else 0.0
        if self._counter():
            t = np.asarray(self.t_mono_ns, dtype=float)
            e = np.asarray(self.energy_mj, dtype=float)
            e0, e1 = np.interp([float(t0), float(t1)], t, e)
            return float(e1 - e0) / 1000.0
        t = np.asarray(self.t_mono_ns, dtype=np.int64)
        p = np.asarray(self.power_w, dtype=float)
        inside = (t > t0) & (t < t1)
        ts = np.concatenate(([t0], t[inside], [t1]))
        ps = np.interp(ts.astype(float), t.astype(float), p)
        return float(np.trapezoid(ps, ts / 1e9))

    def energy_bounds_j(self, t0: int, t1: int) -> tuple[float, float | None] | None:
        """What the energy over [t0, t1] can be, from the counter alone: at least its difference between the first
        sample at or after ``t0`` and the last at or before ``t1`` (0 where none lies inside), at most its difference
        between the last sample at or before ``t0`` and the first at or after ``t1`` (None: the window reaches past
        the samples). None where the GPU has no counter (power between samples is not known: no bound)."""
        if not self._counter() or t1 <= t0:
            return None if not self._counter() else (0.0, 0.0)
        t, e = self.t_mono_ns, self.energy_mj
        inside = [i for i, ti in enumerate(t) if t0 <= ti <= t1]
        lo = (e[inside[-1]] - e[inside[0]]) / 1000.0 if inside else 0.0
        before = [i for i, ti in enumerate(t) if ti <= t0]
        after = [i for i, ti in enumerate(t) if ti >= t1]
        hi = (e[after[0]] - e[before[-1]]) / 1000.0 if before and after else None
        return float(lo), (float(hi) if hi is not None else None)

    def summary(self) -> dict[str, Any]:
        def agg(xs: list[float]) -> dict[str, float] | None:
            return {"mean": float(np.mean(xs)), "max": float(np.max(xs))} if xs else None

        return {
            "index": self.index, "name": self.name, "samples": len(self.t_mono_ns),
            "utilisation_pct": agg(self.util_pct), "memory_used_mib": agg(self.mem_used_mib),
            "temperature_c": agg(self.temp_c), "power_w": agg(self.power_w), "energy_method": self.energy_method,
            "first_sample_unix_ns": to_unix_ns(self.t_mono_ns[0]) if self.t_mono_ns else None,
        }


class GpuSampler:
    def __init__(self, interval_s: float = 1.0) -> None:
        self.interval_s = interval_s
        self.series: list[GpuSeries] = []
        self.available = False
        self.reason = ""
        self._nvml: Any = None
        self._handles: list[Any] = []
        self._counters: list[bool] = []  # per GPU: NVML's total-energy counter works there
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)  # "pynvml is deprecated" (it wraps nvidia-ml-py)
                import pynvml
            pynvml.nvmlInit()
            n = pynvml.nvmlDeviceGetCount()
            if n == 0:
                raise RuntimeError("NVML reports no GPU")
            self._nvml = pynvml
            for i in range(n):
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                name = pynvml.nvmlDeviceGetName(h)
                self._handles.append(h)
                self.series.append(GpuSeries(i, name.decode() if isinstance(name, bytes) else str(name)))
                try:  # (pre-Volta GPUs and some virtual ones answer NotSupported: energy from power then)
                    pynvml.nvmlDeviceGetTotalEnergyConsumption(h)
                    self._counters.append(True)
                except Exception:
                    self._counters.append(False)
            self.available = True
        except Exception as exc:  # no driver, no library, no device: say so once, go on
            self.reason = f"{type(exc).__name__}: {exc}"
            present = nvidia_gpu_present()
            if present:
                self.reason = f"NVML failed on a machine with an NVIDIA GPU: {self.reason}"
            log.log(no_gpu_log_level(present), "no GPU metrics: %s", self.reason)

    def start(self) -> None:
        if self.available and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="deltatap-gpu-sampler", daemon=True)
            self._thread.start()

    def _sample(self) -> None:
        nv = self._nvml
        for h, s, counter in zip(self._handles, self.series, self._counters, strict=True):
            try:
                t = mono_ns()  # (the energy counter first, right at its stamp: the windows are cut on it)
                energy = float(nv.nvmlDeviceGetTotalEnergyConsumption(h)) if counter else None
                util = nv.nvmlDeviceGetUtilizationRates(h).gpu
                mem = nv.nvmlDeviceGetMemoryInfo(h).used / 2**20
                temp = nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)
                power = nv.nvmlDeviceGetPowerUsage(h) / 1000.0
            except Exception as exc:  # a transient NVML error: skip this sample, note it
                self.reason = f"sample failed: {type(exc).__name__}: {exc}"
                continue
            s.t_mono_ns.append(t)
            if energy is not None:
                s.energy_mj.append(energy)
            s.util_pct.append(float(util))
            s.mem_used_mib.append(float(mem))
            s.temp_c.append(float(temp))
            s.power_w.append(float(power))

    def _run(self) -> None:
        while True:
            self._sample()
            if self._stop.wait(self.interval_s):
                self._sample()  # one closing sample so the last window is bracketed
                return

    def stop(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=5)
            self._thread = None
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:  # pragma: no cover - best effort
                pass
            self._nvml = None

    def energy_j(self, t0: int, t1: int) -> float | None:
        vals = [e for s in self.series if (e := s.energy_j(t0, t1)) is not None]
        return float(sum(vals)) if vals else None

    def energy_bounds_j(self, t0: int, t1: int) -> tuple[float, float | None] | None:
        """The counter's bounds on :meth:`energy_j`, summed over GPUs; None unless every GPU sampled has a counter."""
        bounds = [s.energy_bounds_j(t0, t1) for s in self.series if len(s.t_mono_ns) >= 2]
        if not bounds or any(b is None for b in bounds):
            return None
        his = [b[1] for b in bounds]
        return float(sum(b[0] for b in bounds)), (float(sum(his)) if all(h is not None for h in his) else None)

    def report(self, windows: list[tuple[int, int]], output_tokens: int, requests: int) -> dict[str, Any]:
        """GPU section of the summary: per-GPU series stats, energy over the run and per request."""
        if not self.available:
            return {"available": False, "reason": self.reason or "no NVIDIA GPU"}
        per_req = [e for t0, t1 in windows if (e := self.energy_j(t0, t1)) is not None]
        run_j = bounds = None
        if windows:
            w0, w1 = min(w[0] for w in windows), max(w[1] for w in windows)
            run_j, bounds = self.energy_j(w0, w1), self.energy_bounds_j(w0, w1)
        methods = sorted({s.energy_method for s in self.series})
        return {
            "available": True,
            "interval_s": self.interval_s,
            "gpus": [s.summary() for s in self.series],
            "energy_run_j": run_j,
            "energy_run_bounds_j": list(bounds) if bounds is not None else None,
            "energy_method": methods[0] if len(methods) == 1 else "mixed: " + ", ".join(methods),
            "energy_per_request_j": {"mean": float(np.mean(per_req)), "p50": float(np.median(per_req))} if per_req else None,
            "energy_per_request_method": "each request's [T_submit, end] window: NVML's energy counter interpolated "
            "at its edges where the GPU has one, else the trapezoidal integral of sampled power; overlapping requests "
            "share the same joules",
            "tokens_per_joule": (output_tokens / run_j) if run_j else None,
            "joules_per_request": (run_j / requests) if run_j and requests else None,
            "note": self.reason or None,
        }
