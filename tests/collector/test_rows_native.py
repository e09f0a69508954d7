"""The row-plan accelerator (collector/_rows.c) against its Python reference (collector.decompose._plan_values).

On generated plans and values (valid ones, huge ints, floats, None and strings among the values, negative and
out-of-range indices, bools for indices, plan entries of the wrong type or length, unhashable names, a "one
observer" flag that is not a bool), ``plan_values`` must give exactly what the reference gives: the same dicts
(keys in the same order, values of the same types) or the same exception with the same message; the C function
alone gives the same or None (not sure). Run under ``PYTHONMALLOC=debug`` too (see docs/benchmarks.md).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deltatap.collector import decompose
from deltatap.collector.decompose import Decomposer, _plan_values
from deltatap.collector.rows import DeltaValue, PointObs
from deltatap.core import native

pytestmark = pytest.mark.skipif(decompose._acc is None, reason="the C row planner is not built or DELTATAP_NATIVE turns it off: the reference runs")

value = st.one_of(st.integers(min_value=-2**63, max_value=2**63), st.integers(), st.integers(), st.integers(),
                  st.floats(allow_nan=False), st.none(), st.text(max_size=2), st.booleans())
index = st.one_of(st.integers(min_value=0, max_value=12), st.integers(min_value=0, max_value=12), st.integers(min_value=0, max_value=12),
                  st.integers(min_value=-14, max_value=14), st.booleans(), st.integers(min_value=2**63, max_value=2**65), st.none())
name = st.one_of(st.sampled_from(["a", "b", "c", "d", "e"]), st.sampled_from(["a", "b"]), st.just(["unhashable"]), st.integers(0, 3))
point = st.tuples(name, index, index, st.sampled_from(["tap:edge", "client:x"]), st.sampled_from(["tap", "client"]))
delta = st.tuples(name, index, index, index, index, st.one_of(st.booleans(), st.booleans(), st.sampled_from([0, 1, None])))
odd = st.one_of(st.tuples(name, index), st.lists(index, max_size=6), st.integers())  # wrong length, not a tuple


def entries(of):
    return st.lists(st.one_of(of, of, of, of, of, of, of, of, of, odd), max_size=12)


def view(d):
    return [(k, type(v).__name__, [(type(x).__name__, repr(x)) for x in v]) for k, v in d.items()]


def outcome(fn, *args):
    try:
        pts, dls = fn(*args)
        return ("ok", view(pts), view(dls))
    except Exception as exc:  # noqa: BLE001 - whatever the reference does, the accelerated path must do the same
        return (type(exc).__name__, str(exc))


def test_the_accelerator_is_registered_and_used():
    assert native.status()["deltatap.collector._rows"] == "used"
    assert decompose.plan_values is not _plan_values


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(value, max_size=12), st.lists(value, max_size=6), entries(point), entries(delta))
def test_same_as_the_reference(vals, uncs, points, deltas):
    want = outcome(_plan_values, vals, uncs, points, deltas)
    assert outcome(decompose.plan_values, vals, uncs, points, deltas) == want
    try:
        direct = decompose._acc.plan_values(vals, uncs, points, deltas, PointObs, DeltaValue)
    except Exception as exc:  # noqa: BLE001
        assert want == (type(exc).__name__, str(exc))
    else:
        if direct is not None:
            assert want == ("ok", view(direct[0]), view(direct[1]))


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_valid_plans_are_taken_by_the_accelerator(data):
    """What a row plan makes (exact ints in range, bool flags) never falls back, and gives the reference's dicts."""
    n_vals = data.draw(st.integers(1, 20))
    n_spans = data.draw(st.integers(1, 6))
    vals = data.draw(st.lists(st.integers(min_value=-2**70, max_value=2**70), min_size=n_vals, max_size=n_vals))
    uncs = data.draw(st.lists(st.integers(min_value=0, max_value=2**40), min_size=n_spans, max_size=n_spans))
    vi, si = st.integers(0, n_vals - 1), st.integers(0, n_spans - 1)
    points = data.draw(st.lists(st.tuples(st.text(max_size=3), vi, si, st.text(max_size=3), st.text(max_size=3)), max_size=20))
    deltas = data.draw(st.lists(st.tuples(st.text(max_size=3), vi, vi, si, si, st.booleans()), max_size=30))
    direct = decompose._acc.plan_values(vals, uncs, points, deltas, PointObs, DeltaValue)
    assert direct is not None
    assert ("ok", view(direct[0]), view(direct[1])) == outcome(_plan_values, vals, uncs, points, deltas)
    assert all(type(v) is PointObs for v in direct[0].values()) and all(type(v) is DeltaValue for v in direct[1].values())


def test_other_arguments_are_left_to_the_reference():
    f = decompose._acc.plan_values
    assert f((1,), [0], [], [], PointObs, DeltaValue) is None  # a tuple of values
    assert f([1], [0], [("a", 0, 0, "o", "s")], [], dict, DeltaValue) is None  # not a tuple type
    assert f([1], [0], [("a", 0, 0, "o", "s")], [], PointObs, 3) is None
    with pytest.raises(TypeError):
        f([1], [0], [], [])


def test_rows_from_the_pipeline_are_the_same(monkeypatch):
    """Real requests through one Decomposer with the accelerator and one with the reference: the same rows."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    try:
        import collector_throughput as ct
    finally:
        sys.path.pop(0)
    from deltatap.collector.compact import decode_compact
    from deltatap.collector.pipeline import Pipeline, PipelineOptions

    exports = ct.build_exports(300, 50, with_client=True)

    def rows():
        p = Pipeline(options=PipelineOptions(grace_s=0.2, join_hold_s=0.2, orphan_wait_s=10.0, keep_rows=0))
        for data in exports:
            for f in p.assembler.add(decode_compact(data), 0.0):
                p.joiner.add(f, 0.0)
        for f in p.assembler.flush(1.0):
            p.joiner.add(f, 1.0)
        return [repr(r) for r in p._rows(p.joiner.flush())]

    fast = rows()
    monkeypatch.setattr(decompose, "plan_values", _plan_values)
    assert rows() == fast and len(fast) == 300
