"""benchmarks/selfreport_gap.py: its CPU layouts (its reading of the scheduler's events: tests/reliability/test_selfreport_gap_sched.py)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import selfreport_gap as srg  # noqa: E402


def test_layouts_parse_and_bad_ones_get_one_line():
    assert srg.parse_layout("client=0,tap=0,sink=0,engine=1", 2) == {"client": {0}, "tap": {0}, "sink": {0}, "engine": {1}}
    assert srg.parse_layout("client=0+1,tap=1,sink=0,engine=1", 2)["client"] == {0, 1}
    for bad, says in (("client=0,tap=0,sink=0", "no CPU for engine"), ("client=0,tap=0,sink=0,engine=2", "CPUs 0..1"),
                      ("client=0,tap=x,sink=0,engine=1", "not a CPU number"), ("proxy=0", "PROCESS=CPU")):
        with pytest.raises(ValueError) as exc:
            srg.parse_layout(bad, 2)
        assert says in str(exc.value) and "\n" not in str(exc.value)
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "selfreport_gap.py"), "--pin", "client=0"], capture_output=True,
                         text=True, timeout=60)
    if shutil.which("tcpdump") is None:
        assert out.returncode == 2 and "tcpdump" in out.stderr
    else:
        assert out.returncode == 2 and out.stderr.strip().count("\n") == 0 and "no CPU for" in out.stderr
