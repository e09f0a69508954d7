"""End-to-end accuracy: every component delta deltatap reports vs the components' own true points.

    .venv/bin/python benchmarks/accuracy.py [--requests 270] [--rate 50]

Runs the harness of ``deltatap/app/accuracy.py`` (its ``summarize`` is also what ``deltatap selftest`` prints) twice: loadgen -> tap -> gateway -> tap
-> firewall -> tap -> engine on loopback, every component and tap in its own process, the taps and
the load generator exporting to a collector over OTLP/gRPC, the components sending their true
(socket-stamped) points to a separate sink the collector never reads. Run 1 propagates trace headers (joined by
trace id); run 2 has the firewall strip them (joined by body fingerprint). Per delta: |reported − true|
p50/p99/max and counts over the requests after the warm-up. Target (issue 4): p50 ≤ 0.3 ms and
p99 ≤ 1 ms. Writes benchmarks/results/accuracy.json with the 1-min/5-min/15-min load average
(``uptime``) at the start and the end.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from deltatap.net.aio import run  # noqa: E402
from deltatap.app.accuracy import COMPONENT_DELTAS, RATE, REQUESTS, WARMUP, run_once, summarize  # noqa: E402

TARGET_P50_MS = 0.3
TARGET_P99_MS = 1.0
RUNS = {"propagating": True, "headers_stripped": False}


def uptime() -> dict:
    line = subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()
    return {"uptime": line, "loadavg": list(os.getloadavg())}


def met(summary: dict) -> bool:
    return all(d["count"] and d["p50_ms"] <= TARGET_P50_MS and d["p99_ms"] <= TARGET_P99_MS for d in summary["deltas"].values())


def print_table(label: str, summary: dict) -> None:
    print(f"\n{label}: {summary['ok']}/{summary['requests']} ok, joins {summary['join_methods']}, ambiguous {summary['ambiguous']}, "
          f"evicted {summary['traces_evicted']}, late {summary['late_spans']}; {summary['compared']} compared after warm-up")
    print(f"  {'delta':<18} {'n':>4} {'|err| p50':>10} {'p99':>8} {'max':>8} {'reported p50':>13} {'true p50':>9}  (ms)")
    for name, d in summary["deltas"].items():
        f = lambda x: f"{x:.3f}" if x is not None else "-"  # noqa: E731
        print(f"  {name:<18} {d['count']:>4} {f(d['p50_ms']):>10} {f(d['p99_ms']):>8} {f(d['max_ms']):>8} {f(d['reported_median_ms']):>13} {f(d['true_median_ms']):>9}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=REQUESTS)
    ap.add_argument("--rate", type=float, default=RATE)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "accuracy.json"))
    args = ap.parse_args()
    if args.requests <= WARMUP:
        ap.error(f"--requests must exceed the {WARMUP} warm-up requests")
    start = uptime()
    t0 = time.monotonic()
    runs = {}
    with tempfile.TemporaryDirectory(prefix="deltatap-accuracy-") as tmp:
        for label, propagate in RUNS.items():
            r = run(run_once(propagate, Path(tmp) / label, requests=args.requests, rate=args.rate))
            runs[label] = summarize(r, args.requests)
            print_table(label, runs[label])
    end = uptime()
    result = {
        "benchmark": "accuracy", "command": "benchmarks/accuracy.py " + " ".join(sys.argv[1:]),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "setup": {"requests": args.requests, "rate_per_s": args.rate, "warmup_excluded": WARMUP, "processes": "3 components + 3 taps, each its own process; collector + loadgen in the benchmark's",
                  "compared_deltas": {k: f"{c}: {e} - {s}" for k, (c, e, s) in COMPONENT_DELTAS.items()}},
        "targets": {"p50_ms": TARGET_P50_MS, "p99_ms": TARGET_P99_MS},
        "runs": runs,
        "met": {label: met(s) for label, s in runs.items()},
        "wall_s": time.monotonic() - t0,
        "load_at_start": start, "load_at_end": end,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"\ntarget (p50 ≤ {TARGET_P50_MS} ms, p99 ≤ {TARGET_P99_MS} ms): " + ", ".join(f"{k} {'met' if v else 'not met'}" for k, v in result["met"].items()))
    print(f"load at start: {start['uptime']}\nload at end:   {end['uptime']}\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
