"""The span kinds' readers run over a whole block: requests whose spans share one sequence of layouts, read as columns.

A tick's joined requests whose spans are all compact (:class:`~deltatap.collector.compact.CompactSpan`) are grouped by
the sequence of their spans' layouts. For each layout, :class:`LayoutColumns` is compiled once from the same
description the per-span reader is compiled from (the kind's :class:`~deltatap.collector.kinds.model.Site` and facts,
and the layout's positions, :mod:`deltatap.collector.kinds.compile`): which packed number is which observation's time,
the clock's offset and uncertainty, which attribute is which fact. A group's spans at one place in the sequence are
then read at once: their packed numbers as one numpy record array (``np.frombuffer`` over the joined packed bytes,
the layout's struct as a dtype), so every observation's time, the uncertainties, the tap overheads and inter-token
gap statistics are int64 columns, and the group becomes one :class:`~deltatap.collector.batch.RowBlock` without a
reader run per span.

What the row says beyond its points and deltas (:meth:`Decomposer.finish_row`: outcome, HTTP status, tokens and
their source) depends on which observers stated what, the same for the whole group, and on the status values: the
reference ``finish_row`` itself is asked once per distinct combination of status values, with the group's facts,
and its answer holds for every request with those values. The rest of the row (labels, gaps, the cascade's engine
end and attempts, the request id, the start) is filled from the columns.

The columns take only the usual layouts; everything else keeps the per-span readers (:func:`~deltatap.collector.batch.build_rows`'
per-request way): a kind whose site reads something here not handled (a give-up event, a derived observation, a
firewall decision of its own, the engine's tokens after a disconnect, token counts unless stated, numbers not packed
as the reader expects, stamp intervals), a link or an observer met twice in a request (retries: the latest attempt
wins, a matter of values), and a group whose values do not fit the arithmetic (a time past 2**62, a zero start, a
float that is not finite, a missing or non-str request id, an empty run id). tests/collector/test_batch_rows.py checks
the rows equal the ones built one by one.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from itertools import repeat
from typing import Any

import numpy as np

from deltatap.collector.kinds.model import PER_LINK, Emit, EngineEnd, Into
from deltatap.collector.observations import Extracted, as_int
from deltatap.collector.rows import Cascade, GapStats, LinkGaps
from deltatap.core.vocab import Attr

_new = tuple.__new__
_DT = {"Q": "<u8", "q": "<i8", "d": "<f8", "?": "?"}
_TIME_MAX = 1 << 62  # times, offsets and uncertainties below it: differences and sums stay in int64
_FLOAT_MAX = 9.0e12  # milliseconds whose nanoseconds fit int64 with room
MIN_BLOCK = 8  # fewer requests of one layout sequence: read span by span (numpy's fixed cost per block)


class _No(Exception):
    """This layout (or this group's values) does not take the columns."""


class LayoutColumns:
    """What the spans of one layout say, as columns: compiled once per (layout, reader) from the reader's Site."""

    __slots__ = ("dtype", "tdtype", "observer", "times", "ends", "unc", "offset", "common", "link", "overhead", "gaps", "content",
                 "status", "outcome", "decision", "decides", "tokens", "tokenizer", "labels", "rid")

    def __init__(self, lay: Any, prog: Any, kind: Any) -> None:
        site, pos, names = prog.site, lay.positions, lay.event_names
        codes = lay.struct.format.lstrip("<")[4:]  # after "8s8s": one code per packed number
        if any(c not in _DT for c in codes) or Attr.STAMP_BOUNDS in pos:
            raise _No
        n_packed = 2 + len(names) + len(lay.packed_keys)
        fixed = dict(lay.fixed)
        self.dtype = np.dtype({"names": ["sid", "par", *(f"f{i}" for i in range(len(codes)))],
                               "formats": ["S8", "S8", *(_DT[c] for c in codes)]})
        k = 2 + len(names)  # the times (uint64) come first, after the span and parent ids
        self.tdtype = np.dtype({"names": ["t"], "formats": [("<u8", (k,))], "offsets": [16], "itemsize": self.dtype.itemsize})

        def code(p: int | None) -> str | None:  # the struct code at position p (None: not a packed number)
            return codes[p] if p is not None and p < n_packed else None

        def key_at(attr: str) -> tuple[str, Any] | None:  # ("p", position) packed, ("o", index) per span, ("c", value) fixed
            p = pos.get(attr)
            if p is None:
                return None
            if p < n_packed:
                return ("p", p)
            if attr in fixed:
                return ("c", fixed[attr])
            return ("o", p - n_packed)

        def packed_int(attr: str) -> int | None:
            p = pos.get(attr)
            if p is None:
                return None
            if code(p) != "q":
                raise _No
            return p

        self.observer = site.observer
        self.offset, self.unc = packed_int(Attr.CLOCK_OFFSET_NS), packed_int(Attr.CLOCK_UNCERTAINTY_NS)
        if site.decision is not None or any(d.alternatives and any(all(a in pos for a, _, _ in alt) for alt in d.alternatives) for d in site.derived):
            raise _No
        if any(f.attr in pos for f in site.facts if f.into in (Into.TOKENS_IN_UNLESS_STATED, Into.TOKENS_OUT_UNLESS_STATED)):
            raise _No
        # the observations' times, in the reader's order: events, then the span's start and end
        present = set(names)
        self.times: list[int] = []
        self.ends: list[int] = []  # engine ends: the latest counts
        for i, name in enumerate(names):
            act = site.events.get(name)
            if act is None:
                continue
            if isinstance(act, Emit):
                if act.unless is not None and act.unless in present:
                    continue
                self.times.append(2 + i)
                if act.engine_end:
                    self.ends.append(2 + i)
            elif isinstance(act, EngineEnd):
                self.ends.append(2 + i)
            else:  # a give-up: the earliest wins, a cascade (per row)
                raise _No
        for e in site.edges:
            p = 0 if e.at == "start" else 1
            if e.point is None:
                if e.engine_end:
                    raise _No  # (only when the span states an end: a matter of values)
                continue
            self.times.append(p)
            if e.engine_end:
                self.ends.append(p)
        # facts per observer, in the description's order
        self.status = self.outcome = self.decision = self.rid = None  # (decision, rid: where, as labels)
        self.tokens: tuple[int | None, int | None] | None = None
        self.labels: list[tuple[str, tuple[str, Any]]] = []  # (label, where), setdefault order
        self.decides, self.tokenizer, self.common = site.decides, site.tokenizer, kind.common
        for f in kind.facts:
            if f.into in PER_LINK:
                continue
            if f.into is Into.LABELS:
                for name, q in sorted(((k[len(f.attr):], q) for k, q in pos.items() if k.startswith(f.attr)), key=lambda x: x[1]):
                    self.labels.append((name, key_at(f.attr + name)))  # type: ignore[arg-type]
                continue
            if f.into in (Into.TOKENS_IN, Into.TOKENS_OUT):
                if self.tokens is None:
                    tin = next((g.attr for g in kind.facts if g.into is Into.TOKENS_IN), None)
                    tout = next((g.attr for g in kind.facts if g.into is Into.TOKENS_OUT), None)
                    pair = (packed_int(tin) if tin else None, packed_int(tout) if tout else None)
                    self.tokens = pair if pair != (None, None) else ()  # type: ignore[assignment]
                continue
            at = key_at(f.attr)
            if at is None:
                continue
            if f.into is Into.REQUEST_ID:
                self.rid = at
            elif f.into is Into.HTTP_STATUS:
                if at[0] == "p":
                    self.status = ("p", packed_int(f.attr))
                elif at[0] == "c":
                    v = at[1] if at[1].__class__ is int else as_int(at[1])
                    self.status = None if v is None else ("c", v)
                else:
                    raise _No
            elif f.into is Into.OUTCOME:
                if at[0] != "c":
                    raise _No
                if at[1]:
                    self.outcome = str(at[1])
            elif f.into is Into.DECISION:
                self.decision = at
            elif f.into is Into.RUN_ID:
                self.labels.append(("run_id", at if at[0] != "c" else (("c", str(at[1])) if at[1] else None)))  # type: ignore[arg-type]
            else:  # the engine's tokens after a disconnect: a cascade
                raise _No
        self.labels = [x for x in self.labels if x[1] is not None]
        # per link (taps)
        self.link = site.link
        self.overhead: tuple[Any, Any] = (None, None)
        self.gaps: tuple[Any, Any] = (None, None)
        self.content: int | None = None
        if self.link is not None:
            facts = {f.into: f for f in (*kind.facts, *site.facts) if f.into in PER_LINK}
            first: dict[str, int] = {}
            for i, name in enumerate(names):
                first.setdefault(name, 2 + i)
            ov = []
            for into in (Into.OVERHEAD_REQUEST, Into.OVERHEAD_FIRST_TOKEN):
                f = facts.get(into)
                p = None if f is None else packed_int(f.attr)
                if p is not None:
                    ov.append(("p", p))
                elif f is not None and f.fallback and f.fallback[0] in first and f.fallback[1] in first:
                    ov.append(("d", first[f.fallback[1]], first[f.fallback[0]]))
                else:
                    ov.append(None)
            self.overhead = (ov[0], ov[1])

            def stat(into: Into) -> int | None:
                f = facts.get(into)
                p = None if f is None else pos.get(f.attr)
                if p is not None and code(p) != "d":
                    raise _No
                return p

            cnt = None if facts.get(Into.GAP_COUNT) is None else packed_int(facts[Into.GAP_COUNT].attr)
            sides = []
            for trio in ((Into.GAP_UP_MEAN, Into.GAP_UP_P99, Into.GAP_UP_MAX), (Into.GAP_DOWN_MEAN, Into.GAP_DOWN_P99, Into.GAP_DOWN_MAX)):
                m, p99, mx = (stat(i) for i in trio)
                sides.append(None if m is None else (cnt, m, p99, mx))
            self.gaps = (sides[0], sides[1])
            f = facts.get(Into.CONTENT_EVENTS)
            self.content = None if f is None else packed_int(f.attr)


class _Cols:
    """One place in a group's layout sequence: the spans' packed numbers as columns, and their per-span values."""

    __slots__ = ("lc", "arr", "others", "shift", "t")

    def __init__(self, lc: LayoutColumns, spans: list) -> None:
        self.lc, self.others = lc, [s.others for s in spans]
        buf = b"".join([s.packed for s in spans])
        self.arr = np.frombuffer(buf, lc.dtype)
        t = np.frombuffer(buf, lc.tdtype)["t"]  # start, end and every event's time: an (n, k) uint64 matrix
        if t.size and int(t.max()) >= _TIME_MAX:
            raise _No
        self.t = t.astype(np.int64)
        self.shift = None if lc.offset is None else self.arr[f"f{lc.offset}"]
        if self.shift is not None and self.shift.size and int(np.abs(self.shift).max()) >= _TIME_MAX:
            raise _No

    def num(self, p: int) -> np.ndarray:
        return self.t[:, p] if p < self.t.shape[1] else self.arr[f"f{p}"]

    def time(self, p: int) -> np.ndarray:
        """A time on the collector's clock."""
        col = self.t[:, p]
        return col if self.shift is None else col - self.shift

    def times(self, ps: list[int]) -> np.ndarray:
        """Several times on the collector's clock, as an (n, len(ps)) matrix."""
        m = self.t[:, ps]
        return m if self.shift is None else m - self.shift[:, None]

    def get(self, at: tuple[str, Any], n: int) -> Any:
        kind, x = at
        if kind == "c":
            return [x] * n
        if kind == "o":
            return [o[x] for o in self.others]
        return self.num(x).tolist()

    def gap_side(self, side: Any, n: int) -> tuple | None:
        """One side's (count, mean, p99, max) columns, nanoseconds (a missing statistic: None)."""
        if side is None:
            return None
        cnt, m, p99, mx = side
        out: list[Any] = [np.zeros(n, np.int64) if cnt is None else self.num(cnt)]
        for p in (m, p99, mx):
            if p is None:
                out.append(None)
                continue
            f = self.arr[f"f{p}"]
            if f.size and not np.abs(f).max() < _FLOAT_MAX:  # (NaN too)
                raise _No
            out.append(np.rint(f * 1e6).astype(np.int64))
        return tuple(out)


def layout_columns(dec: Any, lay: Any, prog: Any) -> LayoutColumns | None:
    """The columns of layout ``lay`` read by ``prog`` (cached on the Decomposer, with its readers); None: per span."""
    cache = dec.__dict__.setdefault("_layout_columns", {})
    got = cache.get(lay, False)
    if got is False:
        kind = next((k for k in dec.kinds if k.name == prog.kind), None)
        try:
            got = None if kind is None or prog.site is None else LayoutColumns(lay, prog, kind)
        except _No:
            got = None
        if len(cache) >= 4096:
            cache.clear()
        cache[lay] = got
    return got


def read_group(dec: Any, lcs: Sequence[LayoutColumns], groups: list, spans: list[list], rp: Any, block_cls: type, row_cls: type) -> tuple[Any, list] | None:
    """``groups`` (one layout sequence, read by ``lcs``; ``spans``: each one's spans) as one block and its rows; None
    when the values do not take the columns (the caller reads them span by span)."""
    n = len(groups)
    try:
        cols = [_Cols(lc, [sp[j] for sp in spans]) for j, lc in enumerate(lcs)]
        return _read(dec, cols, groups, spans, rp, block_cls, row_cls, n)
    except _No:
        return None


def _read(dec: Any, cols: list[_Cols], groups: list, spans: list[list], rp: Any, block_cls: type, row_cls: type, n: int) -> tuple[Any, list]:
    ex = Extracted()  # the group's facts: observers and links as every request has them, values as columns
    times, uncs, ends, starts, rids = [], [], [], [], []
    decisions: list | None = None
    statuses: list[tuple[str, Any]] = []  # per observer stating a status (in order): ("col", column) or ("c", value)
    tokens: dict[str, tuple[Any, Any]] = {}
    labels: list[tuple[str, list]] = []
    overhead: dict[str, tuple[Any, Any]] = {}
    gaps: dict[str, tuple[Any, Any]] = {}
    for c in cols:
        lc = c.lc
        if lc.times:
            times.append(c.times(lc.times))
        uncs.append(np.zeros(n, np.int64) if lc.unc is None else np.maximum(c.num(lc.unc), 0))
        ends += [c.time(p) for p in lc.ends]
        ob = lc.observer
        if lc.rid is not None:
            vals = c.get(lc.rid, n)
            if not all(v.__class__ is str and v for v in vals):
                raise _No
            rids.append(vals)
        if lc.status is not None:
            if ob in ex.http_status:
                raise _No
            ex.http_status[ob] = 0
            statuses.append(("col", c.num(lc.status[1])) if lc.status[0] == "p" else lc.status)
        if lc.outcome is not None:
            if ob in ex.outcome:
                raise _No
            ex.outcome[ob] = lc.outcome
        if lc.decision is not None:  # (a value per request: the first, or a component's)
            vals = c.get(lc.decision, n)
            decisions = [str(v) if v and (lc.decides or d is None) else d for v, d in zip(vals, decisions or [None] * n, strict=True)]
        for name, at in lc.labels:
            vals = c.get(at, n)
            if name == "run_id" and not all(vals):
                raise _No
            labels.append((name, list(map(str, vals))))
        if lc.common:
            if not c.t[:, 0].all():  # (a zero start is not a start)
                raise _No
            starts.append(c.time(0))
        if lc.tokens:
            if ob in tokens:
                raise _No
            tokens[ob] = tuple(None if p is None else c.num(p) for p in lc.tokens)  # type: ignore[assignment]
            ex.tokens[ob] = (("in", ob), ("out", ob))  # type: ignore[assignment]
        if lc.tokenizer and ob in ex.tokens:
            ex.tokenizer_counted.add(ob)
        link = lc.link
        if link is not None:
            if link in ex.attempts:
                raise _No
            ex.attempts[link] = 1
            ov = []
            for o in lc.overhead:
                ov.append(None if o is None else c.num(o[1]) if o[0] == "p" else c.num(o[1]) - c.num(o[2]))
            overhead[link] = (ov[0], ov[1])
            up, down = c.gap_side(lc.gaps[0], n), c.gap_side(lc.gaps[1], n)
            if up is not None or down is not None:
                gaps[link] = (up, down)
    # outcome, status and tokens: the reference finish_row, once per distinct combination of status values and decision
    status_obs = list(ex.http_status)
    per_row = [st[1].tolist() if st[0] == "col" else [st[1]] * n for st in statuses]
    per_row.append(decisions or [None] * n)
    which: dict[tuple, int] = {}
    if all(col.count(col[0]) == n for col in per_row):  # (the usual block: one combination)
        which[tuple(col[0] for col in per_row)] = 0
        inv = [0] * n
    else:
        inv = [which.setdefault(k, len(which)) for k in zip(*per_row, strict=True)]
    answers = []
    for combo in which:
        ex.http_status = dict(zip(status_obs, combo, strict=False))
        ex.firewall_decision = combo[-1]
        r = dec.finish_row(ex, (), None, "", ("",), None, None, None, iter(()))
        tin = tout = None
        if r.tokens_in is not None or r.tokens_out is not None:
            ob = (r.tokens_in or r.tokens_out)[1]
            tin, tout = tokens[ob]
        answers.append((r.outcome, r.http_status, r.firewall_decision, tin, tout, r.tokens_source))

    # the block: its observations' times and the spans' uncertainties as matrices, overheads and gaps as columns
    blk = block_cls(rp, dec.engine_last)
    v = np.concatenate(times, axis=1) if times else np.zeros((n, 0), np.int64)
    blk.vals, blk.uncs = v, np.stack(uncs, axis=1)
    blk.cols = (overhead, gaps, ex.attempts)
    eng = np.maximum.reduce(ends) if ends else (v[:, blk.engine_last] if blk.engine_last is not None else None)
    if starts:
        start = np.minimum.reduce(starts)
    elif blk.times:
        start = v[:, blk.times].min(axis=1)
    else:
        start = None
    per = [a[3] for a in answers], [a[4] for a in answers]
    tin_l = _pick(per[0], inv, n)
    tout_l = _pick(per[1], inv, n)
    eng_l = [None] * n if eng is None else eng.tolist()
    start_l = [None] * n if start is None else start.tolist()
    links = tuple(ex.attempts)
    # per request: request id (finish_row's rule: the one every span states, else the most common), labels, gaps
    if not rids:
        rid_l: list = [None] * n
    else:
        rid_l = rids[0]
        if any(col != rid_l for col in rids[1:]):
            rid_l = [r[0] if r.count(r[0]) == len(r) else Counter(r).most_common(1)[0][0] for r in map(list, zip(*rids, strict=True))]
    names = [name for name, _ in labels]
    if not labels:
        lab_l: list = [None] * n
    elif len(set(names)) == len(names):
        lab_l = list(map(dict, map(zip, repeat(names, n), zip(*(vals for _, vals in labels), strict=True))))
    else:
        lab_l = []
        for t in zip(*(vals for _, vals in labels), strict=True):
            lab: dict = {}
            for name, val in zip(names, t, strict=True):
                lab.setdefault(name, val)
            lab_l.append(lab)
    one = answers[0] if len(answers) == 1 else None
    rows = []
    for i, g in enumerate(groups):
        outcome, status, decision, _, _, tsrc = one or answers[inv[i]]
        tl = g.trace_ids
        tids = (tl[0],) if len(tl) == 1 else tuple(dict.fromkeys(tl or [s.trace_id for s in spans[i]]))  # (finish_row's)
        row = row_cls(tids[0] if tids else "", rid_l[i], g.method, g.note, start_l[i], outcome, status, decision, lab_l[i] or {}, tin_l[i], tout_l[i],
                      tsrc, None, None, None if gaps else {}, Cascade({}, eng_l[i], None, None, dict.fromkeys(links, 1)), tids)
        row._block, row._i = blk, i
        rows.append(row)
    blk.exs = [None] * n
    return blk, rows


def gap_rows(gaps: dict[str, tuple[Any, Any]], n: int) -> list[dict]:
    """Each request's ``gaps`` (:class:`LinkGaps` per link) from a block's gap columns ({link: (up, down)}, each side
    (count, mean, p99, max) columns or None): built when a row's gaps are first read (:class:`~deltatap.collector.batch.BlockRow`)."""
    none = [None] * n
    # (map over C callables: no bytecode per request)
    per_link = [list(map(_new, repeat(LinkGaps, n), zip(_stats(up, n) or none, _stats(down, n) or none, strict=True))) for up, down in gaps.values()]
    return list(map(dict, map(zip, repeat(tuple(gaps), n), zip(*per_link, strict=True))))


def _pick(per_answer: list, inv: list[int], n: int) -> list:
    """Per request, the column (or None) its answer names."""
    if all(c is None for c in per_answer):
        return [None] * n
    if len(per_answer) == 1:
        return per_answer[0].tolist()
    lists = [None if c is None else c.tolist() for c in per_answer]
    return [None if lists[k] is None else lists[k][i] for i, k in enumerate(inv)]


def _stats(side: tuple | None, n: int) -> list | None:
    """One side's GapStats per request."""
    if side is None:
        return None
    parts = [c.tolist() if c is not None else [None] * n for c in side]
    return list(map(_new, repeat(GapStats, n), zip(*parts, strict=True)))
