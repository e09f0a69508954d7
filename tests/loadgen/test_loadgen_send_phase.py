"""The send phase's own delays: no garbage-collector pause while sending, the open-loop dispatcher waking once per
window (not one timer per request), span export in short batches (a batch is encoded in one call that holds the
GIL), and the event loop's wait for a CPU reported. How small the send lag gets is a benchmark figure
(benchmarks/loadgen_vs_aiperf.py, docs/benchmarks.md), not an assertion here."""

from __future__ import annotations

import asyncio
import gc
import json
from pathlib import Path

import numpy as np
import pytest

from loadgen_server import load_cli
from deltatap.core.clock import mono_ns, to_unix_ns
from deltatap.loadgen import LoadOptions, modes, run_load
from deltatap.loadgen.client import ENDPOINTS, Target, make_session, prepare
from deltatap.loadgen.records import RequestRecord
from deltatap.loadgen.runner import SendClock, send_phase_gc
from deltatap.telemetry.tracer import EXPORT_BATCH


def opts(url: str, **kw) -> LoadOptions:
    base = dict(target=url, progress=False, gpu=False, workload="synthetic-uniform", seed=1)
    base.update(kw)
    return LoadOptions(**base)


async def test_no_collection_runs_while_requests_are_sent(sse_server, telemetry):
    state, url = sse_server
    state.first_ms, state.interval_ms, state.tokens = 1.0, 1.0, 3
    seen: list[tuple[str, int, int]] = []

    def watch(phase: str, info: dict) -> None:
        seen.append((phase, to_unix_ns(mono_ns()), info["generation"]))

    assert gc.isenabled()
    gc.callbacks.append(watch)
    try:
        res = await run_load(opts(url, rate=400.0, requests=200, arrival="poisson"), telemetry)
    finally:
        gc.callbacks.remove(watch)
    assert res.summary["request_count"] == 200
    first = min(r["send_unix_ns"] for r in res.records)
    last = max(r["send_unix_ns"] for r in res.records)
    during = [(p, g) for p, t, g in seen if first <= t <= last]
    assert during == [], f"collections while sending: {during[:5]}"
    assert any(t < first for _p, t, _g in seen)  # (the callback saw the collection the send phase starts with)
    assert gc.isenabled() and gc.get_freeze_count() == 0  # the collector is back as it was


def test_send_phase_gc_restores_the_collector_on_every_path():
    class Boom(Exception):
        pass

    assert gc.isenabled()
    with pytest.raises(Boom), send_phase_gc():
        assert not gc.isenabled() and gc.get_freeze_count() > 0
        raise Boom
    assert gc.isenabled() and gc.get_freeze_count() == 0
    gc.disable()
    try:
        with send_phase_gc():
            assert not gc.isenabled()
        assert not gc.isenabled()  # off before, off after: the caller's choice is kept
    finally:
        gc.enable()


async def test_open_loop_dispatcher_wakes_once_per_window(sse_server, telemetry, monkeypatch):
    state, url = sse_server
    state.first_ms, state.interval_ms, state.tokens = 1.0, 1.0, 2
    wakes = []
    real = modes.sleep_coarse_until

    async def counted(t_mono_ns: int) -> None:
        wakes.append(t_mono_ns)
        await real(t_mono_ns)

    monkeypatch.setattr(modes, "sleep_coarse_until", counted)
    n, rate = 400, 2000.0  # 0.2 s of plan: ~40 dispatch windows of 5 ms
    res = await run_load(opts(url, rate=rate, requests=n, arrival="poisson"), telemetry)
    assert res.summary["request_count"] == n
    assert len(wakes) <= n // 5, f"{len(wakes)} dispatcher wakes for {n} requests"
    lag = np.array([r["schedule_lag_ns"] for r in res.records])
    assert (lag >= 0).all()  # every task existed before its instant and waited for it


async def test_cli_exports_spans_in_short_batches_and_reports_its_cpu_wait(sse_server, tmp_path):
    state, url = sse_server
    state.first_ms, state.interval_ms, state.tokens = 0.0, 0.0, 1
    n = 3 * EXPORT_BATCH + 5
    spans = tmp_path / "spans.jsonl"
    rc, _out, err = await load_cli("--target", url, "--concurrency", "16", "--requests", str(n), "--no-progress", "--no-gpu",
                                   "--out", str(tmp_path / "run"), "--otlp", f"file:{spans}")
    assert rc == 0, err
    per_export = [sum(len(ss["spans"]) for rs in json.loads(line)["resourceSpans"] for ss in rs["scopeSpans"])
                  for line in spans.read_text().splitlines()]
    assert sum(per_export) == n
    assert max(per_export) <= EXPORT_BATCH and len(per_export) >= 4
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    wait = run["send_phase_cpu_wait_s"]
    if not Path("/proc/thread-self/schedstat").exists():
        assert wait is None
        return
    recs = [json.loads(line) for line in (tmp_path / "run" / "records.jsonl").read_text().splitlines()]
    wall_s = (max(r["end_unix_ns"] for r in recs) - min(r["planned_send_unix_ns"] for r in recs)) / 1e9
    assert isinstance(wait, float) and 0 <= wait <= wall_s + 0.5  # a wait inside the send phase, never more than it


async def test_send_clock_runs_the_send_at_the_instant_before_the_task_resumes():
    clock = SendClock(1_500_000)
    try:
        order: list[tuple[str, int]] = []
        t = mono_ns() + 20 * 1_000_000

        async def waiter() -> None:
            await clock.wait(t, lambda: order.append(("due", mono_ns())))
            order.append(("resumed", mono_ns()))

        await asyncio.wait_for(waiter(), 5)
        assert [k for k, _t in order] == ["due", "resumed"] and order[0][1] >= t
        # an instant already past: the send runs at once, before wait() returns, without yielding
        seen: list[str] = []
        await clock.wait(mono_ns() - 1, lambda: seen.append("due"))
        assert seen == ["due"]
        # a wait cancelled before its instant sends nothing
        task = asyncio.create_task(clock.wait(mono_ns() + 50 * 1_000_000, lambda: seen.append("late")))
        await asyncio.sleep(0.005)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.08)
        assert seen == ["due"]
    finally:
        clock.close()


async def test_start_now_writes_on_an_idle_connection_and_exchange_reads_the_answer(sse_server):
    state, url = sse_server
    state.tokens = 2
    t = Target(url=url + "/v1/chat/completions", endpoint=ENDPOINTS["chat"], model="m")
    pool = make_session(t)
    try:
        rec = RequestRecord(index=0, request_id="r-1", trace_id="1" * 32, span_id="2" * 16)
        headers = t.request_headers(rec, f"00-{'1' * 32}-{'2' * 16}-01")
        ex, data = prepare(pool, t, t.body(None, [], "hello", 2), headers)
        assert pool.start_now(ex, data) is None  # no idle connection yet: nothing written
        assert await pool.preconnect(1) == 1
        conn = pool.start_now(ex, data)
        assert conn is not None and ex.written_mono_ns is not None  # written before any await
        await asyncio.wait_for(pool.exchange(ex, data, started=conn), 10)
        assert ex.status == 200 and ex.error is None
        assert [s.request_id for s in state.seen] == ["r-1"]
    finally:
        await pool.close()
