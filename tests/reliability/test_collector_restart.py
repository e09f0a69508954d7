"""``deltatap collect`` killed (SIGKILL) and restarted mid-run behind a real ``deltatap tap`` process: requests
keep flowing and complete, the loss is counted by the tap (dropped spans, with ``ended == exported + dropped +
queued``), and after the restart every exported span becomes a complete row."""

from __future__ import annotations

import asyncio
import signal
import time

import aiohttp
import pytest
from rel_support import chat_body, record_figures
from rel_procs import free_port, metrics, span_counts, spawn, start_tap_proc, wait_http

from deltatap.collector.sinks import read_rows

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(180)]

PATH = "/v1/chat/completions?n=4&gap_ms=2"
PHASE_S = 3.0  # traffic with the first collector, with none, with the second


def _collector(port: int, out, log):
    return spawn(["collect", "--otlp-grpc", "none", "--otlp-http", f"127.0.0.1:{port}", "--metrics", "none",
                  "--out", str(out), "--rows-format", "jsonl", "--grace-s", "0.5", "--orphan-wait-s", "2"], log)


async def test_collector_killed_and_restarted_mid_run(engine, tmp_path):
    port = free_port()
    col1 = _collector(port, tmp_path / "run1", tmp_path / "collect1.log")
    col2 = None
    await wait_http(f"http://127.0.0.1:{port}/v1/clock", col1)
    tap = await start_tap_proc(engine.url, f"http://127.0.0.1:{port}", tmp_path / "tap.log", "--grace-s", "1",
                               env={"DELTATAP_SPAN_SHUTDOWN_S": "3"})
    results: list[tuple[int, bool]] = []
    stop = asyncio.Event()

    async def traffic():
        async with aiohttp.ClientSession() as s:
            while not stop.is_set():
                async with s.post(tap.url + PATH, data=chat_body(), headers={"Content-Type": "application/json"}) as r:
                    body = await r.read()
                results.append((r.status, body.endswith(b"data: [DONE]\n\n")))
                await asyncio.sleep(0.03)

    client = asyncio.create_task(traffic())
    try:
        await asyncio.sleep(PHASE_S)
        n_before_kill = len(results)
        col1.proc.kill()  # SIGKILL: no goodbye
        await asyncio.get_running_loop().run_in_executor(None, col1.proc.wait, 10)
        await asyncio.sleep(PHASE_S)
        n_during_outage = len(results) - n_before_kill
        before = span_counts(await metrics(tap.admin))
        col2 = _collector(port, tmp_path / "run2", tmp_path / "collect2.log")
        await wait_http(f"http://127.0.0.1:{port}/v1/clock", col2)
        await asyncio.sleep(PHASE_S)
        stop.set()
        await asyncio.wait_for(client, 30)
        # the tap's queue drains into the second collector (bounded)
        after = {}

        async def drained():
            nonlocal after
            after = span_counts(await metrics(tap.admin))
            return after["queued"] == 0 and after["ended"] == len(results)

        deadline = time.monotonic() + 15
        while not await drained() and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        rc2 = await asyncio.get_running_loop().run_in_executor(None, lambda: col2.stop(signal.SIGTERM, 60))
    finally:
        stop.set()
        client.cancel()
        await asyncio.gather(client, return_exceptions=True)
        await asyncio.get_running_loop().run_in_executor(None, lambda: tap.stop(timeout_s=30))
        for c in (col1, col2):
            if c is not None and c.proc.poll() is None:
                c.proc.kill()
                c.proc.wait(10)

    # requests kept flowing, all of them complete
    assert n_during_outage > 0, "no request was served while the collector was down"
    assert all(status == 200 and done for status, done in results), [r for r in results if r != (200, True)][:5]
    # the loss is counted, every span accounted for
    assert after["ended"] == len(results), (after, len(results))
    assert after["ended"] == after["exported"] + after["dropped"] + after["queued"], after
    assert after["queued"] == 0, after
    assert after["dropped"] > 0 and set(after["dropped_by_reason"]) <= {"export_failed", "export_timeout"}, after
    # after the restart: one complete row per span exported to the second collector
    assert rc2 == 0, col2.text()[-2000:]
    rows = read_rows(tmp_path / "run2" / "rows.jsonl")
    exported_after = after["exported"] - before["exported"]
    record_figures("collector_restart", {
        "requests": len(results), "requests_during_outage": n_during_outage, "phase_s": PHASE_S,
        "tap_spans_before_restart": before, "tap_spans_at_end": after, "rows_after_restart": len(rows),
        "spans_exported_after_restart": exported_after})
    assert exported_after > 0 and len(rows) == exported_after, (len(rows), exported_after)
    reference = set(rows[0].points)
    for row in rows:
        assert row.outcome == "ok" and row.http_status == 200, row
        assert set(row.points) == reference, (sorted(row.points), sorted(reference))
        assert "tap_edge_first_token" in row.deltas and "tap_edge_request" in row.deltas, sorted(row.deltas)
