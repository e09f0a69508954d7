"""Session 26, task tail1: what the slowest 1 % of 1-stream requests through the tap have in common (issue 15: added
TTFT p99 <= 1.5x Envoy's at 1 stream).

One run, one stream, against benchmarks/tap_mock_upstream.py: ``direct``, ``tap`` (the checkout's), optionally
``tap-base`` (``--base-tree DIR``), ``tap-NAME`` (``--tap-env NAME:VAR=VAL,...``) and ``envoy`` (``--concurrency 1``),
in blocks of ``--block`` requests, the paths in a shuffled order each cycle (each block on a fresh client session after
``--warm`` requests left out). Per request: TTFT and path time (TTFT less the engine's own time, as
benchmarks/tap_overhead.py measures them, with its ``one``), and every process's CPU and run delay (time runnable
but waiting for a CPU, /proc/PID/task/*/schedstat) over the request.

Unless ``--no-hooks``, every tap runs under this script's wrapper (``--hooked-tap``), which records, in the
tap's process and on the clock the client stamps with, the windows of what a tap does off the request path: each
garbage collection (``gc.callbacks``), each span export (the batch's encoding and write; the collector's answer),
and every callback the tap's code put on a loop timer (``call_later`` / ``call_at``: the packet log's hand-back, the
relay's watches, held-write rechecks, exchange timeouts; by callback name). Nothing in the tap is changed. The
client's own collections are timed too; ``--hook-engine`` runs the mock engine under the same wrapper (its collections
and timers: it never freezes its heap). ``--no-schedstat`` leaves out the /proc reads between requests (they allocate in
the client and move its collections out of the requests); ``--gap-us`` pauses between requests; ``--tap-tree`` runs the
tap path (and the ``--tap-env`` variants) from another source tree; ``OTLP=none`` in a ``--tap-env`` variant turns its
span export off (what the export costs the tail). Each path's p99 comes with its 95 % bootstrap interval: a p99 of a few
hundred requests moves by more than the tap's whole added p50 from run to run. ``$TAIL1_RAW``: every request and event
to that file.

The analysis takes each tap request's *critical windows* -- from the client's send to ``--win-us`` after it (the
request's way to the engine) and the ``--win-us`` before the first token's read (its way back) -- and for each kind
of event the share of the slowest 1 % (path time at or above the path's p99) with such an event in a critical window,
against the share of all requests: a cause is what the slow requests have far more often than the rest.

    .venv/bin/python benchmarks/tail1_s26_tail1.py --n 3000 --out benchmarks/results/tail1_s26_tail1.json
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


# ---------------------------------------------------------------- the tap's wrapper (runs in the tap's process)
def hooked_tap(events_out: str, argv: list[str], engine: bool = False) -> int:
    import gc

    import uvloop

    from deltatap.net import aio

    clock = time.perf_counter_ns  # (deltatap.core.clock.mono_ns: the client's clock)
    ev: list[tuple[str, int, int]] = []
    gc_t0 = [0]

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            gc_t0[0] = clock()
        else:
            ev.append((f"gc{info.get('generation', 0)}", gc_t0[0], clock()))

    gc.callbacks.insert(0, on_gc)

    def timed(kind: str, fn):
        def run(*a, **k):
            t = clock()
            try:
                return fn(*a, **k)
            finally:
                ev.append((kind, t, clock()))

        return run

    def cb_name(cb) -> str:
        f = getattr(cb, "__func__", cb)
        return "timer:" + getattr(f, "__qualname__", type(cb).__name__)

    class HookLoop(uvloop.Loop):
        def call_later(self, delay, callback, *args, context=None):
            return super().call_later(delay, timed(cb_name(callback), callback), *args, context=context)

        def call_at(self, when, callback, *args, context=None):
            return super().call_at(when, timed(cb_name(callback), callback), *args, context=context)

    aio.run = lambda coro: uvloop.run(coro, loop_factory=HookLoop)

    def dump() -> None:
        Path(events_out).write_text(json.dumps(ev))

    atexit.register(dump)
    if engine:  # benchmarks/tap_mock_upstream.py, its collections and timers timed the same way (it never freezes)
        import runpy
        import signal

        signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
        sys.argv = [str(HERE / "tap_mock_upstream.py"), *argv]
        runpy.run_path(sys.argv[0], run_name="__main__")
        return 0
    from deltatap.telemetry import otlp_loop

    otlp_loop.encode_export_request = timed("export:encode", otlp_loop.encode_export_request)
    conn = otlp_loop._HttpConnection
    conn.data_received = timed("export:answer", conn.data_received)
    conn.request = timed("export:write", conn.request)
    from deltatap.app.cli import main

    return main(argv)


# ---------------------------------------------------------------- the client
def schedstat(pid: int) -> tuple[int, int]:
    """(CPU ns, run delay ns) of every thread of ``pid``."""
    cpu = wait = 0
    try:
        for t in os.listdir(f"/proc/{pid}/task"):
            try:
                a, b, _ = open(f"/proc/{pid}/task/{t}/schedstat").read().split()
            except (OSError, ValueError):
                continue
            cpu += int(a)
            wait += int(b)
    except OSError:
        pass
    return cpu, wait


async def measure(args, urls: dict[str, str], pids: dict[str, int]) -> dict[str, list[dict]]:
    import aiohttp

    from deltatap.net.wire import make_stamping_connector
    from tap_overhead import one

    rows: dict[str, list[dict]] = {p: [] for p in urls}
    cycles = -(-args.n // args.block)
    for cyc in range(cycles):
        order = list(urls)
        random.Random(cyc * 7 + 1).shuffle(order)
        for path in order:
            conn = make_stamping_connector(limit=0)
            async with aiohttp.ClientSession(connector=conn, auto_decompress=False, timeout=aiohttp.ClientTimeout(total=30)) as s:
                for i in range(args.warm + args.block):
                    rid = f"{path}-{cyc}-{i}"
                    before = {k: schedstat(p) for k, p in pids.items()} if args.schedstat else {}
                    detail: dict = {}
                    try:
                        r = await one(s, urls[path], rid, detail)
                    except (aiohttp.ClientError, asyncio.TimeoutError):
                        r = None
                    after = {k: schedstat(p) for k, p in pids.items()} if args.schedstat else {}
                    if args.gap_us:
                        await asyncio.sleep(args.gap_us / 1e6)
                    if i < args.warm or r is None or rid not in detail:
                        continue
                    t0, tft, engine = detail[rid]
                    rows[path].append({
                        "rid": rid, "t0": t0, "tft": tft, "engine_ns": engine, "ttft_ns": r[0], "path_ns": r[1],
                        "cpu_ns": {k: after[k][0] - before[k][0] for k in after},
                        "wait_ns": {k: after[k][1] - before[k][1] for k in after},
                    })
        print(f"cycle {cyc + 1}/{cycles}: " + ", ".join(f"{p} {len(v)}" for p, v in rows.items()), flush=True)
    return rows


def pct(v, q):
    import numpy as np

    return float(np.percentile(np.asarray(v, dtype=float), q)) if len(v) else float("nan")


def p99_ci_ms(v, boot: int = 1000, seed: int = 26) -> list[float] | None:
    """95 % percentile-bootstrap interval of the p99 of ``v`` (ns), in ms: what one run's p99 can tell apart."""
    import numpy as np

    x = np.asarray(v, dtype=float)
    if len(x) < 100:
        return None
    idx = np.random.default_rng(seed).integers(0, len(x), (boot, len(x)))
    return [round(float(c) / 1e6, 3) for c in np.percentile(np.percentile(x[idx], 99, axis=1), [2.5, 97.5])]


def analyse(args, rows: dict[str, list[dict]], events: dict[str, list], overheads: dict[str, dict[str, float]]) -> dict:
    out: dict = {"paths": {}, "slow_vs_all": {}}
    for path, rs in rows.items():
        pt = [r["path_ns"] for r in rs if r["path_ns"] is not None]
        tt = [r["ttft_ns"] for r in rs]
        out["paths"][path] = {"n": len(rs), "ttft_ms": {"p50": pct(tt, 50) / 1e6, "p99": pct(tt, 99) / 1e6, "p99_ci95": p99_ci_ms(tt)},
                              "path_ms": {"p50": pct(pt, 50) / 1e6, "p90": pct(pt, 90) / 1e6, "p99": pct(pt, 99) / 1e6,
                                          "p99.9": pct(pt, 99.9) / 1e6, "p99_ci95": p99_ci_ms(pt)}}
    d = out["paths"].get("direct")
    if d:
        for path, v in out["paths"].items():
            if path != "direct":
                v["added_ttft_ms"] = {q: v["ttft_ms"][q] - d["ttft_ms"][q] for q in ("p50", "p99")}
                v["added_path_ms"] = {q: v["path_ms"][q] - d["path_ms"][q] for q in ("p50", "p99")}
    win = args.win_us * 1000
    for path, rs in rows.items():
        rs = [r for r in rs if r["path_ns"] is not None]
        if not rs:
            continue
        p99 = pct([r["path_ns"] for r in rs], 99)
        slow = [r for r in rs if r["path_ns"] >= p99]
        rest = [r for r in rs if r["path_ns"] < p99]
        feat: dict = {"slow_n": len(slow), "p99_path_ms": p99 / 1e6}
        med = pct([r["path_ns"] for r in rs], 50)
        # load-robust: the share of requests more than 0.3 / 0.5 / 1 ms above the path's own median
        feat["share_over_median_plus"] = {f"{x}us": round(sum(r["path_ns"] > med + x * 1000 for r in rs) / len(rs), 4) for x in (300, 500, 1000)}
        ov = overheads.get(path, {})
        if ov:  # the tap's own report per request (request + first token, ns): its share over 100 / 200 / 400 us
            v = [ov[r["rid"]] for r in rs if r["rid"] in ov]
            feat["self_report_us"] = {"n": len(v), "p50": round(pct(v, 50) / 1e3, 1), "p99": round(pct(v, 99) / 1e3, 1),
                                      **{f"share_over_{x}us": round(sum(o > x * 1000 for o in v) / max(len(v), 1), 4) for x in (100, 200, 400)},
                                      "slow_p50": round(pct([ov[r["rid"]] for r in slow if r["rid"] in ov], 50) / 1e3, 1)}
        # run delay / CPU of each process over the request: mean for the slow ones and the rest
        for key in ("wait_ns", "cpu_ns"):
            for proc in rs[0][key] if args.schedstat else ():
                feat[f"{key[:-3]}_{proc}_us"] = {
                    "slow": round(sum(r[key][proc] for r in slow) / len(slow) / 1e3, 1),
                    "rest": round(sum(r[key][proc] for r in rest) / max(len(rest), 1) / 1e3, 1),
                    # share of requests whose process waited for a CPU over 100 us in the request
                    "slow_waited_100us": round(sum(r[key][proc] > 100_000 for r in slow) / len(slow), 3),
                    "rest_waited_100us": round(sum(r[key][proc] > 100_000 for r in rest) / max(len(rest), 1), 3),
                } if key == "wait_ns" else {
                    "slow": round(sum(r[key][proc] for r in slow) / len(slow) / 1e3, 1),
                    "rest": round(sum(r[key][proc] for r in rest) / max(len(rest), 1) / 1e3, 1)}
        evs = events.get(path)
        if evs:  # (only what happened while the requests ran: not the start-up's collections)
            first, last = min(r["t0"] for r in rs) - 1_000_000_000, max(r["tft"] for r in rs) + 1_000_000_000
            evs = [e for e in evs if first <= e[1] <= last]
        if evs:
            import bisect

            evs = sorted(evs, key=lambda e: e[1])
            starts = [e[1] for e in evs]
            kinds = sorted({e[0] for e in evs})

            def hits(r) -> set[str]:
                found = set()
                for a, b in ((r["t0"] - win // 2, r["t0"] + win), (r["tft"] - win, r["tft"])):
                    i = bisect.bisect_left(starts, a - 50_000_000)  # (an event that began before and ran into it)
                    while i < len(evs) and evs[i][1] <= b:
                        if evs[i][2] >= a:
                            found.add(evs[i][0])
                        i += 1
                return found

            hs, hr = [hits(r) for r in slow], [hits(r) for r in rest]
            feat["events_in_window"] = {
                k: {"slow": round(sum(k in h for h in hs) / len(hs), 3), "rest": round(sum(k in h for h in hr) / max(len(hr), 1), 3)}
                for k in kinds
            }
            feat["slow_any_event"] = round(sum(bool(h) for h in hs) / len(hs), 3)
            feat["rest_any_event"] = round(sum(bool(h) for h in hr) / max(len(hr), 1), 3)
            counts: dict = {}
            for k, a, b in evs:
                c = counts.setdefault(k, [0, 0, 0])
                c[0] += 1
                c[1] += b - a
                c[2] = max(c[2], b - a)
            feat["event_counts"] = {k: {"n": c[0], "mean_us": round(c[1] / c[0] / 1e3, 1), "max_us": round(c[2] / 1e3, 1)} for k, c in counts.items()}
            feat["slowest"] = [
                {"rid": r["rid"], "path_us": round(r["path_ns"] / 1e3), "events": sorted(hits(r)),
                 "wait_us": {k: round(v / 1e3) for k, v in r["wait_ns"].items()}}
                for r in sorted(slow, key=lambda r: -r["path_ns"])[:15]
            ]
        out["slow_vs_all"][path] = feat
    return out


# ---------------------------------------------------------------- the wire (tcpdump on loopback)
# what tcpdump keeps: segments whose payload starts with "POST" (a request head, its x-request-id in it) or with
# "65\r\n" (a chunk of the mock's token size: the first one with " tok0" is the first content token)
WIRE_FILTER = "tcp[((tcp[12:1] & 0xf0) >> 2):4] = 0x504f5354 or tcp[((tcp[12:1] & 0xf0) >> 2):4] = 0x36350d0a"
SEGMENTS = ("client_send", "proxy_in", "engine_read", "engine_write", "proxy_out", "client_read")


def wire_segments(text: str, rows: dict[str, list[dict]], engine_port: int, wall_minus_mono: int,
                  engine_timers: list[tuple[str, int, int]]) -> dict:
    """Each request's path time split where the wire saw it: the client's send (its ``t0`` -> its head on the wire), the
    proxy's forward of the head (-> the head on the engine's port), the engine's read (-> the engine's own start, from its
    first-token timer less its own time; with ``--hook-engine``), its write of the first token (-> on the wire), the
    proxy's forward of it (-> on the client's connection) and the client's read (-> its stamp). Per path: the medians,
    and the slowest 1 %'s mean excess over them per segment (``share_of_excess``: where the tail is)."""
    import bisect
    import re
    import statistics

    hdr = re.compile(r"^(\d+)\.(\d+) IP 127\.0\.0\.1\.(\d+) > 127\.0\.0\.1\.(\d+):")
    heads: dict[str, list[tuple[int, int, int]]] = {}  # request id -> (mono ns, source port, destination port)
    toks: dict[tuple[int, int], list[int]] = {}  # (source port, destination port) -> first tokens' mono ns
    cur = None
    for line in text.splitlines():
        m = hdr.match(line)
        if m:
            cur = (int(m.group(1)) * 1_000_000_000 + int(m.group(2)) - wall_minus_mono, int(m.group(3)), int(m.group(4)))
            continue
        if cur is None:
            continue
        i = line.find("x-request-id: ")
        if i >= 0:
            rid = re.match(r"[\w-]+", line[i + 14 :])
            if rid:
                heads.setdefault(rid.group(0), []).append(cur)
                cur = None
        elif ' tok0"' in line:
            toks.setdefault((cur[1], cur[2]), []).append(cur[0])
            cur = None
    for v in toks.values():
        v.sort()

    def first_after(key, t):
        v = toks.get(key, [])
        i = bisect.bisect_left(v, t)
        return v[i] if i < len(v) else None

    ends = sorted(e[2] for e in engine_timers)
    out: dict = {}
    for path, rs in rows.items():
        segs = []
        for r in rs:
            hs = heads.get(r["rid"])
            if r["path_ns"] is None or not hs:
                continue
            first = min(hs)
            at_engine = [h for h in hs if h[2] == engine_port]
            if not at_engine:
                continue
            eh = at_engine[0]
            te = first_after((engine_port, eh[1]), eh[0])  # the first token leaves the engine on that connection
            if te is None:
                continue
            tc = te if eh is first else first_after((first[2], first[1]), te)  # ... and reaches the client's connection
            if tc is None:
                continue
            if ends:  # the engine's own start: its first-token timer (the last before the client's read) less its own time
                i = bisect.bisect_right(ends, r["tft"]) - 1
                t_first = ends[i] if i >= 0 else te
            else:
                t_first = None
            eng_io = te - eh[0] - r["engine_ns"]  # the engine's read and write together
            e_read = t_first - r["engine_ns"] - eh[0] if t_first is not None else eng_io
            e_write = te - t_first if t_first is not None else 0
            segs.append((r["path_ns"], first[0] - r["t0"], eh[0] - first[0], e_read, e_write, tc - te, r["tft"] - tc))
        if len(segs) < 100:
            continue
        med = [statistics.median(x[k] for x in segs) for k in range(7)]
        segs.sort(key=lambda x: -x[0])
        k = max(1, len(segs) // 100)
        exc = [sum(x[j] - med[j] for x in segs[:k]) / k for j in range(1, 7)]
        tot = sum(exc) or 1.0
        out[path] = {
            "n": len(segs), "slow_n": k,
            "median_us": {n: round(v / 1e3) for n, v in zip(("path", *SEGMENTS), med)},
            "slowest_1pct_mean_excess_us": {n: round(v / 1e3) for n, v in zip(SEGMENTS, exc)},
            "share_of_excess": {n: round(v / tot, 3) for n, v in zip(SEGMENTS, exc)},
            "slowest_us": [{n: round(v / 1e3) for n, v in zip(("path", *SEGMENTS), x)} for x in segs[:k]],
        }
    if not ends:
        out["note"] = "no --hook-engine: engine_read is the engine's read and write together, engine_write 0"
    return out


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--hooked-tap":
        return hooked_tap(sys.argv[2], sys.argv[3:])
    if len(sys.argv) > 2 and sys.argv[1] == "--hooked-engine":
        return hooked_tap(sys.argv[2], sys.argv[3:], engine=True)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=2000, help="requests per path")
    p.add_argument("--block", type=int, default=100)
    p.add_argument("--warm", type=int, default=3)
    p.add_argument("--win-us", type=int, default=600, help="critical window after the send and before the first token")
    p.add_argument("--otlp", choices=["http", "file", "none"], default="http")
    p.add_argument("--no-hooks", action="store_true")
    p.add_argument("--hook-engine", action="store_true", help="also time the mock engine's collections and timer callbacks")
    p.add_argument("--wire", action="store_true",
                   help="tcpdump on loopback (request heads and first tokens): each request's path time split by segment")
    p.add_argument("--gap-us", type=int, default=0, help="a pause between requests (0: back to back, as tap_overhead runs them)")
    p.add_argument("--no-schedstat", dest="schedstat", action="store_false",
                   help="no /proc reads between requests (they allocate: the client's own collections then fall between requests)")
    p.add_argument("--no-envoy", action="store_true")
    p.add_argument("--base-tree", help="also a tap from this source tree (path tap-base)")
    p.add_argument("--tap-tree", help="the tap path itself from this source tree rather than the checkout")
    p.add_argument("--tap-env", action="append", default=[], metavar="NAME:VAR=VAL[,VAR=VAL]")
    p.add_argument("--out", default=str(HERE / "results" / "tail1_s26_tail1.json"))
    args = p.parse_args()
    sys.path.insert(0, str(HERE))
    import string

    from deltatap.net import aio
    from tap_overhead import envoy_binary, free_port, stop_all, wait_port

    py = sys.executable
    tmp = Path(tempfile.mkdtemp(prefix="tail1-"))
    procs: list[subprocess.Popen] = []
    pids: dict[str, int] = {"client": os.getpid()}
    urls: dict[str, str] = {}
    ev_files: dict[str, Path] = {}
    try:
        sink_port, up_port = free_port(), free_port()
        sink = subprocess.Popen([py, str(HERE / "tap_sink.py"), "--port", str(sink_port), "--out", str(tmp / "spans.bin")], stdout=subprocess.DEVNULL)
        procs.append(sink)
        wait_port(sink_port, sink, "sink")
        engine_ev = tmp / "events-engine.json"
        up = subprocess.Popen([py, str(Path(__file__).resolve()), "--hooked-engine", str(engine_ev), "--port", str(up_port)]
                              if args.hook_engine else [py, str(HERE / "tap_mock_upstream.py"), "--port", str(up_port)], stdout=subprocess.DEVNULL)
        procs.append(up)
        wait_port(up_port, up, "engine")
        pids["engine"], pids["sink"] = up.pid, sink.pid
        urls["direct"] = f"http://127.0.0.1:{up_port}/v1/chat/completions"
        otlp = {"http": f"http://127.0.0.1:{sink_port}", "file": f"file:{tmp / 'spans.jsonl'}", "none": "none"}[args.otlp]

        def start_tap(name: str, env: dict | None = None, cwd: Path | None = None) -> None:
            port = free_port()
            cli = ["tap", "--link", "fw-engine", "--listen", f"127.0.0.1:{port}", "--no-admin", "--upstream", f"http://127.0.0.1:{up_port}", "--otlp", otlp]
            if args.no_hooks:
                cmd = [py, "-m", "deltatap.app.cli", *cli]
            else:
                ev_files[name] = tmp / f"events-{name}.json"
                cmd = [py, str(Path(__file__).resolve()), "--hooked-tap", str(ev_files[name]), *cli]
            env = dict(env or {})
            if "OTLP" in env:  # (this tap's --otlp: e.g. none, what the export costs)
                mode = env.pop("OTLP")
                cmd[cmd.index("--otlp") + 1] = {"http": f"http://127.0.0.1:{sink_port}", "none": "none"}[mode]
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, **(env or {})}, cwd=cwd)
            procs.append(proc)
            wait_port(port, proc, name)
            urls[name], pids[name] = f"http://127.0.0.1:{port}/v1/chat/completions", proc.pid

        if args.tap_tree:  # the tap path from another source tree (benchmarks/tap_overhead.py's --tap-tree)
            from tap_cpu_ab import shim

            tree_env, tree_cwd = {"PYTHONPATH": str(shim(Path(args.tap_tree).resolve(), tmp / "shim-tap"))}, tmp
        else:
            tree_env, tree_cwd = {}, None
        start_tap("tap", tree_env, tree_cwd)
        for variant in args.tap_env:
            name, _, assigns = variant.partition(":")
            start_tap(f"tap-{name}", {**tree_env, **dict(a.split("=", 1) for a in assigns.split(",") if "=" in a)}, tree_cwd)
        if args.base_tree:
            from tap_cpu_ab import shim

            start_tap("tap-base", {"PYTHONPATH": str(shim(Path(args.base_tree).resolve(), tmp / "shim-base"))}, cwd=tmp)
        envoy = None if args.no_envoy else envoy_binary()
        if envoy is not None:
            port = free_port()
            cfg = tmp / "envoy.yaml"
            cfg.write_text(string.Template((HERE / "tap_overhead_envoy.yaml").read_text()).substitute(LISTEN_PORT=port, UPSTREAM_PORT=up_port))
            ev = subprocess.Popen([str(envoy), "-c", str(cfg), "--concurrency", "1", "--log-level", "error", "--disable-hot-restart",
                                   "--base-id", str(random.randrange(1, 1 << 16))], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            procs.append(ev)
            wait_port(port, ev, "envoy")
            urls["envoy"], pids["envoy"] = f"http://127.0.0.1:{port}/v1/chat/completions", ev.pid
        load0 = os.getloadavg()[0]
        wall_minus_mono = time.time_ns() - time.perf_counter_ns()
        t0 = time.monotonic()
        import gc

        client_ev: list = []
        gc_t0 = [0]

        def on_gc(phase: str, info: dict) -> None:  # the client's own collections (deltatap.core.clock.mono_ns' clock)
            if phase == "start":
                gc_t0[0] = time.perf_counter_ns()
            else:
                client_ev.append((f"client-gc{info.get('generation', 0)}", gc_t0[0], time.perf_counter_ns()))

        gc.callbacks.append(on_gc)
        dump = None
        if args.wire:
            dump = subprocess.Popen(["tcpdump", "-i", "lo", "-n", "-tt", "--time-stamp-precision=nano", "-l", "-A", "-s", "400", WIRE_FILTER],
                                    stdout=open(tmp / "wire.txt", "w"), stderr=subprocess.DEVNULL)  # noqa: SIM115
            procs.append(dump)
            time.sleep(1.0)
        rows = aio.run(measure(args, urls, pids))
        gc.callbacks.remove(on_gc)
        if dump is not None:
            time.sleep(0.5)
            dump.terminate()
            dump.wait(10)
        wall = time.monotonic() - t0
        load1 = os.getloadavg()[0]
        for proc in procs:
            if proc.pid in (pids.get(k) for k in urls if k.startswith("tap")):
                proc.terminate()
                proc.wait(30)
        up.terminate()
        up.wait(30)
        events = {k: json.loads(f.read_text()) for k, f in ev_files.items() if f.exists()}
        if engine_ev.exists():  # the engine's collections and timers matter to every path
            eng = [("engine-" + k, a, b) for k, a, b in json.loads(engine_ev.read_text())]
            for k in urls:
                events[k] = events.get(k, []) + eng
        for k in urls:  # the client's collections matter to every path
            events[k] = events.get(k, []) + client_ev
    finally:
        stop_all(procs)
    overheads: dict[str, dict[str, float]] = {}
    if args.otlp == "http":
        from tap_overhead import read_overheads

        for rid, (o, _hop) in read_overheads(tmp / "spans.bin").items():
            overheads.setdefault(rid.rsplit("-", 2)[0], {})[rid] = o
    res = analyse(args, rows, events, overheads)
    if args.wire and (tmp / "wire.txt").exists():
        timers = [e for e in events.get("direct", []) if e[0] == "engine-timer:_set_result_unless_cancelled"]
        res["wire_segments"] = wire_segments((tmp / "wire.txt").read_text(errors="replace"), rows, int(urls["direct"].split(":")[2].split("/")[0]),
                                             wall_minus_mono, timers)
    res.update({"command": "python benchmarks/tail1_s26_tail1.py " + " ".join(sys.argv[1:]), "loadavg_1m": {"before": load0, "after": load1},
                "wall_s": round(wall, 1), "otlp": args.otlp, "hooks": not args.no_hooks})
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1) + "\n")
    if os.environ.get("TAIL1_RAW"):
        Path(os.environ["TAIL1_RAW"]).write_text(json.dumps({"rows": rows, "events": events, "ports": {k: u.split(":")[2].split("/")[0] for k, u in urls.items()},
                                                             "wall_minus_mono_ns": wall_minus_mono}))
    print(json.dumps(res["paths"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
