"""The 1-stream self-report over several process lifetimes (issue 15, session 25).

``tap_overhead.py --pairs`` gives, per run, the median of per-turn ``(tap path - self-report) - direct path`` with a
95 % bootstrap interval over turns (±~10 µs at 400 turns); but consecutive runs of the same tree at the same load
land 30-60 µs apart, well outside each other's interval: each run starts its own tap, engine, sink and client, and
what differs between those lifetimes (CPU placement, memory layout, what else the host runs) moves the figure more
than the turns within one lifetime do. This runs ``--runs`` short runs in a row (each ``tap_overhead.py --levels
none --pairs N --tput-rounds 0``: fresh processes) and reports the figure over runs: the median of the runs'
medians with a 95 % bootstrap interval over runs, for the whole and split by the request just before the tap's
(``after_same_path``: the tap's own, ``after_other_path``: the direct one).

    .venv/bin/python benchmarks/selfreport_runs_s25_selfreport.py [--runs 8] [--pairs 160] [--tap-tree DIR]

Writes benchmarks/results/selfreport_runs_s25_selfreport.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def over_runs(values: list[float], seed: int = 15) -> dict:
    """Median of the runs' figures, with a 95 % percentile-bootstrap interval over runs, and their spread."""
    a = np.asarray([v for v in values if v is not None], dtype=np.float64)
    if len(a) < 2:
        return {"runs": len(a)}
    rng = np.random.default_rng(seed)
    boot = np.median(a[rng.integers(0, len(a), (4000, len(a)))], axis=1)
    return {"runs": len(a), "median_us": round(float(np.median(a)), 1),
            "ci95_us": [round(float(np.percentile(boot, 2.5)), 1), round(float(np.percentile(boot, 97.5)), 1)],
            "min_max_us": [round(float(a.min()), 1), round(float(a.max()), 1)], "sd_us": round(float(a.std(ddof=1)), 1)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=8)
    p.add_argument("--pairs", type=int, default=160)
    p.add_argument("--tap-tree", metavar="DIR", help="as tap_overhead.py's: the tap from this source tree")
    p.add_argument("--out", default=str(HERE / "results" / "selfreport_runs_s25_selfreport.json"))
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="deltatap-srruns-"))
    per_run = []
    load0 = os.getloadavg()[0]
    for i in range(args.runs):
        out = tmp / f"run{i}.json"
        cmd = [sys.executable, str(HERE / "tap_overhead.py"), "--levels", "none", "--pairs", str(args.pairs), "--tput-rounds", "0",
               "--out", str(out), *(["--tap-tree", args.tap_tree] if args.tap_tree else [])]
        r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=600)
        if r.returncode != 0:
            print(f"run {i}: tap_overhead.py exited {r.returncode}: {r.stderr.strip()[-500:]}", file=sys.stderr)
            return 1
        x = json.loads(out.read_text())["self_report_pairs"]["tap"]
        b = x.get("median_pair_difference_by_previous_request_us", {})
        row = {"median_us": x["median_pair_difference_us"], "ci95_us": x["median_pair_difference_ci95_us"],
               "with_hop_us": x["median_pair_difference_with_hop_us"], "self_reported_p50_us": x["self_reported_p50_us"],
               "after_same_path_us": b.get("after_same_path", {}).get("median"), "after_other_path_us": b.get("after_other_path", {}).get("median"),
               "after_same_path_ci95_us": b.get("after_same_path", {}).get("ci95"), "after_other_path_ci95_us": b.get("after_other_path", {}).get("ci95"),
               "loadavg_1m": round(os.getloadavg()[0], 2)}
        per_run.append(row)
        print(f"run {i + 1}/{args.runs}: {row['median_us']} {row['ci95_us']} (with hop {row['with_hop_us']}); after the tap's own "
              f"{row['after_same_path_us']}, after another path's {row['after_other_path_us']} us; load {row['loadavg_1m']}", flush=True)
    result = {
        "benchmark": "selfreport_runs_s25_selfreport", "command": "python benchmarks/selfreport_runs_s25_selfreport.py " + " ".join(sys.argv[1:]),
        "tap_tree": str(Path(args.tap_tree).resolve()) if args.tap_tree else "checkout",
        "loadavg_1m": {"before": load0, "after": os.getloadavg()[0]},
        "over_runs": {k: over_runs([r[k] for r in per_run]) for k in ("median_us", "with_hop_us", "after_same_path_us", "after_other_path_us")},
        "within_run_ci95_halfwidth_us_median": round(float(np.median([(r["ci95_us"][1] - r["ci95_us"][0]) / 2 for r in per_run if r["ci95_us"]])), 1),
        "runs": per_run,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["over_runs"], indent=1), f"within-run 95 % half-width (median) {result['within_run_ci95_halfwidth_us_median']} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
