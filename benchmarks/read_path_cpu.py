"""CPU time of one stamped read (deltatap/net/kstamp.py with the packet log), Python reference vs C accelerator.

A loopback pair in one process, a :class:`~deltatap.net.kstamp.KernelStampTransport` on the receiving side (no event
loop running: its read handler is called directly after each send), an SSE-sized event (100 bytes) per write:

- ``one_segment``: one write, then one read (the packet log's fast path: ``TCP_INFO`` counters, one ``recvmsg``);
- ``merged_4``: four writes, 0.1 ms, then one read holding all four (placed segment by segment from the packet log,
  handed over at once to a protocol with ``cuts_received``, as the relay's);
- ``write``: one stamped write of the same event the other way (:meth:`deltatap.net.conn.StampedProtocol.send` on a
  kernel-stamped transport, as the relay forwards each event; the peer drains every 64 writes, untimed).

Each measurement runs in a child process, ``DELTATAP_NATIVE=0`` (the Python) and unset (the C twin,
``deltatap/net/_pktring.c``: ``read_one`` for the first, ``read_split`` and ``read_packets`` for the second, ``send``
for the third), alternating, ``--rounds`` times; the figure is the CPU time (``thread_time``: user + system, the syscalls
included: on loopback a send also runs the receiver's TCP work) of the read handler per read, of ``send`` per write (and
its user time alone, ``write_user_us``: the part the C twin can change). ``--base DIR``: also another source tree's read path with its C built (e.g. a worktree of an earlier commit),
in the same alternation, for a before/after in one run. Needs CAP_NET_RAW (the packet log).

    .venv/bin/python benchmarks/read_path_cpu.py [--reads 20000] [--rounds 3] [--base /tmp/deltatap-base]

Writes benchmarks/results/read_path_cpu.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

CHILD = r"""
import asyncio, json, socket, sys, time
from deltatap.net import kstamp, pktstamp
if pktstamp.packet_log() is None:
    print(json.dumps({"error": "no packet log (needs CAP_NET_RAW)"})); sys.exit(0)

class P(asyncio.Protocol):
    n = 0
    def data_received(self, d): self.n += len(d)
    def cuts_received(self, d, pieces): self.n += len(d)

loop = asyncio.new_event_loop()
ls = socket.create_server(("127.0.0.1", 0))
c = socket.create_connection(ls.getsockname()); s, _ = ls.accept()
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
s.setsockopt(socket.SOL_SOCKET, kstamp.SO_TIMESTAMPING, kstamp.RX_FLAGS)
p = P(); tr = kstamp.KernelStampTransport(loop, s, p)
msg = b"data: " + b"x" * 90 + b"\n\n"
N = int(sys.argv[1])
out = {"accelerated": pktstamp._acc is not None, "tree": kstamp.__file__}
cost = 0
for _ in range(N):
    c.send(msg)
    t = time.thread_time_ns(); tr._on_readable(); cost += time.thread_time_ns() - t
out["one_segment_us"] = cost / N / 1000
cost, M = 0, N // 4
before = dict(kstamp.MERGED_READS)
for _ in range(M):
    for _ in range(4):
        c.send(msg)
    time.sleep(0.0001)
    t = time.thread_time_ns(); tr._on_readable(); cost += time.thread_time_ns() - t
out["merged_4_us"] = cost / M / 1000
out["merged_reads_placed"] = kstamp.MERGED_READS["packets"] - before["packets"]
out["merged_reads"] = M
out["bytes_ok"] = p.n == (N + 4 * M) * len(msg)
from deltatap.net.conn import StampedProtocol
class W(StampedProtocol):
    def on_data(self, data, t, bound): pass
w = W(); wtr = kstamp.KernelStampTransport(loop, c, w); w.connection_made(wtr)
c.setblocking(False)
out["write_accelerated"] = getattr(wtr, "_wfast", None) is not None
import resource
cost, user, got, sink = 0, 0.0, 0, bytearray(1 << 20)
for i in range(0, N, 64):  # 64 writes timed at once (user time is counted in ticks: over a batch), then the peer drains
    r0 = resource.getrusage(resource.RUSAGE_THREAD).ru_utime; t = time.thread_time_ns()
    for _ in range(min(64, N - i)):
        w.send(msg)
    cost += time.thread_time_ns() - t; user += resource.getrusage(resource.RUSAGE_THREAD).ru_utime - r0
    while True:
        try:
            k = s.recv_into(sink)
        except BlockingIOError:
            break
        got += k
s.setblocking(False)
while got < N * len(msg):
    try:
        got += s.recv_into(sink)
    except BlockingIOError:
        time.sleep(0.001)
out["write_us"] = cost / N / 1000
out["write_user_us"] = user / N * 1e6
out["write_bytes_ok"] = got == N * len(msg) and wtr.writes == N and not wtr._wbuf
print(json.dumps(out))
"""


def child(native: bool, reads: int, tree: str | None = None) -> dict:
    env = dict(os.environ)
    env.pop("DELTATAP_NATIVE", None)
    if not native:
        env["DELTATAP_NATIVE"] = "0"
    if tree is not None:  # (that tree's deltatap package first on the path: the installed checkout is not imported)
        env["PYTHONPATH"] = tree + os.pathsep + env.get("PYTHONPATH", "")
    cwd = tree or str(HERE.parent)  # (``-c`` puts the working directory first on the path)
    r = subprocess.run([sys.executable, "-c", CHILD, str(reads)], env=env, cwd=cwd, capture_output=True, text=True, timeout=600, check=False)
    if r.returncode != 0:
        raise SystemExit(f"read_path_cpu: the measuring process failed: {r.stderr.strip().splitlines()[-1:] or r.returncode}")
    got = json.loads(r.stdout.strip().splitlines()[-1])
    if "error" in got:
        raise SystemExit(f"read_path_cpu: {got['error']}")
    return got


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reads", type=int, default=20000, help="one-segment reads per process (a quarter as many merged reads)")
    ap.add_argument("--rounds", type=int, default=3, help="processes per mode, alternating")
    ap.add_argument("--base", metavar="DIR", help="also measure this source tree's read path (its C built), as base_c")
    ap.add_argument("--out", default=str(HERE / "results" / "read_path_cpu.json"))
    args = ap.parse_args()
    if args.reads < 4 or args.rounds < 1:
        raise SystemExit("read_path_cpu: --reads must be at least 4 and --rounds at least 1")
    base = None
    if args.base is not None:
        base = str(Path(args.base).resolve())
        if not (Path(base) / "deltatap" / "net" / "kstamp.py").is_file():
            raise SystemExit(f"read_path_cpu: --base {args.base}: not a deltatap source tree (no deltatap/net/kstamp.py)")
    runs: dict[str, list[dict]] = {"python": [], "c": []} | ({"base_c": []} if base else {})
    for _ in range(args.rounds):
        runs["python"].append(child(False, args.reads))
        runs["c"].append(child(True, args.reads))
        if base:
            runs["base_c"].append(child(True, args.reads, base))
    if not all(r["accelerated"] for r in runs["c"] + runs.get("base_c", [])):
        raise SystemExit("read_path_cpu: deltatap.net._pktring is not built (rebuild: .venv/bin/pip install -e '.[test]')")
    if not all(r["bytes_ok"] and r["write_bytes_ok"] for rs in runs.values() for r in rs):
        raise SystemExit("read_path_cpu: a measuring process lost or duplicated bytes")
    if not all(r["write_accelerated"] for r in runs["c"]) or any(r["write_accelerated"] for r in runs["python"]):
        raise SystemExit("read_path_cpu: the write's C twin (_pktring send) was not where it should be (rebuild the C)")
    if base and not all(r["tree"].startswith(base) for r in runs["base_c"]):
        raise SystemExit(f"read_path_cpu: --base {args.base}: its deltatap package was not the one imported")
    keys = ("one_segment_us", "merged_4_us", "write_us", "write_user_us")
    summary = {mode: {k: round(statistics.median(r[k] for r in rs), 2) for k in keys} for mode, rs in runs.items()}
    result = {
        "command": "python benchmarks/read_path_cpu.py " + " ".join(sys.argv[1:]),
        "what": "CPU us (thread_time, syscalls included) of one stamped read with the packet log: one segment, and four "
                "merged segments placed from the log; of one stamped write (send) of the same 98-byte event; Python reference (DELTATAP_NATIVE=0) "
                "vs C accelerator (vs --base's C); median of the rounds",
        "base": base,
        "loadavg_1m_before": os.getloadavg()[0],
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "summary": summary,
        "runs": runs,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
