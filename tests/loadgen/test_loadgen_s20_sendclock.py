"""Session 20's send-clock and request-path steps, on real sockets and the real timer descriptor: the clock's wake
consumes its expiry by re-arming (no read, and no wake left pending: the loop does not spin on a readable descriptor),
a send due while the loop works through reads goes out before them (``H1Pool.before_read`` ->
``SendClock.release_due``), the request head's serialisation (no comprehension) writes what it always wrote, and what
the send phase made is frozen with the rest at its end (no young-generation scan of the run's records after it), and
the event loop thread's short scheduler slice while sending, given back after."""

from __future__ import annotations

import asyncio
import ctypes
import gc
import os
import select
import socket
import sys
import threading
import time
import weakref

import pytest

from test_loadgen_h1client import SSE_HEAD, chunked, sse_body, target
from deltatap.core.clock import mono_ns
from deltatap.core.vocab import Outcome
from deltatap.loadgen.client import make_session
from deltatap.loadgen.h1client import H1Pool
from deltatap.loadgen.runner import SEND_SLICE_NS, Runner, SendClock, _SchedAttr, send_phase_gc, send_phase_slice
from deltatap.loadgen.workloads.base import PlannedRequest

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="timerfd: Linux")


class CountingClock(SendClock):
    def __init__(self) -> None:
        super().__init__(0)
        self.fires = 0

    def _fire(self) -> None:
        self.fires += 1
        super()._fire()


@linux
async def test_each_instant_is_one_wake_and_the_descriptor_is_left_quiet():
    clock = CountingClock()
    got: list[tuple[int, int]] = []
    try:
        t0 = mono_ns()
        instants = [t0 + 3_000_000, t0 + 6_000_000, t0 + 9_000_000]
        for k, t in enumerate(instants):
            clock.at(t, lambda k=k: got.append((k, mono_ns())))
        assert clock.fd >= 0
        deadline = time.monotonic() + 5
        while len(got) < 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.002)
        await asyncio.sleep(0.02)  # a descriptor left readable would wake the loop again and again meanwhile
        assert [k for k, _ in got] == [0, 1, 2]
        assert all(t >= instants[k] for k, t in got)  # never early
        assert 3 <= clock.fires <= 6  # one wake per instant (at most one more each, if two were armed at once)
        assert select.select([clock.fd], [], [], 0)[0] == []  # nothing pending: the last wake read its expiry
        assert clock._heap == []
    finally:
        clock.close()


@linux
async def test_release_due_calls_only_what_has_come_and_the_timer_finds_the_rest():
    clock = CountingClock()
    got: list[int] = []
    try:
        t0 = mono_ns()
        clock.at(t0 + 1_000_000, lambda: got.append(1))
        clock.at(t0 + 2_000_000, lambda: got.append(2))
        clock.at(t0 + 40_000_000, lambda: got.append(3))
        clock.release_due()
        assert got == []  # nothing due yet
        while mono_ns() < t0 + 2_500_000:  # (the loop's thread busy: the timer cannot wake it)
            pass
        clock.release_due()
        assert got == [1, 2] and clock.fires == 0
        deadline = time.monotonic() + 5
        while len(got) < 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.01)
        assert got == [1, 2, 3]  # each once
        assert select.select([clock.fd], [], [], 0)[0] == []
    finally:
        clock.close()


class OneShotServer:
    """A thread that answers every request on each accepted connection at once with a whole SSE response: it answers
    while the client's event loop thread is busy."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        answer = SSE_HEAD + b"".join(chunked(e) for e in sse_body(2)) + b"0\r\n\r\n"
        self.sock.settimeout(10)
        try:
            conn, _ = self.sock.accept()
        except OSError:
            return
        with conn:
            conn.settimeout(10)
            buf = b""
            try:
                while True:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buf += data
                    head, sep, rest = buf.partition(b"\r\n\r\n")
                    if not sep:
                        continue
                    length = int([ln.split(b":")[1] for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length")][0])
                    if len(rest) < length:
                        continue
                    buf = rest[length:]
                    conn.sendall(answer)
            except OSError:
                return

    def close(self) -> None:
        self.sock.close()


@linux
async def test_a_send_due_during_a_backlog_of_reads_goes_out_before_them(telemetry):
    srv = OneShotServer()
    t = target(f"http://127.0.0.1:{srv.port}")
    runner = Runner(t, None, telemetry, "run1")
    pool = make_session(t)
    order: list[str] = []
    try:
        await pool.preconnect(1)
        pool.before_read = runner.clock_wait.release_due  # (what the open loop sets on its sessions)
        req = PlannedRequest(index=0, prompt="hello", max_tokens=2, input_tokens=1)
        runner.launch(pool, req, mono_ns(), 0, on_done=lambda rec: order.append("read"))  # written now
        due = mono_ns() + 5_000_000
        runner.clock_wait.at(due, lambda: order.append("send" if mono_ns() >= due else "early"))
        time.sleep(0.03)  # the loop's thread busy: the answer arrives (first), then the timer expires
        assert await runner.flights_ended(5)
        await asyncio.sleep(0.01)
    finally:
        await pool.close()
        runner.clock_wait.close()
        srv.close()
    assert runner.records[0].status == Outcome.OK and runner.records[0].content_events == 2
    assert order == ["send", "read"]  # the due send before the read that waited with it


def test_the_request_head_is_serialised_as_before():
    pool = H1Pool("http://127.0.0.1:8080/v1/chat/completions", header_names=("Content-Type", "x-request-id"))
    body = b'{"a":1}'
    headers = {"Content-Type": "application/json", "x-request-id": "run-m1", "X-Extra": "v"}
    want = pool._prefix + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + f"Content-Length: {len(body)}\r\n\r\n"
    assert pool.serialise(headers, body) == want.encode() + body
    assert pool.serialise({}, b"") == (pool._prefix + "Content-Length: 0\r\n\r\n").encode()
    odd = {"X-Number": 7, "X-Text": "t"}  # (a value that is not a string: formatted, as before)
    assert pool.serialise(odd, b"") == (pool._prefix + "X-Number: 7\r\nX-Text: t\r\nContent-Length: 0\r\n\r\n").encode()
    assert pool._prefix.startswith("POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nUser-Agent: ")


def test_what_the_send_phase_made_joins_the_oldest_generation_and_its_cycles_are_still_collected():
    class Node:
        pass

    with send_phase_gc():
        kept = [Node() for _ in range(2000)]  # (the run's records: alive after the phase)
        a = Node()
        a.me = a  # the run's cyclic garbage
        gone = weakref.ref(a)
        del a
    assert gc.isenabled() and gc.get_freeze_count() == 0
    oldest = {id(o) for o in gc.get_objects(generation=2)}
    assert all(id(o) in oldest for o in kept)  # not young objects the first collection after the phase would scan
    gc.collect()
    assert gone() is None  # memory stays bounded: a full collection still finds the cycles


def _slice_now() -> int | None:
    libc = ctypes.CDLL(None, use_errno=True)
    attr = _SchedAttr()
    if libc.syscall(315, 0, ctypes.byref(attr), ctypes.sizeof(attr), 0) != 0:
        return None
    return attr.sched_runtime


@pytest.mark.skipif(not sys.platform.startswith("linux") or os.uname().machine != "x86_64", reason="sched_setattr: Linux x86-64")
def test_the_send_phase_asks_for_a_short_slice_and_gives_the_thread_its_own_back():
    before = _slice_now()
    if before is None or before == SEND_SLICE_NS:
        pytest.skip("the system does not say the thread's slice")
    inside: list[int | None] = []
    other: list[int | None] = []

    class Boom(Exception):
        pass

    asked, said = threading.Event(), threading.Event()

    def export_like() -> None:  # a thread started before the phase, as the span export's is
        asked.wait(5)
        other.append(_slice_now())
        said.set()

    t = threading.Thread(target=export_like)
    t.start()
    with pytest.raises(Boom), send_phase_slice():
        inside.append(_slice_now())
        asked.set()
        said.wait(5)
        raise Boom
    t.join(5)
    release = tuple(int(x) for x in os.uname().release.split("-")[0].split(".")[:2])
    if release < (6, 12):
        pytest.skip("the kernel keeps no slice of a normal task's own (before Linux 6.12)")
    assert inside == [SEND_SLICE_NS]  # the calling (event loop) thread's
    assert other == [before]  # no other thread's (the span export's keeps the default)
    assert _slice_now() == before  # given back, on every path
    with send_phase_slice(0):  # 0: left as it is
        assert _slice_now() == before


@pytest.mark.skipif(not sys.platform.startswith("linux") or os.uname().machine != "x86_64", reason="sched_setattr: Linux x86-64")
def test_overlapping_send_phases_on_one_thread_give_the_threads_own_slice_back():
    # two runs sharing one loop (`run_load` called concurrently, as the report tests' demos do): their send phases
    # begin and end in any order; the first sets the slice, the last to end restores the thread's own
    before = _slice_now()
    if before is None or before == SEND_SLICE_NS:
        pytest.skip("the system does not say the thread's slice")
    release = tuple(int(x) for x in os.uname().release.split("-")[0].split(".")[:2])
    if release < (6, 12):
        pytest.skip("the kernel keeps no slice of a normal task's own (before Linux 6.12)")
    a, b = send_phase_slice(), send_phase_slice()
    a.__enter__()
    b.__enter__()
    assert _slice_now() == SEND_SLICE_NS
    a.__exit__(None, None, None)  # the first run ends while the second still sends
    assert _slice_now() == SEND_SLICE_NS
    b.__exit__(None, None, None)
    assert _slice_now() == before
    with send_phase_slice():  # and the next run begins from the thread's own again
        assert _slice_now() == SEND_SLICE_NS
    assert _slice_now() == before


def test_overlapping_send_phases_keep_the_collector_off_until_the_last_ends():
    # the garbage collector is the process's: with two runs in one loop, the first run's end must not turn it back on
    # under the second's sends, and the last end gives back what the process had before (on or off)
    import gc

    for was in (True, False):
        (gc.enable if was else gc.disable)()
        try:
            a, b = send_phase_gc(), send_phase_gc()
            a.__enter__()
            b.__enter__()
            assert not gc.isenabled()
            a.__exit__(None, None, None)
            assert not gc.isenabled()  # the second run still sends
            b.__exit__(None, None, None)
            assert gc.isenabled() is was
            assert gc.get_freeze_count() == 0  # nothing left frozen out of every scan
        finally:
            gc.enable()
