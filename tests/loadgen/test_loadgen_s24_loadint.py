"""``deltatap load --processes N`` stopped mid-run (session 24): Ctrl-C / SIGTERM ends every process's sending as one
process's is ended (in-flight requests end as ``client_cancel``) and the merged records and summary are written; a
process killed hard (SIGKILL, a crash) stops the run, its loss named in one line, the others' records written; the parent
killed hard leaves no process sending. Against the loadgen test server on 127.0.0.1 holding each answer ~2 s, so every
stop lands with requests in flight; every wait is bounded.

Before: an interrupt with --processes wrote nothing (exit by the signal, no records, no summary), a spawned process
killed mid-run lost the whole run's records (a one-line error after the parent's share ended), and a spawned process
outlived a parent killed hard, sending the rest of its share for nobody."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import signal
import sys
from pathlib import Path

import pytest

from deltatap.app.cli import main
from deltatap.core.vocab import Outcome
from deltatap.loadgen import LoadOptions, run_load
from deltatap.loadgen.options import processes_allowed
from deltatap.loadgen.records import ErrorKind

ROOT = Path(__file__).resolve().parents[2]
LONG = dict(first_ms=5.0, interval_ms=50.0, tokens=40)  # ~2 s answers: a stop meets them in flight


def opts(url: str, **kw) -> LoadOptions:
    base = dict(target=url, progress=False, gpu=False, workload="synthetic-uniform", seed=7, run_id="li", model="m")
    base.update(kw)
    return LoadOptions(**base)


def hold(state) -> None:
    state.first_ms, state.interval_ms, state.tokens = LONG["first_ms"], LONG["interval_ms"], LONG["tokens"]


async def until(cond, what: str, timeout_s: float = 10.0) -> None:
    for _ in range(int(timeout_s / 0.01)):
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"not within {timeout_s} s: {what}")


def spawned_children(pid: int) -> list[int]:
    """The spawned load processes (multiprocessing's spawn) whose parent is ``pid``."""
    kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    out = []
    for k in kids:
        try:
            if b"spawn_main" in Path(f"/proc/{k}/cmdline").read_bytes():
                out.append(int(k))
        except OSError:
            pass
    return out


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


async def cli(out: Path, url: str, *flags: str) -> asyncio.subprocess.Process:
    """``deltatap load`` in a subprocess of its own session (a terminal's Ctrl-C is SIGINT to its process group)."""
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "deltatap.app.cli", "load", "--target", url, "--model", "m", "--no-progress", "--no-gpu",
        "--seed", "7", "--run-id", "li", "--out", str(out), *flags,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=str(ROOT), start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # (a background job's SIGINT is ignored)


def read_out(out: Path) -> tuple[list[dict], dict]:
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    return records, json.loads((out / "summary.json").read_text())


def in_planned_order(records: list[dict]) -> bool:
    keys = [(r["planned_send_unix_ns"], r["index"]) for r in records]
    return keys == sorted(keys)


def cancelled(records: list[dict]) -> bool:
    return all(r["status"] == Outcome.CLIENT_CANCEL and r["error_kind"] == ErrorKind.CANCELLED for r in records)


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
async def test_a_signal_ends_every_process_sending_and_keeps_the_merged_records(sse_server, telemetry, sig):
    state, url = sse_server
    hold(state)

    async def signal_when_in_flight() -> None:
        await until(lambda: state.in_flight >= 4, "4 requests in flight (2 per process)")
        os.kill(os.getpid(), getattr(signal, sig))

    kill = asyncio.ensure_future(signal_when_in_flight())
    res = await run_load(opts(url, concurrency=4, duration_s=30, processes=2), telemetry)
    await kill
    assert res.interrupted == sig and res.lost == [] and res.stopped == []
    # every process's in-flight requests, ended as one process ends them, merged as at a run's end (ids m1..m4, in
    # planned order: closed loop plans each at its launch)
    assert len(res.records) == 4 and cancelled(res.records)
    assert sorted(r["request_id"] for r in res.records) == [f"li-m{k}" for k in range(1, 5)]
    assert in_planned_order(res.records)
    run = res.summary["run"]
    assert run["interrupted"] == sig and run["processes_lost"] == [] and run["processes"] == 2
    assert res.summary["requests_total"] == 4 and res.summary["status_counts"] == {"client_cancel": 4}
    assert len(run["send_phase_cpu_s_per_process"]) == 2
    await until(lambda: state.in_flight == 0, "the cancelled requests' connections closed")
    assert multiprocessing.active_children() == []


async def test_one_process_run_says_it_ran_to_its_end(sse_server, telemetry):
    state, url = sse_server
    state.first_ms, state.interval_ms, state.tokens = 1.0, 1.0, 2
    res = await run_load(opts(url, concurrency=1, requests=2), telemetry)
    assert res.summary["run"]["interrupted"] is None and res.summary["run"]["processes_lost"] == []


async def test_ctrl_c_to_the_process_group_writes_what_it_got(sse_server, tmp_path):
    # a terminal's Ctrl-C: SIGINT to the command and its spawned process at once
    state, url = sse_server
    hold(state)
    out = tmp_path / "out"
    proc = await cli(out, url, "--concurrency", "4", "--duration", "30", "--processes", "2")
    try:
        await until(lambda: state.in_flight >= 4, "4 requests in flight", 20)
        kids = spawned_children(proc.pid)
        assert len(kids) == 1
        os.killpg(proc.pid, signal.SIGINT)
        _out, err = await asyncio.wait_for(proc.communicate(), 20)
    finally:
        if proc.returncode is None:
            os.killpg(proc.pid, signal.SIGKILL)
    err = err.decode()
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "deltatap load: interrupted (SIGINT): nothing more was sent; 4 requests recorded" in err
    records, summary = read_out(out)
    assert len(records) == 4 and cancelled(records) and summary["run"]["interrupted"] == "SIGINT"
    assert sorted(r["request_id"] for r in records) == [f"li-m{k}" for k in range(1, 5)] and in_planned_order(records)
    await until(lambda: not any(alive(k) for k in kids), "the spawned process gone", 5)


async def test_a_process_killed_hard_stops_the_run_and_is_named(sse_server, tmp_path):
    state, url = sse_server
    hold(state)
    out = tmp_path / "out"
    proc = await cli(out, url, "--concurrency", "4", "--duration", "30", "--processes", "2")
    try:
        await until(lambda: state.in_flight >= 4, "4 requests in flight", 20)
        (kid,) = spawned_children(proc.pid)
        os.kill(kid, signal.SIGKILL)
        _out, err = await asyncio.wait_for(proc.communicate(), 20)  # (before: the parent ran its share to the end)
    finally:
        if proc.returncode is None:
            os.killpg(proc.pid, signal.SIGKILL)
    err = err.decode()
    assert proc.returncode == 1, err
    assert "Traceback" not in err
    assert (f"deltatap load: --processes: process 2 of 2 was killed by SIGKILL (pid {kid}) before it handed back its "
            "records: its records are lost (requests 2, 4, 6, ... of the plan") in err, err
    assert "the sending stopped when a process was lost; 2 requests of the others recorded" in err
    records, summary = read_out(out)  # the first process's share: requests 1 and 3, cancelled when the run stopped
    assert [r["request_id"] for r in records] == ["li-m1", "li-m3"] and cancelled(records)
    assert len(summary["run"]["processes_lost"]) == 1 and summary["run"]["interrupted"] is None


async def test_the_parent_killed_hard_leaves_no_process_sending(sse_server, tmp_path):
    state, url = sse_server
    hold(state)
    proc = await cli(tmp_path / "out", url, "--concurrency", "4", "--duration", "30", "--processes", "2")
    try:
        await until(lambda: state.in_flight >= 4, "4 requests in flight", 20)
        (kid,) = spawned_children(proc.pid)
        proc.kill()
        await asyncio.wait_for(proc.wait(), 10)
        # before: the spawned process went on sending its share for the whole --duration
        await until(lambda: not alive(kid), "the orphaned process gone", 5)
        await until(lambda: state.in_flight == 0, "nothing in flight", 5)
        seen = len(state.seen)
        await asyncio.sleep(0.3)
        assert len(state.seen) == seen
    finally:
        if proc.returncode is None:
            os.killpg(proc.pid, signal.SIGKILL)


async def test_a_process_that_does_not_hand_back_its_records_is_given_up(sse_server, telemetry, monkeypatch):
    # a stopped (SIGSTOP) process: the parent waits STOP_GRACE_S after the interrupt, not for ever, names it, writes the rest
    from deltatap.loadgen import coordinate

    monkeypatch.setattr(coordinate, "STOP_GRACE_S", 0.5)
    state, url = sse_server
    hold(state)
    stopped: list[int] = []

    async def freeze_then_interrupt() -> None:
        await until(lambda: state.in_flight >= 4, "4 requests in flight")
        (child,) = multiprocessing.active_children()
        os.kill(child.pid, signal.SIGSTOP)
        stopped.append(child.pid)
        os.kill(os.getpid(), signal.SIGINT)

    task = asyncio.ensure_future(freeze_then_interrupt())
    try:
        res = await asyncio.wait_for(run_load(opts(url, concurrency=4, duration_s=30, processes=2), telemetry), 20)
    finally:
        await task
        for pid in stopped:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
    assert res.interrupted == "SIGINT"
    assert res.lost == ["process 2 of 2 did not hand back its records within 0.5 s of the stop (SIGINT): its records are "
                        "lost (requests 2, 4, 6, ... of the plan, 500 planned)"]
    assert [r["request_id"] for r in res.records] == ["li-m1", "li-m3"] and cancelled(res.records)
    assert res.summary["run"]["send_phase_cpu_s_per_process"][1] is None
    assert not alive(stopped[0])


async def test_a_sigterm_to_one_spawned_process_ends_its_share_only(sse_server, telemetry):
    state, url = sse_server
    state.first_ms, state.interval_ms, state.tokens = 5.0, 50.0, 20  # ~1 s answers

    async def term_the_child() -> None:
        await until(lambda: state.in_flight >= 2, "2 requests in flight")
        (child,) = multiprocessing.active_children()
        os.kill(child.pid, signal.SIGTERM)

    task = asyncio.ensure_future(term_the_child())
    res = await run_load(opts(url, concurrency=2, requests=2, processes=2), telemetry)
    await task
    assert res.interrupted == "SIGTERM" and res.lost == [] and len(res.stopped) == 1
    assert res.stopped[0].startswith("process 2 of 2 was stopped by SIGTERM (pid ")
    by_id = {r["request_id"]: r["status"] for r in res.records}
    assert by_id == {"li-m1": Outcome.OK, "li-m2": Outcome.CLIENT_CANCEL}


@pytest.mark.parametrize("flags, names", [
    # before: spawned them all (~75 MB each: 256 of them fill 19 GB)
    (["--processes", str(processes_allowed() + 1)], f"at most {processes_allowed()} on this host"),
    (["--processes", "0"], "--processes: Input should be greater than or equal to 1"),
    # before: hung for ever: the default closed loop (--concurrency 1) gave the second process 0 requests in flight
    (["--processes", "2", "--requests", "3"], "--processes 2 needs --concurrency >= 2"),
])
def test_processes_past_the_host_or_the_load_are_refused_in_one_line(capsys, tmp_path, flags, names):
    assert main(["load", "--target", "http://127.0.0.1:9", "--model", "m", "--no-progress", "--no-gpu",
                 *flags, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.startswith("deltatap load: ") and names in err, err
    assert not (tmp_path / "out").exists()


async def test_more_processes_than_requests_is_no_loss(sse_server, telemetry):
    # the processes with nothing to send end at once (status 0): not a process lost, the run goes to its end
    state, url = sse_server
    state.first_ms, state.interval_ms, state.tokens = 2.0, 1.0, 2
    res = await run_load(opts(url, rate=50, requests=2, processes=3), telemetry)
    assert res.lost == [] and res.interrupted is None and res.summary["status_counts"] == {"ok": 2}
    assert [r["request_id"] for r in res.records] == ["li-m1", "li-m2"]


def test_a_death_after_the_hand_back_is_told_by_the_bytes_waiting():
    # a process that exits non-zero after handing back its records (a crash at exit) lost nothing: its bytes wait
    from deltatap.loadgen.coordinate import _has_data

    ours, theirs = multiprocessing.get_context("spawn").Pipe()
    assert not _has_data(ours)
    theirs.send({"records": []})
    assert _has_data(ours) and _has_data(ours)  # (a peek takes nothing)
    assert ours.recv() == {"records": []}
    theirs.close()
    assert not _has_data(ours)  # (its end, nothing waiting)
    ours.close()



# Before (this session's first version): uvloop's reader on a pipe (the stop's in a spawned process, the results' wait
# in the parent) leaves its descriptor non-blocking; a hand-back larger than the socket buffer then failed with
# BlockingIOError, in the process sending it or in the parent reading it: the records of every --processes run past
# ~400 requests a process were lost (benchmarks/processes_stop_s24_loadint.py, 3 of 3 runs of 3000 requests). Both
# run on uvloop here (deltatap.net.aio.run), as in the command; the pauses make the buffer run full / empty for sure.

BIG = 4 << 20


def test_a_spawned_processes_pipe_is_blocking_again_after_the_send_phase():
    import threading
    import time

    from deltatap.loadgen.run import SendStop
    from deltatap.net import aio

    ours, theirs = multiprocessing.get_context("spawn").Pipe()
    got: list[bytes] = []

    def read_late() -> None:
        time.sleep(0.2)  # (the sender meets a full buffer)
        got.append(ours.recv_bytes())

    async def child_side() -> None:
        with SendStop(None, (), stop_pipe=theirs) as stop:  # type: ignore[arg-type]
            await stop.run(asyncio.sleep(0))
        assert stop.name is None
        reader = threading.Thread(target=read_late, daemon=True)
        reader.start()
        try:
            theirs.send_bytes(b"r" * BIG)
        finally:
            reader.join(10)

    aio.run(child_side())
    assert len(got) == 1 and len(got[0]) == BIG
    ours.close()
    theirs.close()


def test_the_parent_reads_a_hand_back_that_comes_slowly():
    import struct
    import threading
    import time
    from multiprocessing.reduction import ForkingPickler

    from deltatap.loadgen.coordinate import ProcessGroup
    from deltatap.net import aio

    group = ProcessGroup(1, None)  # (no process spawned: the pipe below stands for process 2's)
    ours, theirs = multiprocessing.get_context("spawn").Pipe()
    group._pipes.append(ours)
    payload = bytes(ForkingPickler.dumps({"records": [b"r" * BIG]}))
    framed = struct.pack("!i", len(payload)) + payload

    def write_in_two() -> None:  # the hand-back's first part, a pause (the reader meets an empty buffer), the rest
        half = len(framed) // 2
        view = memoryview(framed)
        theirs_fd = theirs.fileno()
        sent = 0
        while sent < half:
            sent += os.write(theirs_fd, view[sent:half])
        time.sleep(0.2)
        while sent < len(framed):
            sent += os.write(theirs_fd, view[sent:])

    async def parent_side() -> object:
        writer = threading.Thread(target=write_in_two, daemon=True)
        writer.start()
        try:
            return await group._result(0)
        finally:
            writer.join(10)

    got = aio.run(parent_side())
    assert isinstance(got, dict) and len(got["records"][0]) == BIG
    ours.close()
    theirs.close()


async def test_a_process_killed_before_its_share_came_is_named_in_one_line():
    # before: 'deltatap load: Broken pipe' (exit 1), naming nothing
    from deltatap.core.config import ConfigError
    from deltatap.loadgen.coordinate import ProcessGroup
    from deltatap.loadgen.modes import ModeConfig

    group = ProcessGroup(2, None)
    try:
        (proc,) = group._procs
        proc.kill()
        await asyncio.get_running_loop().run_in_executor(None, proc.join, 10)
        with pytest.raises(ConfigError) as err:
            await group.prepare([{"cfg": ModeConfig(units=[])}], timeout_s=10)
        assert str(err.value) == f"--processes: process 2 of 2 ended unexpectedly: it was killed by SIGKILL (pid {proc.pid})"
    finally:
        await group.close()


async def test_an_out_that_fills_up_names_the_file_cut_short(sse_server, telemetry, tmp_path):
    # before: 'deltatap load: No space left on device' - no file named, nothing said of records.jsonl cut short
    from deltatap.core.config import os_error_line

    state, url = sse_server
    state.first_ms, state.interval_ms, state.tokens = 1.0, 1.0, 1
    out = tmp_path / "out"
    out.mkdir()
    (out / "records.jsonl").symlink_to("/dev/full")  # (every write there: ENOSPC, a full disk)
    with pytest.raises(OSError) as err:
        await run_load(opts(url, rate=200, requests=6, processes=2, out=str(out)), telemetry)
    assert os_error_line(err.value) == (f"{out / 'records.jsonl'}: No space left on device: written in part; not written: "
                                        "requests.jsonl, summary.json, run.json")


async def test_a_second_ctrl_c_ends_the_wait_for_a_process_that_hangs(sse_server, telemetry):
    # the grace for the records (30 s) is cut short by a second Ctrl-C: the user who presses it twice gets the command back
    state, url = sse_server
    hold(state)
    stopped: list[int] = []

    async def freeze_then_interrupt_twice() -> None:
        await until(lambda: state.in_flight >= 4, "4 requests in flight")
        (child,) = multiprocessing.active_children()
        os.kill(child.pid, signal.SIGSTOP)
        stopped.append(child.pid)
        os.kill(os.getpid(), signal.SIGINT)
        await asyncio.sleep(0.3)
        os.kill(os.getpid(), signal.SIGINT)

    task = asyncio.ensure_future(freeze_then_interrupt_twice())
    try:
        res = await asyncio.wait_for(run_load(opts(url, concurrency=4, duration_s=30, processes=2), telemetry), 20)
    finally:
        await task
        for pid in stopped:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
    assert res.interrupted == "SIGINT"
    assert res.lost == ["process 2 of 2 had not handed back its records at a second signal after the stop (SIGINT): its "
                        "records are lost (requests 2, 4, 6, ... of the plan, 500 planned)"]
    assert [r["request_id"] for r in res.records] == ["li-m1", "li-m3"] and cancelled(res.records)
