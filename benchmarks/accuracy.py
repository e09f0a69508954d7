"""End-to-end accuracy: every component delta deltatap reports vs the components' own true points.

    .venv/bin/python benchmarks/accuracy.py [--requests 270] [--rate 50]

Runs the harness of ``tests/integration/accuracy_harness.py`` twice: loadgen -> tap -> gateway -> tap
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

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from deltatap.net.aio import run  # noqa: E402
from tests.integration.accuracy_harness import (  # noqa: E402
    COMPONENT_DELTAS, RATE, REQUESTS, WARMUP, after_warmup, delta_median_ns, errors_vs_truth, run_once,
)

TARGET_P50_MS = 0.3
TARGET_P99_MS = 1.0
RUNS = {"propagating": True, "headers_stripped": False}


def uptime() -> dict:
    line = subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()
    return {"uptime": line, "loadavg": list(os.getloadavg())}


def true_median_ms(rows, truth, name: str) -> float | None:
    comp, end, start = COMPONENT_DELTAS[name]
    v = []
    for r in rows:
        t: dict[str, int] = {}
        for tid in r.trace_ids:
            t.update(truth.get(tid, {}).get(comp, {}))
        if str(end) in t and str(start) in t:
            v.append(t[str(end)] - t[str(start)])
    return float(np.median(v)) / 1e6 if v else None


def summarize(run_result, requests: int) -> dict:
    rows = run_result.rows
    kept = after_warmup([r for r in rows if r.outcome == "ok"])
    errs = errors_vs_truth(kept, run_result.truth)
    deltas = {}
    for name, v in errs.items():
        ms = v / 1e6
        deltas[name] = {
            "count": int(len(v)),
            "p50_ms": float(np.percentile(ms, 50)) if len(v) else None,
            "p99_ms": float(np.percentile(ms, 99)) if len(v) else None,
            "max_ms": float(ms.max()) if len(v) else None,
            "reported_median_ms": (lambda m: m / 1e6 if m is not None else None)(delta_median_ns(kept, name)),
            "true_median_ms": true_median_ms(kept, run_result.truth, name),
        }
    joins: dict[str, int] = {}
    for r in rows:
        joins[str(r.join_method)] = joins.get(str(r.join_method), 0) + 1
    s = run_result.stats
    return {
        "requests": requests, "rows": len(rows), "ok": sum(r.outcome == "ok" for r in rows), "compared": len(kept),
        "join_methods": joins, "ambiguous": s.get("ambiguous"), "traces_evicted": s.get("traces_evicted"), "late_spans": s.get("late_spans"),
        "deltas": deltas,
    }


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
