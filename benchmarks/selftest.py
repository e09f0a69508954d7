"""deltatap selftest against the accuracy benchmark, on this machine: wall time and agreement of the figures.

    .venv/bin/python benchmarks/selftest.py [--rounds 2]

Per round: ``deltatap selftest --json`` as a user runs it (its default 120 requests; the wire referee where a
capture is allowed), then the benchmark's propagating run (``benchmarks/accuracy.py``: 270 requests at 50 req/s,
the same harness and :func:`deltatap.app.accuracy.summarize`). Per component delta: |error| p50 and p99 of each
and their difference; the self-test's wall time. Writes benchmarks/results/selftest.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from deltatap.app.accuracy import RATE, REQUESTS, run_once, summarize
from deltatap.net.aio import run

RESULTS = Path(__file__).resolve().parent / "results"


def deltatap_exe() -> list[str]:
    exe = Path(sys.executable).parent / "deltatap"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "deltatap.app.cli"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default=str(RESULTS / "selftest.json"))
    args = ap.parse_args()
    rounds = []
    with tempfile.TemporaryDirectory(prefix="deltatap-selftest-bench-") as tmp:
        for i in range(args.rounds):
            js = Path(tmp) / f"selftest{i}.json"
            t0 = time.monotonic()
            p = subprocess.run([*deltatap_exe(), "selftest", "--json", str(js)], capture_output=True, text=True, timeout=300)
            wall = time.monotonic() - t0
            if p.returncode != 0:
                print(p.stdout + p.stderr, file=sys.stderr)
                return 1
            st = json.loads(js.read_text())
            bench = summarize(run(run_once(True, Path(tmp) / f"bench{i}", requests=REQUESTS, rate=RATE)), REQUESTS)
            per = {}
            for name, d in bench["deltas"].items():
                s = st["truth"]["deltas"][name]
                per[name] = {"selftest_p50_ms": s["p50_ms"], "benchmark_p50_ms": d["p50_ms"], "selftest_p99_ms": s["p99_ms"], "benchmark_p99_ms": d["p99_ms"],
                             "diff_p50_ms": s["p50_ms"] - d["p50_ms"], "diff_p99_ms": s["p99_ms"] - d["p99_ms"]}
            wire = st.get("wire") or {}
            rounds.append({"selftest_wall_s": wall, "selftest_reported_wall_s": st["wall_s"], "wire_referee": "deltas" in wire,
                           "wire_abs_p50_ms": {k: v.get("abs_p50_ms") for k, v in (wire.get("deltas") or {}).items()},
                           "wire_abs_p99_ms": {k: v.get("abs_p99_ms") for k, v in (wire.get("deltas") or {}).items()},
                           "deltas": per, "loadavg": list(os.getloadavg())})
            print(f"\nround {i + 1}: selftest {wall:.1f} s (wire referee {'yes' if 'deltas' in wire else 'no'}); load {os.getloadavg()[0]:.1f}")
            print(f"  {'delta':<18} {'selftest |err| p50':>19} {'bench p50':>10} {'selftest p99':>13} {'bench p99':>10}  (ms)")
            for name, d in per.items():
                print(f"  {name:<18} {d['selftest_p50_ms']:>19.3f} {d['benchmark_p50_ms']:>10.3f} {d['selftest_p99_ms']:>13.3f} {d['benchmark_p99_ms']:>10.3f}")
    result = {"benchmark": "selftest", "command": "benchmarks/selftest.py " + " ".join(sys.argv[1:]),
              "machine": {"cpus": os.cpu_count()}, "setup": {"selftest": "deltatap selftest defaults (120 requests at 50 req/s, 20 warm-up)",
                                                             "benchmark": f"benchmarks/accuracy.py propagating run ({REQUESTS} requests at {RATE:g} req/s)"},
              "rounds": rounds}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
