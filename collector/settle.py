"""Rows handed over as settled: out of the garbage collector's sight where nothing can form a cycle.

A row is ~60 small objects (a PointObs per point, a DeltaValue per delta, GapStats, the dicts holding them), all
built for the row, none able to reference anything but ints and strings. Each one is traversed by every young
collection while it is new and by every older one for as long as the row is kept (``keep_rows``, the row writer's
batch); CPython untracks a plain tuple of such values on its first pass, but never a NamedTuple. The pipeline settles
each batch of rows once they are built (:func:`settle_rows`). Python cannot untrack an object: the reference only
reads the fields; ``collector/_settle.c`` untracks every tuple and dict in them that holds nothing tracked (a dict
tracks itself again when given a container; a tuple cannot change), which is what the collector's first pass would
conclude about each, so nothing observable changes.
"""

from __future__ import annotations

from collections.abc import Iterable

from deltatap.core import native

_acc = native.load("deltatap.collector._settle", __name__)

SETTLED = ("points", "deltas", "gaps", "labels", "trace_ids", "point_bounds", "delta_bounds")  # the Row fields settled


def _settle_rows(rows: Iterable, fields: tuple[str, ...] = SETTLED) -> None:
    """The reference: reads each row's ``fields`` (one a row lacks is skipped)."""
    for r in rows:
        for f in fields:
            getattr(r, f, None)


if _acc is None:
    settle_rows = _settle_rows
else:
    def settle_rows(rows: Iterable, fields: tuple[str, ...] = SETTLED) -> None:
        """:func:`_settle_rows`, and the untracking, in one call (``collector/_settle.c``)."""
        _acc.settle_rows(rows, fields)
