"""benchmarks/tap_cpu_handler.py (CPU per read of the stamped transport's reader callback, one-segment and four-segment
reads) for two source trees in one run: each round runs that tree's own copy of the script (which imports the tree's
``deltatap`` with its built extensions) once per tree, the order alternating round by round, so that a loaded machine
weighs on both alike. Reports each tree's per-round figures and their medians.

    .venv/bin/python benchmarks/tap_cpu_handler_s21_kstamp.py --tree base=/tmp/s21base --tree new=. [--reads 2000] [--rounds 6]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tree", action="append", required=True, metavar="NAME=DIR")
    p.add_argument("--reads", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--out", default=str(HERE / "results" / "tap_cpu_handler_s21_kstamp.json"))
    args = p.parse_args()
    trees = {spec.split("=", 1)[0]: Path(spec.split("=", 1)[1]).resolve() for spec in args.tree}
    figures: dict[str, dict[str, dict[str, list[int]]]] = {n: {} for n in trees}
    load = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory() as tmp:
        for rnd in range(args.rounds):
            for name in (list(trees) if rnd % 2 == 0 else list(reversed(trees))):
                out = Path(tmp) / f"{name}.json"
                cmd = [sys.executable, str(trees[name] / "benchmarks" / "tap_cpu_handler.py"), "--reads", str(args.reads),
                       "--rounds", "1", "--out", str(out)]
                subprocess.run(cmd, check=True, cwd=trees[name], stdout=subprocess.DEVNULL, timeout=300)
                for what, per in json.loads(out.read_text())["reads"].items():
                    for handler, r in per.items():
                        figures[name].setdefault(what, {}).setdefault(handler, []).append(r["cpu_ns_per_read_median"])
            load.append(os.getloadavg()[0])
    medians = {name: {what: {h: round(statistics.median(v)) for h, v in per.items()} for what, per in f.items()}
               for name, f in figures.items()}
    print(json.dumps(medians, indent=1))
    result = {"command": "python benchmarks/tap_cpu_handler_s21_kstamp.py " + " ".join(sys.argv[1:]),
              "trees": {n: str(t) for n, t in trees.items()}, "loadavg_1m": load, "cpu_ns_per_read_median": medians,
              "rounds": figures}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
