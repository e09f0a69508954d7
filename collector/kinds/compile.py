"""A span kind's :class:`~deltatap.collector.kinds.model.Site` + a layout's value positions -> one reader.

The reader, ``run(src, ex, vals, uncs) -> Shape``, takes a span's values as one tuple (``src``: start, end,
every event's time, then attribute values at the positions the layout gives, a final None for "absent") and
records what the span says in ``ex`` (:class:`~deltatap.collector.observations.Extracted`) the way the Site
describes, except its observations: their *times* go to ``vals`` (moved onto the collector's clock), the
span's clock uncertainty to ``uncs`` (once), and the Shape it returns says, for each of those times, which
point, observer, source and rank it is. Everything that depends only on the layout (which position holds which
attribute, which event observes which point, which facts exist) is decided here, once: the reader is Python
source generated for that layout and compiled, so per span only the values are read. A compact span's tuple
comes straight from its packed form (:meth:`deltatap.collector.compact.Layout.values`), a ``SpanRecord``'s from
its dict; both take the same reader, so the plain path and the fast path cannot differ.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from deltatap.collector.kinds.model import PER_LINK, Emit, EngineEnd, Fact, GiveUp, Into, Site
from deltatap.collector.observations import Extracted, as_float, as_int
from deltatap.collector.rows import GapStats, LinkGaps
from deltatap.core.vocab import Attr, delta_bound, parse_stamp_bounds

# a slot: (point, observer, source, rank, attempt is the observation's own time rather than its span's start)
Slot = tuple[str, str, str, int, bool]


class Shape:
    """The observations a reader contributes, in order (one object per variant: row plans are keyed by identity)."""

    __slots__ = ("slots",)

    def __init__(self, slots: tuple[Slot, ...]) -> None:
        self.slots = slots


class Program:
    """A compiled reader and what the joiner needs of the layout: the kind's name, the link and where the
    request id and body fingerprint are."""

    __slots__ = ("run", "kind", "site", "p_rid", "p_fp", "source")

    def __init__(self, run: Callable[[tuple, Extracted, list, list], Shape], kind: str | None, site: Site | None,
                 p_rid: int, p_fp: int, source: str) -> None:
        self.run, self.kind, self.site, self.p_rid, self.p_fp, self.source = run, kind, site, p_rid, p_fp, source


_EMPTY = Shape(())


def _skip(src: tuple, ex: Extracted, vals: list, uncs: list) -> Shape:
    uncs.append(0)
    return _EMPTY


def skip_program(none: int) -> Program:
    """The reader of a span no kind knows (or whose site says nothing)."""
    return Program(_skip, None, None, none, none, "")


def _gap(cnt: Any, m: Any, p99: Any, mx: Any) -> GapStats | None:
    """One side's gap statistics (milliseconds in, nanoseconds out); None without a mean."""
    if m.__class__ is not float:
        m = as_float(m)
        if m is None:
            return None
    p = round(p99 * 1e6) if p99.__class__ is float else _ms_ns(p99)
    x = round(mx * 1e6) if mx.__class__ is float else _ms_ns(mx)
    return _new(GapStats, (cnt, round(m * 1e6), p, x))


def _ms_ns(v: Any) -> int | None:
    f = as_float(v)
    return None if f is None else round(f * 1e6)


def _gap_count(cnt: Any) -> int:
    if cnt.__class__ is not int:
        cnt = as_int(cnt)
        if cnt is None:
            cnt = 0
    return cnt


_new = tuple.__new__
_ENV = {"as_int": as_int, "as_float": as_float, "_new": _new, "LinkGaps": LinkGaps, "GapStats": GapStats, "_gap": _gap, "_gap_count": _gap_count,
        "parse_stamp_bounds": parse_stamp_bounds, "delta_bound": delta_bound}


def compile_site(kind: str, kind_facts: tuple[Fact, ...], common: bool, site: Site, names: tuple[str, ...],
                 pos: Mapping[str, int], none: int) -> Program:
    """The reader of ``site`` for a layout with event ``names`` and attributes at ``pos`` (absent: ``none``)."""
    env: dict[str, Any] = dict(_ENV)
    lines: list[str] = []
    w = lines.append

    def c(v: Any) -> str:  # a constant of the reader
        name = f"_k{len(env)}"
        env[name] = v
        return name

    def at(key: str) -> int | None:
        return pos.get(key)

    def num(var: str, p: int, cls: str = "int") -> None:
        w(f"    {var} = src[{p}]")
        w(f"    if {var}.__class__ is not {cls}: {var} = as_{cls}({var})")

    obs = c(site.observer)
    w("    start = src[0]")
    p_off, p_unc = at(Attr.CLOCK_OFFSET_NS), at(Attr.CLOCK_UNCERTAINTY_NS)
    shifted = p_off is not None
    if shifted:
        w(f"    offset = src[{p_off}]")
        w("    if offset.__class__ is not int: offset = as_int(offset) or 0")
    if p_unc is not None:
        w(f"    unc = src[{p_unc}]")
        w("    if unc.__class__ is not int: unc = as_int(unc) or 0")
        w("    if unc < 0: unc = 0")
        w("    uncs.append(unc)")
    else:
        w("    uncs.append(0)")

    def t(p: int) -> str:  # an event time on the collector's clock
        return f"(src[{p}] - offset)" if shifted else f"src[{p}]"

    # ---- facts per observer, in the description's order
    facts = [f for f in kind_facts if f.into not in PER_LINK]
    link_facts = {f.into: f for f in (*kind_facts, *site.facts) if f.into in PER_LINK}
    tok = {f.into: at(f.attr) for f in facts if f.into in (Into.TOKENS_IN, Into.TOKENS_OUT)}
    for f in facts:
        p = at(f.attr)
        if f.into is Into.LABELS:
            labels = [(k[len(f.attr):], q) for k, q in pos.items() if k.startswith(f.attr)]
            for name, q in sorted(labels, key=lambda x: x[1]):
                w(f"    ex.labels.setdefault({c(name)}, str(src[{q}]))")
            continue
        if f.into in (Into.TOKENS_IN, Into.TOKENS_OUT):  # both at the first of them, as a pair
            if tok and any(q is not None for q in tok.values()):
                for into, var in ((Into.TOKENS_IN, "tin"), (Into.TOKENS_OUT, "tout")):
                    q = tok.get(into)
                    w(f"    {var} = None") if q is None else num(var, q)
                w(f"    if tin is not None or tout is not None: ex.tokens[{obs}] = (tin, tout)")
            tok = {}
            continue
        if p is None:
            continue
        if f.into is Into.REQUEST_ID:
            w(f"    v = src[{p}]")
            w("    if v: ex.request_ids.append(str(v))")
        elif f.into is Into.HTTP_STATUS:
            num("v", p)
            w(f"    if v is not None: ex.http_status[{obs}] = v")
        elif f.into is Into.OUTCOME:
            w(f"    v = src[{p}]")
            w(f"    if v: ex.outcome[{obs}] = str(v)")
        elif f.into is Into.DECISION:
            w(f"    v = src[{p}]")
            w(f"    if v{'' if site.decides else ' and ex.firewall_decision is None'}: ex.firewall_decision = str(v)")
        elif f.into is Into.RUN_ID:
            w(f"    v = src[{p}]")
            w('    if v: ex.labels.setdefault("run_id", str(v))')
        elif f.into is Into.AFTER_DISCONNECT:
            num("v", p)
            w("    if v is not None: ex.engine_tokens_after_disconnect = v")
    if common:
        w(f"    s = start{' - offset' if shifted else ''}")
        w("    if start and (ex.start_ns is None or s < ex.start_ns): ex.start_ns = s")
    if site.tokenizer:
        w(f"    if {obs} in ex.tokens: ex.tokenizer_counted.add({obs})")
    if site.decision is not None:
        value, strength = site.decision
        w("    cur = ex.firewall_decision")
        w(f"    if cur is None or {strength.get(value, 0)} > {c(strength)}.get(cur, 0): ex.firewall_decision = {c(value)}")
    link = c(site.link) if site.link is not None else None
    if link is not None:
        w(f"    ex.attempts[{link}] = ex.attempts.get({link}, 0) + 1")

    # ---- events
    present = set(names)
    slots: list[Slot] = []
    times: list[str] = []
    bounded: list[tuple[str, str]] = []  # (event, point), in event order
    first: dict[str, int] = {}
    for i, name in enumerate(names):
        first.setdefault(name, 2 + i)
        act = site.events.get(name)
        if act is None:
            continue
        if isinstance(act, Emit):
            if act.unless is not None and act.unless in present:
                continue
            slots.append((act.point, site.observer, act.source or site.source, site.rank if act.rank is None else act.rank, False))
            times.append(t(2 + i))
            bounded.append((name, act.point))
            if act.engine_end:
                _engine_end(w, t(2 + i))
        elif isinstance(act, GiveUp):
            comp = c(act.component)
            w(f"    v = {t(2 + i)}")
            w(f"    g = ex.gave_up.get({comp})")
            w(f"    if g is None or v < g: ex.gave_up[{comp}] = v")
        elif isinstance(act, EngineEnd):
            _engine_end(w, t(2 + i))
    if times:
        w(f"    vals += ({', '.join(times)},)")
    p_sb = at(Attr.STAMP_BOUNDS) if site.bounds else None
    if p_sb is not None:
        w(f"    sb = parse_stamp_bounds(src[{p_sb}])")
        if bounded:
            w("    if sb:")
            for name, point in bounded:
                w(f"        b = sb.get({c(name)})")
                w(f"        if b is not None: ex.bounds[({obs}, {c(point)})] = b")

    # ---- per link, from the latest attempt (taps)
    if link is not None and link_facts:
        for var, into in (("req", Into.OVERHEAD_REQUEST), ("ft", Into.OVERHEAD_FIRST_TOKEN)):
            f = link_facts.get(into)
            p = None if f is None else at(f.attr)
            w(f"    {var} = None") if p is None else num(var, p)
            if f is not None and f.fallback and f.fallback[0] in first and f.fallback[1] in first:
                w(f"    if {var} is None: {var} = src[{first[f.fallback[1]]}] - src[{first[f.fallback[0]]}]")
        w(f"    prev = ex.tap_overhead.get({link})")
        w("    if prev is None or start >= prev[2]:")
        w(f"        ex.tap_overhead[{link}] = (req, ft, start)")
        if p_sb is not None:
            req_f, ft_f = link_facts.get(Into.OVERHEAD_REQUEST), link_facts.get(Into.OVERHEAD_FIRST_TOKEN)
            pairs = []
            for f, body_first in ((req_f, True), (ft_f, False)):
                if f is None or f.fallback is None:
                    pairs.append("0")
                    continue
                recv, fwd = f.fallback
                if body_first and site.values.get("body_received") in first:
                    recv = site.values["body_received"]
                pairs.append(f"delta_bound(sb.get({c(fwd)}), sb.get({c(recv)}))")
            w("        if sb:")
            w(f"            ex.tap_overhead_bounds[{link}] = ({pairs[0]}, {pairs[1]})")
            w("        else:")
            w(f"            ex.tap_overhead_bounds.pop({link}, None)")
        else:
            w(f"        ex.tap_overhead_bounds.pop({link}, None)")
        g = {into: (None if link_facts.get(into) is None else at(link_facts[into].attr)) for into in
             (Into.GAP_COUNT, Into.GAP_UP_MEAN, Into.GAP_UP_P99, Into.GAP_UP_MAX, Into.GAP_DOWN_MEAN, Into.GAP_DOWN_P99, Into.GAP_DOWN_MAX)}
        up, down = g[Into.GAP_UP_MEAN] is not None, g[Into.GAP_DOWN_MEAN] is not None
        if up or down:
            r = lambda into: f"src[{none if g[into] is None else g[into]}]"  # noqa: E731
            w(f"        cnt = {r(Into.GAP_COUNT)}")
            w("        if cnt.__class__ is not int: cnt = _gap_count(cnt)")
            for var, on, stats in (("up", up, (Into.GAP_UP_MEAN, Into.GAP_UP_P99, Into.GAP_UP_MAX)),
                                   ("down", down, (Into.GAP_DOWN_MEAN, Into.GAP_DOWN_P99, Into.GAP_DOWN_MAX))):
                if not on:
                    w(f"        {var} = None")
                    continue
                w(f"        gm, gp, gx = {', '.join(r(i) for i in stats)}")
                # all three in float milliseconds (the usual case): _gap's arithmetic inline, else _gap itself
                w(f"        {var} = _new(GapStats, (cnt, round(gm * 1e6), round(gp * 1e6), round(gx * 1e6))) "
                  "if gm.__class__ is float and gp.__class__ is float and gx.__class__ is float else _gap(cnt, gm, gp, gx)")
            w(f"        if up or down: ex.gaps[{link}] = _new(LinkGaps, (up, down))")
        f = link_facts.get(Into.CONTENT_EVENTS)
        if f is not None and at(f.attr) is not None:
            w(f"        v = src[{at(f.attr)}]")
            w("        if v.__class__ is not int: v = as_int(v)")
            w(f"        if v is not None: ex.content_events[{link}] = v")

    # ---- the span's start and end
    for e in site.edges:
        raw = "src[0]" if e.at == "start" else "src[1]"
        tv = f"({raw} - offset)" if shifted else raw
        if e.point is None:
            if e.engine_end:
                w(f"    if {raw}:")
                _engine_end(w, tv, "    ")
            continue
        slots.append((e.point, site.observer, e.source or site.source, site.rank if e.rank is None else e.rank, e.attempt_is_time))
        w(f"    vals.append({tv})")
        if e.engine_end:
            _engine_end(w, tv)

    # ---- observations computed from attributes: each may be missing, one Shape per combination
    variants: list[tuple[int, Slot]] = []
    for j, d in enumerate(site.derived):
        base = "src[0]" if d.base == "start" else (f"src[{first[d.base]}]" if d.base in first else None)
        alts = [alt for alt in d.alternatives if all(at(a) is not None for a, _, _ in alt)]
        if base is None or not alts:
            continue
        bit = 1 << len(variants)
        variants.append((bit, (d.point, site.observer, d.source or site.source, site.rank if d.rank is None else d.rank, False)))
        w("    got = None")
        for k, alt in enumerate(alts):
            for n, (a, _, _) in enumerate(alt):
                num(f"a{n}", at(a), "float")
            cond = " and ".join(f"a{n} is not None" for n in range(len(alt)))
            terms = " ".join(f"{'+' if sign > 0 else '-'} round(a{n} * {float(unit)!r})" for n, (_, unit, sign) in enumerate(alt))
            w(f"    if got is None and {cond}: got = ({base}{' - offset' if shifted else ''}) {terms}")
        w("    if got is not None:")
        w("        vals.append(got)")
        w(f"        m |= {bit}")
        if d.engine_end:
            _engine_end(w, "got", "    ")
    # ---- facts that hold only at this site (after the kind's)
    unless = {f.into: at(f.attr) for f in site.facts if f.into in (Into.TOKENS_IN_UNLESS_STATED, Into.TOKENS_OUT_UNLESS_STATED)}
    if any(q is not None for q in unless.values()):
        for into, var in ((Into.TOKENS_IN_UNLESS_STATED, "tin"), (Into.TOKENS_OUT_UNLESS_STATED, "tout")):
            q = unless.get(into)
            w(f"    {var} = as_int(src[{none if q is None else q}])")
        w(f"    if (tin is not None or tout is not None) and {obs} not in ex.tokens: ex.tokens[{obs}] = (tin, tout)")
    base_slots = tuple(slots)
    if variants:
        shapes = []
        for mask in range(1 << len(variants)):
            shapes.append(Shape(base_slots + tuple(s for bit, s in variants if mask & bit)))
        lines.insert(0, "    m = 0")
        w(f"    return {c(tuple(shapes))}[m]")
    else:
        w(f"    return {c(Shape(base_slots))}")
    src_text = "def run(src, ex, vals, uncs):\n" + "\n".join(lines) + "\n"
    exec(compile(src_text, f"<deltatap.collector.kinds {kind} {site.observer}>", "exec"), env)  # noqa: S102 - our own generated source
    run = env["run"]
    run.source = src_text  # type: ignore[attr-defined]  (for reading and debugging a reader)
    return Program(run, kind, site, pos.get(Attr.REQUEST_ID, none), pos.get(Attr.BODY_FINGERPRINT, none), src_text)


def _engine_end(w: Callable[[str], None], tv: str, indent: str = "") -> None:
    w(f"{indent}    e = {tv}")
    w(f"{indent}    if ex.engine_end is None or e > ex.engine_end: ex.engine_end = e")
