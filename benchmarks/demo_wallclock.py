"""Wall-clock time of `deltatap demo` (the README's first command; target: under 60 s on the 2-core machine).

    .venv/bin/python benchmarks/demo_wallclock.py [--runs 3]

Runs the console script as a user does (a fresh process each time, imports included) into a temporary
output directory, and records the wall time of each run, the demo's own elapsed figure, the number of
requests and rows, and the cascade it reported. Writes benchmarks/results/demo_wallclock.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET_S = 60.0


def one_run(exe: Path) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "demo"
        t0 = time.monotonic()
        proc = subprocess.run([str(exe), "demo", "--out", str(out)], capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "200"})
        wall = time.monotonic() - t0
        if proc.returncode != 0:
            raise SystemExit(f"deltatap demo failed (rc {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
        m = re.search(r"(\d+) requests, (\d+) decomposition rows, ([\d.]+) s", proc.stdout)
        doc = json.loads((out / "report.json").read_text())
        casc = doc["sections"]["cascades"]["data"]
        return {"wall_s": round(wall, 2), "demo_elapsed_s": float(m.group(3)) if m else None, "requests": int(m.group(1)) if m else None,
                "rows": int(m.group(2)) if m else None, "cascades": casc["cascades"], "engine_wasted_s": round(casc["engine_wasted_s"], 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    exe = Path(sys.executable).with_name("deltatap")
    runs = [one_run(exe) for _ in range(args.runs)]
    worst = max(r["wall_s"] for r in runs)
    result = {"benchmark": "demo_wallclock", "command": "deltatap demo --out TMP", "target_s": TARGET_S, "runs": runs,
              "worst_wall_s": worst, "met": worst < TARGET_S, "cpus": os.cpu_count(), "python": platform.python_version()}
    path = ROOT / "benchmarks" / "results" / "demo_wallclock.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
