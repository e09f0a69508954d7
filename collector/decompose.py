"""Observations of one request -> one decomposition row (:class:`collector.rows.Row`).

Points: for each generic point the best observation wins (lowest rank: a component's own stamp,
then engine telemetry, then a tap; ties go to the latest attempt). Deltas (:func:`rows.delta_defs`):
when the chosen end and start points come from different observers but some single observer saw
both, that observer's pair is used instead (within-observer deltas are preferred, DESIGN section 4);
otherwise the delta's error bound is the sum of both observers' clock uncertainties. Missing points
leave the delta missing. The arithmetic is on integer ns (Python ints: exact, a dozen deltas per
row, cheaper than numpy on arrays that small). A :class:`Decomposer`, one per topology (the pipeline
owns it), holds everything worked out once: what depends only on the topology (delta names, the links
around each intermediary, the observer order), the compiled reader of every span layout
(:mod:`deltatap.collector.kinds.compile`) and the row plan of every sequence of span Shapes. Nothing is
cached at module level.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from deltatap.collector import kinds as _kinds
from deltatap.collector.compact import CompactSpan
from deltatap.collector.deltas import RESIDUAL, SYSTEM_TTFT, TAP, delta_name
from deltatap.collector.kinds.compile import Program, Shape, compile_site, skip_program
from deltatap.collector.kinds.model import SpanKind, SpanView
from deltatap.collector.observations import Extracted, Obs
from deltatap.collector.rows import Cascade, DeltaValue, JoinMethod, LinkGaps, PointObs, Row, TokenSource, delta_defs, intermediaries
from deltatap.collector.spans import SpanRecord
from deltatap.core import native
from deltatap.core.topology import Topology
from deltatap.core.vocab import Attr, Outcome, Role, add_bounds, delta_bound, point


_new = tuple.__new__  # builds a NamedTuple (PointObs, DeltaValue) without its Python-level __new__
_acc = native.load("deltatap.collector._rows", __name__)


def _plan_values(vals: list, uncs: list, points: list[tuple[str, int, int, str, str]],
                 deltas: list[tuple[str, int, int, int, int, bool]]) -> tuple[dict[str, PointObs], dict[str, DeltaValue]]:
    """A row plan's points and deltas from the observations' times and the spans' clock uncertainties
    (:class:`_RowPlan`). The definition: ``collector/_rows.c`` builds the same dicts in one call."""
    return ({p: _new(PointObs, (vals[i], uncs[si], observer, source)) for p, i, si, observer, source in points},
            {name: _new(DeltaValue, (vals[e] - vals[s], 0 if same else uncs[es] + uncs[ss], same)) for name, e, s, es, ss, same in deltas})


if _acc is None:
    plan_values = _plan_values
else:
    _acc_plan = _acc.plan_values

    def plan_values(vals: list, uncs: list, points: list, deltas: list) -> tuple[dict[str, PointObs], dict[str, DeltaValue]]:
        """:func:`_plan_values`, through the accelerator (which answers None for what it does not take)."""
        got = _acc_plan(vals, uncs, points, deltas, PointObs, DeltaValue)
        return _plan_values(vals, uncs, points, deltas) if got is None else got


def _best_first(o: Obs) -> tuple[int, int]:
    return (o[5], -o[6])  # (rank, -attempt_ns)


def choose_points(obs: Sequence[Obs]) -> dict[str, list[Obs]]:
    """Observations per point, best first."""
    by: dict[str, list[Obs]] = {}
    several: list[list[Obs]] = []
    get = by.get
    for o in obs:
        lst = get(o[0])
        if lst is None:
            by[o[0]] = [o]
        else:
            if len(lst) == 1:
                several.append(lst)
            lst.append(o)
    for lst in several:  # a point seen once needs no sorting (the usual case)
        if len(lst) == 2:
            a, b = lst
            if (b[5], -b[6]) < (a[5], -a[6]):  # what a stable sort on _best_first does with two
                lst.reverse()
        else:
            lst.sort(key=_best_first)
    return by


def _pair(ends: list[Obs], starts: list[Obs]) -> tuple[Obs, Obs, bool]:
    e, s = ends[0], starts[0]
    if e.observer == s.observer:
        return e, s, True
    if len(starts) == 1:  # only the start's observer can have seen both
        ob = s.observer
        return next(((o, s, True) for o in ends if o.observer == ob), (e, s, False))
    if len(ends) == 1:
        ob = e.observer
        return next(((e, o, True) for o in starts if o.observer == ob), (e, s, False))
    common = {o.observer for o in ends} & {o.observer for o in starts}
    if common:
        best = min(common, key=lambda ob: (max(next(o.rank for o in ends if o.observer == ob), next(o.rank for o in starts if o.observer == ob)), ob))
        return next(o for o in ends if o.observer == best), next(o for o in starts if o.observer == best), True
    return e, s, False


def _point_deltas(defs: list[tuple[str, str, str]], by: dict[str, list[Obs]],
                  bounds: dict[tuple[str, str], tuple[int, int]] | None = None,
                  delta_bounds: dict[str, int] | None = None) -> dict[str, DeltaValue]:
    """Every point-to-point delta whose two points were observed (plain ints: a dozen per row);
    ``defs``: (name, end point, start point) as :func:`_point_defs` gives them. ``bounds``: the observations that are
    intervals (``Extracted.bounds``): their width goes into the delta's error bound, and into ``delta_bounds``."""
    out: dict[str, DeltaValue] = {}
    get = by.get
    for name, end, start in defs:
        e_obs = get(end)
        if e_obs is None:
            continue
        s_obs = get(start)
        if s_obs is None:
            continue
        e, s = e_obs[0], s_obs[0]
        if e[3] == s[3]:  # one observer saw both
            d = _new(DeltaValue, (e[1] - s[1], 0, True))
        elif len(e_obs) == 1 and len(s_obs) == 1:
            d = _new(DeltaValue, (e[1] - s[1], e[2] + s[2], False))
        else:
            e, s, same = _pair(e_obs, s_obs)
            d = _new(DeltaValue, (e[1] - s[1], 0 if same else e[2] + s[2], same))
        if bounds:
            b = delta_bound(bounds.get((e[3], e[0])), bounds.get((s[3], s[0])))
            if b:  # (BOUND_UNKNOWN: no bound; the delta's err keeps its clock part, delta_bounds says unknown)
                if b > 0:
                    d = _new(DeltaValue, (d[0], d[1] + b, d[2]))
                if delta_bounds is not None:
                    delta_bounds[name] = b
        out[name] = d
    return out


def _any_bounded(spans: Sequence[SpanRecord]) -> bool:
    """Whether a span states an interval for one of its events (those rows take the general way below)."""
    key = Attr.STAMP_BOUNDS
    for sp in spans:
        lay = getattr(sp, "layout", None)
        if key in (lay.positions if lay is not None else sp.attrs):
            return True
    return False


def _tap_names(link: str) -> tuple[str, str]:
    """The names of a link's two tap-overhead deltas."""
    return (delta_name("tap_request", link), delta_name("tap_first_token", link))


_CACHE_MAX = 4096
_UNSEEN = object()
_NO_GAPS = LinkGaps()
_CAUSE_HIDDEN = (Outcome.UPSTREAM_ERROR, Outcome.HTTP_ERROR, Outcome.UPSTREAM_ERROR.value, Outcome.HTTP_ERROR.value)


class Decomposer:
    """Spans of one request -> its row, for one topology and the span kinds registered when it is made.

    Owns every cache of the decomposition (the pipeline makes one; nothing is kept at module level): the
    compiled reader of each span layout (:mod:`deltatap.collector.kinds.compile`), of each shape of span read
    the plain way, and the row plan of each sequence of span Shapes; plus what depends only on the topology
    (delta names, the links around each intermediary, the observer order)."""

    def __init__(self, topo: Topology, kinds: Sequence[SpanKind] | None = None) -> None:
        self.topo = topo
        self.kinds = tuple(_kinds.registered() if kinds is None else kinds)
        defs = delta_defs(topo)
        self.point_defs = [(d.name, d.end, d.start) for d in defs if d.end]
        # (link it answers on, link it calls out on, names of its mean, p99 and max ITL deltas) per intermediary
        self.mid_links = [(next((x.name for x in topo.links if x.upstream == m), None), next((x.name for x in topo.links if x.downstream == m), None),
                           delta_name("itl_added_mean", m), delta_name("itl_added_p99", m), delta_name("max_pause_added", m))
                          for m in intermediaries(topo)]
        self.residual_terms = [d.name for d in defs if d.contributes and d.phase != TAP]
        self.tap_names = {x.name: _tap_names(x.name) for x in topo.links}
        self.residual_taps = [(x.name, *self.tap_names[x.name]) for x in topo.links]
        self.order = [f"tap:{x.name}" for x in topo.links] + [f"component:{c.name}" for c in topo.components]
        self.inner_first = [f"tap:{x.name}" for x in reversed(topo.links)] + [f"component:{topo.engine.name}"]
        self.engine_last = point(topo.engine.name, Role.LAST_TOKEN)
        self.inner_outer = (topo.links[-1].name, topo.links[0].name) if topo.links else None  # innermost, outermost link
        self.link_index = {x.name: i for i, x in enumerate(topo.links)}
        self._by_layout: dict[Any, Program | None] = {}  # compact span layout -> its reader (None: read the plain way)
        self._by_shape: dict[tuple, Program] = {}  # (kind, name, service, events, keys, shape values) -> reader
        self._rows: dict[tuple[Shape, ...], _RowPlan | None] = {}  # row plans by the Shapes of a request's spans
        self._terms: dict[tuple[str, ...], list[str]] = {}  # the residual's terms by the links tapped, in attempt order

    # ---- spans -> readers ------------------------------------------------------------------------
    def _kind(self, view: SpanView) -> SpanKind | None:
        for k in self.kinds:
            if k.matches(view):
                return k
        return None

    def _compile(self, kind: SpanKind | None, view: SpanView, pos: dict[str, int], none: int) -> Program:
        site = None if kind is None else kind.site(view, self.topo)
        if site is None:
            return skip_program(none)
        return compile_site(kind.name, kind.facts, kind.common, site, view.event_names, pos, none)  # type: ignore[union-attr]

    def _layout_program(self, span: CompactSpan) -> Program | None:
        lay = span.layout
        if len(self._by_layout) >= _CACHE_MAX:
            self._by_layout.clear()
        fixed = dict(lay.fixed)
        view = SpanView(lay.name, lay.service, fixed, frozenset(lay.positions), lay.event_names)
        prog: Program | None = None
        if Attr.OBSERVER in fixed or Attr.OBSERVER not in lay.positions:  # else the kind may change from span to span
            kind = self._kind(view)
            if kind is None or not any(k in lay.positions and k not in fixed for k in kind.shape):
                prog = self._compile(kind, view, lay.positions, lay.none)
        self._by_layout[lay] = prog
        return prog

    def program(self, span: SpanRecord) -> tuple[Program, tuple]:
        """The reader of ``span`` and the span's values as it reads them."""
        if span.__class__ is CompactSpan:
            lay = span.layout  # type: ignore[attr-defined]
            prog = self._by_layout.get(lay, _UNSEEN)
            if prog is _UNSEEN:
                prog = self._layout_program(span)  # type: ignore[arg-type]
            if prog is not None:
                return prog, lay.values(span)  # type: ignore[return-value]
        a = span.attrs
        events = span.events
        names = tuple(e[0] for e in events)
        view = SpanView(span.name, span.service, a, frozenset(a), names)
        kind = self._kind(view)
        src = (span.start_unix_ns, span.end_unix_ns, *(e[1] for e in events), *a.values(), None)
        key = (kind.name if kind else None, span.name, span.service, names, tuple(a), *(a.get(k) for k in (kind.shape if kind else ())))
        try:
            prog = self._by_shape.get(key)
        except TypeError:  # an unhashable shape value (a list): compiled for this span alone
            key, prog = None, None
        if prog is None:
            prog = self._compile(kind, view, {k: 2 + len(names) + i for i, k in enumerate(a)}, len(src) - 1)
            if key is not None:
                if len(self._by_shape) >= _CACHE_MAX:
                    self._by_shape.clear()
                self._by_shape[key] = prog
        return prog, src  # type: ignore[return-value]

    def layout_reader(self, lay: Any) -> Program | None:
        """The reader every compact span of layout ``lay`` takes (after :meth:`program` saw one), None if it has none."""
        return self._by_layout.get(lay)

    def join_facts(self, span: SpanRecord) -> tuple[int | None, int, Any, Any]:
        """(link index: -1 for the client, None for no link; start; request id; body fingerprint), for the joiner."""
        prog, src = self.program(span)
        return self.link_of(prog), src[0], src[prog.p_rid], src[prog.p_fp]

    def link_of(self, prog: Program) -> int | None:
        """The index of the link a reader's spans are on (-1: the client; None: none)."""
        return -1 if prog.kind == "client" else (self.link_index.get(prog.site.link) if prog.site is not None and prog.site.link is not None else None)

    # ---- spans -> observations ---------------------------------------------------------------------
    def extract_flat(self, spans: Sequence[SpanRecord]) -> tuple[Extracted, list[int], list[int], tuple[Shape, ...], list[tuple]]:
        """(facts, the observations' times in order, each span's clock uncertainty, each span's Shape, each span's values)."""
        ex = Extracted()
        vals: list[int] = []
        uncs: list[int] = []
        shapes, srcs = [], []
        program = self.program
        for span in spans:
            prog, src = program(span)
            shapes.append(prog.run(src, ex, vals, uncs))
            srcs.append(src)
        return ex, vals, uncs, tuple(shapes), srcs

    def extract(self, spans: Sequence[SpanRecord]) -> Extracted:
        """Observations and facts of every span of one request (spans no kind knows are ignored)."""
        ex, vals, uncs, shapes, srcs = self.extract_flat(spans)
        ex.obs = _observations(vals, uncs, shapes, srcs)
        return ex

    def _points(self, spans: Sequence[SpanRecord]) -> tuple[Extracted, dict[str, PointObs], dict[str, DeltaValue], dict, dict]:
        """Points and point deltas (and the intervals of bounded ones): through a row plan when the Shapes have one."""
        ex, vals, uncs, shapes, srcs = self.extract_flat(spans)
        point_bounds: dict[str, tuple[int, int]] = {}
        delta_bounds: dict[str, int] = {}
        rp = None if _any_bounded(spans) else self.row_plan(shapes)
        if rp is not None:
            points, deltas = plan_values(vals, uncs, rp.points, rp.deltas)  # type: ignore[union-attr]
            return ex, points, deltas, point_bounds, delta_bounds
        ex.obs = _observations(vals, uncs, shapes, srcs)
        by = choose_points(ex.obs)
        deltas = _point_deltas(self.point_defs, by, ex.bounds, delta_bounds)
        points = {p: _new(PointObs, o[0][1:5]) for p, o in by.items()}  # Obs[1:5]: unix_ns, unc_ns, observer, source
        if ex.bounds:
            for p, o in by.items():
                b = ex.bounds.get((o[0][3], p))
                if b:
                    point_bounds[p] = b
        return ex, points, deltas, point_bounds, delta_bounds

    def row_plan(self, shapes: tuple[Shape, ...]) -> _RowPlan | None:
        rp = self._rows.get(shapes, _UNSEEN)
        if rp is _UNSEEN:
            if len(self._rows) >= _CACHE_MAX:
                self._rows.clear()
            rp = self._rows[shapes] = _row_plan(shapes, self.point_defs)
        return rp  # type: ignore[return-value]

    def _itl_added(self, ex: Extracted, out: dict[str, DeltaValue]) -> None:
        """Per intermediary: the gap statistic it released minus the one it received (mean, p99, max)."""
        gaps = ex.gaps
        for link_out, link_in, n_mean, n_p99, n_max in self.mid_links:
            g_out, g_in = gaps.get(link_out, _NO_GAPS).up, gaps.get(link_in, _NO_GAPS).down  # type: ignore[arg-type]
            if g_out is None or g_in is None:
                continue
            for name, a, b in ((n_mean, g_out[1], g_in[1]), (n_p99, g_out[2], g_in[2]), (n_max, g_out[3], g_in[3])):
                if a is not None and b is not None:
                    out[name] = _new(DeltaValue, (int(a) - int(b), 0, False))

    def _residual_terms(self, attempts: dict[str, int]) -> list[str]:
        """The residual's terms for the links that were tapped (``attempts``: link -> attempts, never 0), worked
        out once per set of tapped links."""
        key = tuple(attempts)
        terms = self._terms.get(key)
        if terms is None:
            terms = list(self.residual_terms)
            for link, n_req, n_ft in self.residual_taps:
                if attempts.get(link, 0):  # an untapped link costs nothing
                    terms += (n_req, n_ft)
            if len(self._terms) >= _CACHE_MAX:
                self._terms.clear()
            self._terms[key] = terms
        return terms

    def _residual(self, deltas: dict[str, DeltaValue], ex: Extracted) -> DeltaValue | None:
        """system_ttft minus every term of the TTFT path (the tap overheads of the links that were tapped)."""
        total = deltas.get(SYSTEM_TTFT)
        if total is None:
            return None
        terms = self._residual_terms(ex.attempts)
        ns = err = 0
        for n in terms:
            d = deltas.get(n)
            if d is None:
                return None
            ns += d[0]
            err += d[1]
        return _new(DeltaValue, (total[0] - ns, total[1] + err, False))

    # ---- spans -> row ------------------------------------------------------------------------------
    def build_row(self, spans: Sequence[SpanRecord], join_method: JoinMethod = JoinMethod.TRACE_ID, join_note: str = "",
                  trace_ids: Sequence[str] = ()) -> Row:
        if not isinstance(spans, list | tuple):
            spans = list(spans)  # read more than once below
        ex, points, deltas, point_bounds, delta_bounds = self._points(spans)
        for link, (req, ft, _) in ex.tap_overhead.items():  # each tap's own overheads: request, first token
            for name, v, b in zip(self.tap_names.get(link) or _tap_names(link), (req, ft), ex.tap_overhead_bounds.get(link, (0, 0))):
                if v is not None:
                    deltas[name] = _new(DeltaValue, (v, b if b > 0 else 0, True))
                    if b:
                        delta_bounds[name] = b
        if ex.gaps:
            self._itl_added(ex, deltas)
        res = self._residual(deltas, ex)
        if res is not None:
            deltas[RESIDUAL] = res
            if delta_bounds:
                b = add_bounds(delta_bounds.get(SYSTEM_TTFT, 0), *(delta_bounds.get(n, 0) for n in self.residual_terms),
                               *(delta_bounds.get(n, 0) for link, r, f in self.residual_taps if ex.attempts.get(link, 0) for n in (r, f)))
                if b:
                    delta_bounds[RESIDUAL] = b

        last = points.get(self.engine_last)
        row = self.finish_row(ex, spans, join_method, join_note, trace_ids, points, deltas, last and last.unix_ns, (p.unix_ns for p in points.values()))
        if point_bounds or delta_bounds:
            row.point_bounds, row.delta_bounds = point_bounds, delta_bounds
        return row

    def finish_row(self, ex: Extracted, spans: Sequence[SpanRecord], join_method: JoinMethod, join_note: str, trace_ids: Sequence[str],
                   points: Any, deltas: Any, engine_last_ns: int | None, point_times: Any, make: type = Row) -> Row:
        """A request's row around its points and deltas (``make``: its class; ``point_times`` read only if no span gave a start)."""
        tp, topo = self, self.topo
        # outermost observer first: the client, then taps from the edge inwards, then components
        # (the client observers in the order they first appear in http_status, then in outcome)
        hs, ocs = ex.http_status, ex.outcome
        status = outcome = _UNSET
        for o in hs:
            if o.startswith("client"):
                if status is _UNSET:
                    status = hs[o]
                if o in ocs:
                    outcome = ocs[o]
                    break
        if status is _UNSET:
            status = _pick_by_order(hs, tp.order)
        if outcome is _UNSET:
            for o in ocs:
                if o.startswith("client"):
                    outcome = ocs[o]
                    break
            else:
                outcome = _pick_by_order(ocs, tp.order)
        if outcome in _CAUSE_HIDDEN and Outcome.TIMEOUT in ocs.values():
            # the client saw a cut stream or a 504; a layer behind it timed out: name the row by the cause,
            # as the stack and the taps do (the dashboard's outcome="timeout" counts these)
            outcome = Outcome.TIMEOUT
        if outcome is None:
            if ex.firewall_decision and str(ex.firewall_decision).startswith("block"):
                outcome = Outcome.REFUSED
            elif isinstance(status, int) and status >= 400:
                outcome = Outcome.HTTP_ERROR
            else:
                outcome = Outcome.OK
        toks = ex.tokens
        tok_observer = None
        if toks:  # innermost observer first, then the client, then whoever counted
            for o in tp.inner_first:
                if o in toks:
                    tok_observer = o
                    break
            else:
                for o in toks:
                    if o.startswith("client"):
                        tok_observer = o
                        break
                else:
                    tok_observer = next(iter(toks))
        tokens = toks.get(tok_observer) if tok_observer else None
        tok_source = None if tokens is None else (TokenSource.TOKENIZER if tok_observer in ex.tokenizer_counted else TokenSource.USAGE)

        # ex is this call's own: its dicts become the row's
        cascade = Cascade(ex.gave_up, None, None, None, ex.attempts)
        cascade.engine_end_unix_ns = ex.engine_end if ex.engine_end is not None else engine_last_ns
        first = cascade.first_gave_up
        if first is not None and cascade.engine_end_unix_ns is not None:
            cascade.engine_busy_after_gave_up_ns = max(0, cascade.engine_end_unix_ns - first[1])
            inner, outer = tp.inner_outer or (topo.links[-1].name, topo.links[0].name)  # (no links: IndexError, as ever)
            if ex.engine_tokens_after_disconnect is not None:  # the engine's own count wins
                cascade.tokens_after_gave_up = ex.engine_tokens_after_disconnect
            elif inner in ex.content_events and outer in ex.content_events:
                cascade.tokens_after_gave_up = max(0, ex.content_events[inner] - ex.content_events[outer])

        rids = ex.request_ids
        rid = (rids[0] if rids.count(rids[0]) == len(rids) else Counter(rids).most_common(1)[0][0]) if rids else None
        tids = tuple(dict.fromkeys(trace_ids or [s.trace_id for s in spans]))
        start = ex.start_ns if ex.start_ns is not None else min(point_times, default=None)
        return make(  # positional, in field order: trace_id .. trace_ids
            tids[0] if tids else "", rid, join_method, join_note, start, str(outcome), status if isinstance(status, int) else None,
            ex.firewall_decision, ex.labels, tokens[0] if tokens else None, tokens[1] if tokens else None, tok_source, points, deltas,
            ex.gaps, cascade, tids,
        )


class _RowPlan:
    """choose_points and the point deltas, worked out for one sequence of span Shapes.

    Which observation is best for a point, and which pair a delta uses, depend only on the
    observations' points, observers and ranks, except where two spans observe one point at the same
    rank (retries: the later attempt wins); for such Shapes there is no plan (None) and the row is
    built the general way."""

    __slots__ = ("points", "deltas")

    def __init__(self, points: list[tuple[str, int, int, str, str]], deltas: list[tuple[str, int, int, int, int, bool]]) -> None:
        self.points = points  # (point, observation index, span index, observer, source)
        self.deltas = deltas  # (name, end index, start index, end span, start span, one observer)


def _row_plan(shapes: tuple[Shape, ...], point_defs: list[tuple[str, str, str]]) -> _RowPlan | None:
    # the observations with their index in place of a time and their span's index in place of the attempt
    obs = [Obs(p, i, 0, observer, source, rank, si) for i, (si, (p, observer, source, rank, _)) in
           enumerate((si, slot) for si, sh in enumerate(shapes) for slot in sh.slots)]
    by: dict[str, list[Obs]] = {}
    for o in obs:
        by.setdefault(o.point, []).append(o)
    for lst in by.values():
        if len({(o.rank, o.attempt_ns) for o in lst}) != len({o.rank for o in lst}):
            return None  # two spans observe this point at one rank: the later attempt wins, a matter of times
        lst.sort(key=lambda o: o.rank)  # stable: within one span, first observed first (as choose_points)
    points = [(p, lst[0].unix_ns, lst[0].attempt_ns, lst[0].observer, lst[0].source) for p, lst in by.items()]
    deltas = []
    for name, end, start in point_defs:
        if end in by and start in by:
            e, s, same = _pair(by[end], by[start])
            deltas.append((name, e.unix_ns, s.unix_ns, e.attempt_ns, s.attempt_ns, same))
    return _RowPlan(points, deltas)


def _observations(vals: list[int], uncs: list[int], shapes: tuple[Shape, ...], srcs: list[tuple]) -> list[Obs]:
    """The Obs of a request from what its readers gave (the attempt: the span's start, or the observation's time)."""
    it = iter(vals)
    out = []
    for si, sh in enumerate(shapes):
        for p, observer, source, rank, own in sh.slots:
            t = next(it)
            out.append(_new(Obs, (p, t, uncs[si], observer, source, rank, t if own else srcs[si][0])))
    return out


_UNSET = object()


def _pick_by_order(values: dict[str, object], order: list[str]) -> object | None:
    for ob in order:
        if ob in values:
            return values[ob]
    return next(iter(values.values()), None)


def build_row(spans: Sequence[SpanRecord], topo: Topology, join_method: JoinMethod = JoinMethod.TRACE_ID, join_note: str = "",
              trace_ids: Sequence[str] = ()) -> Row:
    """One request's row with a Decomposer of its own (tests, one-off use; the pipeline keeps one Decomposer)."""
    return Decomposer(topo).build_row(spans, join_method, join_note, trace_ids)


def extract(spans: Sequence[SpanRecord], topo: Topology) -> Extracted:
    """One request's observations and facts with a Decomposer of its own."""
    return Decomposer(topo).extract(spans)
