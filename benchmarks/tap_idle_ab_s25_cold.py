"""The cold request path, A/B by source trees in one run (issue 15, session 25 "cold"): benchmarks/tap_idle_s25_selfreport.py's
measurement with one tap per tree (each importing its own tree through benchmarks/tap_cpu_ab.py's shim) in front of
the same mock engine, the same OTLP sink: blocks of 1-stream tap requests per (tree, condition), the order shuffled
each round; ``b2b`` back to back, ``sleepN`` the client sleeps N ms before each request (the tap idles, its CPU
goes cold). Per tree and condition: the spans' request overhead p50 (the request's last byte read -> its last byte
written upstream: the tap's cold path), the first-token overhead p50, the path time p50 (TTFT less the engine's own
time) and the tap's CPU per request (/proc schedstat).

    .venv/bin/python benchmarks/tap_idle_ab_s25_cold.py --tree base=/tmp/deltatap-base --tree new=. [--rounds 8] [--block 20]
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
from selfreport_gap import schedstat  # noqa: E402
from tap_cpu_ab import parse_trees, shim  # noqa: E402
from tap_overhead import free_port, one, stop_all, wait_port  # noqa: E402
from tap_sink import read_spans  # noqa: E402

from deltatap.net import aio  # noqa: E402
from deltatap.net.wire import make_stamping_connector  # noqa: E402


async def drive(args, urls: dict[str, str], pids: dict[str, int]) -> tuple[dict, dict]:
    conds = args.conds.split(",")
    cells = [(name, c) for name in urls for c in conds]
    paths: dict[tuple[str, str], list[float]] = {cell: [] for cell in cells}
    sched: dict[tuple[str, str], list[int]] = {cell: [0, 0] for cell in cells}  # the tap's CPU ns, requests
    rng = random.Random(7)
    mk = lambda: aiohttp.ClientSession(connector=make_stamping_connector(limit=0), auto_decompress=False)  # noqa: E731
    sessions = {name: mk() for name in urls}
    try:
        for name, url in urls.items():
            for i in range(3):
                await one(sessions[name], url, f"warm-{i}")
        for rnd in range(args.rounds):
            order = cells[:]
            rng.shuffle(order)
            for name, c in order:
                before = schedstat(pids[name])[0]
                for k in range(args.block):
                    if c.startswith("sleep"):
                        await asyncio.sleep(int(c[5:]) / 1000)
                    r = await one(sessions[name], urls[name], f"tap-{name}-{c}-{rnd}-{k}")
                    if r is not None and r[1] is not None:
                        paths[(name, c)].append(r[1])
                sched[(name, c)][0] += schedstat(pids[name])[0] - before
                sched[(name, c)][1] += args.block
    finally:
        for s in sessions.values():
            await s.close()
    return paths, sched


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tree", action="append", required=True, metavar="NAME=DIR")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--block", type=int, default=20)
    p.add_argument("--conds", default="b2b,sleep30")
    p.add_argument("--out", default=str(HERE / "results" / "tap_idle_ab_s25_cold.json"))
    args = p.parse_args()
    args.out = str(Path(args.out).resolve())
    trees = parse_trees(args.tree)
    if trees is None:
        return 2
    py = sys.executable
    tmp = Path(tempfile.mkdtemp(prefix="deltatap-idle-ab-"))
    os.chdir(tmp)  # (python -m puts the working directory first on sys.path: a checkout there would win over the shim)
    procs: list[subprocess.Popen] = []
    up_port, sink_port = free_port(), free_port()
    try:
        sink = subprocess.Popen([py, str(HERE / "tap_sink.py"), "--port", str(sink_port), "--out", str(tmp / "spans.bin")], stdout=subprocess.DEVNULL)
        procs.append(sink)
        wait_port(sink_port, sink, "OTLP sink")
        up = subprocess.Popen([py, str(HERE / "tap_mock_upstream.py"), "--port", str(up_port)], stdout=subprocess.DEVNULL)
        procs.append(up)
        wait_port(up_port, up, "mock upstream")
        urls, pids, taps = {}, {}, []
        for name, tree in trees.items():
            path = shim(tree, tmp / f"shim-{name}")
            env = {**os.environ, "PYTHONPATH": str(path)}
            check = subprocess.run([py, "-c", "import deltatap.proxy.relay as r; print(r.__file__)"], capture_output=True, text=True, env=env, check=True)
            if not Path(check.stdout.strip()).resolve().is_relative_to(tree):
                print(f"--tree {name}: the tap would import {check.stdout.strip()}, not {tree}", file=sys.stderr)
                return 1
            port = free_port()
            tap = subprocess.Popen([py, "-m", "deltatap.app.cli", "tap", "--link", "fw-engine", "--listen", f"127.0.0.1:{port}", "--no-admin",
                                    "--upstream", f"http://127.0.0.1:{up_port}", "--otlp", f"http://127.0.0.1:{sink_port}"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
            procs.append(tap)
            taps.append(tap)
            wait_port(port, tap, f"tap {name}")
            urls[name], pids[name] = f"http://127.0.0.1:{port}/v1/chat/completions", tap.pid
        load0 = os.getloadavg()[0]
        paths, sched = aio.run(drive(args, urls, pids))
        load1 = os.getloadavg()[0]
        for tap in taps:
            tap.terminate()
        for tap in taps:
            tap.wait(30)
        time.sleep(0.3)
    finally:
        stop_all(procs)
    req: dict[tuple[str, str], list[float]] = {cell: [] for cell in paths}
    ft: dict[tuple[str, str], list[float]] = {cell: [] for cell in paths}
    for a in read_spans(tmp / "spans.bin"):
        parts = a.get("deltatap.request_id", "").split("-")
        cell = (parts[1], parts[2]) if len(parts) > 2 and parts[0] == "tap" else None
        if cell in req and a.get("deltatap.overhead.request_ns") is not None:
            req[cell].append(float(a["deltatap.overhead.request_ns"]))
            ft[cell].append(float(a["deltatap.overhead.first_token_ns"]))
    p50 = lambda v: round(float(np.percentile(v, 50)) / 1e3, 1) if v else None  # noqa: E731
    out = {"benchmark": "tap_idle_ab_s25_cold", "command": "python benchmarks/tap_idle_ab_s25_cold.py " + " ".join(sys.argv[1:]),
           "trees": {k: str(v) for k, v in trees.items()}, "loadavg_1m": {"before": load0, "after": load1},
           "cells": {f"{n}/{c}": {"n": len(req[(n, c)]), "request_overhead_p50_us": p50(req[(n, c)]),
                                  "first_token_overhead_p50_us": p50(ft[(n, c)]), "path_p50_us": p50(paths[(n, c)]),
                                  "tap_cpu_us_per_request": round(sched[(n, c)][0] / max(sched[(n, c)][1], 1) / 1e3, 1)}
                     for (n, c) in paths}}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
