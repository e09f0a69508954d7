"""DeltaHistograms.add_rows given the batch's unfiltered delta columns (the pipeline's way: numpy masks cut
the applicable values out) holds exactly what it holds when it collects them row by row (the reference):
bucket counts, sums, observation counts, sketches, outcomes and the order every delta was first seen in."""

from __future__ import annotations

import json
import random

import numpy as np

from deltatap.collector.metrics import DeltaHistograms
from deltatap.collector.rows import DeltaValue, delta_columns, delta_defs
from deltatap.core.topology import default_topology
from tests.reports.factories import row


def _state(h: DeltaHistograms) -> str:
    return json.dumps({"counts": {k: v.tolist() for k, v in h.counts.items()}, "sums": list(h.sums.items()), "n": list(h.n.items()),
                       "hist_sums": list(h.hist_sums.items()), "sketches": h.sketches.to_dict(), "order": list(h.sketches.deltas)}, default=str)


def _rows(seed: int, n: int, mostly_ok: bool) -> list:
    defs = delta_defs(default_topology())
    names = [d.name for d in defs] + ["not_a_registered_delta"]
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        outcome = "ok" if mostly_ok and rnd.random() < 0.9 else rnd.choice(["ok", "refused", "timeout", "http_error"])
        decision = rnd.choice([None, "allow", "block_pattern"]) if outcome != "refused" else "block_pattern"
        picked = rnd.sample(names, rnd.randint(0, len(names)))
        r = row(i, outcome=outcome, firewall_decision=decision, deltas_ms={n: rnd.uniform(-5, 300) for n in picked})
        if r.deltas and rnd.random() < 0.2:
            r.delta_bounds = {n: rnd.randint(1, 10**6) for n in list(r.deltas)[:3]}
        out.append(r)
    return out


def test_columns_given_equal_columns_collected_row_by_row():
    defs = delta_defs(default_topology())
    for seed in range(12):
        rows = _rows(seed, 300, mostly_ok=seed % 2 == 0)
        ref, fast = DeltaHistograms(defs), DeltaHistograms(defs)
        rnd = random.Random(seed)
        lo = 0
        while lo < len(rows):
            hi = lo + rnd.randint(1, 80)
            batch = rows[lo:hi]
            ref.add_rows(batch)
            fast.add_rows(batch, delta_columns(batch))
            lo = hi
        assert _state(fast) == _state(ref)


def test_a_batch_where_every_delta_applies_takes_the_columns_as_they_are():
    defs = delta_defs(default_topology())
    rows = [row(i, outcome="ok", deltas_ms={"firewall_outbound": 27.0 + i, "firewall_outbound_last": 3.0 + i}) for i in range(50)]
    ref, fast = DeltaHistograms(defs), DeltaHistograms(defs)
    ref.add_rows(rows)
    cols = delta_columns(rows)
    assert DeltaHistograms(defs)._kept_columns(rows, cols)[0] is cols  # no copy
    fast.add_rows(rows, cols)
    assert _state(fast) == _state(ref)


def test_columns_that_do_not_match_the_rows_are_not_trusted():
    defs = delta_defs(default_topology())
    rows = _rows(3, 120, mostly_ok=False)
    ref = DeltaHistograms(defs)
    ref.add_rows(rows)
    for wrong in (delta_columns(rows[:-1]), delta_columns(rows[:60]),
                  {k: (tuple(v.tolist()), tuple(e.tolist())) for k, (v, e) in delta_columns(rows).items()}):
        h = DeltaHistograms(defs)
        assert h._kept_columns(rows, wrong) is None and h.sketches.rows == 0  # nothing counted
        h.add_rows(rows, wrong)
        assert _state(h) == _state(ref)


def test_values_beyond_int64_raise_as_before():
    defs = delta_defs(default_topology())
    rows = _rows(5, 20, mostly_ok=True)
    rows[3].deltas["firewall_outbound"] = DeltaValue(2**70)
    for cols in (None, delta_columns(rows)):
        h = DeltaHistograms(defs)
        try:
            h.add_rows(rows, cols)
        except OverflowError as exc:
            got = type(exc)
        else:
            got = None
        assert got is OverflowError
    assert isinstance(delta_columns(rows[:3])["firewall_outbound"][0], np.ndarray)
