"""Does a tap request cost the tap more after the tap idled, or after other processes ran? (issue 15, session 25)

benchmarks/tap_overhead.py ``--pairs`` showed the tap's own time per request (its span's request + first-token
overhead) ~60-90 us higher when tap requests alternate with direct ones than back to back. Here one tap, the mock
engine and the OTLP sink (as tap_overhead.py starts them), and blocks of tap requests at 1 stream under conditions
interleaved per round (order shuffled): ``b2b`` back to back; ``sleepN`` the client sleeps N ms before each request
(the machine idles); ``direct`` one direct request before each (the client and the engine run in between, as in
``--pairs``); ``spin`` the client spins on the CPU for 30 ms before each (no idle, no other process's work: the
tap's CPU may idle, the client's does not). Per condition: the spans' request / first-token overhead p50 and the
path time (TTFT less the engine's own time) p50.

    .venv/bin/python benchmarks/tap_idle_s25_selfreport.py [--rounds 10] [--block 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from tap_overhead import free_port, one, stop_all, wait_port  # noqa: E402
from tap_sink import read_spans  # noqa: E402

from deltatap.net import aio  # noqa: E402
from deltatap.net.wire import make_stamping_connector  # noqa: E402


async def drive(args, tap_url: str, direct_url: str, tap_pid: int) -> tuple[dict[str, list[float]], dict[str, list[int]]]:
    from selfreport_gap import schedstat

    conds = args.conds.split(",")
    paths: dict[str, list[float]] = {c: [] for c in conds}
    sched: dict[str, list[int]] = {c: [0, 0, 0] for c in conds}  # the tap's CPU ns, run delay ns, requests
    rng = random.Random(7)
    mk = lambda: aiohttp.ClientSession(connector=make_stamping_connector(limit=0), auto_decompress=False)  # noqa: E731
    async with mk() as tap_s, mk() as dir_s:
        for i in range(3):
            await one(tap_s, tap_url, f"warm-{i}")
            await one(dir_s, direct_url, f"warmd-{i}")
        for rnd in range(args.rounds):
            order = conds[:]
            rng.shuffle(order)
            for c in order:
                before = schedstat(tap_pid)
                for k in range(args.block):
                    if c.startswith("sleep"):
                        await asyncio.sleep(int(c[5:]) / 1000)
                    elif c == "direct":
                        await one(dir_s, direct_url, f"d-{rnd}-{k}")
                    elif c == "spin":
                        end = time.perf_counter() + 0.030
                        while time.perf_counter() < end:
                            pass
                    r = await one(tap_s, tap_url, f"tap-{c}-{rnd}-{k}")
                    if r is not None and r[1] is not None:
                        paths[c].append(r[1])
                after = schedstat(tap_pid)  # (the sleeps and direct requests in the block: the tap idle then)
                sched[c] = [sched[c][0] + after[0] - before[0], sched[c][1] + after[1] - before[1], sched[c][2] + args.block]
    return paths, sched


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--block", type=int, default=20)
    p.add_argument("--conds", default="b2b,sleep30,sleep60,direct,spin")
    p.add_argument("--out", default=str(HERE / "results" / "tap_idle_s25_selfreport.json"))
    args = p.parse_args()
    py = sys.executable
    tmp = Path(tempfile.mkdtemp(prefix="deltatap-idle-"))
    procs: list[subprocess.Popen] = []
    up_port, tap_port, sink_port = free_port(), free_port(), free_port()
    try:
        sink = subprocess.Popen([py, str(HERE / "tap_sink.py"), "--port", str(sink_port), "--out", str(tmp / "spans.bin")], stdout=subprocess.DEVNULL)
        procs.append(sink)
        wait_port(sink_port, sink, "OTLP sink")
        up = subprocess.Popen([py, str(HERE / "tap_mock_upstream.py"), "--port", str(up_port)], stdout=subprocess.DEVNULL)
        procs.append(up)
        wait_port(up_port, up, "mock upstream")
        tap = subprocess.Popen([py, "-m", "deltatap.app.cli", "tap", "--link", "fw-engine", "--listen", f"127.0.0.1:{tap_port}", "--no-admin",
                                "--upstream", f"http://127.0.0.1:{up_port}", "--otlp", f"http://127.0.0.1:{sink_port}"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(tap)
        wait_port(tap_port, tap, "tap")
        print(f"pids: tap {tap.pid} engine {up.pid} sink {sink.pid} client {os.getpid()}", file=sys.stderr, flush=True)
        load0 = os.getloadavg()[0]
        paths, sched = aio.run(drive(args, f"http://127.0.0.1:{tap_port}/v1/chat/completions",
                                     f"http://127.0.0.1:{up_port}/v1/chat/completions", tap.pid))
        load1 = os.getloadavg()[0]
        tap.terminate()
        tap.wait(30)
        time.sleep(0.3)
    finally:
        stop_all(procs)
    req: dict[str, list[float]] = {c: [] for c in paths}
    ft: dict[str, list[float]] = {c: [] for c in paths}
    for a in read_spans(tmp / "spans.bin"):
        rid = a.get("deltatap.request_id", "")
        c = rid.split("-")[1] if rid.startswith("tap-") else None
        if c in req and a.get("deltatap.overhead.request_ns") is not None:
            req[c].append(float(a["deltatap.overhead.request_ns"]))
            ft[c].append(float(a["deltatap.overhead.first_token_ns"]))
    p50 = lambda v: round(float(np.percentile(v, 50)) / 1e3, 1) if v else None  # noqa: E731
    out = {"benchmark": "tap_idle_s25_selfreport", "command": "python benchmarks/tap_idle_s25_selfreport.py " + " ".join(sys.argv[1:]),
           "loadavg_1m": {"before": load0, "after": load1},
           "conditions": {c: {"n": len(req[c]), "request_overhead_p50_us": p50(req[c]), "first_token_overhead_p50_us": p50(ft[c]),
                              "path_p50_us": p50(paths[c]),
                              "tap_cpu_us_per_request": round(sched[c][0] / max(sched[c][2], 1) / 1e3, 1),
                              "tap_run_delay_us_per_request": round(sched[c][1] / max(sched[c][2], 1) / 1e3, 1)} for c in paths}}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
