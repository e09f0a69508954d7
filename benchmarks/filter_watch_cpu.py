"""CPU per connect/close of the packet log's port bookkeeping (deltatap/net/pktstamp.py) with many connections open.

Each stamped connection watches its local port (``PacketLog.watch``) and stops at its close (``unwatch``). Before
session 17 each new or last port rebuilt the filter from every watched port (``_filter(sorted(ports))``: a sort, a
min and a max over them all), so at 10,000 open streams every connect and every close paid a pass over 10,000 ports.
Now, past ``_MAX_LISTED_PORTS``, a connect widens the range by its port and a close leaves it until half the ports
are gone. Both are timed here, in one process, alternating, over ``--ports`` watched ports spaced as Linux hands out
ephemeral ports (the packet log is built over a ring in memory: no packet socket needed, no filter attached; the
``setsockopt`` that attaches a rebuilt filter is not counted, so the old figure is a lower bound).

    .venv/bin/python benchmarks/filter_watch_cpu.py [--ports 10000] [--rounds 3]

Writes benchmarks/results/filter_watch_cpu.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from deltatap.net import pktstamp  # noqa: E402


def rebuild_all(ports: dict[int, int], n: int) -> float:
    """us CPU per rebuild from every watched port (what each connect and close did before)."""
    t = time.process_time()
    for _ in range(n):
        pktstamp._filter(sorted(ports))
    return (time.process_time() - t) / n * 1e6


def watch_now(base: list[int], n: int) -> float:
    """us CPU per watch + unwatch pair at len(base) watched ports, as connections come and go."""
    log = pktstamp.PacketLog.over(bytearray(pktstamp._FRAME * 16))
    for p in base:
        log.watch(p)
    top = base[-1]
    t = time.process_time()
    for i in range(n):  # a new connection above the range (ephemeral ports climb), the oldest one closing
        log.watch(top + 2 * (i + 1))
        log.unwatch(base[i % len(base)])
    return (time.process_time() - t) / (2 * n) * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ports", type=int, default=10_000, help="watched ports (default 10000)")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "filter_watch_cpu.json"))
    args = ap.parse_args()
    if args.ports <= pktstamp._MAX_LISTED_PORTS or args.rounds < 1:
        ap.error(f"--ports > {pktstamp._MAX_LISTED_PORTS} (below it the ports are listed one by one), --rounds >= 1")
    base = list(range(20000, 20000 + 2 * args.ports, 2))
    ports = dict.fromkeys(base, 1)
    before, after = [], []
    for _ in range(args.rounds):
        before.append(rebuild_all(ports, 50))
        after.append(watch_now(base, 2000))
    res = {
        "benchmark": "filter_watch_cpu", "ports": args.ports, "rounds": args.rounds,
        "before_rebuild_us_per_connect_or_close": [round(x, 1) for x in before],
        "after_us_per_connect_or_close": [round(x, 2) for x in after],
        "median_before_us": round(statistics.median(before), 1), "median_after_us": round(statistics.median(after), 2),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "loadavg": os.getloadavg()},
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2) + "\n")
    print(f"filter_watch_cpu: {args.ports} ports: rebuild from all (before) {res['median_before_us']} us, "
          f"watch/unwatch now {res['median_after_us']} us CPU per connect or close; wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
