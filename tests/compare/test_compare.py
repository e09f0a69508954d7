"""deltatap compare against real runs: the reference stack run twice on loopback with the firewall's injected
inbound delay at 40 ms and then 70 ms (each +-30 ms, the same seeded draws), then compared from the collector's rows.
The harness is deltatap.app.accuracy's: every component and tap in its own process, as deployed. The two runs go
at the same time, so that the rest of the machine's load falls on both (one after the other, a busy spell during
one run moved its firewall latency by 13 ms, outside any honest interval of the injected difference)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from deltatap.app.cli import main
from deltatap.collector.compare.stats import Threshold, bootstrap_percentile_diff, mann_whitney, verdict
from deltatap.net.aio import run as aio_run

DELAYS_MS = {"fast": 40.0, "slow": 70.0}
# uniform +-30 ms, the same seeded draws in both runs: the spread is wide against what a busy machine adds to one
# run and not the other (a shared 2-core machine delays a process by several ms at times), so the interval, which
# measures the spread, holds the injected difference whatever the load
JITTER_MS = 30.0
REQUESTS = 60
RATE = 12.0  # requests seldom overlap: each run sees the machine, not its own queue


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory) -> dict[str, Path]:
    """The accuracy harness (every component and tap its own process), one run after the other; rows written as
    the collector writes them."""
    from deltatap.app.accuracy import run_once
    from deltatap.collector.sinks import write_rows
    from deltatap.core.topology import default_topology

    import asyncio

    base = tmp_path_factory.mktemp("compare")
    out = {label: base / label for label in DELAYS_MS}

    async def both():  # at the same time: whatever else the machine does weighs on both runs alike
        return await asyncio.gather(*(run_once(True, out[label] / "work", requests=REQUESTS, rate=RATE, injected={"firewall_inbound": ms},
                                               jitter={"firewall_inbound": JITTER_MS}) for label, ms in DELAYS_MS.items()))

    for label, r in zip(DELAYS_MS, aio_run(both()), strict=True):
        write_rows(r.rows, out[label] / "rows.parquet", default_topology())
    return out


def test_intervals_contain_the_injected_difference(two_runs, capsys, tmp_path):
    true_diff = DELAYS_MS["slow"] - DELAYS_MS["fast"]
    rc = main(["compare", f"fast={two_runs['fast']}", f"slow={two_runs['slow']}", "--format", "json", "--threshold", "5ms",
               "--out", str(tmp_path / "cmp"), "--resamples", "1000"])
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["baseline"] == "fast" and [r["label"] for r in doc["runs"]] == ["fast", "slow"]
    assert all(r["ok"] >= REQUESTS - 2 for r in doc["runs"])
    (pair,) = doc["comparisons"]
    fw = next(d for d in pair["deltas"] if d["delta"] == "firewall_inbound")
    assert fw["component"] == "firewall" and fw["n_baseline"] >= REQUESTS - 2
    for p in fw["percentiles"]:
        if p["stat"] == "P50":
            assert p["ci_low_ms"] <= true_diff <= p["ci_high_ms"], p
            assert p["verdict"] == "regression"
    assert fw["mann_whitney"]["p"] < 0.01 and fw["mann_whitney"]["prob_candidate_slower"] > 0.7  # ~0.875 for this shift
    assert {"delta": "firewall_inbound", "stat": "P50", "candidate": "slow"} in doc["regressions"]
    # a component nobody changed is not flagged at its median
    gw = next(d for d in pair["deltas"] if d["delta"] == "gateway_inbound")
    assert next(p for p in gw["percentiles"] if p["stat"] == "P50")["verdict"] != "regression"
    html = (tmp_path / "cmp" / "compare.html").read_text()
    assert html.count("data:image/png;base64,") == 2 and "firewall_inbound" in html
    assert "| firewall_inbound |" in (tmp_path / "cmp" / "compare.md").read_text()
    # the same seed gives the same intervals
    assert json.loads((tmp_path / "cmp" / "compare.json").read_text())["comparisons"] == doc["comparisons"]


def test_fail_on_regression_and_terminal(two_runs, capsys):
    assert main(["compare", str(two_runs["fast"]), str(two_runs["slow"]), "--deltas", "firewall_inbound", "--fail-on-regression"]) == 1
    out = capsys.readouterr().out
    assert "regression" in out and "firewall_inbound" in out
    assert main(["compare", str(two_runs["slow"]), str(two_runs["fast"]), "--deltas", "firewall_inbound", "--threshold", "5ms", "--fail-on-regression"]) == 0
    assert "improvement" in capsys.readouterr().out


def test_bad_inputs_say_one_line(two_runs, tmp_path, capsys):
    cases = [
        (["compare", str(two_runs["fast"])], "at least two runs"),
        (["compare", str(two_runs["fast"]), str(tmp_path / "nope")], "no such file or directory"),
        (["compare", str(two_runs["fast"]), str(tmp_path)], "no rows file"),
        (["compare", str(two_runs["fast"]), str(two_runs["slow"]), "--threshold", "fast"], "--threshold"),
        (["compare", str(two_runs["fast"]), str(two_runs["slow"]), "--deltas", "nope"], "not a delta"),
        (["compare", str(two_runs["fast"]), str(two_runs["slow"]), "--baseline", "zzz"], "no such run"),
        (["compare", str(two_runs["fast"].parent), str(two_runs["slow"])], "holds 2 runs"),
    ]
    for argv, msg in cases:
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert msg in err and "Traceback" not in err and len(err.splitlines()) == 1, err


def test_bootstrap_and_mann_whitney_on_known_samples():
    rng = np.random.default_rng(1)
    a = rng.normal(10.0, 1.0, 400)
    b = a + 3.0  # every value shifted by exactly 3
    cis, resampled = bootstrap_percentile_diff(a, b, [50, 99], resamples=500, seed=4)
    assert resampled.shape == (2, 500)
    for ci in cis:
        assert ci.diff == pytest.approx(3.0) and ci.lo < 3.0 < ci.hi
    again, _ = bootstrap_percentile_diff(a, b, [50, 99], resamples=500, seed=4)
    assert again == cis
    assert mann_whitney(a, b).p < 1e-12 and mann_whitney(a, a.copy()).p == pytest.approx(1.0, abs=0.05)
    assert verdict(cis[0], Threshold.parse("10%")) == "regression"
    assert verdict(cis[0], Threshold.parse("50%")) == "changed, within threshold"


def test_repeated_runs_flag_the_outlier_and_keep_it(two_runs, capsys):
    """Three runs of one configuration and one of another (one hardware class, one workload): the odd one is
    flagged beyond 3 sigma of its cluster and stays in every comparison."""
    f = two_runs["fast"]
    assert main(["compare", f"a={f}", f"b={f}", f"c={f}", f"odd={two_runs['slow']}", "--deltas", "firewall_inbound",
                 "--resamples", "200", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {"run": "odd", "delta": "firewall_inbound"} in [{k: o[k] for k in ("run", "delta")} for o in doc["outliers"]]
    assert not [o for o in doc["outliers"] if o["run"] != "odd"]
    assert [c["candidate"] for c in doc["comparisons"]] == ["b", "c", "odd"]
