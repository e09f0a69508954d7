"""Rows handed over as settled (``collector.settle.settle_rows``; ``collector/_settle.c`` untracks from the garbage
collector every tuple and dict of a row that can be in no reference cycle) and the sketch digests two aggregates
share (``Aggregator.add_columns(shared=...)``): neither may change a value.

Settling is checked on real rows from the pipeline and on generated fields (nested tuples, NamedTuples, dicts,
lists, a cycle): the rows compare equal before and after, and whatever is untracked holds nothing tracked (so it
can be in no cycle the collector would have to find); a dict that is given a container later is tracked again, and
a cycle through a row's field is still collected.
"""

from __future__ import annotations

import gc
import sys
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deltatap.collector import settle
from deltatap.collector.compact import decode_compact
from deltatap.collector.pipeline import Pipeline, PipelineOptions
from deltatap.collector.rows import DeltaColumns, Row
from deltatap.collector.sketches import Aggregator

native = pytest.mark.skipif(settle._acc is None, reason="the C row settler is not built or DELTATAP_NATIVE turns it off: the reference runs")


def bench_groups(n: int) -> tuple[Pipeline, list]:
    """A pipeline and the joined groups of ``n`` of benchmarks/collector_throughput.py's requests (not yet rows)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    try:
        import collector_throughput as ct
    finally:
        sys.path.pop(0)
    p = Pipeline(options=PipelineOptions(grace_s=0.2, join_hold_s=0.2, orphan_wait_s=10.0, keep_rows=0))
    for data in ct.build_exports(n, 50, with_client=True):
        for f in p.assembler.add(decode_compact(data), 0.0):
            p.joiner.add(f, 0.0)
    for f in p.assembler.flush(1.0):
        p.joiner.add(f, 1.0)
    return p, p.joiner.flush()


def _bench_rows(n: int) -> list[Row]:
    p, groups = bench_groups(n)
    rows = p._rows(groups)  # (settled there)
    assert len(rows) == n
    return rows


def _walk(o, seen=None):
    """Every tuple and dict reachable from ``o`` through tuples and dicts (what settling may touch)."""
    seen = set() if seen is None else seen
    if id(o) in seen or not isinstance(o, tuple | dict):
        return
    seen.add(id(o))
    yield o
    for x in (o.values() if isinstance(o, dict) else o):
        yield from _walk(x, seen)
    if isinstance(o, dict):
        for k in o:
            yield from _walk(k, seen)


def _no_tracked_inside(o) -> bool:
    items = list(o.values()) + list(o) if isinstance(o, dict) else list(o)
    return not any(gc.is_tracked(x) for x in items)


FIELDS = settle.SETTLED


def _check_invariant(rows) -> int:
    untracked = 0
    for r in rows:
        for f in FIELDS:
            for o in _walk(getattr(r, f)):
                if not gc.is_tracked(o):
                    untracked += 1
                    assert _no_tracked_inside(o), (f, o)
    return untracked


@native
def test_pipeline_rows_are_settled_and_unchanged():
    rows = _bench_rows(150)
    before = [repr(r) for r in rows]
    assert _check_invariant(rows) > 150 * 20  # every point and delta of every row at least
    assert all(not gc.is_tracked(v) for r in rows for v in (*r.points.values(), *r.deltas.values()))
    assert all(not gc.is_tracked(r.points) and not gc.is_tracked(r.deltas) for r in rows)
    settle.settle_rows(rows)  # twice: nothing more to do, nothing changes
    assert [repr(r) for r in rows] == before


class Pair(NamedTuple):
    a: object
    b: object


class WithDict(tuple):
    """A tuple subclass whose instances have a __dict__: it could hold a cycle, so it stays tracked."""


leaf = st.one_of(st.integers(), st.text(max_size=3), st.none(), st.booleans(), st.floats(allow_nan=False))
tree = st.recursive(leaf, lambda kids: st.one_of(st.tuples(kids, kids), st.builds(Pair, kids, kids), st.lists(kids, max_size=3),
                                                 st.dictionaries(st.text(max_size=2), kids, max_size=3), st.builds(lambda x: WithDict((x,)), kids)),
                    max_leaves=12)


def _fresh(v):
    """A copy made of new (tracked) containers, as a row's fields are when built."""
    if isinstance(v, WithDict):
        return WithDict(_fresh(x) for x in v)
    if isinstance(v, Pair):
        return Pair(_fresh(v.a), _fresh(v.b))
    if isinstance(v, tuple):
        return tuple(_fresh(x) for x in v)
    if isinstance(v, list):
        return [_fresh(x) for x in v]
    if isinstance(v, dict):
        return {k: _fresh(x) for k, x in v.items()}
    return v


@native
@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(FIELDS), tree, max_size=len(FIELDS)))
def test_generated_fields_keep_their_values_and_only_cycle_free_containers_are_untracked(fields):
    row = Row("t")
    for k, v in fields.items():
        setattr(row, k, _fresh(v))
    want = repr(row)
    settle.settle_rows([row])
    assert repr(row) == want
    _check_invariant([row])
    for f in FIELDS:
        for o in _walk(getattr(row, f)):
            if isinstance(o, WithDict) or any(isinstance(x, list | WithDict) for x in (o.values() if isinstance(o, dict) else o)):
                assert gc.is_tracked(o)


@native
def test_a_settled_dict_given_a_container_is_tracked_again_and_cycles_are_still_collected():
    row = Row("t", labels={"a": "b"})
    settle.settle_rows([row])
    assert not gc.is_tracked(row.labels)
    row.labels["x"] = []  # the dict tracks itself again
    assert gc.is_tracked(row.labels)
    cyc: list = []
    holder = (cyc,)
    cyc.append(holder)
    row.gaps = {"link": holder}
    settle.settle_rows([row])
    assert gc.is_tracked(holder) and gc.is_tracked(row.gaps)
    import weakref

    class Box:
        pass

    box = Box()
    cyc.append(box)
    ref = weakref.ref(box)
    del row, holder, cyc, box
    gc.collect()
    assert ref() is None


def _outcome(fn, *args):
    try:
        return ("ok", fn(*args))
    except Exception as exc:  # noqa: BLE001 - whatever the reference does, the accelerated path must do the same
        return (type(exc).__name__, str(exc))


class Raises:
    @property
    def points(self):
        raise RuntimeError("boom")


class NoRowFields:
    __slots__ = ()


@native
@pytest.mark.parametrize("rows", [3, None, [object(), 1, "x"], [NoRowFields()], [Raises()], iter([Row("t")]), (Row("t"), Raises()), "ab"])
def test_odd_arguments_as_the_reference(rows):
    assert _outcome(settle.settle_rows, rows) == _outcome(settle._settle_rows, rows)
    with pytest.raises(TypeError):
        settle._acc.settle_rows([], ["points"])  # the fields: a tuple of names


def test_shared_digests_give_the_same_aggregates():
    """Two aggregates fed the same columns with one shared digest per column equal two fed separately."""
    rng = np.random.default_rng(7)
    cols = DeltaColumns()
    for r in _bench_rows(120):
        cols.add(r)
    columns = cols.columns()
    columns["neg"] = (rng.integers(-10**9, 10**9, 40), rng.integers(0, 10, 40))
    columns["empty"] = (np.zeros(0, np.int64), np.zeros(0, np.int64))
    apart = [Aggregator(), Aggregator()]
    together = [Aggregator(), Aggregator()]
    shared: dict = {}
    for a in apart:
        a.add_columns(columns, {})
    for a in together:
        a.add_columns(columns, {}, shared)
    assert len(shared) == len(columns)
    for a, b in zip(apart, together, strict=True):
        assert a.to_dict() == b.to_dict() and a.summaries() == b.summaries()
    other = Aggregator(0.01)  # another accuracy: its own digests
    other.add_columns(columns, {}, shared)
    alone = Aggregator(0.01)
    alone.add_columns(columns, {})
    assert other.to_dict() == alone.to_dict()
