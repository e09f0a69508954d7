"""The stamped write's (or, --what read-nolog, the read's without the packet log) own cost, A/B between deltatap trees (session 25, task perf): one process per round and tree,
alternating, each writing N small SSE-sized writes through a ``KernelStampTransport`` (the C write path, the packet
log on where the process may open it) to a loopback peer that reads after each write; the CPU time of the
``write`` calls alone (the thread's, ``thread_time_ns``: user + system, the peer's TCP input that loopback runs inside
the send included) per write, and the wall time. A tree's figure: the median of its rounds; compare within one run.

    .venv/bin/python benchmarks/write_cost_s25_perf.py --tree base=/tmp/s25base --tree new=. --rounds 6
    .venv/bin/python benchmarks/write_cost_s25_perf.py --what read-nolog --tree base=/tmp/s25base --tree new=. --rounds 6

read-nolog: DELTATAP_PACKET_STAMPS=0 (as without CAP_NET_RAW); a peer writes one SSE-sized event, the transport's read
handler (what the loop calls: ``kstamp._readable``, else ``_on_readable``) takes it in: the handler's CPU time per read.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

CHILD = r"""
import asyncio, json, socket, sys, time
import deltatap
from deltatap.net import kstamp, pktstamp
N = int(sys.argv[1])
async def main():
    got = []
    class P(asyncio.Protocol):
        def connection_made(self, tr): got.append(tr)
    server = await kstamp.start_server(P, "127.0.0.1", 0)
    peer = socket.create_connection(server.sockets[0].getsockname()); peer.setblocking(False)
    while not got:
        await asyncio.sleep(0.01)
    tr = got[0]
    data = b"data: " + b"x" * 100 + b"\n\n"
    cpu = wall = 0
    bounds = set()
    for i in range(N + 200):
        c0, w0 = time.thread_time_ns(), time.perf_counter_ns()
        tr.write(data)
        c1, w1 = time.thread_time_ns(), time.perf_counter_ns()
        if i >= 200:  # (the first writes warm up; the anchor is found at the first)
            cpu += c1 - c0
            wall += w1 - w0
            bounds.add(tr.last_write_bound_ns == -1)
        try:
            while peer.recv(1 << 16):
                pass
        except BlockingIOError:
            pass
    print(json.dumps({"cpu_ns_per_call": cpu / N, "wall_ns_per_call": wall / N, "queued_seen": sorted(bounds),
                      "packet_log": tr._plog is not None, "c_write": tr._wfast is not None, "module": deltatap.__file__}))
    tr.abort(); server.close(); peer.close()
asyncio.run(main())
"""


CHILD_READ = r"""
import json, socket, sys, time
import deltatap
from deltatap.net import kstamp
N = int(sys.argv[1])
class Loop:
    def add_reader(self, *a): pass
    remove_reader = add_writer = remove_writer = add_reader
    def call_soon(self, cb, *a): cb(*a)
class P:
    n = 0
    def connection_made(self, tr): pass
    def data_received(self, d): self.n += 1
    def eof_received(self): return True
    def connection_lost(self, exc): pass
with socket.create_server(("127.0.0.1", 0)) as ls:
    c = socket.create_connection(ls.getsockname()); s, _ = ls.accept()
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
s.setsockopt(socket.SOL_SOCKET, kstamp.SO_TIMESTAMPING, kstamp.RX_FLAGS)
p = P(); tr = kstamp.KernelStampTransport(Loop(), s, p)
readable = kstamp._readable or type(tr)._on_readable  # (what the loop calls: the C reader callback where built)
data = b"data: " + b"x" * 100 + b"\n\n"
cpu = wall = 0
for i in range(N + 200):
    c.send(data)
    while True:
        c0, w0 = time.thread_time_ns(), time.perf_counter_ns()
        readable(tr)
        c1, w1 = time.thread_time_ns(), time.perf_counter_ns()
        if i >= 200:
            cpu += c1 - c0
            wall += w1 - w0
        if p.n > i:
            break
print(json.dumps({"cpu_ns_per_call": cpu / N, "wall_ns_per_call": wall / N, "queued_seen": [],
                  "packet_log": tr._plog is not None, "c_write": getattr(kstamp, "_read_plain", None) is not None,
                  "module": deltatap.__file__}))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tree", action="append", required=True, help="NAME=DIR: a deltatap source tree (built)")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--what", choices=["write", "read-nolog"], default="write")
    ap.add_argument("--writes", type=int, default=20000)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "write_cost_s25_perf.json"))
    args = ap.parse_args()
    trees = [(name, str(Path(d).resolve())) for name, d in (t.split("=", 1) for t in args.tree)]  # (the children run in /tmp)
    res: dict[str, list[dict]] = {name: [] for name, _ in trees}
    load = [os.getloadavg()[0]]
    for r in range(args.rounds):
        order = trees if r % 2 == 0 else trees[::-1]
        for name, d in order:
            env = {**os.environ, "PYTHONPATH": d}
            if args.what == "read-nolog":
                env["DELTATAP_PACKET_STAMPS"] = "0"
            out = subprocess.run([sys.executable, "-c", CHILD if args.what == "write" else CHILD_READ, str(args.writes)], env=env, cwd="/tmp", capture_output=True,
                                 text=True, timeout=120)
            if out.returncode != 0:
                raise SystemExit(f"{name}: {out.stderr[-2000:]}")
            res[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
        load.append(os.getloadavg()[0])
    summary = {}
    for name, rounds in res.items():
        summary[name] = {"cpu_ns_per_call_median": round(statistics.median(x["cpu_ns_per_call"] for x in rounds), 1),
                         "wall_ns_per_call_median": round(statistics.median(x["wall_ns_per_call"] for x in rounds), 1),
                         "cpu_ns_per_call": [round(x["cpu_ns_per_call"], 1) for x in rounds],
                         "packet_log": rounds[0]["packet_log"], "c_write": rounds[0]["c_write"],
                         "module": rounds[0]["module"], "queued_seen": sorted({q for x in rounds for q in x["queued_seen"]})}
        print(f"{name:8s} cpu/call median {summary[name]['cpu_ns_per_call_median']:7.1f} ns  wall {summary[name]['wall_ns_per_call_median']:7.1f} ns  "
              f"rounds {summary[name]['cpu_ns_per_call']}  log {summary[name]['packet_log']} C {summary[name]['c_write']}")
    if len(trees) == 2:  # paired by round (the two trees ran back to back): first tree minus second
        a, b = (res[name] for name, _ in trees)
        diffs = [round(x["cpu_ns_per_call"] - y["cpu_ns_per_call"], 1) for x, y in zip(a, b)]
        summary["paired_cpu_ns_first_minus_second"] = {"median": statistics.median(diffs), "rounds": diffs}
        print(f"paired ({trees[0][0]} - {trees[1][0]}) cpu ns/call: median {statistics.median(diffs):.1f}, rounds {diffs}")
    doc = {"benchmark": "write_cost_s25_perf", "what": args.what, "calls": args.writes, "rounds": args.rounds, "trees": dict(trees),
           "loadavg_1m": load, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "summary": summary, "raw": res}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
