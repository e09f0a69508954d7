"""The collector's /metrics feed a dashboard whose numbers are true (issue 22), checked on its exposition:
no histogram of a signed delta (a falling _sum reads as a counter reset), signed means through a sum gauge,
buckets at most 10 % apart, values that describe no latency left out, every outcome present from the start,
and the collector's own quantiles equal to the report's."""

from __future__ import annotations

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from deltatap.collector.metrics import BUCKETS_S, CollectorMetrics, DeltaHistograms
from deltatap.collector.rows import delta_defs
from deltatap.core.topology import default_topology
from deltatap.core.vocab import Outcome
from tests.reports.factories import row

SNAPSHOT = {"spans_received": 0, "decode_errors": {}, "traces_opened": 0, "traces_closed": 0, "traces_evicted": 0, "late_spans": 0,
            "open_traces": 0, "joined": {}, "ambiguous": 0, "outcomes": {"ok": 3, "refused": 1, "timeout": 1}, "forward_dropped": 0}


def _rows():
    ok = [row(i, outcome="ok", deltas_ms={"firewall_outbound": 27.0 + i, "firewall_outbound_last": 3.0 + i, "firewall_itl_added_mean": -0.5,
                                          "residual": -0.2, "firewall_inbound_block": 4.0 + i}) for i in range(3)]
    refused = row(3, outcome="refused", firewall_decision="block_pattern", deltas_ms={"firewall_inbound_block": 15.0})
    cut = row(4, outcome="timeout", deltas_ms={"firewall_outbound": 30.0, "firewall_outbound_last": -154.0, "firewall_itl_added_mean": -70.0})
    return [*ok, refused, cut]


def _samples(hist: DeltaHistograms) -> dict[tuple, float]:
    text = CollectorMetrics(lambda: SNAPSHOT, hist).render().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _get(samples, name, **labels):
    return samples[(name, tuple(sorted(labels.items())))]


def test_buckets_are_at_most_ten_percent_apart_and_cover_the_deltas():
    b = np.array(BUCKETS_S)
    assert (b[1:] / b[:-1]).max() <= 1.1 + 1e-9 and b[0] <= 1e-4 and b[-1] >= 60


def test_exposition_is_true_for_signed_cut_and_blocked_values():
    hist = DeltaHistograms(delta_defs(default_topology()))
    hist.add_rows(_rows())
    s = _samples(hist)
    fw = {"component": "firewall"}
    # a duration's histogram: the cut stream's -154 ms last-token "delay" is not in it, nor anywhere
    assert _get(s, "deltatap_collector_delta_seconds_count", delta="firewall_outbound_last", **fw) == 3
    assert _get(s, "deltatap_collector_delta_seconds_sum", delta="firewall_outbound_last", **fw) == pytest.approx((3 + 4 + 5) / 1e3)
    # block latency: the blocked request only
    assert _get(s, "deltatap_collector_delta_seconds_count", delta="firewall_inbound_block", **fw) == 1
    # first-token delta of the cut stream stays (its first token was real)
    assert _get(s, "deltatap_collector_delta_seconds_count", delta="firewall_outbound", **fw) == 4
    # signed: no histogram; mean through the sum gauge and the counter, the cut stream's -70 ms left out
    assert not any(k[0].startswith("deltatap_collector_delta_seconds") and ("delta", "firewall_itl_added_mean") in k[1] for k in s)
    total = _get(s, "deltatap_collector_delta_sum_seconds", delta="firewall_itl_added_mean", **fw)
    n = _get(s, "deltatap_collector_delta_observations_total", delta="firewall_itl_added_mean", **fw)
    assert (n, total / n * 1e3) == (3, pytest.approx(-0.5))
    assert _get(s, "deltatap_collector_delta_sum_seconds", delta="residual", component="") == pytest.approx(-0.6e-3)
    # the collector's own quantiles: the median of 27, 28, 29, 30 ms
    assert _get(s, "deltatap_collector_delta_quantile_seconds", delta="firewall_outbound", quantile="0.5", **fw) * 1e3 == pytest.approx(28.5)
    # every outcome from the start (rate() then counts the first timeout), at 0 where none yet
    for o in Outcome:
        assert ("deltatap_collector_rows_total", (("outcome", o.value),)) in s
    assert _get(s, "deltatap_collector_rows_total", outcome="client_cancel") == 0
    # a delta's buckets exist (at 0) before its first value
    assert _get(s, "deltatap_collector_delta_seconds_count", delta="gateway_inbound", component="gateway") == 0


def test_a_histogram_sum_never_falls():
    hist = DeltaHistograms(delta_defs(default_topology()))
    before = 0.0
    for i in range(3):
        hist.add_rows([row(i, outcome="ok", deltas_ms={"gateway_outbound": -0.05 if i == 1 else 1.0})])  # clock error: a tiny negative
        now = _get(_samples(hist), "deltatap_collector_delta_seconds_sum", delta="gateway_outbound", component="gateway")
        assert now >= before
        before = now


def test_batched_applicability_equals_the_row_by_row_rule():
    """DeltaHistograms works out which deltas apply once per (delta names, refused, complete) and reuses it
    across rows and batches; what it holds equals what the row-by-row rule (applies.applicable_rows) keeps."""
    import random

    from deltatap.collector.applies import applicable_rows
    from deltatap.collector.rows import delta_columns
    from deltatap.collector.sketches import Aggregator

    defs = delta_defs(default_topology())
    names = [d.name for d in defs] + ["not_a_registered_delta"]
    rnd = random.Random(16)
    rows = []
    for i in range(400):
        outcome = rnd.choice(["ok", "ok", "ok", "refused", "timeout", "http_error"])
        decision = rnd.choice([None, "allow", "block_pattern"]) if outcome != "refused" else "block_pattern"
        r = row(i, outcome=outcome, firewall_decision=decision,
                deltas_ms={n: rnd.uniform(-5, 300) for n in rnd.sample(names, rnd.randint(0, len(names)))})
        if r.deltas and rnd.random() < 0.2:
            r.delta_bounds = {n: rnd.randint(1, 10**6) for n in list(r.deltas)[:3]}
        rows.append(r)
    hist = DeltaHistograms(defs)
    for lo in range(0, len(rows), 37):  # several batches: plans made in one are reused in the next
        hist.add_rows(rows[lo:lo + 37])

    kept = applicable_rows(rows, defs)
    ref = Aggregator()
    ref.add_rows(kept)
    assert hist.sketches.rows == ref.rows and hist.sketches.outcomes == ref.outcomes
    assert hist.sketches.summaries() == ref.summaries()
    cols = delta_columns(kept)
    assert {k: v for k, v in hist.n.items() if v} == {k: len(v) for k, (v, _) in cols.items()}
    assert {k: v for k, v in hist.sums.items() if hist.n[k]} == {k: int(np.sum(v)) for k, (v, _) in cols.items()}
    excluded = sum(len(r.deltas) for r in rows) - sum(len(r.deltas) for r in kept)
    assert excluded > 0  # the mix exercises the rule
