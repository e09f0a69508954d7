"""``deltatap load`` fed bad flags (found by probing it, session 23): each is refused before a run starts, in the one
format of a flag error (exit 2, no traceback), instead of a traceback, a run that sends wrong bytes, or a hang."""

from __future__ import annotations

import asyncio
import resource

import pytest

from deltatap.app.cli import main
from deltatap.loadgen.modes import ModeConfig, sessions_needed

_FILES = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
PAST_ULIMIT = str(_FILES + 1 if _FILES != resource.RLIM_INFINITY else 1 << 31)
BASE = ["load", "--target", "http://127.0.0.1:9", "--model", "m", "--no-progress", "--no-gpu"]


@pytest.mark.parametrize("flags, names", [
    # before: a numpy traceback (7.28 TiB for the plan)
    (["--requests", "1000000000000"], "--requests: Input should be less than or equal to 10000000"),
    # before: OverflowError traceback (a timer of 1e300 s)
    (["--request-timeout", "1e300"], "--request-timeout:"),
    (["--drain", "1e300"], "--drain:"),
    # before: 'workload synthetic-uniform: Maximum allowed dimension exceeded'
    (["--rate", "1", "--duration", "1e300"], "--duration:"),
    (["--rate", "1000000", "--duration", "1000000"], "--rate x --duration"),
    # before: the plan's offsets overflowed int64 and all 3 requests went at once
    (["--rate", "1e-300", "--requests", "3"], "--rate 1e-300"),
    # before: --batch 1000000 hung opening connections past ulimit -n
    (["--batch", PAST_ULIMIT, "--duration", "1"], "connections at once"),
    (["--rate", "10", "--workers", PAST_ULIMIT], "connections at once"),
    # before: 'workload synthetic-uniform: expected non-negative integer', naming the workload, not the flag
    (["--seed", "-1"], "seed"),
    # before: every 200 counted as a refusal
    (["--refusal-status", "200"], "--refusal-status 200"),
    # before: sent as a second Content-Length, every request answered 400
    (["--header", "Content-Length:5"], "--header Content-Length"),
    (["--header", "transfer-encoding:chunked"], "--header transfer-encoding"),
    # before: put into each x-request-id header as given (a line break in a request head)
    (["--run-id", "a b\nc"], "--run-id"),
    # before: sent, and answered 400 ('model' is required) by every server
    (["--model", ""], "model"),
])
def test_bad_flag_is_refused_before_the_run(capsys, tmp_path, flags, names):
    argv = [a for a in BASE]
    if "--model" in flags:
        i = argv.index("--model")
        del argv[i : i + 2]
    assert main([*argv, *flags, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.startswith("deltatap load: ") and names in err, err
    assert not (tmp_path / "out").exists()


def test_good_edges_still_pass(capsys, tmp_path):
    from deltatap.loadgen.options import LoadOptions

    o = LoadOptions(target="http://h:1", rate=0.01, requests=3, seed=0, refusal_statuses=[429, 503], run_id="run_1.a-b",
                    headers={"Host": "h", "X-A": "b"}, request_timeout_s=86400.0)
    assert o.planned_count() == 3 and o.run_id == "run_1.a-b"


def test_sessions_of_a_plan_that_does_not_cycle():
    # a barrier batch or an open loop larger than the plan opens no more connections than the plan has requests
    units = [[object()] for _ in range(3)]
    assert sessions_needed("batch", ModeConfig(units=units, batch=100_000)) == 3
    assert sessions_needed("open", ModeConfig(units=units, workers=64)) == 3
    assert sessions_needed("batch", ModeConfig(units=units, batch=8, cycle=True)) == 8
    assert sessions_needed("closed", ModeConfig(units=units, concurrency=8)) == 8


async def _one_request(srv):
    """One request of the load generator's client to the RawServer ``srv``, on a session of its own."""
    from test_loadgen_h1client import one, target

    from deltatap.loadgen.client import make_session

    t = target(f"http://127.0.0.1:{srv.port}", timeout_s=30)
    pool = make_session(t)
    try:
        return await one(t, pool)
    finally:
        await pool.close()


async def test_a_close_in_the_middle_of_the_response_head_says_so():
    # before: 'the server closed the connection before the response head (0 bytes read)' after 37 bytes of the head
    from test_loadgen_h1client import RawServer

    from deltatap.core.vocab import Outcome

    async def handler(r, w, conn):
        await srv.read_request(r, conn)
        w.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/ev")
        await w.drain()
        w.write_eof()
        await asyncio.wait_for(r.read(), 10)

    async with RawServer(handler) as srv:
        rec = await _one_request(srv)
    assert rec.status == Outcome.UPSTREAM_ERROR
    assert rec.error == "the server closed the connection in the middle of the response head"


@pytest.mark.parametrize("target, names", [
    ("http://[zz", "not a URL"),  # before: ValueError traceback (Invalid IPv6 URL)
    ("http://127.0.0.1:99999", "not a URL"),
    ("http://:80/", "no host"),
    ("http://u:secret@127.0.0.1:9", "--header Authorization"),  # before: sent without them, the password kept in run.json
])
def test_target_that_is_no_url_is_one_flag_error(capsys, tmp_path, target, names):
    argv = [*BASE, "--out", str(tmp_path / "out")]
    argv[argv.index("--target") + 1] = target
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "--target" in err and names in err and "secret" not in err, err


def test_clock_sync_that_is_no_url(capsys):
    # before: 'cannot reach the collector at bogus/v1/clock: bogus/v1/clock'
    assert main([*BASE, "--clock-sync", "bogus"]) == 2
    assert "--clock-sync 'bogus': expected an http:// or https:// URL" in capsys.readouterr().err


def test_tls_failure_hint():
    from deltatap.loadgen.summary import describe_problem

    g = {"kind": "unreachable", "message": "cannot connect to 127.0.0.1:1 (TLS handshake failed: WRONG_VERSION_NUMBER)", "count": 2}
    assert describe_problem(g).endswith("does the server speak TLS there (else use http://)?")
    g["message"] = "cannot connect to 127.0.0.1:1 (certificate verify failed: self-signed certificate)"
    assert describe_problem(g).endswith("does this host trust its certificate (SSL_CERT_FILE, SSL_CERT_DIR)?")
    g["message"] = "cannot connect to 127.0.0.1:1 (connection refused)"
    assert describe_problem(g).endswith("is the server running?")


async def test_a_stream_without_end_is_cut_at_the_limit():
    # before: a server streaming without end filled the client's memory (6 GB in 10 s, probed), then the run's end
    # tokenised all of it
    from test_loadgen_h1client import RawServer

    from deltatap.core.vocab import Outcome
    from deltatap.loadgen.h1client import STREAM_LIMIT

    sent = [0]

    async def handler(r, w, conn):
        await srv.read_request(r, conn)
        w.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n")
        piece = b": " + b"x" * (1 << 16) + b"\n"  # SSE comments: bytes, no content to keep
        try:
            while sent[0] < STREAM_LIMIT + (8 << 20):  # (bounded: the client must stop reading before this)
                w.write(piece)
                sent[0] += len(piece)
                await w.drain()
        except (ConnectionError, OSError):
            pass

    async with RawServer(handler) as srv:
        rec = await _one_request(srv)
    assert rec.status == Outcome.UPSTREAM_ERROR
    assert rec.error.startswith(f"the answer passed {STREAM_LIMIT >> 20} MiB"), rec.error
    assert sent[0] < STREAM_LIMIT + (8 << 20)


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
async def test_a_signal_ends_the_sending_and_keeps_the_records(sse_server, telemetry, sig):
    # before: Ctrl-C (or SIGTERM) mid-run ended the process with nothing written: no records, no summary, no line
    # (the command line's exit status and line: loadgen/cli.py, from result.interrupted)
    import os
    import signal

    from deltatap.loadgen import LoadOptions, run_load

    state, url = sse_server
    state.interval_ms, state.tokens = 50.0, 40  # 2 s answers: both are in flight at the signal

    async def signal_when_in_flight() -> None:
        for _ in range(1000):  # (at most 10 s; the run's 30 s send phase is still on)
            if state.in_flight >= 2:
                break
            await asyncio.sleep(0.01)
        os.kill(os.getpid(), getattr(signal, sig))

    kill = asyncio.ensure_future(signal_when_in_flight())
    res = await run_load(LoadOptions(target=url, concurrency=2, duration_s=30, progress=False, gpu=False, seed=3), telemetry)
    await kill
    assert res.interrupted == sig
    assert len(res.records) == 2 and all(r["status"] == "client_cancel" for r in res.records)


@pytest.mark.parametrize("params, names", [
    # before: planning 10^9-token prompts ran until memory ran out (probed: killed after 20 s)
    ("input: {dist: uniform, min: 1000000000, max: 1000000001}\n  output: {dist: fixed, value: 8}", "less than or equal to 2000000"),
    ("input: {dist: fixed, value: 8}\n  output: {dist: choice, values: [8, 100000000]}", "less than or equal to 2000000"),
    # before: a nan mu planned garbage lengths
    ("input: {dist: lognormal, mu: .nan, sigma: 1, max: 100}\n  output: {dist: fixed, value: 8}", "finite number"),
])
def test_workload_lengths_are_bounded(capsys, tmp_path, params, names):
    wl = tmp_path / "wl.yaml"
    wl.write_text(f"workload: synthetic-uniform\nparams:\n  {params}\n")
    assert main([*BASE, "--workload", str(wl), "--plan-only", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and str(wl) in err and names in err, err
