"""benchmarks/tap_cpu_ab.py with each process's CPU time read at nanosecond resolution (session 26, task rate).

tap_cpu_ab reads CPU time from /proc/PID/stat in 10 ms ticks: over 3,000 requests a step of 3.3 us per request, as
large as the differences a small change makes. This runs it unchanged except for that reading: the sum over the
process's threads of /proc/PID/task/TID/schedstat's first field (time on a CPU, ns; the same user + system time the
ticks count, without their rounding). A thread that ends between two readings takes its time with it (the taps'
threads live as long as the tap). Same arguments and output as tap_cpu_ab.py (``--out``: its JSON, whose
cpu_us_per_request figures are then these readings; ``what`` says so).

    .venv/bin/python benchmarks/tap_cpu_ab_s26_rate.py --tree base=/tmp/s26base --tree new=. --concurrency 32 --rounds 6
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tap_cpu  # noqa: E402
import tap_cpu_ab  # noqa: E402


def cpu_s(pid: int) -> float:
    """CPU seconds of all of ``pid``'s threads so far (schedstat, ns resolution)."""
    total = 0
    base = f"/proc/{pid}/task"
    for tid in os.listdir(base):
        try:
            with open(f"{base}/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            pass  # (the thread ended)
    return total / 1e9


def main() -> int:
    tap_cpu.cpu_s = cpu_s  # (tap_cpu.measure's reading, which tap_cpu_ab's rounds use)
    out = Path(sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv[:-1] else tap_cpu_ab.HERE / "results" / "tap_cpu_ab.json").resolve()
    rc = tap_cpu_ab.main()  # (it changes to a temporary folder: out resolved before)
    if rc == 0:
        got = json.loads(out.read_text())
        got["command"] = "python benchmarks/tap_cpu_ab_s26_rate.py " + " ".join(sys.argv[1:])
        got["cpu_reading"] = "sum of /proc/PID/task/*/schedstat run time (ns), not /proc/PID/stat ticks"
        out.write_text(json.dumps(got, indent=2) + "\n")
    return rc


if __name__ == "__main__":
    sys.exit(main())
