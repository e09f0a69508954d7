"""benchmarks/selfreport_gap.py's reading of the scheduler's events (perf, system-wide) against a real wake-up: in the
reliability tier, since recording and decoding every CPU's events takes 3-10 s on the 2-core machine."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import selfreport_gap as srg  # noqa: E402


@pytest.mark.reliability
@pytest.mark.skipif(shutil.which("perf") is None or os.geteuid() != 0, reason="needs perf and root (system-wide scheduler events)")
def test_sched_index_finds_the_wakeup_a_write_causes(tmp_path):
    """A child blocked on a pipe is woken by our write: the index finds that waking (inside the write call) and the child's
    switch-in after it, and the child's sleep after it read."""
    child = subprocess.Popen([sys.executable, "-c", "import os,sys\nfor _ in range(3):\n    os.read(0, 1)\n"], stdin=subprocess.PIPE)
    trace = srg.SchedTrace(tmp_path / "sched.data")
    trace.start()
    if trace.proc is None or trace.proc.poll() is not None:
        child.kill()
        pytest.skip("perf record could not start (no access to the scheduler's tracepoints here)")
    try:
        time.sleep(0.3)  # the child is asleep in read
        writes = []
        for _ in range(3):
            t0 = time.monotonic_ns()
            child.stdin.write(b"x")
            child.stdin.flush()
            writes.append((t0, time.monotonic_ns()))
            time.sleep(0.05)
        assert child.wait(10) == 0
    finally:
        trace.stop()
        if child.poll() is None:
            child.kill()
    idx = trace.load({child.pid: "child"})
    if not idx.cpu_t:
        pytest.skip("perf recorded no scheduler events here")
    for t0, t1 in writes:
        wk = idx.wake_after(child.pid, t0, within_ns=t1 - t0 + 1_000_000)
        assert wk is not None
        waking, switch_in = wk
        assert t0 - 5_000 <= waking <= t1 + 1_000_000 and switch_in >= waking
        assert idx.running_at(waking)  # every CPU's task at that moment is known (or "?" before its first switch)
