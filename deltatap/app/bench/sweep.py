"""Load-level sweeps: the knee and saturation points (§5.3.4) and the saturation test of §5.2.3.1, shared by
the throughput-latency curve, the maximum-throughput search and the ITL levels."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from deltatap.app.bench.measure import LevelMetrics

SATURATION_COMPLETION = 0.9  # §5.2.3.1: completion rate below 90 % of the arrival rate
SATURATION_P99_X_P50 = 10.0  # §5.2.3.1: P99 latency above 10x the P50 latency at lower load
KNEE_X_MIN_P99 = 2.0  # §5.3.4: P99 latency above 2x the minimum P99 observed
NOISE = 0.03  # a throughput "decrease" smaller than this fraction is noise


def knee_index(levels: Sequence[LevelMetrics], stat: str = "p99") -> int | None:
    """§5.3.4: the first level whose TTFT P99 exceeds 2x the minimum TTFT P99 observed - and stays above it at every
    higher level: one noisy level below the knee (a P99 over a few samples is nearly their maximum) is not the knee.
    ``stat="p50"``: the same rule on the median, the knee a busy machine's tail noise does not move."""
    p99 = np.array([getattr(m.ttft, stat) for m in levels], dtype=float)
    if not np.isfinite(p99).any():
        return None
    lo = np.nanmin(p99)
    above = [bool(np.isfinite(v) and v > KNEE_X_MIN_P99 * lo) for v in p99]
    for i in range(len(above)):
        if all(above[i:]):
            return i
    return None


def saturation_index(levels: Sequence[LevelMetrics]) -> int | None:
    """§5.3.4: the first level whose achieved throughput decreases from the previous level's (by more than
    the noise margin)."""
    for i in range(1, len(levels)):
        if levels[i].output_tok_s < (1 - NOISE) * levels[i - 1].output_tok_s:
            return i
    return None


def saturated(m: LevelMetrics, low_load_p50_ms: float | None) -> list[str]:
    """§5.2.3.1: why this level is saturated (empty when it is not)."""
    why = []
    if m.steady.get("growing"):
        why.append(f"queue grows (in flight {m.steady['in_flight_first_third']:.1f} -> {m.steady['in_flight_last_third']:.1f})")
    arr, comp = m.steady.get("arrival_rps"), m.steady.get("completion_rps")
    if arr and comp is not None and comp < SATURATION_COMPLETION * arr:
        why.append(f"completion {comp:.2f} req/s < 90 % of arrival {arr:.2f} req/s")
    if low_load_p50_ms and m.e2e.p99 > SATURATION_P99_X_P50 * low_load_p50_ms:
        why.append(f"E2E P99 {m.e2e.p99:.0f} ms > 10x low-load P50 {low_load_p50_ms:.0f} ms")
    if m.success_rate < 0.99:
        why.append(f"success {m.success_rate:.1%}")
    return why


def meets_slos(m: LevelMetrics, slos: dict[str, float]) -> bool:
    """Every SLO met at P99 (§5.2.2.3: the SLOs bound P99 TTFT and P99 TPOT)."""
    return all(getattr(m, k).p99 <= v for k, v in slos.items())


def reference_capacity_rps(model, input_tokens: int, output_tokens: int) -> float:
    """The reference engine's configured capacity (req/s) for fixed lengths, without chunked prefill: a full batch
    of ``max_batch`` decodes at ``decode_ms(max_batch)`` per token, and every admission stalls it for one prefill
    step. (Prefix-cache hits make it faster; the bench's random-token workloads share no prefix.)"""
    b = model.max_batch
    prefill = model.prefill_base_ms + model.prefill_per_token_ms * input_tokens
    return b / ((output_tokens * model.decode_ms(b) + b * prefill) / 1000.0)
