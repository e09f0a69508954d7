"""benchmarks/soak.py end to end at a small size: real engine, tap and client processes on 127.0.0.1; the result
JSON holds what docs/benchmarks.md quotes (delays per phase and per second, each process's CPU per event, the tap's
garbage-collection and read counters from its /metrics). No timing is asserted: only that every figure is there
and every stream went through. In the reliability tier (``.ci/reliability``), beside the other soak-like tests."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(150)]

ROOT = Path(__file__).resolve().parents[2]


def test_a_small_soak_reports_every_figure(tmp_path):
    out = tmp_path / "soak.json"
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "soak.py"), "--streams", "40", "--duration", "6",
                        "--interval", "0.2", "--ramp-rate", "200", "--out", str(out)],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(out.read_text())
    for name in ("direct", "tap"):
        ph = res["phases"][name]
        assert ph["opened"] == 40 and ph["failed_connect"] == 0 and ph["ended_early"] == 0 and ph["bad_status"] == 0
        assert ph["events"] > 0 and 0 < ph["delay_ms"]["p50"] <= ph["delay_ms"]["p99"] <= ph["delay_ms"]["max"]
        seconds = [row[0] for row in ph["delay_timeline"]]
        assert seconds == sorted(seconds) and sum(row[1] for row in ph["delay_timeline"]) == ph["events"]
        for proc in ("engine", "client") + (("tap",) if name == "tap" else ()):
            p = ph["processes"][proc]
            assert p["cpu_us_per_event"] >= 0 and p["rss_max_mb"] > 0 and p["cpu_curve"]
    tap = res["phases"]["tap"]
    m = tap["tap_metrics_last"]
    assert "deltatap_process_gc_collections_total{generation=2}" in m and "deltatap_process_read_lag_seconds_count" in m
    if tap["tap_stamp_source"] != "process":  # (kernel-stamped reads count their lag; read after the end: the whole phase)
        assert m["deltatap_process_read_lag_seconds_count"] >= tap["events"] / 2
    assert tap["tap_gc_full_curve"] and res["summary"]["all_streams_through_tap"] is True
