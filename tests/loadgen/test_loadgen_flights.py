"""The load generator's task-free requests (loadgen/runner.py ``Flight``, ``Runner.launch``: sent from the send clock's
timer callback, read in the connection's callbacks, filed at the end) against real servers on 127.0.0.1: the same
records, stamps and outcomes as the task path (``Runner.request`` / ``execute``) — an answer, a timeout, the run's end,
the one retry after a kept-alive connection the server closed, no idle connection, an unreachable target — and no task
per request."""

from __future__ import annotations

import asyncio
import socket

import pytest

from test_loadgen_h1client import RawServer, target, write_sse
from deltatap.core.clock import mono_ns
from deltatap.core.vocab import ClientEvent, Outcome
from deltatap.loadgen.client import make_session
from deltatap.loadgen.records import ErrorKind, RequestRecord
from deltatap.loadgen.runner import Runner
from deltatap.loadgen.workloads.base import PlannedRequest


def plan(n: int) -> list[PlannedRequest]:
    return [PlannedRequest(index=i, prompt="hello", max_tokens=3, input_tokens=1) for i in range(n)]


async def launched(runner: Runner, pool, reqs: list[PlannedRequest], at_ns: int | None = None, timeout_s: float = 10) -> list[RequestRecord]:
    """Launch every request (all at ``at_ns``, default now) and wait until they have ended; the records in plan order."""
    t = mono_ns() if at_ns is None else at_ns
    for r in reqs:
        runner.launch(pool, r, t, 0)
    assert await runner.flights_ended(timeout_s)
    return sorted(runner.records, key=lambda r: r.index)


def client_tasks() -> int:
    """Tasks of this loop other than the test server's connection handlers."""
    return sum("on_conn" not in t.get_coro().__qualname__ for t in asyncio.all_tasks())


async def sse_forever(srv: RawServer, r, w, conn, gap_s: float = 0.002) -> None:
    while True:
        await srv.read_request(r, conn)
        await write_sse(w, gap_s=gap_s)


async def test_a_launched_request_is_sent_at_its_instant_and_read_without_a_task(telemetry, span_exporter):
    async def handler(r, w, conn):
        await sse_forever(srv, r, w, conn, gap_s=0.02)

    async with RawServer(handler) as srv:
        t = target(f"http://127.0.0.1:{srv.port}")
        runner = Runner(t, None, telemetry, "run1")
        pool = make_session(t)
        try:
            await pool.preconnect(4)
            tasks_before = client_tasks()
            at = mono_ns() + 30_000_000
            for r in plan(4):
                runner.launch(pool, r, at, 0)
            await asyncio.sleep(0.06)  # sent, answers under way (3 tokens 20 ms apart)
            assert len(runner.flights) == 4 and runner.counters.in_flight == 4
            assert client_tasks() <= tasks_before  # no task per request (4 would be 4 more)
            assert await runner.flights_ended(5)
            recs = sorted(runner.records, key=lambda r: r.index)
        finally:
            await pool.close()
            runner.clock_wait.close()
    assert [r.status for r in recs] == [Outcome.OK] * 4 and srv.connections == 4
    for r in recs:
        assert r.planned_mono_ns == at <= r.send_mono_ns <= r.written_mono_ns < r.headers_mono_ns <= r.first_token_mono_ns
        assert r.content_events == 3 and r.output_text == " t0 t1 t2" and r.usage_output_tokens == 3
        assert len(r.chunk_mono_ns) == 3 and r.last_token_mono_ns == r.chunk_mono_ns[-1] <= r.end_mono_ns
        assert ClientEvent.SEND in r.stamp_bounds and ClientEvent.FIRST_TOKEN in r.stamp_bounds
    assert runner.counters.sent == runner.counters.done == 4 and runner.counters.in_flight == 0
    telemetry.processor.force_flush()
    spans = {s.attributes["deltatap.request_id"]: s for s in span_exporter.get_finished_spans()}
    assert set(spans) == {r.request_id for r in recs}
    assert [r.request_id for r in recs] == ["run1-m1", "run1-m2", "run1-m3", "run1-m4"]


async def test_launched_requests_time_out_like_a_task_each_at_its_own_deadline(telemetry):
    served = []

    async def handler(r, w, conn):
        await srv.read_request(r, conn)
        served.append(conn)
        if len(served) == 1:  # the first request read is answered, the others never are
            await write_sse(w)
        await asyncio.sleep(5)

    async with RawServer(handler) as srv:
        t = target(f"http://127.0.0.1:{srv.port}", timeout_s=0.3)
        runner = Runner(t, None, telemetry, "run1")
        pool = make_session(t)
        try:
            await pool.preconnect(3)
            a, b, c = plan(3)
            now = mono_ns()
            runner.launch(pool, a, now, 0)
            runner.launch(pool, b, now + 100_000_000, 0)  # sent 0.1 s later: its deadline is 0.1 s later too
            runner.launch(pool, c, now + 150_000_000, 0)
            assert await runner.flights_ended(5)
        finally:
            await pool.close()
            runner.clock_wait.close()
    recs = sorted(runner.records, key=lambda r: r.index)
    assert recs[0].status == Outcome.OK
    for rec in recs[1:]:
        assert (rec.status, rec.error_kind, rec.error) == (Outcome.TIMEOUT, ErrorKind.TIMEOUT, "no complete answer within 0.3 s")
        assert 0.29e9 <= rec.end_mono_ns - rec.send_mono_ns < 5e9
    assert recs[2].end_mono_ns - recs[1].end_mono_ns >= 40_000_000  # each at its own deadline, not swept together
    assert not pool._idle and runner._timer is None  # their connections closed, not reused; no timer left behind


async def test_the_runs_end_cancels_launched_requests_and_files_them(telemetry):
    async def handler(r, w, conn):
        await srv.read_request(r, conn)
        await asyncio.sleep(5)

    async with RawServer(handler) as srv:
        t = target(f"http://127.0.0.1:{srv.port}", timeout_s=0.5)
        runner = Runner(t, None, telemetry, "run1")
        pool = make_session(t)
        try:
            await pool.preconnect(1)
            sent, later = plan(2)
            runner.launch(pool, sent, mono_ns(), 0)
            runner.launch(pool, later, mono_ns() + 10 * 10**9, 0)  # not sent yet when the run ends
            assert not await runner.flights_ended(0.1)
            runner.cancel_flights()
            assert await runner.flights_ended(1)
            await asyncio.sleep(0.6)  # past the request timeout: its timer went with the cancel, nothing fires
        finally:
            await pool.close()
            runner.clock_wait.close()
    [rec] = runner.records  # (the unsent one has no record, as a task cancelled in its wait)
    assert (rec.index, rec.status, rec.error_kind) == (0, Outcome.CLIENT_CANCEL, ErrorKind.CANCELLED)
    assert runner.counters.sent == runner.counters.done == 1 and runner.counters.in_flight == 0


async def test_a_kept_alive_connection_the_server_closed_gets_the_one_retry(telemetry):
    async def handler(r, w, conn):
        await srv.read_request(r, conn)
        await write_sse(w)
        if conn == 1:  # the idle-timeout race: the next request arrives, the server closes without a byte
            await srv.read_request(r, conn)
            return
        await sse_forever(srv, r, w, conn)

    async with RawServer(handler) as srv:
        t = target(f"http://127.0.0.1:{srv.port}")
        runner = Runner(t, None, telemetry, "run1")
        pool = make_session(t)
        try:
            first, second = plan(2)
            await launched(runner, pool, [first])  # (no idle connection: sent by the task path, which connects)
            recs = await launched(runner, pool, [second])
        finally:
            await pool.close()
            runner.clock_wait.close()
    assert [r.status for r in recs] == [Outcome.OK, Outcome.OK]
    assert srv.connections == 2 and [c for c, _h, _b in srv.requests] == [1, 1, 2]  # the second sent again, once
    assert recs[1].send_mono_ns <= recs[1].written_mono_ns  # (written again on the new connection: its stamp is that write's)


ERR = b'{"error":{"message":"overloaded"}}'


@pytest.mark.parametrize("answer, status, kind", [
    (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(ERR), ERR),
     Outcome.HTTP_ERROR, ErrorKind.HTTP_STATUS),
    (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}", Outcome.UPSTREAM_ERROR, ErrorKind.NON_SSE),
    (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: 100\r\n\r\ndata: x", Outcome.UPSTREAM_ERROR,
     ErrorKind.DISCONNECTED),
])
async def test_every_outcome_of_an_answer_is_recorded_as_the_task_path_records_it(telemetry, answer, status, kind):
    async def handler(r, w, conn):
        await srv.read_request(r, conn)
        w.write(answer)
        await w.drain()
        if kind == ErrorKind.DISCONNECTED:  # the server goes away mid-body
            return
        await asyncio.sleep(1)

    async with RawServer(handler) as srv:
        t = target(f"http://127.0.0.1:{srv.port}")
        runner = Runner(t, None, telemetry, "run1")
        pool = make_session(t)
        try:
            await pool.preconnect(1)
            [rec] = await launched(runner, pool, plan(1))
        finally:
            await pool.close()
            runner.clock_wait.close()
    assert (rec.status, rec.error_kind) == (status, kind)
    assert rec.send_mono_ns <= rec.written_mono_ns <= rec.headers_mono_ns <= rec.end_mono_ns
    if status == Outcome.HTTP_ERROR:
        assert rec.http_status == 503 and rec.server_message == "overloaded"


async def test_an_unreachable_target_is_recorded_from_the_launch(telemetry):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there
    t = target(f"http://127.0.0.1:{port}")
    runner = Runner(t, None, telemetry, "run1")
    pool = make_session(t)
    try:
        [rec] = await launched(runner, pool, plan(1))
    finally:
        await pool.close()
        runner.clock_wait.close()
    assert (rec.status, rec.error_kind, rec.error) == (Outcome.UPSTREAM_ERROR, ErrorKind.UNREACHABLE,
                                                        f"cannot connect to 127.0.0.1:{port} (connection refused)")
