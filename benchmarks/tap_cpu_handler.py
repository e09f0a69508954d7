"""CPU per read of the stamped transport's reader callback: the C handler (``deltatap.net._pktring.readable``, what the
loop calls where it is built) against ``KernelStampTransport._on_readable`` (the definition, with the C ``read_one``
and ``read_split`` it calls), on real loopback connections with the packet log, alternating in one run.

Two reads: one SSE event of 98 bytes (one segment: ``read_one``), and four such events sent back to back while the
reader waits (several segments: ``read_split`` and the protocol's ``cuts_received``). The protocol does nothing but
count. Each callback is called from C (a ``functools.partial``, as the loop's handle calls it). Each figure is the thread's CPU time (``time.thread_time_ns``) around the callback only, median of the rounds;
the sender's work is outside it. Needs CAP_NET_RAW (the packet log) and the built accelerator.

    .venv/bin/python benchmarks/tap_cpu_handler.py [--reads 5000] [--rounds 5] [--out benchmarks/results/tap_cpu_handler.json]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import socket
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from deltatap.net import kstamp, pktstamp  # noqa: E402


class _Counter:
    def __init__(self) -> None:
        self.reads = 0
        self.cuts = 0

    def connection_made(self, transport) -> None:
        pass

    def data_received(self, data: bytes) -> None:
        self.reads += 1

    def cuts_received(self, data: bytes, pieces) -> None:
        self.cuts += 1

    def eof_received(self) -> bool:
        return True

    def connection_lost(self, exc) -> None:
        pass


class _Loop:
    def add_reader(self, *a) -> None:
        pass

    remove_reader = add_writer = remove_writer = add_reader

    def call_soon(self, cb, *args) -> None:
        cb(*args)


def _pair():
    with socket.create_server(("127.0.0.1", 0)) as lsock:
        c = socket.create_connection(lsock.getsockname(), timeout=5)
        s, _ = lsock.accept()
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.setsockopt(socket.SOL_SOCKET, kstamp.SO_TIMESTAMPING, kstamp.RX_FLAGS)
    p = _Counter()
    tr = kstamp.KernelStampTransport(_Loop(), s, p)
    return c, s, tr, p


def _waiting(s: socket.socket) -> int:
    import fcntl
    import struct
    import termios

    return struct.unpack("i", fcntl.ioctl(s.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0]


EVENT = b"data: " + b"x" * 90 + b"\n\n"  # 98 bytes


def one_round(handler, c, s, tr, reads: int, burst: int) -> float:
    """CPU ns per callback over ``reads`` reads of ``burst`` events each."""
    used = 0
    for _ in range(reads):
        for _ in range(burst):
            c.send(EVENT)
            if burst > 1:
                time.sleep(0.00005)
        deadline = time.monotonic() + 5
        while _waiting(s) < burst * len(EVENT) - 0:
            if time.monotonic() > deadline:
                raise RuntimeError("the bytes did not arrive")
        call = functools.partial(handler, tr)  # (called from C, as the loop calls it: the Python handler's frame is entered from C)
        t0 = time.thread_time_ns()
        while _waiting(s):
            call()
        used += time.thread_time_ns() - t0
    return used / reads


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reads", type=int, default=5000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", default=str(HERE / "results" / "tap_cpu_handler.json"))
    args = p.parse_args()
    if pktstamp.packet_log() is None or kstamp._readable is None:
        print("needs CAP_NET_RAW (the packet log) and the built deltatap.net._pktring", file=sys.stderr)
        return 2
    handlers = {"c_handler": kstamp._readable, "on_readable": kstamp.KernelStampTransport._on_readable}
    load = os.getloadavg()[0]
    result: dict = {}
    for burst, what in ((1, "one_segment"), (4, "four_segments")):
        pairs = {name: _pair() for name in handlers}
        for name, (c, s, tr, _p) in pairs.items():  # past TCP's quick-ack start (back-to-back writes then merge)
            one_round(handlers[name], c, s, tr, 50, 1)
        rounds: dict[str, list[float]] = {name: [] for name in handlers}
        for rnd in range(args.rounds):
            for name in (list(handlers) if rnd % 2 == 0 else list(reversed(handlers))):
                c, s, tr, _p = pairs[name]
                rounds[name].append(one_round(handlers[name], c, s, tr, args.reads, burst))
        counts = {name: {"reads": pr[3].reads, "cuts": pr[3].cuts} for name, pr in pairs.items()}
        result[what] = {name: {"cpu_ns_per_read_median": round(statistics.median(v)), "rounds": [round(x) for x in v],
                               "deliveries": counts[name]} for name, v in rounds.items()}
        for c, _s, tr, _p in pairs.values():
            c.close()
            tr.abort()
        print(what, {name: r["cpu_ns_per_read_median"] for name, r in result[what].items()}, flush=True)
    out = {"command": "python benchmarks/tap_cpu_handler.py " + " ".join(sys.argv[1:]), "loadavg_1m_before": load,
           "loadavg_1m_after": os.getloadavg()[0],
           "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
           "reads": result}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
