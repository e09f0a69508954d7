"""A block's rows read as columns (``collector/colread.py``) hold their ``gaps`` in the block until first read
(``BlockRow.gaps``, ``colread.gap_rows``), as their points and deltas: nothing is built for a row nobody reads,
and what a read builds equals the row built the per-request way (``Decomposer.build_row``), settled as the
pipeline settles every row (no dict or tuple of it left for the garbage collector to traverse)."""

from __future__ import annotations

import gc

import pytest

from deltatap.collector import settle
from deltatap.collector.batch import BlockRow
from deltatap.collector.rows import Row, to_record
from tests.collector.test_rows_settle import bench_groups


def test_block_rows_build_their_gaps_on_first_read_as_the_per_request_way():
    p, groups = bench_groups(60)
    rows = p._rows(groups)
    assert len(rows) == 60
    held = [r for r in rows if r.__class__ is BlockRow and Row.gaps.__get__(r) is None]
    assert len(held) == 60  # read as columns: no gaps built yet (the pipeline's settling did not read them)
    want = [p.decomposer.build_row(g.spans, g.method, g.note, g.trace_ids) for g in groups]
    first = held[7].gaps  # one read builds the block's gaps, and sets this row's
    assert first == want[7].gaps and len(first) == 3
    assert Row.gaps.__get__(held[8]) is None  # another row's slot stays empty until it is read
    for r, w in zip(rows, want, strict=True):
        assert r.gaps == w.gaps
        assert to_record(r, p.topo) == to_record(w, p.topo)
    if settle._acc is not None:
        assert not any(gc.is_tracked(r.gaps) for r in rows)
        assert not any(gc.is_tracked(lg) for r in rows for lg in r.gaps.values())


@pytest.mark.parametrize("n", [9])
def test_rows_equal_after_gaps_are_read_in_any_order(n: int):
    p, groups = bench_groups(n)
    rows = p._rows(groups)
    want = [p.decomposer.build_row(g.spans, g.method, g.note, g.trace_ids) for g in groups]
    for r, w in zip(reversed(rows), reversed(want), strict=True):
        assert r == w


def test_a_rows_file_batch_fills_every_held_rows_gaps_at_once():
    from deltatap.collector.batch import records

    p, groups = bench_groups(20)
    rows = p._rows(groups)
    assert all(Row.gaps.__get__(r) is None for r in rows)
    want = [p.decomposer.build_row(g.spans, g.method, g.note, g.trace_ids) for g in groups]
    assert records(rows, p.topo) == [to_record(w, p.topo) for w in want]
    assert all(Row.gaps.__get__(r) == w.gaps for r, w in zip(rows, want, strict=True))  # filled by records()
    if settle._acc is not None:
        assert not any(gc.is_tracked(Row.gaps.__get__(r)) for r in rows)
