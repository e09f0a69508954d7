"""What every bench measures at one load level: the latency percentiles, throughput, success and error
rate, goodput under SLOs, steady state, the per-component decomposition, and confidence intervals over
repetitions.

Per-request values come from the load generator's records (the client's view: TTFT from the request's
last byte written to the first content token, TPOT = AIPerf's ITL per request, E2E to the last byte);
the per-component deltas from the collector's rows of the same requests.

Goodput is AIPerf's: the number of requests that meet *every* SLO given, per second of the benchmark
(first send to last end); a failed request is never good. The error rate is failed / sent, a ratio.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from deltatap.collector.reports.stats import pct, summarize
from deltatap.core.config import ConfigError
from deltatap.core.sse import itl_per_request_ns

# SLO names -> the per-request value (ms) they bound (AIPerf's --goodput names accepted as aliases)
SLO_METRICS = {"ttft": "ttft", "time_to_first_token": "ttft", "tpot": "tpot", "inter_token_latency": "tpot", "itl": "tpot",
               "e2e": "e2e", "request_latency": "e2e"}

# two-sided 95 % Student t quantiles by degrees of freedom (1..30); above 30 the normal 1.96
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def parse_slos(specs: Sequence[str] | None) -> dict[str, float]:
    """``["ttft=500", "tpot=50"]`` -> ``{"ttft": 500.0, "tpot": 50.0}`` (milliseconds)."""
    out: dict[str, float] = {}
    for spec in specs or ():
        name, sep, value = spec.partition("=")
        key = SLO_METRICS.get(name.strip().lower())
        if not sep or key is None:
            raise ConfigError(f"--slo {spec!r}: write NAME=MS with NAME one of ttft, tpot, e2e (e.g. --slo ttft=500)")
        try:
            ms = float(value)
        except ValueError:
            raise ConfigError(f"--slo {spec!r}: {value!r} is not a number of milliseconds") from None
        if ms <= 0:
            raise ConfigError(f"--slo {spec!r}: the bound must be above 0 ms")
        out[key] = ms
    return out


def ci95(values: Sequence[float]) -> tuple[float, float] | None:
    """Half-width-based 95 % confidence interval of the mean of ``values`` (Student t), None below 2 values."""
    v = np.asarray([x for x in values if x is not None and np.isfinite(x)], dtype=float)
    if v.size < 2:
        return None
    df = v.size - 1
    t = _T95[df - 1] if df <= len(_T95) else 1.96
    half = t * v.std(ddof=1) / np.sqrt(v.size)
    return float(v.mean() - half), float(v.mean() + half)


@dataclass
class PerRequest:
    """Per-request arrays (ms) of the successful requests, and the counts."""

    ttft: np.ndarray
    tpot: np.ndarray
    e2e: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    sent: int
    ok: int
    duration_s: float


def _submit(r: dict[str, Any]) -> int | None:
    return r["request_written_unix_ns"] if r.get("request_written_unix_ns") is not None else r.get("send_unix_ns")


def per_request(records: Sequence[dict[str, Any]]) -> PerRequest:
    ok = [r for r in records if r["status"] == "ok"]
    nan = float("nan")
    ttft, tpot, e2e = [], [], []
    for r in ok:
        sub = _submit(r)
        ft = r.get("first_token_unix_ns")
        ttft.append((ft - sub) / 1e6 if ft is not None and sub is not None else nan)
        v = itl_per_request_ns(ft, r.get("last_token_unix_ns"), r.get("output_tokens"))
        tpot.append(v / 1e6 if v is not None else nan)
        e2e.append((r["end_unix_ns"] - sub) / 1e6 if r.get("end_unix_ns") is not None and sub is not None else nan)
    sends = [r["send_unix_ns"] for r in records if r.get("send_unix_ns") is not None]
    ends = [r["end_unix_ns"] for r in records if r.get("end_unix_ns") is not None]
    dur = (max(ends) - min(sends)) / 1e9 if sends and ends else 0.0
    return PerRequest(np.asarray(ttft, float), np.asarray(tpot, float), np.asarray(e2e, float),
                      np.asarray([r.get("input_tokens") or 0 for r in ok], float), np.asarray([r.get("output_tokens") or 0 for r in ok], float),
                      len(records), len(ok), dur)


def good_count(p: PerRequest, slos: dict[str, float]) -> int:
    """Successful requests meeting every SLO (AIPerf goodput's numerator); with no SLO every success counts."""
    good = np.ones(p.ok, dtype=bool)
    for key, bound in slos.items():
        v = getattr(p, key)
        good &= np.isfinite(v) & (v <= bound)
    return int(good.sum())


def in_flight_trend(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Steady state (§5.2.3.2) from the client's side: requests in flight sampled over the sending window,
    the first 10 % excluded; the queue is *growing* when the mean of the last third exceeds the mean of the
    first third by more than half and by at least 2 requests. Also the completion rate of each third."""
    sends = np.asarray([r["send_unix_ns"] for r in records if r.get("send_unix_ns") is not None], dtype=float)
    if sends.size < 6:
        return {"growing": None, "note": "too few requests"}
    ends = np.asarray([r.get("end_unix_ns") or np.inf for r in records if r.get("send_unix_ns") is not None], dtype=float)
    t0, t1 = sends.min(), sends.max()
    start = t0 + 0.1 * (t1 - t0)
    grid = np.linspace(start, t1, 30)
    inflight = np.array([np.sum((sends <= t) & (ends > t)) for t in grid], dtype=float)
    a, b = inflight[:10].mean(), inflight[-10:].mean()
    growing = bool(b > 1.5 * a and b - a >= 2)
    thirds = np.array_split(np.sort(ends[np.isfinite(ends) & (ends >= start)]), 3)
    rates = []
    for part in thirds:
        if part.size >= 2:
            rates.append((part.size - 1) / ((part[-1] - part[0]) / 1e9) if part[-1] > part[0] else float("nan"))
    stable = bool(len(rates) == 3 and all(np.isfinite(rates)) and min(rates) >= 0.8 * max(rates))
    # arrival rate over the sending window, completion rate over the window the answers ended in (§5.2.3.1)
    done = np.sort(ends[np.isfinite(ends)])
    arrival = (sends.size - 1) / ((t1 - t0) / 1e9) if t1 > t0 else float("nan")
    completion = (done.size - 1) / ((done[-1] - done[0]) / 1e9) if done.size >= 2 and done[-1] > done[0] else float("nan")
    return {"growing": growing, "arrival_rps": float(arrival), "completion_rps": float(completion), "in_flight_first_third": float(a), "in_flight_last_third": float(b), "throughput_stable": stable,
            "completion_rate_by_third": rates}


@dataclass
class LevelMetrics:
    """The figures of one level, over every repetition's requests (CIs over the repetitions)."""

    label: str
    x: float  # the load value (offered req/s, concurrency, context length...)
    reps: int
    sent: int
    ok: int
    duration_s: float
    offered_rps: float | None
    request_rps: float
    output_tok_s: float
    input_tok_s: float
    success_rate: float
    error_rate: float
    goodput_rps: float
    good: int
    ttft: Any  # stats.Summary (ms)
    tpot: Any
    e2e: Any
    steady: dict[str, Any]
    ci: dict[str, tuple[float, float] | None] = field(default_factory=dict)
    deltas: dict[str, dict[str, Any]] = field(default_factory=dict)  # component line -> {"delta", "p50", "p99"} (ms)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def queue(self) -> str:
        g = self.steady.get("growing")
        return "n/a" if g is None else ("growing" if g else "stable")

    def as_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in self.__dict__.items() if k not in ("ttft", "tpot", "e2e")}
        for k in ("ttft", "tpot", "e2e"):
            d[f"{k}_ms"] = getattr(self, k).as_dict()
        d["queue"] = self.queue
        return d


def level_metrics(label: str, x: float, reps: Sequence[Any], slos: dict[str, float], offered_rps: float | None = None,
                  topology: Any = None) -> LevelMetrics:
    """``reps``: the :class:`~deltatap.app.bench.target.LevelData` of each repetition."""
    per = [per_request(r.records) for r in reps]
    sent, ok = sum(p.sent for p in per), sum(p.ok for p in per)
    dur = sum(p.duration_s for p in per)
    cat = lambda k: np.concatenate([getattr(p, k) for p in per]) if per else np.array([])  # noqa: E731
    good = sum(good_count(p, slos) for p in per)
    rps = [p.ok / p.duration_s if p.duration_s > 0 else float("nan") for p in per]
    tok = [float(np.nansum(p.output_tokens)) / p.duration_s if p.duration_s > 0 else float("nan") for p in per]
    m = LevelMetrics(
        label=label, x=x, reps=len(reps), sent=sent, ok=ok, duration_s=dur, offered_rps=offered_rps,
        request_rps=ok / dur if dur > 0 else float("nan"),
        output_tok_s=float(np.nansum(cat("output_tokens"))) / dur if dur > 0 else float("nan"),
        input_tok_s=float(np.nansum(cat("input_tokens"))) / dur if dur > 0 else float("nan"),
        success_rate=ok / sent if sent else float("nan"), error_rate=(sent - ok) / sent if sent else float("nan"),
        goodput_rps=good / dur if dur > 0 else float("nan"), good=good,
        ttft=summarize(cat("ttft")), tpot=summarize(cat("tpot")), e2e=summarize(cat("e2e")),
        steady=in_flight_trend(reps[-1].records) if reps else {},
    )
    m.ci = {"output_tok_s": ci95(tok), "request_rps": ci95(rps),
            "ttft_p50_ms": ci95([pct(p.ttft, 50) for p in per]), "ttft_p99_ms": ci95([pct(p.ttft, 99) for p in per])}
    rows = [row for r in reps for row in r.rows]
    if rows and topology is not None:
        m.deltas = component_deltas(rows, topology)
    return m


def component_deltas(rows: Sequence[Any], topology: Any) -> dict[str, dict[str, Any]]:
    """The decomposition table's lines (the collector's own arithmetic, :func:`collector.table.decomposition`)
    at P50 and P99: component -> {"delta": name, "p50": ms, "p99": ms}."""
    from deltatap.collector.sketches import Aggregator
    from deltatap.collector.table import decomposition

    agg = Aggregator()
    agg.add_rows(rows)
    out: dict[str, dict[str, Any]] = {}
    for l50, l99 in zip(decomposition(agg, topology), decomposition(agg, topology, "p99_ms"), strict=True):
        out[l50.component] = {"delta": l50.delta or "", "p50": l50.ttft_ms, "p99": l99.ttft_ms}
    return out


def fmt_ci(ci: tuple[float, float] | None, digits: int = 1) -> str:
    """The interval as text; every figure here is non-negative, so a lower bound below 0 shows as 0."""
    return "" if ci is None else f"[{max(0.0, ci[0]):.{digits}f}, {ci[1]:.{digits}f}]"
