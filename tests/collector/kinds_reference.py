"""The collector's extraction as it was at a53e57f (plain extractors only), frozen: the migration guard's reference.

Copied from collector/observations.py, litellm_spans.py, points.py (the plain extractors, not the plans) and
decompose.py (the general path of build_row) before issue 16 rewrote them into collector/kinds; caches
removed, nothing else changed. tests/collector/test_kinds_migration.py checks that the new path's rows equal
this module's for generated span sets. Do not edit it to make a test pass.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from deltatap.collector.rows import Cascade, DeltaValue, GapStats, JoinMethod, LinkGaps, PointObs, Row, TokenSource, delta_defs, intermediaries
from deltatap.collector.spans import SpanRecord
from deltatap.core.topology import Topology
from deltatap.core.vocab import (
    SPAN_CLIENT, SPAN_COMPONENT_PREFIX, SPAN_TAP, Attr, ClientEvent, ComponentKind, Observer, Outcome, Role, TapEvent, add_bounds, delta_bound,
    parse_stamp_bounds, point, tap_point,
)

RANK_COMPONENT, RANK_TELEMETRY, RANK_TAP, RANK_FALLBACK = 0, 1, 2, 3
class Obs(NamedTuple):
    """One observation of a point (a tuple: built tens of times per request on the hot path)."""

    point: str
    unix_ns: int
    unc_ns: int
    observer: str
    source: str
    rank: int
    attempt_ns: int  # start of the observing span: later attempts (retries) win ties


@dataclass(slots=True)
class Extracted:
    """Everything the spans of one request say, before points are chosen."""

    obs: list[Obs] = field(default_factory=list)
    tap_overhead: dict[str, tuple[int | None, int | None, int]] = field(default_factory=dict)  # link -> (req, ft, attempt)
    gaps: dict[str, LinkGaps] = field(default_factory=dict)
    attempts: dict[str, int] = field(default_factory=dict)
    content_events: dict[str, int] = field(default_factory=dict)  # link -> content events read from upstream
    gave_up: dict[str, int] = field(default_factory=dict)  # component -> earliest give-up (collector clock)
    engine_end: int | None = None
    request_ids: list[str] = field(default_factory=list)
    http_status: dict[str, int] = field(default_factory=dict)  # observer -> status
    outcome: dict[str, str] = field(default_factory=dict)
    firewall_decision: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    tokens: dict[str, tuple[int | None, int | None]] = field(default_factory=dict)  # observer -> (in, out)
    start_ns: int | None = None
    tokenizer_counted: set[str] = field(default_factory=set)  # observers whose token counts come from a tokenizer
    engine_tokens_after_disconnect: int | None = None
    # (observer, point) -> (before_ns, after_ns): an observation that is an interval, not exact (Attr.STAMP_BOUNDS)
    bounds: dict[tuple[str, str], tuple[int, int]] = field(default_factory=dict)
    tap_overhead_bounds: dict[str, tuple[int, int]] = field(default_factory=dict)  # link -> (request, first token) ns


def as_int(v: Any) -> int | None:
    try:
        return None if v is None else int(v)
    except (TypeError, ValueError):
        return None


def as_float(v: Any) -> float | None:
    try:
        return None if v is None else float(v)
    except (TypeError, ValueError):
        return None


def clock(span: SpanRecord) -> tuple[int, int]:
    """(clock offset, uncertainty) ns the observer stated on its span (0, 0 when it did not)."""
    return as_int(span.attrs.get(Attr.CLOCK_OFFSET_NS)) or 0, max(0, as_int(span.attrs.get(Attr.CLOCK_UNCERTAINTY_NS)) or 0)
SERVICE = "litellm"  # LiteLLM's default OTEL_SERVICE_NAME (the real stack's launcher sets it too)
GUARDRAIL_MODE, GUARDRAIL_STATUS, MASKED_ENTITY_COUNT, CALL_TYPE = "guardrail_mode", "guardrail_status", "masked_entity_count", "call_type"
# the attributes read here (collector.compact keeps them on the live path)
ATTRS: frozenset[str] = frozenset({GUARDRAIL_MODE, GUARDRAIL_STATUS, MASKED_ENTITY_COUNT, CALL_TYPE})
INBOUND_MODES = frozenset({"pre_call", "during_call"})  # guardrail modes that inspect the request
UPSTREAM_CALL_SUFFIX = "<- track_llm_api_timing"
SOURCE = "litellm"


def _decision_intervened(span: SpanRecord) -> str:
    masked = str(span.attrs.get(MASKED_ENTITY_COUNT) or "").strip()
    return "modify" if masked not in ("", "{}", "null", "None") else "block_pattern"


# guardrail_status -> firewall decision (deltatap.firewall.decision values); other statuses
# (guardrail_failed_to_respond, not_run) decide nothing
DECISIONS: dict[str, Callable[[SpanRecord], str]] = {
    "success": lambda _span: "allow",
    "guardrail_intervened": _decision_intervened,
}
_STRENGTH = {"allow": 0, "allow_after_analysis": 1, "modify": 2, "block_pattern": 3, "block_analysis": 3}



def litellm_component(topo: Topology) -> str | None:
    names = [c.name for c in topo.components]
    return SERVICE if SERVICE in names else next(
        (c.name for kind in (ComponentKind.FIREWALL, ComponentKind.GATEWAY) for c in topo.components if c.kind == kind), None)

def _guardrail(span: SpanRecord, comp: str, ex: Extracted) -> None:
    a = span.attrs
    if a.get(GUARDRAIL_MODE) not in INBOUND_MODES or not span.end_unix_ns:
        return
    offset, unc = clock(span)
    end = span.end_unix_ns - offset
    # ties among this observer's decisions go to the highest attempt_ns: the guardrail that ended last
    ex.obs.append(Obs(point(comp, Role.IN_DECISION), end, unc, f"component:{comp}", SOURCE, RANK_COMPONENT, end))
    decide = DECISIONS.get(str(a.get(GUARDRAIL_STATUS)))
    if decide is not None:
        new = decide(span)
        cur = ex.firewall_decision
        if cur is None or _STRENGTH.get(new, 0) > _STRENGTH.get(cur, 0):
            ex.firewall_decision = new


def _service_call(span: SpanRecord, comp: str, ex: Extracted) -> None:
    if not str(span.attrs.get(CALL_TYPE) or "").endswith(UPSTREAM_CALL_SUFFIX):
        return
    offset, unc = clock(span)
    start = span.start_unix_ns - offset
    ex.obs.append(Obs(point(comp, Role.IN_EXIT), start, unc, f"component:{comp}", SOURCE, RANK_FALLBACK, start))


# LiteLLM span name -> handler (spans not listed carry no point)
SPAN_HANDLERS: dict[str, Callable[[SpanRecord, str, Extracted], None]] = {
    "guardrail": _guardrail,
    "self": _service_call,
}


def is_litellm(span: SpanRecord) -> bool:
    return span.service == SERVICE


def extract_litellm(span: SpanRecord, topo: Topology, ex: Extracted) -> None:
    handler = SPAN_HANDLERS.get(span.name)
    if handler is None:
        return
    comp = litellm_component(topo)
    if comp is not None:
        handler(span, comp, ex)
def _common(span: SpanRecord, observer: str, ex: Extracted, offset: int) -> None:
    a = span.attrs
    rid = a.get(Attr.REQUEST_ID)
    if rid:
        ex.request_ids.append(str(rid))
    st = _i(a.get(Attr.HTTP_STATUS))
    if st is not None:
        ex.http_status[observer] = st
    oc = a.get(Attr.OUTCOME)
    if oc:
        ex.outcome[observer] = str(oc)
    fd = a.get(Attr.FIREWALL_DECISION)
    if fd and (ex.firewall_decision is None or observer.startswith("component")):
        ex.firewall_decision = str(fd)
    for k, v in a.items():
        if k.startswith(_LABEL):
            ex.labels.setdefault(k[_LABEL_LEN:], str(v))
    if a.get(Attr.RUN_ID):
        ex.labels.setdefault("run_id", str(a[Attr.RUN_ID]))
    tin, tout = _i(a.get(Attr.GENAI_INPUT_TOKENS)), _i(a.get(Attr.GENAI_OUTPUT_TOKENS))
    if tin is not None or tout is not None:
        ex.tokens[observer] = (tin, tout)
    start = span.start_unix_ns
    s = start - offset
    if start and (ex.start_ns is None or s < ex.start_ns):
        ex.start_ns = s


_LABEL = Attr.LABEL_PREFIX
_LABEL_LEN = len(_LABEL)


_new = tuple.__new__  # builds a NamedTuple (Obs, GapStats) without its Python-level __new__


def _give_up(ex: Extracted, component: str, t: int) -> None:
    if component not in ex.gave_up or t < ex.gave_up[component]:
        ex.gave_up[component] = t


# --------------------------------------------------------------------------------------------
# tap spans
# --------------------------------------------------------------------------------------------

_TAP_EVENTS = {e.value: e for e in TapEvent}
_ENGINE_END_EVENTS = frozenset({TapEvent.RESPONSE_END, TapEvent.UPSTREAM_CLOSED, TapEvent.UPSTREAM_ERROR})



def _tap_points(ds: str, dsk: str, us: str, usk: str) -> dict[TapEvent, str | None]:
    return {ev: tap_point(ev, ds, dsk, us, usk) for ev in TapEvent}

def _tap_link(span: SpanRecord, topo: Topology) -> tuple[str, str, str, str, str]:
    a = span.attrs
    link = a.get(Attr.LINK) or span.name[len(SPAN_TAP) :].strip()
    ds, us = a.get(Attr.DOWNSTREAM), a.get(Attr.UPSTREAM)
    dsk, usk = a.get(Attr.DOWNSTREAM_KIND), a.get(Attr.UPSTREAM_KIND)
    if not (ds and us and dsk and usk):
        spec = next((x for x in topo.links if x.name == link), None)
        if spec is not None:
            ds, us = ds or spec.downstream, us or spec.upstream
            dsk = dsk or topo.component(spec.downstream).kind
            usk = usk or topo.component(spec.upstream).kind
    return str(link), str(ds or "downstream"), str(dsk or ""), str(us or "upstream"), str(usk or "")


def _ms_ns(v: Any) -> int | None:
    f = _f(v)
    return None if f is None else round(f * 1e6)


def _gap_count(cnt: Any) -> int:
    # the usual values (a float per statistic, an int count) skip the generic readers
    if cnt.__class__ is not int:
        cnt = _i(cnt)
        if cnt is None:
            cnt = 0
    return cnt


def _gap_stats(cnt: int, m: Any, p99: Any, mx: Any) -> GapStats | None:
    """One side's gap statistics (milliseconds in, nanoseconds out); None without a mean."""
    if m.__class__ is not float:
        m = _f(m)
        if m is None:
            return None
    p = round(p99 * 1e6) if p99.__class__ is float else _ms_ns(p99)
    x = round(mx * 1e6) if mx.__class__ is float else _ms_ns(mx)
    return _new(GapStats, (cnt, round(m * 1e6), p, x))


def _gap(a: dict, count_key: str, mean: str, p99: str, mx: str) -> GapStats | None:
    return _gap_stats(_gap_count(a.get(count_key)), a.get(mean), a.get(p99), a.get(mx))


def extract_tap(span: SpanRecord, topo: Topology, ex: Extracted) -> None:
    a = span.attrs
    link, ds, dsk, us, usk = _tap_link(span, topo)
    observer = f"tap:{link}"
    offset, unc = _clock(span)
    _common(span, observer, ex, offset)
    ex.attempts[link] = ex.attempts.get(link, 0) + 1
    times: dict[str, int] = {}
    points = _tap_points(ds, dsk, us, usk)
    start = span.start_unix_ns
    events = span.events
    obs_append = ex.obs.append
    intermediary = dsk != ComponentKind.CLIENT
    skip_received = intermediary and any(e[0] == TapEvent.REQUEST_BODY_RECEIVED for e in events)
    sb = parse_stamp_bounds(a.get(Attr.STAMP_BOUNDS))  # {} when the span states none
    for name, t, _ in events:
        ev = _TAP_EVENTS.get(name)
        if ev is None:
            continue
        tc = t - offset
        if name not in times:
            times[name] = tc
        p = points[ev]
        if p is not None:
            if ev is TapEvent.REQUEST_RECEIVED and skip_received:
                continue  # an intermediary has let the request go when its last byte arrived (below)
            obs_append(Obs(p, tc, unc, observer, "tap", RANK_TAP, start))
            if name in sb:
                ex.bounds[(observer, p)] = sb[name]
        elif ev is TapEvent.REQUEST_BODY_RECEIVED and intermediary:
            p = point(ds, Role.IN_EXIT)
            obs_append(Obs(p, tc, unc, observer, "tap", RANK_TAP, start))
            if name in sb:
                ex.bounds[(observer, p)] = sb[name]
        elif ev is TapEvent.DOWNSTREAM_CLOSED:
            _give_up(ex, ds, tc)
        elif ev in _ENGINE_END_EVENTS and usk == ComponentKind.ENGINE:
            ex.engine_end = tc if ex.engine_end is None else max(ex.engine_end, tc)
    req = _i(a.get(Attr.OVERHEAD_REQUEST_NS))
    if req is None and TapEvent.REQUEST_RECEIVED in times and TapEvent.REQUEST_FORWARDED in times:
        req = times[TapEvent.REQUEST_FORWARDED] - times[TapEvent.REQUEST_RECEIVED]
    ft = _i(a.get(Attr.OVERHEAD_FIRST_TOKEN_NS))
    if ft is None and TapEvent.FIRST_TOKEN_RECEIVED in times and TapEvent.FIRST_TOKEN_FORWARDED in times:
        ft = times[TapEvent.FIRST_TOKEN_FORWARDED] - times[TapEvent.FIRST_TOKEN_RECEIVED]
    prev = ex.tap_overhead.get(link)
    if prev is None or start >= prev[2]:
        ex.tap_overhead[link] = (req, ft, start)
        if sb:  # the overheads are forwarded - received: the bounds of both ends
            first_in = TapEvent.REQUEST_BODY_RECEIVED if TapEvent.REQUEST_BODY_RECEIVED in times else TapEvent.REQUEST_RECEIVED
            ex.tap_overhead_bounds[link] = (delta_bound(sb.get(TapEvent.REQUEST_FORWARDED), sb.get(first_in)),
                                            delta_bound(sb.get(TapEvent.FIRST_TOKEN_FORWARDED), sb.get(TapEvent.FIRST_TOKEN_RECEIVED)))
        else:
            ex.tap_overhead_bounds.pop(link, None)
        up = _gap(a, Attr.GAP_COUNT, Attr.GAP_MEAN_MS, Attr.GAP_P99_MS, Attr.GAP_MAX_MS)
        down = _gap(a, Attr.GAP_COUNT, Attr.GAP_FWD_MEAN_MS, Attr.GAP_FWD_P99_MS, Attr.GAP_FWD_MAX_MS)
        if up or down:
            ex.gaps[link] = LinkGaps(up, down)
        ce = _i(a.get(Attr.CONTENT_EVENTS))
        if ce is not None:
            ex.content_events[link] = ce
    if usk == ComponentKind.ENGINE:
        prompt_ms = _f(a.get(Attr.ENGINE_PROMPT_MS))
        first = times.get(TapEvent.FIRST_TOKEN_RECEIVED)
        if prompt_ms is not None and first is not None:
            # llama.cpp timings: prefill took prompt_ms and ended when the first token came out
            obs_append(Obs(point(us, Role.EXEC_START), first - round(prompt_ms * 1e6), unc, observer, "llamacpp", RANK_TELEMETRY, start))
        pn, dn = _i(a.get(Attr.ENGINE_PROMPT_N)), _i(a.get(Attr.ENGINE_PREDICTED_N))
        if (pn is not None or dn is not None) and observer not in ex.tokens:
            ex.tokens[observer] = (pn, dn)


# --------------------------------------------------------------------------------------------
# client spans
# --------------------------------------------------------------------------------------------

_CLIENT_ROLES = {
    ClientEvent.SEND.value: Role.SEND,
    ClientEvent.FIRST_TOKEN.value: Role.FIRST_TOKEN_RECEIVED,
    ClientEvent.LAST_TOKEN.value: Role.LAST_TOKEN_RECEIVED,
    ClientEvent.END.value: Role.END,
}
_CLIENT_GAVE_UP = {ClientEvent.CANCEL.value, ClientEvent.ERROR.value}


def extract_client(span: SpanRecord, topo: Topology, ex: Extracted) -> None:
    client = topo.client.name
    observer = f"client:{span.service or client}"
    offset, unc = _clock(span)
    _common(span, observer, ex, offset)
    source = "aiperf" if span.service == "aiperf" else "client"
    if source == "aiperf" and observer in ex.tokens:
        ex.tokenizer_counted.add(observer)  # AIPerf counts tokens with its tokenizer
    a = span.attrs
    sb = parse_stamp_bounds(a.get(Attr.STAMP_BOUNDS))  # {} when the span states none
    for name, t, _ in span.events:
        role = _CLIENT_ROLES.get(name)
        if role is not None:
            p = point(client, role)
            ex.obs.append(Obs(p, t - offset, unc, observer, source, RANK_COMPONENT, span.start_unix_ns))
            if name in sb:
                ex.bounds[(observer, p)] = sb[name]
        elif name in _CLIENT_GAVE_UP:
            _give_up(ex, client, t - offset)


# --------------------------------------------------------------------------------------------
# component spans (reference stack, any component that states its own points)
# --------------------------------------------------------------------------------------------

_ROLES = {r.value: r for r in Role}


def extract_component(span: SpanRecord, topo: Topology, ex: Extracted) -> None:
    a = span.attrs
    comp = str(a.get(Attr.COMPONENT) or span.name[len(SPAN_COMPONENT_PREFIX) :].lstrip(".") or span.service)
    observer = f"component:{comp}"
    offset, unc = _clock(span)
    _common(span, observer, ex, offset)
    kind = a.get(Attr.COMPONENT_KIND)
    after = _i(a.get(Attr.ENGINE_TOKENS_AFTER_DISCONNECT))
    if after is not None:
        ex.engine_tokens_after_disconnect = after
    for name, t, _ in span.events:
        tc = t - offset
        role = _ROLES.get(name)
        if role is not None:
            ex.obs.append(Obs(point(comp, role), tc, unc, observer, "component", RANK_COMPONENT, span.start_unix_ns))
            if role == Role.LAST_TOKEN and (kind == ComponentKind.ENGINE or comp == topo.engine.name):
                ex.engine_end = tc if ex.engine_end is None else max(ex.engine_end, tc)
        elif name == TapEvent.TIMEOUT.value:  # the component's own timeout toward its upstream fired
            _give_up(ex, comp, tc)
    if (kind == ComponentKind.ENGINE or comp == topo.engine.name) and span.end_unix_ns:
        end = span.end_unix_ns - offset
        ex.engine_end = end if ex.engine_end is None else max(ex.engine_end, end)


# --------------------------------------------------------------------------------------------
# vLLM's llm_request span
# --------------------------------------------------------------------------------------------


def extract_vllm(span: SpanRecord, topo: Topology, ex: Extracted) -> None:
    a = span.attrs
    engine = topo.engine.name
    observer = f"component:{engine}"
    offset, unc = _clock(span)
    _common(span, observer, ex, offset)
    t0 = span.start_unix_ns - offset  # vLLM starts the span at the request's arrival
    s = lambda k: None if _f(a.get(k)) is None else round(_f(a.get(k)) * 1e9)  # noqa: E731
    queue, ttft, prefill, decode, inference = s(Attr.VLLM_TIME_IN_QUEUE), s(Attr.VLLM_TTFT), s(Attr.VLLM_PREFILL), s(Attr.VLLM_DECODE), s(Attr.VLLM_INFERENCE)
    add = lambda role, t: ex.obs.append(Obs(point(engine, role), t, unc, observer, "vllm", RANK_COMPONENT, span.start_unix_ns))  # noqa: E731
    add(Role.QUEUE, t0)
    if queue is not None:
        add(Role.EXEC_START, t0 + queue)
    if ttft is not None:
        add(Role.FIRST_TOKEN, t0 + ttft)
    if queue is not None and inference is not None:
        last = t0 + queue + inference
    elif queue is not None and prefill is not None and decode is not None:
        last = t0 + queue + prefill + decode
    else:
        last = None
    if last is not None:
        add(Role.LAST_TOKEN, last)
        ex.engine_end = last if ex.engine_end is None else max(ex.engine_end, last)


# --------------------------------------------------------------------------------------------
# registry
# --------------------------------------------------------------------------------------------


def _is_tap(s: SpanRecord) -> bool:
    return s.attrs.get(Attr.OBSERVER) == Observer.TAP or s.name.startswith(SPAN_TAP)


def _is_client(s: SpanRecord) -> bool:
    return s.attrs.get(Attr.OBSERVER) == Observer.CLIENT or s.name == SPAN_CLIENT


def _is_component(s: SpanRecord) -> bool:
    return s.attrs.get(Attr.OBSERVER) == Observer.COMPONENT or s.name.startswith(SPAN_COMPONENT_PREFIX + ".")


def _is_vllm(s: SpanRecord) -> bool:
    return s.name == "llm_request" or Attr.VLLM_TTFT in s.attrs


Extractor = Callable[[SpanRecord, Topology, Extracted], None]
EXTRACTORS: list[tuple[str, Callable[[SpanRecord], bool], Extractor]] = [
    ("tap", _is_tap, extract_tap),
    ("client", _is_client, extract_client),
    ("component", _is_component, extract_component),
    ("litellm", is_litellm, extract_litellm),  # collector.litellm_spans
    ("vllm", _is_vllm, extract_vllm),
]




def _kind(span: SpanRecord) -> str | None:
    for name, match, _ in EXTRACTORS:
        if match(span):
            return name
    return None


def extract(spans: list[SpanRecord], topo: Topology) -> Extracted:
    ex = Extracted()
    for span in spans:
        for _, match, fn in EXTRACTORS:
            if match(span):
                fn(span, topo, ex)
                break
    return ex






_new = tuple.__new__  # builds a NamedTuple (PointObs, DeltaValue) without its Python-level __new__


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
            if b:
                if b > 0:  # (BOUND_UNKNOWN: the err keeps its clock part)
                    d = _new(DeltaValue, (d[0], d[1] + b, d[2]))
                if delta_bounds is not None:
                    delta_bounds[name] = b
        out[name] = d
    return out


class _TopoPlan:
    """What build_row needs of a topology, worked out once per topology object."""

    __slots__ = ("point_defs", "mid_links", "residual_terms", "residual_taps", "order", "inner_first", "engine_last", "inner_outer", "rows")

    def __init__(self, topo: Topology) -> None:
        defs = delta_defs(topo)
        self.point_defs = [(d.name, d.end, d.start) for d in defs if d.end]
        # (link it answers on, link it calls out on, names of its mean, p99 and max ITL deltas) per intermediary
        self.mid_links = [(link_out, link_in, f"{m}_itl_added_mean", f"{m}_itl_added_p99", f"{m}_max_pause_added")
                          for m, link_out, link_in in _mid_links(topo)]
        self.residual_terms = [d.name for d in defs if d.contributes and d.phase != "tap"]
        self.residual_taps = [(x.name, *_tap_names(x.name)) for x in topo.links]
        self.order = [f"tap:{x.name}" for x in topo.links] + [f"component:{c.name}" for c in topo.components]
        self.inner_first = [f"tap:{x.name}" for x in reversed(topo.links)] + [f"component:{topo.engine.name}"]
        self.engine_last = point(topo.engine.name, Role.LAST_TOKEN)
        self.inner_outer = (topo.links[-1].name, topo.links[0].name) if topo.links else None  # innermost, outermost link


def _tap_names(link: str) -> tuple[str, str]:
    return (f"tap_{link}_request", f"tap_{link}_first_token")


def _mid_links(topo: Topology) -> list[tuple[str, str | None, str | None]]:
    """(intermediary, link it answers on, link it calls out on) per intermediary."""
    return [(m, next((x.name for x in topo.links if x.upstream == m), None), next((x.name for x in topo.links if x.downstream == m), None)) for m in intermediaries(topo)]


def _itl_added(tp: _TopoPlan, ex: Extracted, out: dict[str, DeltaValue]) -> None:
    """Per intermediary: the gap statistic it released minus the one it received (mean, p99, max)."""
    gaps = ex.gaps
    for link_out, link_in, n_mean, n_p99, n_max in tp.mid_links:
        g = gaps.get(link_out)
        g_out = None if g is None else g.up
        g = gaps.get(link_in)
        g_in = None if g is None else g.down
        if g_out is None or g_in is None:
            continue
        _, a_mean, a_p99, a_max = g_out
        _, b_mean, b_p99, b_max = g_in
        if a_mean is not None and b_mean is not None:
            out[n_mean] = _new(DeltaValue, (int(a_mean) - int(b_mean), 0, False))
        if a_p99 is not None and b_p99 is not None:
            out[n_p99] = _new(DeltaValue, (int(a_p99) - int(b_p99), 0, False))
        if a_max is not None and b_max is not None:
            out[n_max] = _new(DeltaValue, (int(a_max) - int(b_max), 0, False))


_CAUSE_HIDDEN = (Outcome.UPSTREAM_ERROR, Outcome.HTTP_ERROR, Outcome.UPSTREAM_ERROR.value, Outcome.HTTP_ERROR.value)


def _residual(tp: _TopoPlan, deltas: dict[str, DeltaValue], ex: Extracted) -> DeltaValue | None:
    """system_ttft minus every term of the TTFT path (the tap overheads of the links that were tapped)."""
    total = deltas.get("system_ttft")
    if total is None:
        return None
    ns = err = 0
    for n in tp.residual_terms:
        d = deltas.get(n)
        if d is None:
            return None
        ns += d[0]
        err += d[1]
    attempts = ex.attempts
    for link, n_req, n_ft in tp.residual_taps:
        if attempts.get(link, 0):  # an untapped link costs nothing
            d = deltas.get(n_req)
            if d is None:
                return None
            ns += d[0]
            err += d[1]
            d = deltas.get(n_ft)
            if d is None:
                return None
            ns += d[0]
            err += d[1]
    return _new(DeltaValue, (total[0] - ns, total[1] + err, False))


_UNSET = object()


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
    if not isinstance(spans, list | tuple):
        spans = list(spans)  # read more than once below
    tp = _TopoPlan(topo)
    point_bounds: dict[str, tuple[int, int]] = {}
    delta_bounds: dict[str, int] = {}
    ex = extract(list(spans), topo)
    by = choose_points(ex.obs)
    deltas = _point_deltas(tp.point_defs, by, ex.bounds, delta_bounds)
    points = {p: _new(PointObs, o[0][1:5]) for p, o in by.items()}  # Obs[1:5]: unix_ns, unc_ns, observer, source
    if ex.bounds:
        for p, o in by.items():
            b = ex.bounds.get((o[0][3], p))
            if b:
                point_bounds[p] = b
    for link, (req, ft, _) in ex.tap_overhead.items():
        names = _tap_names(link)
        req_b, ft_b = ex.tap_overhead_bounds.get(link, (0, 0))
        if req is not None:
            deltas[names[0]] = _new(DeltaValue, (req, max(0, req_b), True))
            if req_b:
                delta_bounds[names[0]] = req_b
        if ft is not None:
            deltas[names[1]] = _new(DeltaValue, (ft, max(0, ft_b), True))
            if ft_b:
                delta_bounds[names[1]] = ft_b
    if ex.gaps:
        _itl_added(tp, ex, deltas)
    res = _residual(tp, deltas, ex)
    if res is not None:
        deltas["residual"] = res
        if delta_bounds:
            b = add_bounds(delta_bounds.get("system_ttft", 0), *(delta_bounds.get(n, 0) for n in tp.residual_terms),
                           *(delta_bounds.get(n, 0) for link, r, f in tp.residual_taps if ex.attempts.get(link, 0) for n in (r, f)))
            if b:
                delta_bounds["residual"] = b

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
    engine_last = points.get(tp.engine_last)
    cascade.engine_end_unix_ns = ex.engine_end if ex.engine_end is not None else (engine_last.unix_ns if engine_last else None)
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
    start = ex.start_ns if ex.start_ns is not None else min((p.unix_ns for p in points.values()), default=None)
    row = Row(  # positional, in field order: trace_id .. trace_ids
        tids[0] if tids else "", rid, join_method, join_note, start, str(outcome), status if isinstance(status, int) else None,
        ex.firewall_decision, ex.labels, tokens[0] if tokens else None, tokens[1] if tokens else None, tok_source, points, deltas,
        ex.gaps, cascade, tids,
    )
    if point_bounds or delta_bounds:
        row.point_bounds, row.delta_bounds = point_bounds, delta_bounds
    return row

_clock, _f, _i = clock, as_float, as_int
