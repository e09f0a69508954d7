"""Rows held as columns per batch: the pipeline's usual rows, built and aggregated without a Python object per value.

A tick's joined requests are grouped by their row plan (the Shapes of their spans: which observation each point
takes and which pair each delta uses, :meth:`Decomposer.row_plan`) and by which tap-overhead, inter-token-gap and
residual deltas they have. Each group is one :class:`RowBlock`: the observations' times as one int64 matrix (a row
per request), the spans' clock uncertainties as another, and every delta as a column computed over the whole block:
a point delta is the masked ``end - start`` of two matrix columns, its error bound the sum of the two spans'
uncertainties unless one observer saw both; a tap's overhead is its span's attribute; an intermediary's added
inter-token gap is the statistic it released minus the one it received; the residual is system TTFT minus every
TTFT term. The aggregates (:class:`~deltatap.collector.rows.DeltaColumns`, the sketches, the Prometheus
histograms) read those columns as they are.

Each request still gets its :class:`~deltatap.collector.rows.Row` (a :class:`BlockRow`), with everything but its
points and deltas filled by the same code as every other row (:meth:`Decomposer.finish_row`); its ``points`` and
``deltas`` dicts are made from the block the first time something reads them (a rows file, a report, a re-export),
through the row plan's reference (:func:`deltatap.collector.decompose.plan_values`) and the block's columns, so the
row equals the one :meth:`Decomposer.build_row` builds (tests/collector/test_batch_rows.py checks it on generated
span sets). A block read as columns (:mod:`deltatap.collector.colread`) keeps its rows' ``gaps`` (each tap's
inter-token gap statistics) as columns too until one is read (:func:`~deltatap.collector.colread.gap_rows`): the
aggregates never read them, a rows file or a report does.

Everything else takes the per-row way, :meth:`Decomposer.build_row`: spans stating stamp intervals, Shapes without a
row plan (one point observed twice at one rank: retries), and a block whose numbers do not fit the arithmetic (a
time past int64, a missing value among present ones, a sum that could overflow int64): those rows are built again,
one by one, exactly as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain
from typing import Any

import numpy as np

from deltatap.collector import colread
from deltatap.collector.decompose import Decomposer, _any_bounded, _tap_names, plan_values
from deltatap.collector.deltas import RESIDUAL, SYSTEM_TTFT
from deltatap.collector.rows import DeltaColumns, DeltaValue, LinkGaps, PointObs, Row, to_record
from deltatap.collector.settle import SETTLED, settle_rows

_POINTS, _DELTAS, _GAPS = Row.points, Row.deltas, Row.gaps  # the Row slots BlockRow fills on first read
_LAZY = ("points", "deltas", "gaps")
_LAZY_FREE = tuple(f for f in SETTLED if f not in _LAZY)
_SAFE = 1 << 58  # a column whose values stay within +-2**58: a sum of up to 31 of them fits in int64
_new = tuple.__new__
_EMPTY: dict = {}  # (never written to: to_record only reads)


class BlockRow(Row):
    """A :class:`Row` whose ``points`` and ``deltas`` (and, read as columns, ``gaps``) live in a :class:`RowBlock`
    until first read."""

    __slots__ = ("_block", "_i")

    def _points(self) -> dict[str, PointObs]:
        v = _POINTS.__get__(self)
        if v is None:
            self._block.materialise(self)
            v = _POINTS.__get__(self)
        return v

    def _deltas(self) -> dict[str, DeltaValue]:
        v = _DELTAS.__get__(self)
        if v is None:
            self._block.materialise(self)
            v = _DELTAS.__get__(self)
        return v

    def _gaps(self) -> dict[str, LinkGaps]:
        v = _GAPS.__get__(self)
        if v is None:
            fill_gaps((self,))
            v = _GAPS.__get__(self)
        return v

    # (set through the slots' own C setters: Row's __init__ sets them on every row)
    points = property(_points, _POINTS.__set__)  # type: ignore[assignment]
    deltas = property(_deltas, _DELTAS.__set__)  # type: ignore[assignment]
    gaps = property(_gaps, _GAPS.__set__)  # type: ignore[assignment]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Row):
            return NotImplemented
        return all(getattr(self, f) == getattr(other, f) for f in Row.__dataclass_fields__)

    __hash__ = None  # type: ignore[assignment]


def _held(row: Row) -> bool:
    """Whether ``row``'s deltas are still only in its block."""
    return row.__class__ is BlockRow and _DELTAS.__get__(row) is None


def delta_keys(row: Row) -> tuple[str, ...]:
    """The names of ``row``'s deltas, in order (of a block's row: read from its block, nothing materialised)."""
    return row._block.names if _held(row) else tuple(row.deltas)  # type: ignore[attr-defined]


class RowBlock:
    """The points and deltas of requests that share one row plan and one set of deltas, as int64 columns."""

    __slots__ = ("plan", "rows", "groups", "exs", "vals", "uncs", "names", "within", "ns", "err", "_lists", "_extra", "engine_last", "times", "_record", "cols", "_gaps")

    def __init__(self, plan: Any, engine_last: str) -> None:
        self.plan = plan
        # where the engine's last-token point and every point's time are among the observations
        self.engine_last = next((i for p, i, *_ in plan.points if p == engine_last), None)
        self.times = [p[1] for p in plan.points]
        self.rows: list[tuple[int, BlockRow]] = []  # (place in the batch, row)
        self.groups: list[Any] = []
        self.exs: list[Any] = []
        self.vals: list[list[int]] | np.ndarray = []
        self.uncs: list[list[int]] | np.ndarray = []
        self.names: tuple[str, ...] = ()
        self.within: tuple[bool, ...] = ()
        self.ns = self.err = np.zeros((0, 0), np.int64)
        self._lists: tuple[list, list, list, list] | None = None
        self._extra = 0  # how many of the deltas come after the plan's point deltas
        self._record: tuple[list[str], list[list]] | None = None
        # read as columns (collector/colread.py): {link: (request, first token) overhead columns}, {link: (up, down) gap
        # columns (count, mean, p99, max)}, the links' attempts; else None: read from each request's Extracted
        self.cols: tuple[dict, dict, dict] | None = None
        self._gaps: list[dict] | None = None  # each request's gaps, once one was read (colread.gap_rows)

    def materialise(self, row: BlockRow) -> None:
        """Fill ``row``'s points and deltas: the row plan's through its reference, then the block's own columns."""
        if self._lists is None:
            self._lists = (self.vals.tolist(), self.uncs.tolist(), self.ns[:, len(self.names) - self._extra:].tolist(),  # type: ignore[union-attr]
                           self.err[:, len(self.names) - self._extra:].tolist())
        vals, uncs, ns, err = self._lists
        i = row._i
        points, deltas = plan_values(vals[i], uncs[i], self.plan.points, self.plan.deltas)
        if self._extra:
            for name, n, e, w in zip(self.names[-self._extra:], ns[i], err[i], self.within[-self._extra:], strict=True):
                deltas[name] = _new(DeltaValue, (n, e, w))
        _POINTS.__set__(row, points)
        _DELTAS.__set__(row, deltas)
        settle_rows([row], _LAZY[:2])  # settled as the pipeline settles every row it builds

    def gap_rows(self) -> list[dict]:
        """Each request's gaps, from the block's gap columns (a block read as columns), built once."""
        if self._gaps is None:
            self._gaps = colread.gap_rows(self.cols[1], len(self.vals))  # type: ignore[index]
        return self._gaps

    def record_items(self, i: int) -> zip:
        """The point and delta columns of the flat record (:func:`~deltatap.collector.rows.to_record`) of the block's
        ``i``-th row, in the order ``to_record`` sets them, from the block's matrices (no point or delta object built)."""
        if self._record is None:
            v, u, n = self.vals, self.uncs, len(self.vals)  # type: ignore[arg-type]
            keys: list[str] = []
            cols = np.empty((n, 3 * (len(self.plan.points) + len(self.names))), object)
            for k, (p, oi, si, observer, source) in enumerate(self.plan.points):
                keys += (f"pt.{p}.unix_ns", f"pt.{p}.unc_ns", f"pt.{p}.src")
                cols[:, 3 * k], cols[:, 3 * k + 1], cols[:, 3 * k + 2] = v[:, oi], u[:, si], f"{observer}/{source}"  # type: ignore[call-overload]
            at = 3 * len(self.plan.points)
            for k, (name, w) in enumerate(zip(self.names, self.within, strict=True)):
                keys += (f"d.{name}.ns", f"d.{name}.err_ns", f"d.{name}.within")
                cols[:, at + 3 * k], cols[:, at + 3 * k + 1], cols[:, at + 3 * k + 2] = self.ns[:, k], self.err[:, k], w
            self._record = (keys, cols.tolist())
        return zip(self._record[0], self._record[1][i])

    def close(self, dec: Decomposer) -> bool:
        """Work out every column; False when the numbers do not fit (the caller builds these rows the per-row way)."""
        n = len(self.exs)
        if self.vals.__class__ is np.ndarray:  # read as columns
            v, u = self.vals, self.uncs
        else:
            v, u = _matrix(self.vals, n), _matrix(self.uncs, n)  # type: ignore[arg-type]
        if v is None or u is None:
            return False
        if v.size and int(v.max()) - int(v.min()) >= 1 << 63 or u.size and int(u.max()) >= 1 << 62:
            return False  # a difference of two times, or a sum of two uncertainties, past int64
        self.vals, self.uncs = v, u
        names: list[str] = []
        within: list[bool] = []
        ns: list[np.ndarray] = []
        err: list[np.ndarray] = []

        def add(name: str, w: bool, n_: np.ndarray, e_: np.ndarray) -> None:
            names.append(name)
            within.append(w)
            ns.append(n_)
            err.append(e_)

        zero = np.zeros(n, np.int64)
        for name, e, s, es, ss, same in self.plan.deltas:
            add(name, same, v[:, e] - v[:, s], zero if same else u[:, es] + u[:, ss])
        n_plan = len(names)
        ex0 = self.exs[0]
        overheads, gaps = self.cols[:2] if self.cols is not None else (ex0.tap_overhead, ex0.gaps)
        for k, link in enumerate(overheads):  # each tap's own overheads (request, first token)
            for name, j in zip(dec.tap_names.get(link) or _tap_names(link), (0, 1), strict=True):
                col = overheads[link][j] if self.cols is not None else _column([ex.tap_overhead[link][j] for ex in self.exs])
                if col is False:
                    return False
                if col is not None:
                    add(name, True, col, zero)
        for link_out, link_in, *stat_names in dec.mid_links:  # each intermediary's added inter-token gaps
            if link_out not in gaps or link_in not in gaps:
                continue
            if self.cols is not None:
                up_c, down_c = gaps[link_out][0], gaps[link_in][1]
                if up_c is None or down_c is None:
                    continue
                pairs = [(up_c[j], down_c[j]) for j in (1, 2, 3)]
            else:
                ups = [ex.gaps[link_out].up for ex in self.exs]
                downs = [ex.gaps[link_in].down for ex in self.exs]
                has = (ups[0] is not None, downs[0] is not None)
                if any((a is not None, b is not None) != has for a, b in zip(ups, downs)):
                    return False
                if not all(has):
                    continue
                pairs = [(_column([g[j] for g in ups]), _column([g[j] for g in downs])) for j in (1, 2, 3)]
            for name, (a, b) in zip(stat_names, pairs, strict=True):
                if a is False or b is False:
                    return False
                if a is not None and b is not None:
                    if not (_safe(a) and _safe(b)):
                        return False
                    add(name, False, a - b, zero)
        if SYSTEM_TTFT in names and len(set(names)) == len(names):  # system TTFT minus every TTFT term
            terms = dec._residual_terms(ex0.attempts if self.cols is None else self.cols[2])
            idx = [names.index(t) for t in terms if t in names]
            if len(idx) == len(terms):
                i0 = names.index(SYSTEM_TTFT)
                parts = [i0, *idx]
                if len(parts) > 31 or not all(_safe(ns[i]) and _safe(err[i]) for i in parts):
                    return False
                add(RESIDUAL, False, ns[i0] - np.sum([ns[i] for i in idx], axis=0, dtype=np.int64) if idx else ns[i0].copy(),
                    err[i0] + np.sum([err[i] for i in idx], axis=0, dtype=np.int64) if idx else err[i0].copy())
        if len(set(names)) != len(names):
            return False  # a name met twice: the per-row way says which value wins
        self.names, self.within, self._extra = tuple(names), tuple(within), len(names) - n_plan
        self.ns = np.stack(ns, axis=1) if ns else np.zeros((n, 0), np.int64)
        self.err = np.stack(err, axis=1) if err else np.zeros((n, 0), np.int64)
        self.exs = []
        return True


def _matrix(lists: list[list[int]], n: int) -> np.ndarray | None:
    """Equally long lists of ints as an int64 matrix (a row per list); None when one is not an int or past int64."""
    flat, width = list(chain.from_iterable(lists)), len(lists[0])
    if len(flat) != n * width or set(map(type, flat)) - {int}:
        return None
    try:
        return np.fromiter(flat, np.int64, len(flat)).reshape(n, width)
    except OverflowError:
        return None


def _column(values: list) -> np.ndarray | None | bool:
    """One delta's values as int64 (None: absent in every row; False: absent in some, or not int64 integers)."""
    if values[0] is None:
        return None if all(x is None for x in values) else False
    try:
        col = np.array(values)
    except (OverflowError, ValueError, TypeError):
        return False
    return col if col.dtype == np.int64 else False  # (a None, a float, an int past int64: not this way)


def _safe(col: np.ndarray) -> bool:
    return not col.size or (int(col.max()) < _SAFE and int(col.min()) > -_SAFE)


def build_rows(dec: Decomposer, groups: Sequence[Any]) -> list[Row]:
    """The rows of joined ``groups`` (:class:`deltatap.collector.join.Group`), in order: held in blocks where they
    can be (read as columns where their layouts allow, :mod:`deltatap.collector.colread`), else built one by one
    (:meth:`Decomposer.build_row`)."""
    rows: list[Any] = [None] * len(groups)
    done: list[RowBlock] = []
    rest = _column_blocks(dec, groups, rows, done)
    blocks: dict[tuple, RowBlock] = {}
    extract, plan_of, finish, engine_last = dec.extract_flat, dec.row_plan, dec.finish_row, dec.engine_last
    for at in rest:
        g = groups[at]
        spans = g.spans
        if not _any_bounded(spans):
            ex, vals, uncs, shapes, _ = extract(spans)
            rp = plan_of(shapes)
            if rp is not None and not ex.tap_overhead_bounds:
                key = (shapes, tuple(ex.tap_overhead), tuple(ex.gaps), tuple(ex.attempts))
                blk = blocks.get(key)
                if blk is None:
                    blk = blocks[key] = RowBlock(rp, engine_last)
                eng = None if blk.engine_last is None else vals[blk.engine_last]
                row = finish(ex, spans, g.method, g.note, g.trace_ids, None, None, eng, (vals[i] for i in blk.times), BlockRow)
                row._block, row._i = blk, len(blk.exs)
                blk.rows.append((at, row))
                blk.groups.append(g)
                blk.exs.append(ex)
                blk.vals.append(vals)  # type: ignore[union-attr]
                blk.uncs.append(uncs)  # type: ignore[union-attr]
                rows[at] = row
                continue
        rows[at] = dec.build_row(spans, g.method, g.note, g.trace_ids)
    for blk in (*done, *blocks.values()):
        if not blk.close(dec):
            for (at, _), g in zip(blk.rows, blk.groups, strict=True):
                rows[at] = dec.build_row(g.spans, g.method, g.note, g.trace_ids)
        blk.groups, blk.rows = [], []  # (its rows hold it: no cycle left behind)
    return rows


def _column_blocks(dec: Decomposer, groups: Sequence[Any], rows: list, done: list) -> list[int]:
    """Read the groups that share a sequence of compact span layouts (at least ``colread.MIN_BLOCK`` of them) as
    columns, one block per sequence, into ``rows`` (``done``: those blocks); the places of the others, in order."""
    by: dict[tuple, list[int]] = {}
    rest: list[int] = []
    spans = [g.spans for g in groups]
    for at, sp in enumerate(spans):
        try:
            key = tuple([s.layout for s in sp])
        except AttributeError:  # a span read the plain way
            rest.append(at)
            continue
        got = by.get(key)
        if got is None:
            by[key] = [at]
        else:
            got.append(at)
    if len(by) == len(groups) - len(rest):  # every request its own sequence: nothing to read as columns
        return list(range(len(groups)))
    for key, ats in by.items():
        if len(ats) < colread.MIN_BLOCK or not _read_columns(dec, key, [groups[at] for at in ats], [spans[at] for at in ats], ats, rows, done):
            rest += ats
    rest.sort()
    return rest


def _read_columns(dec: Decomposer, layouts: tuple, gs: list, sps: list[list], ats: list[int], rows: list, done: list) -> bool:
    spans = sps[0]
    lcs = []
    for lay, span in zip(layouts, spans, strict=True):
        prog = dec.layout_reader(lay)
        if prog is None and lay not in dec._by_layout:  # not seen yet: compiled now
            dec.program(span)
            prog = dec.layout_reader(lay)
        if prog is None:
            return False
        lc = colread.layout_columns(dec, lay, prog)
        if lc is None:
            return False
        lcs.append(lc)
    ex, _, _, shapes, _ = dec.extract_flat(spans)  # (the Shapes: one per layout)
    rp = dec.row_plan(shapes)
    if rp is None or ex.tap_overhead_bounds:
        return False
    got = colread.read_group(dec, lcs, gs, sps, rp, RowBlock, BlockRow)
    if got is None:
        return False
    blk, brows = got
    for at, row in zip(ats, brows, strict=True):
        rows[at] = row
    blk.rows, blk.groups = list(zip(ats, brows, strict=True)), gs
    done.append(blk)
    return True


class BlockColumns(DeltaColumns):
    """:class:`DeltaColumns` that also take a block's columns as they are."""

    __slots__ = ()

    def add_block(self, keys: tuple[str, ...], ns: np.ndarray, err: np.ndarray) -> None:
        """Rows' deltas given as int64 matrices, a row per request and a column per name in ``keys``."""
        self._blocks.append((keys, ns.ravel(), err.ravel()))
        self._keys, self._ns, self._err = (), [], []  # (rows added after it start a block of their own)
        self._blocks.append((self._keys, self._ns, self._err))


def columns_of(rows: list[Row]) -> BlockColumns:
    """The rows' delta columns (:class:`DeltaColumns`), each block's taken as it is, in row order."""
    cols = BlockColumns()
    i, n = 0, len(rows)
    while i < n:
        r = rows[i]
        if _held(r):
            blk, a = r._block, r._i  # type: ignore[attr-defined]
            j = i + 1
            while j < n and _held(rows[j]) and rows[j]._block is blk and rows[j]._i == a + j - i:  # type: ignore[attr-defined]
                j += 1
            cols.add_block(blk.names, blk.ns[a:a + j - i], blk.err[a:a + j - i])
        else:
            j = i + 1
            while j < n and not _held(rows[j]):
                j += 1
            cols.add_rows(rows[i:j])
        i = j
    return cols


def fill_gaps(rows: Sequence[Any]) -> None:
    """Fill the gaps of the rows among ``rows`` whose gaps are still held in their block, settled as the pipeline
    settles every row (a rows file fills a whole batch's at once)."""
    held = [r for r in rows if r.__class__ is BlockRow and _GAPS.__get__(r) is None]
    for r in held:
        _GAPS.__set__(r, r._block.gap_rows()[r._i])
    if held:
        settle_rows(held, _LAZY[2:])


def records(rows: Sequence[Row], topology: Any) -> list[dict[str, Any]]:
    """:func:`~deltatap.collector.rows.to_record` of each row; a held row's points and deltas come from its block's
    columns (:meth:`RowBlock.record_items`), everything else from ``to_record`` itself."""
    fill_gaps(rows)
    out = []
    for r in rows:
        if _held(r):
            _POINTS.__set__(r, _EMPTY)  # (for to_record: none of its own; put back below, nothing else runs between)
            _DELTAS.__set__(r, _EMPTY)
            try:
                rec = to_record(r, topology)
            finally:
                _POINTS.__set__(r, None)
                _DELTAS.__set__(r, None)
            rec.update(r._block.record_items(r._i))  # type: ignore[attr-defined]
        else:
            rec = to_record(r, topology)
        out.append(rec)
    return out


def settle(rows: list[Row]) -> None:
    """:func:`~deltatap.collector.settle.settle_rows`, leaving a block's rows' points and deltas unread."""
    plain = [r for r in rows if r.__class__ is not BlockRow]
    if plain:
        settle_rows(plain)
    if len(plain) < len(rows):
        settle_rows([r for r in rows if r.__class__ is BlockRow], _LAZY_FREE)
