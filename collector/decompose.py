"""Observations of one request -> one decomposition row (:class:`collector.rows.Row`).

Points: for each generic point the best observation wins (lowest rank: a component's own stamp,
then engine telemetry, then a tap; ties go to the latest attempt). Deltas (:func:`rows.delta_defs`):
when the chosen end and start points come from different observers but some single observer saw
both, that observer's pair is used instead (within-observer deltas are preferred, DESIGN section 4);
otherwise the delta's error bound is the sum of both observers' clock uncertainties. Missing points
leave the delta missing. The arithmetic is on integer ns (Python ints: exact, a dozen deltas per
row, cheaper than numpy on arrays that small).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from collector.points import Extracted, Obs, extract
from collector.rows import Cascade, DeltaDef, DeltaValue, JoinMethod, PointObs, Row, TokenSource, delta_defs, intermediaries
from collector.spans import SpanRecord
from deltatap.topology import Topology
from deltatap.vocab import Outcome, Role, point


def choose_points(obs: Sequence[Obs]) -> dict[str, list[Obs]]:
    """Observations per point, best first."""
    by: dict[str, list[Obs]] = {}
    for o in obs:
        by.setdefault(o.point, []).append(o)
    for lst in by.values():
        lst.sort(key=lambda o: (o.rank, -o.attempt_ns))
    return by


def _pair(ends: list[Obs], starts: list[Obs]) -> tuple[Obs, Obs, bool]:
    e, s = ends[0], starts[0]
    if e.observer == s.observer:
        return e, s, True
    if len(ends) == 1 and len(starts) == 1:
        return e, s, False
    common = {o.observer for o in ends} & {o.observer for o in starts}
    if common:
        best = min(common, key=lambda ob: (max(next(o.rank for o in ends if o.observer == ob), next(o.rank for o in starts if o.observer == ob)), ob))
        return next(o for o in ends if o.observer == best), next(o for o in starts if o.observer == best), True
    return e, s, False


def _point_deltas(defs: list[DeltaDef], by: dict[str, list[Obs]]) -> dict[str, DeltaValue]:
    """Every point-to-point delta whose two points were observed (plain ints: a dozen per row)."""
    out: dict[str, DeltaValue] = {}
    for d in defs:
        e_obs = by.get(d.end)
        if not e_obs:
            continue
        s_obs = by.get(d.start)
        if not s_obs:
            continue
        e, s, same = _pair(e_obs, s_obs)
        out[d.name] = DeltaValue(e.unix_ns - s.unix_ns, 0 if same else e.unc_ns + s.unc_ns, same)
    return out


_POINT_DEFS: dict[int, tuple[Topology, list[DeltaDef]]] = {}


def _point_defs(topo: Topology) -> list[DeltaDef]:
    hit = _POINT_DEFS.get(id(topo))
    if hit is None or hit[0] is not topo:
        hit = _POINT_DEFS[id(topo)] = (topo, [d for d in delta_defs(topo) if d.end])
    return hit[1]


_LINKS_CACHE: dict[int, tuple[Topology, list[tuple[str, str | None, str | None]]]] = {}


def _mid_links(topo: Topology) -> list[tuple[str, str | None, str | None]]:
    """(intermediary, link it answers on, link it calls out on) per intermediary, cached per topology."""
    hit = _LINKS_CACHE.get(id(topo))
    if hit is None or hit[0] is not topo:
        val = [(m, next((x.name for x in topo.links if x.upstream == m), None), next((x.name for x in topo.links if x.downstream == m), None)) for m in intermediaries(topo)]
        hit = _LINKS_CACHE[id(topo)] = (topo, val)
    return hit[1]


def _itl_added(topo: Topology, ex: Extracted) -> dict[str, DeltaValue]:
    out: dict[str, DeltaValue] = {}
    if not ex.gaps:
        return out
    for m, link_out, link_in in _mid_links(topo):
        g_out = ex.gaps.get(link_out).up if link_out in ex.gaps else None
        g_in = ex.gaps.get(link_in).down if link_in in ex.gaps else None
        if g_out is None or g_in is None:
            continue
        for suffix, field in (("itl_added_mean", "mean_ns"), ("itl_added_p99", "p99_ns"), ("max_pause_added", "max_ns")):
            a, b = getattr(g_out, field), getattr(g_in, field)
            if a is not None and b is not None:
                out[f"{m}_{suffix}"] = DeltaValue(int(a) - int(b), 0, False)
    return out


def _residual(topo: Topology, deltas: dict[str, DeltaValue], ex: Extracted) -> DeltaValue | None:
    total = deltas.get("system_ttft")
    if total is None:
        return None
    names = [d.name for d in delta_defs(topo) if d.contributes and d.phase != "tap"]
    for link in topo.links:
        if ex.attempts.get(link.name, 0):  # an untapped link costs nothing
            names += [f"tap_{link.name}_request", f"tap_{link.name}_first_token"]
    if any(n not in deltas for n in names):
        return None
    terms = [deltas[n] for n in names]
    return DeltaValue(total.ns - sum(t.ns for t in terms), total.error_bound_ns + sum(t.error_bound_ns for t in terms), False)


def _pick_by_order(values: dict[str, object], order: list[str]) -> object | None:
    for ob in order:
        if ob in values:
            return values[ob]
    return next(iter(values.values()), None)


def build_row(
    spans: Sequence[SpanRecord],
    topo: Topology,
    join_method: JoinMethod = JoinMethod.TRACE_ID,
    join_note: str = "",
    trace_ids: Sequence[str] = (),
) -> Row:
    ex = extract(list(spans), topo)
    by = choose_points(ex.obs)
    deltas = _point_deltas(_point_defs(topo), by)
    for link, (req, ft, _) in ex.tap_overhead.items():
        if req is not None:
            deltas[f"tap_{link}_request"] = DeltaValue(req, 0, True)
        if ft is not None:
            deltas[f"tap_{link}_first_token"] = DeltaValue(ft, 0, True)
    deltas.update(_itl_added(topo, ex))
    res = _residual(topo, deltas, ex)
    if res is not None:
        deltas["residual"] = res
    points = {p: PointObs(o[0].unix_ns, o[0].unc_ns, o[0].observer, o[0].source) for p, o in by.items()}

    # outermost observer first: the client, then taps from the edge inwards, then components
    order = [o for o in ex.http_status | ex.outcome if o.startswith("client")]
    order += [f"tap:{x.name}" for x in topo.links] + [f"component:{c.name}" for c in topo.components]
    inner_first = [f"tap:{x.name}" for x in reversed(topo.links)] + [f"component:{topo.engine.name}"]
    status = _pick_by_order(ex.http_status, order)
    outcome = _pick_by_order(ex.outcome, order)
    if outcome is None:
        if ex.firewall_decision and str(ex.firewall_decision).startswith("block"):
            outcome = Outcome.REFUSED
        elif isinstance(status, int) and status >= 400:
            outcome = Outcome.HTTP_ERROR
        else:
            outcome = Outcome.OK
    tok_order = inner_first + [o for o in ex.tokens if o.startswith("client")]
    tok_observer = next((o for o in tok_order if o in ex.tokens), next(iter(ex.tokens), None))
    tokens = ex.tokens.get(tok_observer) if tok_observer else None
    tok_source = None if tokens is None else (TokenSource.TOKENIZER if tok_observer in ex.tokenizer_counted else TokenSource.USAGE)

    cascade = Cascade(gave_up_unix_ns=dict(ex.gave_up), attempts=dict(ex.attempts))
    engine_last = points.get(point(topo.engine.name, Role.LAST_TOKEN))
    cascade.engine_end_unix_ns = ex.engine_end if ex.engine_end is not None else (engine_last.unix_ns if engine_last else None)
    first = cascade.first_gave_up
    if first is not None and cascade.engine_end_unix_ns is not None:
        cascade.engine_busy_after_gave_up_ns = max(0, cascade.engine_end_unix_ns - first[1])
        inner, outer = topo.links[-1].name, topo.links[0].name
        if ex.engine_tokens_after_disconnect is not None:  # the engine's own count wins
            cascade.tokens_after_gave_up = ex.engine_tokens_after_disconnect
        elif inner in ex.content_events and outer in ex.content_events:
            cascade.tokens_after_gave_up = max(0, ex.content_events[inner] - ex.content_events[outer])

    rids = ex.request_ids
    rid = (rids[0] if len(set(rids)) == 1 else Counter(rids).most_common(1)[0][0]) if rids else None
    tids = tuple(dict.fromkeys(trace_ids or [s.trace_id for s in spans]))
    start = ex.start_ns if ex.start_ns is not None else min((p.unix_ns for p in points.values()), default=None)
    return Row(
        trace_id=tids[0] if tids else "",
        request_id=rid,
        join_method=join_method,
        join_note=join_note,
        start_unix_ns=start,
        outcome=str(outcome),
        http_status=status if isinstance(status, int) else None,
        firewall_decision=ex.firewall_decision,
        labels=ex.labels,
        tokens_in=tokens[0] if tokens else None,
        tokens_out=tokens[1] if tokens else None,
        tokens_source=tok_source,
        points=points,
        deltas=deltas,
        gaps=dict(ex.gaps),
        cascade=cascade,
        trace_ids=tids,
    )
