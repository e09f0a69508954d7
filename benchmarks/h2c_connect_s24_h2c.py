"""What the h2 relay's wait for the upstream's SETTINGS (session 24, "h2c") costs a fresh HTTP/2 connection, A/B.

Since session 24 the tap sends nothing of its own to an HTTP/2 client until its upstream connection's first bytes
show HTTP/2's SETTINGS (so that an upstream that does not speak HTTP/2 reaches the client as it would directly), and
its upstream preface leaves in one write with the client's first frames. Against an HTTP/2 upstream that changes
only a connection's start: this measures it. One h2c upstream process (the tests' h2 peer, ``h2_overhead.py
--serve``), one tap process per tree (``--tree NAME=DIR``, default ``base=/tmp/s24base`` and this checkout; each
tree imported through a PYTHONPATH shim, ``tap_cpu_ab.shim``), and a client that opens a fresh HTTP/2 connection per
request (prior knowledge), one request on it (SSE, first token at once, one token), closes it; rounds alternate the
trees in shuffled order. Per tree: connect -> response end p50/p99 (the wall time is load-dependent: compare within
one run) and the tap process's CPU per connection (/proc).

    .venv/bin/python benchmarks/h2c_connect_s24_h2c.py [--n 300] [--rounds 6] [--tree base=/tmp/s24base --tree new=.]

Writes benchmarks/results/h2c_connect_s24_h2c.json.
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
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests" / "proxy"))
from h2_peer import H2Client  # noqa: E402
from tap_cpu_ab import shim  # noqa: E402
from tap_overhead import free_port, pct, proc_cpu_s, stop_all, wait_port  # noqa: E402

from deltatap.core.clock import mono_ns  # noqa: E402


async def one(port: int) -> int | None:
    """Connect, one request, its response to the end, close: ns, or None when it failed."""
    t0 = mono_ns()
    c = await H2Client().connect("127.0.0.1", port)
    try:
        sid = c.request([(b":method", b"POST"), (b":path", b"/v1/chat/completions?first_ms=0&gap_ms=0&n=1"), (b":scheme", b"http"),
                         (b":authority", b"127.0.0.1"), (b"content-type", b"application/json")], b'{"model":"m","stream":true}')
        r = await c.wait(sid, 10)
        if r.reset is not None or r.status != 200 or not r.data.endswith(b"data: [DONE]\n\n"):
            return None
        return mono_ns() - t0
    finally:
        await c.close()


async def measure(ports: dict[str, int], pids: dict[str, int], n: int, rounds: int) -> dict:
    per: dict[str, list[int]] = {k: [] for k in ports}
    errors = {k: 0 for k in ports}
    cpu = {k: 0.0 for k in ports}
    for k, p in ports.items():  # warm-up
        for _ in range(20):
            await one(p)
    for rnd in range(rounds):
        order = list(ports)
        random.Random(rnd).shuffle(order)
        for k in order:
            c0 = proc_cpu_s(pids[k])
            for _ in range(n // rounds):
                t = await one(ports[k])
                if t is None:
                    errors[k] += 1
                else:
                    per[k].append(t)
            cpu[k] += proc_cpu_s(pids[k]) - c0
    return {k: {"connect_to_end_us": {"p50": pct(v, 50) / 1e3, "p99": pct(v, 99) / 1e3, "n": len(v)}, "errors": errors[k],
                "tap_cpu_us_per_connection": cpu[k] * 1e6 / max(1, len(v) + errors[k])} for k, v in per.items()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=300, help="connections per tree")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--tree", action="append", default=[], metavar="NAME=DIR")
    p.add_argument("--out", default=str(HERE / "results" / "h2c_connect_s24_h2c.json"))
    args = p.parse_args()
    trees = dict(t.split("=", 1) for t in args.tree) or {"base": "/tmp/s24base", "new": str(HERE.parent)}
    py = sys.executable
    procs: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        try:
            up = free_port()
            procs.append(subprocess.Popen([py, str(HERE / "h2_overhead.py"), "--serve", str(up)], cwd=tmp,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            wait_port(up, procs[-1], "the h2 upstream")
            ports, pids = {}, {}
            for name, tree in trees.items():
                path = shim(Path(tree).resolve(), tmp / f"shim-{name}")
                ports[name] = free_port()
                procs.append(subprocess.Popen(
                    [py, "-m", "deltatap", "tap", "--link", "fw-engine", "--listen", f"127.0.0.1:{ports[name]}", "--upstream",
                     f"http://127.0.0.1:{up}", "--otlp", "none", "--no-admin"],
                    cwd=tmp, env={**os.environ, "PYTHONPATH": str(path)}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
                pids[name] = procs[-1].pid
                wait_port(ports[name], procs[-1], f"tap {name}")
            load0 = os.getloadavg()
            result = asyncio.run(measure(ports, pids, args.n, args.rounds))
            doc = {"trees": trees, "n": args.n, "rounds": args.rounds, "loadavg": [load0, os.getloadavg()], "result": result}
        finally:
            stop_all(procs)
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
