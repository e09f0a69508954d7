"""deltatap selftest end to end: the reference stack with known injected delays through the taps (every component and
tap its own process), figures against the components' own clocks and, where this machine allows a capture, the wire."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from deltatap.app.accuracy import COMPONENT_DELTAS, INJECTED_MS, TAP_TRANSIT
from deltatap.app.selftest import capture_allowed

REQUESTS = 40


@pytest.mark.timeout(180)
def test_selftest_prints_and_writes_its_figures(tmp_path):
    out = tmp_path / "selftest.json"
    p = subprocess.run([sys.executable, "-m", "deltatap.app.cli", "selftest", "--requests", str(REQUESTS), "--referee-requests", "30", "--json", str(out)],
                       capture_output=True, text=True, timeout=170)
    assert p.returncode == 0, p.stderr[-3000:]
    doc = json.loads(out.read_text())
    truth = doc["truth"]
    assert truth["ok"] == REQUESTS and truth["compared"] == REQUESTS - 20
    assert set(truth["deltas"]) == set(COMPONENT_DELTAS)
    for name, d in truth["deltas"].items():
        assert d["count"] >= REQUESTS - 20 - 2, name
        assert 0 <= d["p50_ms"] <= d["p99_ms"] <= d["max_ms"]
    for name, ms in INJECTED_MS.items():  # the components' own clocks saw at least the injected delay (fixed part - jitter)
        assert truth["deltas"][name]["injected_ms"] == ms and truth["deltas"][name]["true_median_ms"] >= ms - 0.5
    assert {f"{link} {d}" for link, d in TAP_TRANSIT} == set(truth["tap_transit"])
    for key, t in truth["tap_transit"].items():
        assert t["count"] >= REQUESTS - 22 and t["p50_ms"] > 0, key
    assert doc["provenance"]["suite_version"] and doc["provenance"]["hardware"]["fingerprint_hash"]
    assert "1. Against the components' own clocks" in p.stdout and "|error| p50" in p.stdout and "Taps:" in p.stdout
    allowed, why = capture_allowed()
    if allowed:
        wire = doc["wire"]
        assert wire["matched"] == wire["compared"] > 0 and wire["reassembly_holes"] == 0
        assert {"gateway_inbound", "firewall_inbound", "engine_ttft"} <= set(wire["deltas"])
        assert {f"tap_{link}_request" for link in ("edge", "gw-fw", "fw-engine")} <= set(wire["tap_overhead_on_wire"])
        assert "2. Against the wire" in p.stdout
    else:
        assert doc["wire"] == {"skipped": why} and why in p.stdout


def test_selftest_bad_options_say_one_line(capsys):
    from deltatap.app.cli import main

    for argv, msg in ((["--requests", "5"], "must exceed the 20 warm-up requests"), (["--rate", "0"], "--rate 0"),
                      (["--referee-requests", "3"], "must exceed the referee's 10 warm-up requests")):
        assert main(["selftest", *argv]) == 2
        err = capsys.readouterr().err
        assert msg in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
