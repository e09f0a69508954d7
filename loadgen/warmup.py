"""Warm-up per methodology section 4.5, with the stability check of 4.5.2.

1. Probe: send the probe request ``probes`` times, one after another, and note each latency.
2. Warm up: send ``requests`` requests closed-loop (their own plan, seed + 1, so the measured
   sequence is unchanged); they all end before anything else happens (the queue drains, 4.5.1).
3. Probe again. Stable when every consecutive pair of probe latencies differs by less than
   ``tolerance`` (10%) of the smaller one. If not, warm up again, up to ``rounds`` times.

The report (in summary.json) lists every probe latency, each round and the verdict; an unstable
verdict does not stop the run - it is reported. A target that fails *every* request of the first
probes and the first round (no answer ok, none a refusal) does stop it: :class:`LoadAborted`, one
line with the HTTP status and the server's message (or what could not be reached), before anything
is measured.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import aiohttp

from deltatap.core.clock import mono_ns
from deltatap.core.vocab import Outcome
from deltatap.loadgen.modes import ModeConfig, closed_loop
from deltatap.loadgen.runner import LoadAborted, Runner
from deltatap.loadgen.summary import problem_groups
from deltatap.loadgen.workloads.base import PlannedRequest

PROBE_MAX_TOKENS = 16


def stable(latencies_ns: list[int], tolerance: float) -> bool:
    if len(latencies_ns) < 2:
        return False
    return all(abs(b - a) < tolerance * min(a, b) for a, b in zip(latencies_ns, latencies_ns[1:], strict=False))


async def _probe(runner: Runner, session: aiohttp.ClientSession, probe: PlannedRequest, count: int) -> list[int | None]:
    out: list[int | None] = []
    for _ in range(count):
        rec = await runner.request(session, probe, mono_ns(), 0)
        ok = rec.status == Outcome.OK and rec.end_mono_ns is not None and rec.submit_mono_ns is not None
        out.append(rec.end_mono_ns - rec.submit_mono_ns if ok else None)  # type: ignore[operator]
    return out


async def warm_up(
    runner: Runner,
    sessions: list[aiohttp.ClientSession],
    plan: list[list[PlannedRequest]],
    probe: PlannedRequest,
    probes: int = 5,
    rounds: int = 3,
    tolerance: float = 0.10,
) -> dict[str, Any]:
    probe = replace(probe, max_tokens=min(probe.max_tokens, PROBE_MAX_TOKENS), labels={**probe.labels, "probe": "1"})
    saved_phase = runner.phase
    report: dict[str, Any] = {"requests_per_round": len(plan), "concurrency": len(sessions), "probes": probes,
                              "tolerance": tolerance, "rounds": [], "stable": False}
    t0 = mono_ns()
    runner.phase = "probe"
    report["probe_before_ms"] = _ms(await _probe(runner, sessions[0], probe, probes))
    for r in range(rounds):
        runner.phase = "warmup"
        await closed_loop(runner, ModeConfig(units=plan, concurrency=len(sessions)), sessions)
        if r == 0:
            _stop_if_all_failed(runner)
        runner.phase = "probe"
        lat = await _probe(runner, sessions[0], probe, probes)
        ok = None not in lat and stable([x for x in lat if x is not None], tolerance)
        report["rounds"].append({"round": r + 1, "probe_after_ms": _ms(lat), "stable": ok})
        if ok:
            report["stable"] = True
            break
    runner.phase = saved_phase
    report["duration_s"] = (mono_ns() - t0) / 1e9
    report["verdict"] = (
        f"stable after {len(report['rounds'])} round(s): consecutive probe latencies within {tolerance:.0%}"
        if report["stable"]
        else f"NOT stable after {rounds} round(s): consecutive probe latencies varied by {tolerance:.0%} or more"
    )
    return report


def _stop_if_all_failed(runner: Runner) -> None:
    """Raise :class:`LoadAborted` when no warm-up request so far was answered (ok or a refusal)."""
    recs = runner.records
    if not recs or any(r.status in (Outcome.OK, Outcome.REFUSED) for r in recs):
        return
    groups = problem_groups([r.to_dict() for r in recs])
    why = "; ".join(g["text"] for g in groups[:3]) or "no answer"
    raise LoadAborted(f"warm-up: all {len(recs)} requests failed, nothing measured: {why}")


def _ms(values: list[int | None]) -> list[float | None]:
    return [None if v is None else round(v / 1e6, 3) for v in values]
