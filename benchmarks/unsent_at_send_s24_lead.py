"""How often a loopback ``send`` that took every byte returns while TCP still holds some of them (session 24).

Such a write's bytes leave later (when acknowledgements or the peer's window let them), so a stamp that says "left
within the send" is early. For each congestion control and burst size: ``--connections`` fresh loopback connections
(TCP_NODELAY, as the tap's), each writing ``burst`` writes of ``--size`` bytes back to back while the peer does not
read, then the peer reads; after each ``send`` the sender's ``tcpi_notsent_bytes`` (bytes TCP has not sent:
``deltatap.net.pktstamp.tcp_notsent``, what the stamped transport reads) says whether the write's last byte is still held.

    .venv/bin/python benchmarks/unsent_at_send_s24_lead.py [--connections 100] [--bursts 6 30 100]

Writes benchmarks/results/unsent_at_send_s24_lead.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import time
from pathlib import Path

from deltatap.net.pktstamp import tcp_notsent

ROOT = Path(__file__).resolve().parents[1]


def one(cc: str, burst: int, connections: int, size: int) -> dict:
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(128)
    held = total = 0
    try:
        for _ in range(connections):
            c = socket.socket()
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, cc.encode())
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            c.connect(ls.getsockname())
            s, _ = ls.accept()
            for _ in range(burst):
                n = c.send(b"x" * size)
                total += 1
                if n == size and tcp_notsent(c):
                    held += 1
            time.sleep(0.002)
            s.settimeout(2)
            got = 0
            while got < burst * size:
                got += len(s.recv(1 << 20))
            c.close()
            s.close()
    finally:
        ls.close()
    return {"congestion_control": cc, "burst": burst, "writes": total, "held_at_return": held,
            "share": round(held / total, 4) if total else None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--connections", type=int, default=100)
    ap.add_argument("--bursts", type=int, nargs="+", default=[6, 30, 100])
    ap.add_argument("--size", type=int, default=150)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "unsent_at_send_s24_lead.json"))
    args = ap.parse_args()
    available = Path("/proc/sys/net/ipv4/tcp_available_congestion_control").read_text().split()
    runs = [one(cc, b, args.connections, args.size) for cc in ("cubic", "bbr") if cc in available for b in args.bursts]
    for r in runs:
        print(f"{r['congestion_control']:6} burst {r['burst']:4}: {r['held_at_return']:6} of {r['writes']:6} writes held at send's return")
    doc = {"benchmark": "unsent_at_send", "command": "benchmarks/unsent_at_send_s24_lead.py", "size_bytes": args.size,
           "connections": args.connections, "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
           "default_congestion_control": Path("/proc/sys/net/ipv4/tcp_congestion_control").read_text().strip()},
           "loadavg": os.getloadavg(), "runs": runs}
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
