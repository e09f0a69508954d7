"""GapCore (deltatap.core._content, the tap observer's gap statistics) against GapStats (deltatap.core.gap_stats, the
definition), session 21: the heap now a C array kept with heapq's algorithm, ``mean_ns`` a C getter.

Generated gap sequences (zeros, negatives, equal runs, wide and narrow ranges, past the 128 kept ones into the
sketch, small ``top_k`` values) through ``add`` and ``observe`` (and ``gaps_observe``'s n-at-once form) on both: after
every step the count, sum, max, the kept heap list item for item (heap order, not only its contents), the sketch,
zeros, last stamp, ``mean_ns`` and quantiles are identical; ``_top`` is one list read after read, as the
definition's attribute is."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deltatap.core import sse
from deltatap.core.gap_stats import GapStats

pytestmark = pytest.mark.skipif(sse._GapCore is None, reason="deltatap.core._content is not built or DELTATAP_NATIVE turns it off")


def _state(g) -> tuple:
    return (g.count, g.total_ns, g.max_ns, list(g._top), dict(g._buckets), g._zeros, g._last, repr(g.mean_ns),
            [repr(g.quantile_ns(q)) for q in (0.0, 0.5, 0.9, 0.99, 1.0)])


_gap = st.one_of(st.integers(-5, 5), st.integers(0, 3_000), st.integers(0, 10**12), st.sampled_from([0, 1, 1000, 1000]))


@settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(top_k=st.sampled_from([1, 2, 3, 7, 128]),
       steps=st.lists(st.tuples(st.sampled_from(["add", "observe", "observe_n"]), _gap, st.integers(1, 4)), max_size=400))
def test_gapcore_is_gapstats_step_by_step(top_k, steps):
    ref, core = GapStats(top_k), sse._GapCore(top_k)
    assert _state(core) == _state(ref)
    t = 0
    for how, x, n in steps:
        if how == "add":
            ref.add(x)
            core.add(x)
        else:
            t += abs(x)
            for _ in range(n if how == "observe_n" else 1):
                ref.observe(t)
            if how == "observe_n":
                sse._gaps_observe(core, t, n)
            else:
                core.observe(t)
        assert _state(core) == _state(ref)
    assert core._top is core._top and (core._top == ref._top)


def test_mean_ns_is_the_definitions_division():
    ref, core = GapStats(), sse._GapCore()
    assert core.mean_ns == ref.mean_ns == 0.0 and type(core.mean_ns) is float
    for g in (2**60, 2**60 - 1, 3, 2**53 + 1):  # (sums past 2^53: the int division rounds as Python's does)
        ref.add(g)
        core.add(g)
        assert repr(core.mean_ns) == repr(ref.mean_ns)
