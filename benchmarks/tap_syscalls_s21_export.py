"""Counts per request that do not depend on the machine's load, for taps built from two (or more) source trees in one
run, span export over OTLP/HTTP to benchmarks/tap_sink.py: the tap process's threads, its context switches
(voluntary + involuntary, all threads, /proc/PID/task/*/status), its CPU and its event loop's thread's CPU, and — with ``--strace`` — its system calls by
name (``strace -c -f`` attached for one measured batch of requests). Session 21's "export" task (the span export on
the tap's event loop instead of a thread) measured with it:

    .venv/bin/python benchmarks/tap_syscalls_s21_export.py --tree base=/tmp/s21base --tree export=/tmp/s21/export/tree

Requests: ``--concurrency`` closed-loop streams (benchmarks/tap_cpu.py's ``drive``, its mock upstream), trees
interleaved each round. Writes benchmarks/results/tap_syscalls_s21_export.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from tap_cpu import drive, start_tap  # noqa: E402
from tap_cpu_ab import shim  # noqa: E402
from tap_overhead import BODY as TPUT_BODY  # noqa: E402
from tap_overhead import free_port, stop_all, wait_port  # noqa: E402

from deltatap.net import aio  # noqa: E402


def proc_counts(pid: int) -> dict[str, float]:
    """Threads, context switches over all threads, CPU seconds (user + system) of ``pid`` so far."""
    vol = invol = threads = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            text = (task / "status").read_text()
        except OSError:
            continue
        threads += 1
        vol += int(re.search(r"^voluntary_ctxt_switches:\s+(\d+)", text, re.M).group(1))
        invol += int(re.search(r"^nonvoluntary_ctxt_switches:\s+(\d+)", text, re.M).group(1))
    tick = os.sysconf("SC_CLK_TCK")
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    main = Path(f"/proc/{pid}/task/{pid}/stat").read_text().rsplit(")", 1)[1].split()  # the event loop's thread alone
    return {"threads": threads, "ctxt": vol + invol, "ctxt_voluntary": vol, "cpu_s": (int(fields[11]) + int(fields[12])) / tick,
            "loop_cpu_s": (int(main[11]) + int(main[12])) / tick}


def strace_summary(text: str) -> dict[str, int]:
    """``strace -c`` table -> calls by syscall name."""
    out = {}
    for line in text.splitlines():
        parts = line.split()
        # % time, seconds, usecs/call, calls, [errors,] syscall
        if len(parts) >= 5 and parts[0].replace(".", "").isdigit() and parts[3].isdigit() and parts[-1] != "total":
            out[parts[-1]] = int(parts[3])
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tree", action="append", required=True, metavar="NAME=DIR")
    p.add_argument("--requests", type=int, default=3000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--strace", type=int, default=1500, metavar="N", help="requests per tree under strace -c -f (0: none)")
    p.add_argument("--tput-body", action="store_true", help="tap_overhead.py's maximum-rate request (default: tap_cpu.py's)")
    p.add_argument("--out", default=str(HERE / "results" / "tap_syscalls_s21_export.json"))
    args = p.parse_args()
    args.out = str(Path(args.out).resolve())
    trees = {spec.partition("=")[0]: Path(spec.partition("=")[2]).resolve() for spec in args.tree}
    py = sys.executable
    tmp = Path(tempfile.mkdtemp(prefix="deltatap-syscalls-"))
    os.chdir(tmp)
    procs: list[subprocess.Popen] = []
    up_port = free_port()
    result: dict = {"command": "python benchmarks/tap_syscalls_s21_export.py " + " ".join(sys.argv[1:]),
                    "trees": {k: str(v) for k, v in trees.items()}, "concurrency": args.concurrency,
                    "request": "tap_overhead.BODY" if args.tput_body else "tap_cpu.BODY",
                    "loadavg_1m_before": os.getloadavg()[0], "rounds": {}, "strace_calls_per_request": {}}
    try:
        up = subprocess.Popen([py, str(HERE / "tap_mock_upstream.py"), "--port", str(up_port)], stdout=subprocess.DEVNULL)
        procs.append(up)
        wait_port(up_port, up, "mock upstream")
        taps = {}
        for name, tree in trees.items():
            path = shim(tree, tmp / f"shim-{name}")
            (tmp / name).mkdir()
            taps[name] = start_tap(py, "http", up_port, tmp / name, procs, None, {"PYTHONPATH": str(path)})
        for name, (url, _pid) in taps.items():  # warm-up
            aio.run(drive(url, args.concurrency, 500))
        for rnd in range(args.rounds):
            for name, (url, pid) in (taps.items() if rnd % 2 == 0 else reversed(taps.items())):
                before = proc_counts(pid)
                t0 = time.monotonic()
                ok = aio.run(drive(url, args.concurrency, args.requests, *([TPUT_BODY] if args.tput_body else [])))
                wall = time.monotonic() - t0
                after = proc_counts(pid)
                row = {"ok": ok, "threads": after["threads"], "wall_s": round(wall, 3),
                       "ctxt_per_request": round((after["ctxt"] - before["ctxt"]) / ok, 3),
                       "ctxt_voluntary_per_request": round((after["ctxt_voluntary"] - before["ctxt_voluntary"]) / ok, 3),
                       "cpu_us_per_request": round(1e6 * (after["cpu_s"] - before["cpu_s"]) / ok, 1),
                       "loop_thread_cpu_us_per_request": round(1e6 * (after["loop_cpu_s"] - before["loop_cpu_s"]) / ok, 1)}
                result["rounds"].setdefault(name, []).append(row)
                print(f"round {rnd + 1} {name}: {row}", flush=True)
        if args.strace:
            for name, (url, pid) in taps.items():
                out = tmp / f"strace-{name}.txt"
                st = subprocess.Popen(["strace", "-c", "-f", "-p", str(pid), "-o", str(out)], stderr=subprocess.DEVNULL)
                time.sleep(1.0)
                ok = aio.run(drive(url, args.concurrency, args.strace))
                st.send_signal(signal.SIGINT)
                st.wait(30)
                calls = strace_summary(out.read_text())
                per = {k: round(v / ok, 3) for k, v in sorted(calls.items(), key=lambda kv: -kv[1]) if v / ok >= 0.01}
                result["strace_calls_per_request"][name] = per
                print(f"strace {name} ({ok} requests): {per}", flush=True)
    finally:
        stop_all(procs)
    result["loadavg_1m_after"] = os.getloadavg()[0]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("strace_calls_per_request",)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
