"""The delta-columns accelerator (collector/_columns.c) against its Python reference (``DeltaColumns.add``, row by row).

On generated batches (rows whose deltas have the same or different keys, empty ones, keys that are not exact strs,
values that are DeltaValues, plain tuples, too short, lists, a tuple subclass that indexes its own way, rows with no
``deltas`` or one that raises, several batches into one DeltaColumns) ``DeltaColumns.add_rows`` must leave exactly the
blocks the reference leaves and give the same columns, or raise the same exception after the same rows. Run under
``PYTHONMALLOC=debug`` too (see docs/benchmarks.md).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deltatap.collector import rows as rows_mod
from deltatap.collector.rows import DeltaColumns, DeltaValue, Row
from deltatap.core import native

pytestmark = pytest.mark.skipif(rows_mod._acc is None, reason="the C delta columns are not built or DELTATAP_NATIVE turns them off: the reference runs")


class Str(str):
    def __eq__(self, other):
        return True

    __hash__ = str.__hash__


class OwnIndex(tuple):
    def __getitem__(self, i):
        return ("own", i)


class NoDeltas:
    __slots__ = ()


class RaisingDeltas:
    @property
    def deltas(self):
        raise RuntimeError("no deltas here")


key = st.one_of(st.sampled_from(["a", "b", "c", "d"]), st.sampled_from(["a", "b"]), st.builds(Str, st.sampled_from(["a", "b"])), st.integers(0, 2))
num = st.one_of(st.integers(min_value=-2**63, max_value=2**63 - 1), st.integers(), st.none(), st.floats(allow_nan=False))
value = st.one_of(st.builds(DeltaValue, num, num, st.booleans()), st.builds(DeltaValue, num, num, st.booleans()), st.tuples(num, num),
                  st.tuples(num), st.lists(num, min_size=2, max_size=3), st.builds(lambda a, b: OwnIndex((a, b)), num, num), num)
usual = st.sampled_from([{"a": DeltaValue(1, 0, True), "b": DeltaValue(2, 3, False)}, {"b": DeltaValue(5, 1, True)}, {}])
deltas = st.one_of(usual, usual, usual, st.dictionaries(key, value, max_size=4), st.lists(st.tuples(key, value), max_size=3))


def row_of(d):
    if isinstance(d, list):  # not a dict: the Python way's business
        r = Row("t")
        r.deltas = d  # type: ignore[assignment]
        return r
    return Row("t", deltas=dict(d))


item = st.one_of(deltas.map(row_of), deltas.map(row_of), deltas.map(row_of), st.just(NoDeltas()), st.just(RaisingDeltas()))


def run(batches, fast: bool):
    cols = DeltaColumns()
    for b in batches:
        try:
            if fast:
                cols.add_rows(b)
            else:
                for r in b:
                    cols.add(r)
        except Exception as exc:  # noqa: BLE001 - whatever the reference does, the accelerated path must do the same
            return ("raised", type(exc).__name__, str(exc), repr(cols._blocks), cols._keys)
    try:
        got = cols.columns()
        shown = {k: (repr(list(v)), repr(list(e))) for k, (v, e) in got.items()}
    except Exception as exc:  # noqa: BLE001
        shown = (type(exc).__name__, str(exc))
    return ("ok", repr(cols._blocks), cols._keys, shown)


def test_the_accelerator_is_registered_and_used():
    assert native.status()["deltatap.collector._columns"] == "used"


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(item, max_size=8), max_size=4))
def test_same_as_the_reference(batches):
    assert run(batches, True) == run(batches, False)


def test_the_usual_batch_is_taken_in_one_call(monkeypatch):
    rows = [Row("t", deltas={"a": DeltaValue(i, 0, True), "b": DeltaValue(-i, 2, False)}) for i in range(100)]
    rows += [Row("t", deltas={"c": DeltaValue(7, 1, True)})]
    calls = []
    real = rows_mod._acc.add_rows
    monkeypatch.setattr(rows_mod, "_acc", type("Acc", (), {"add_rows": staticmethod(lambda *a: calls.append(a[2]) or real(*a))}))
    cols = DeltaColumns()
    cols.add_rows(rows)
    assert calls == [0]
    got = cols.columns()
    assert list(got) == ["a", "b", "c"] and got["a"][0].tolist() == list(range(100)) and got["c"][1].tolist() == [1]


def test_odd_arguments():
    f = rows_mod._acc.add_rows
    with pytest.raises(TypeError):
        f((), [], 0)  # blocks: a list
    with pytest.raises(TypeError):
        f([], (), 0)  # rows: a list
    assert f([], [Row("t")], 5) == 5  # past the end: nothing taken
    assert f([("not", "a", "block")], [Row("t", deltas={"a": DeltaValue(1, 0, True)})], 0) == 0  # a block it does not know: not taken
