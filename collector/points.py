"""From spans to observations: which timeline point each span event observes, and the facts spans carry.

One small extractor per kind of span, registered in :data:`EXTRACTORS` and picked by the first
whose ``match`` accepts the span (no if-chains):

* ``tap`` - deltatap's tap spans (``deltatap.observer = tap``): events -> points through
  :func:`deltatap.vocab.tap_point` (an intermediary's ``in.exit`` is when the tap read the last byte
  of the request body, ``request.body_received``, when the tap recorded it: the component has let the
  request go only once it wrote it all; the client's ``send`` stays the head's arrival); tap overhead, gap statistics, usage, llama.cpp ``timings``
  (``deltatap.engine.prompt_ms``: the engine's prefill ended at the first token, so prefill began
  ``prompt_ms`` before it), disconnects (who gave up, when);
* ``client`` - the load generator's client span (events ``client.*``), or an AIPerf record turned
  into one (:mod:`deltatap.collector.ingest`);
* ``component`` - a component's own span (``deltatap.observer = component``): events named by
  :class:`deltatap.vocab.Role` values are that component's *true* points;
* ``vllm`` - vLLM's ``llm_request`` span: ``gen_ai.latency.*`` seconds relative to the span start
  (the request's arrival in the engine) give queue, prefill start, first and last token;
* ``litellm`` - LiteLLM proxy's own spans (service.name ``litellm``): the guardrail's end is the
  component's ``in.decision`` (t4) and its status the firewall decision (:mod:`deltatap.collector.litellm_spans`).

Every observation is shifted onto the collector's clock (``t - deltatap.clock.offset_ns``) and
carries that observer's ``deltatap.clock.uncertainty_ns``. ``rank`` orders sources when several
observe one point: a component's own stamp (0) beats engine telemetry (1) beats a tap (2) beats a
component's approximate stamp (3). The observation types live in :mod:`deltatap.collector.observations`.

Live spans (:class:`collector.compact.CompactSpan`) go through *plans*: everything that depends only on
a span's :class:`~collector.compact.Layout` (which extractor, the link and its components, the
observer, which event index observes which point, which attributes exist) is worked out once per
(layout, topology), with the same rules as the extractors above, and cached; per span only its numbers
and per-request values are read, by position from the compact span's packed form (its attrs and events
are never unpacked). A layout is planned from its second span on (the first takes the plain
extractor: a one-off shape costs no plan). A layout whose shape-forming attributes (observer, link,
components, component name or kind) are not part of the layout is extracted by the plain extractor,
as are vLLM and LiteLLM spans and every ``SpanRecord`` (offline input). The plans assume the registry
below is the module's own: if :data:`EXTRACTORS` is changed, every span takes the plain path.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable
from operator import itemgetter
from typing import Any

from deltatap.collector.compact import CompactSpan, tuple_getter
from deltatap.collector.litellm_spans import extract_litellm, is_litellm
from deltatap.collector.observations import RANK_COMPONENT, RANK_TAP, RANK_TELEMETRY, Extracted, Obs
from deltatap.collector.observations import as_float as _f
from deltatap.collector.observations import as_int as _i
from deltatap.collector.observations import clock as _clock
from deltatap.collector.rows import GapStats, LinkGaps
from deltatap.collector.spans import SpanRecord
from deltatap.core.topology import Topology
from deltatap.core.vocab import (
    SPAN_CLIENT, SPAN_COMPONENT_PREFIX, SPAN_TAP, Attr, ClientEvent, ComponentKind, Observer, Role, TapEvent, delta_bound, parse_stamp_bounds, point,
    tap_point,
)

__all__ = [
    "EXTRACTORS", "RANK_COMPONENT", "RANK_TAP", "RANK_TELEMETRY", "Extracted", "Obs", "Shape", "SpanReader", "extract", "extract_flat",
    "plans_apply", "reader_decided", "span_kind", "span_reader", "varying_keys",
]


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


_POINTS_CACHE: dict[tuple[str, str, str, str], dict[TapEvent, str | None]] = {}


def _tap_points(ds: str, dsk: str, us: str, usk: str) -> dict[TapEvent, str | None]:
    """The point each tap event observes on a link (memoised: the same few links repeat)."""
    key = (ds, dsk, us, usk)
    m = _POINTS_CACHE.get(key)
    if m is None:
        if len(_POINTS_CACHE) > 4096:
            _POINTS_CACHE.clear()
        m = _POINTS_CACHE[key] = {ev: tap_point(ev, ds, dsk, us, usk) for ev in TapEvent}
    return m


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


_DEFAULT_EXTRACTORS = list(EXTRACTORS)


def span_kind(span: SpanRecord) -> str | None:
    if span.__class__ is CompactSpan and EXTRACTORS == _DEFAULT_EXTRACTORS:
        kind = _KINDS.get(span.layout, _UNSEEN)
        if kind is not _UNSEEN:
            return kind  # type: ignore[return-value]
        kind = _kind(span)
        if _kind_is_shape(span):
            if len(_KINDS) >= _CACHE_MAX:
                _KINDS.clear()
            _KINDS[span.layout] = kind
        return kind
    return _kind(span)


def _kind(span: SpanRecord) -> str | None:
    for name, match, _ in EXTRACTORS:
        if match(span):
            return name
    return None


_BOUNDS = Attr.STAMP_BOUNDS  # a span stating intervals takes its plain extractor (the plans do not read them)


def extract(spans: list[SpanRecord], topo: Topology) -> Extracted:
    """Observations and facts of every span of one request (spans no extractor knows are ignored)."""
    ex = Extracted()
    plans = _plans(topo) if EXTRACTORS == _DEFAULT_EXTRACTORS else None
    for span in spans:
        if plans is not None and span.__class__ is CompactSpan and _BOUNDS not in span.layout.other_keys:
            (plans.get(span.layout) or _plan(span, topo, plans))[0](span, topo, ex)
        else:
            _unplanned(span, topo, ex)
    return ex


def _unplanned(span: SpanRecord, topo: Topology, ex: Extracted) -> None:
    for _, match, fn in EXTRACTORS:
        if match(span):
            fn(span, topo, ex)
            break


# --------------------------------------------------------------------------------------------
# plans: per (layout, topology), what the extractors above work out from a span's shape
# --------------------------------------------------------------------------------------------
#
# A planned span is extracted by a "flat" runner: it records the request's facts in an Extracted
# exactly as the extractor above would, but appends only the *times* of its observations to a flat
# list (and its clock uncertainty, once, to another) and returns a Shape: the (point, observer,
# source, rank) of each of those observations, fixed for the layout (a tap to the engine has two
# Shapes: with and without llama.cpp's prefill start). extract() turns them back into Obs;
# collector.decompose.build_row builds rows straight from the times when every span of a request
# is planned (extract_flat).
#
# A runner reads the span's values by position from one tuple (SpanReader): the numbers the compact
# span holds packed, its per-span values, then the layout's constant values. Reading them that way
# never builds the span's attrs dict or events list (CompactSpan unpacks those on first use: most of
# the cost of a span once it is decoded). The positions follow from the Layout (collector.compact:
# start, end, event times, numeric attributes in ``packed_keys`` order, after the two ids; per-span
# values in ``other_keys`` order); they are checked against the own attrs and events of the span the
# reader is made on (a layout's second), and a layout they do not match is extracted by the plain
# extractors.


class Shape:
    """The observations a planned span contributes, in order: (point, observer, source, rank) each."""

    __slots__ = ("slots",)

    def __init__(self, slots: tuple[tuple[str, str, str, int], ...]) -> None:
        self.slots = slots


FlatRunner = Callable[[SpanRecord, Extracted, list, list], Shape]


class SpanReader:
    """A layout's values by position: ``read(span)`` -> (start, end, event times..., numeric attributes...,
    per-span values..., the layout's constant attribute values..., None); ``pos(key)`` is where an
    attribute's value is (absent: the final None); ``picker(keys)`` reads only the start and those
    attributes."""

    __slots__ = ("read", "positions", "none", "_n_packed", "_n_others", "_start", "_tail")

    def __init__(self, read: Callable[[CompactSpan], tuple], positions: dict[str, int], none: int, n_packed: int, n_others: int,
                 start: Callable[[bytes], tuple], tail: tuple) -> None:
        self.read, self.positions, self.none = read, positions, none
        self._n_packed, self._n_others, self._start, self._tail = n_packed, n_others, start, tail

    def pos(self, key: str) -> int:
        return self.positions.get(key, self.none)

    def picker(self, keys: tuple[str, ...]) -> Callable[[CompactSpan], tuple]:
        """span -> (start, value of each of ``keys``): without unpacking the numbers when every key is a
        per-span value or constant."""
        where = tuple(self.pos(k) - self._n_packed for k in keys)  # index into per-span values + constants + None
        if any(w < 0 for w in where):  # a packed number: read everything
            read, get_all = self.read, itemgetter(0, *(self.pos(k) for k in keys))
            return lambda span: get_all(read(span))
        start, tail, get = self._start, self._tail, tuple_getter(where)
        if all(w < self._n_others for w in where):
            return lambda span: (start(span.packed)[0], *get(span.others))
        return lambda span: (start(span.packed)[0], *get(span.others + tail))


_PACKED_HEAD = "<8s8s"  # a compact span's packed numbers start with its span and parent ids


def span_reader(span: CompactSpan) -> SpanReader | None:
    """The reader of ``span``'s layout (cached), or None: for the first span of a layout (a layout is read
    by position from its second span on: a one-off shape is not worth checking, see :func:`reader_decided`)
    or when the layout's packing is not the one described above (checked on that second span)."""
    lay = span.layout
    got = _READERS.get(lay, _UNSEEN)
    if got is _UNSEEN:
        first = _SEEN_ONCE.get(lay)
        if first is None or first == id(span):  # (the joiner and build_row both ask about the same span)
            if len(_SEEN_ONCE) >= 4 * _CACHE_MAX:
                _SEEN_ONCE.clear()
            _SEEN_ONCE[lay] = id(span)
            return None
        _SEEN_ONCE.pop(lay, None)
        if len(_READERS) >= _CACHE_MAX:
            _READERS.clear()
        got = _READERS[lay] = _make_reader(span)
    return got  # type: ignore[return-value]


def reader_decided(span: CompactSpan) -> bool:
    """False while :func:`span_reader` has only seen one span of this layout (its None is not final)."""
    return span.layout in _READERS


def _make_reader(span: CompactSpan) -> SpanReader | None:
    lay = span.layout
    try:
        fmt, n, packed_keys, other_keys, fixed = lay.struct.format, lay.n_events, lay.packed_keys, lay.other_keys, lay.fixed
        packed, others = span.packed, span.others
    except AttributeError:
        return None
    if isinstance(fmt, bytes):
        fmt = fmt.decode()
    if not fmt.startswith(_PACKED_HEAD):
        return None
    try:
        unpack = struct.Struct("<16x" + fmt[len(_PACKED_HEAD) :]).unpack  # skip the ids
        n_packed = len(unpack(packed))
    except (struct.error, TypeError):
        return None
    if n_packed != 2 + n + len(packed_keys):
        return None
    n_others = len(others)
    if n_others != len(other_keys):
        return None
    # attrs = fixed, then packed, then per-span values (a later one wins): the same order here
    where: dict[str, tuple[str, Any]] = {}
    for k, v in fixed:
        where[k] = ("const", v)
    for i, k in enumerate(packed_keys):
        where[k] = ("at", 2 + n + i)
    for j, k in enumerate(other_keys):
        where[k] = ("at", n_packed + j)
    consts: list[Any] = []
    positions: dict[str, int] = {}
    for k, (how, v) in where.items():
        if how == "at":
            positions[k] = v
        else:
            positions[k] = n_packed + n_others + len(consts)
            consts.append(v)
    none = n_packed + n_others + len(consts)
    tail = (*consts, None)

    def read(span: CompactSpan) -> tuple:
        return unpack(span.packed) + span.others + tail

    m = re.match(r"([a-zA-Z?])", fmt[len(_PACKED_HEAD) :])  # the start's code (without a repeat count)
    if m is None:
        return None
    start = struct.Struct("<16x" + m.group(1)).unpack_from

    # check the positions against what the span itself says
    src = read(span)
    a = span.attrs
    if set(a) != set(positions) or src[0] != span.start_unix_ns or src[1] != span.end_unix_ns:
        return None
    if [t for _, t, _ in span.events] != list(src[2 : 2 + n]):
        return None
    if start(packed)[0] != src[0]:
        return None
    for k, v in a.items():
        got = src[positions[k]]
        if got is not v and (got.__class__ is not v.__class__ or got != v):
            return None
    return SpanReader(read, positions, none, n_packed, n_others, start, tail)


_CACHE_MAX = 4096
_UNSEEN = object()
_KINDS: dict[Any, str | None] = {}  # layout -> extractor name (span_kind, for the joiner)
_READERS: dict[Any, SpanReader | None] = {}  # layout -> its reader
_SEEN_ONCE: dict[Any, int] = {}  # layout -> id() of the one span of it span_reader has seen
# id(topology) -> (topology, layout -> (runner, flat runner or None))
_PLANS: dict[int, tuple[Topology, dict[Any, tuple[Extractor, FlatRunner | None]]]] = {}
# attributes whose values decide a span's kind, link or component: a plan needs them in the layout
_SHAPE_TAP = (Attr.OBSERVER, Attr.LINK, Attr.DOWNSTREAM, Attr.DOWNSTREAM_KIND, Attr.UPSTREAM, Attr.UPSTREAM_KIND)
_SHAPE_COMPONENT = (Attr.OBSERVER, Attr.COMPONENT, Attr.COMPONENT_KIND)
_NO_OBS = Shape(())


def _skip(span: SpanRecord, topo: Topology, ex: Extracted) -> None:
    """The runner of a span no extractor knows."""


def _skip_flat(span: SpanRecord, ex: Extracted, vals: list, uncs: list) -> Shape:
    uncs.append(0)
    return _NO_OBS


def _plans(topo: Topology) -> dict[Any, tuple[Extractor, FlatRunner | None]]:
    hit = _PLANS.get(id(topo))
    if hit is None or hit[0] is not topo:
        if len(_PLANS) >= 64:
            _PLANS.clear()
        hit = _PLANS[id(topo)] = (topo, {})
    return hit[1]


def plans_apply() -> bool:
    """True while :data:`EXTRACTORS` is the module's own registry (what every plan assumes)."""
    return EXTRACTORS == _DEFAULT_EXTRACTORS


def varying_keys(span: CompactSpan) -> set[str] | None:
    """The attribute keys whose values are not part of ``span``'s layout (None: unknown layout kind)."""
    fixed = getattr(span.layout, "fixed", None)
    if fixed is None:
        return None
    return set(span.attrs) - {k for k, _ in fixed}


def _kind_is_shape(span: CompactSpan) -> bool:
    """True when the span's kind follows from its layout (the observer attribute, if any, is in it)."""
    v = varying_keys(span)
    return v is not None and Attr.OBSERVER not in v


def _plan(span: CompactSpan, topo: Topology, plans: dict[Any, tuple[Extractor, FlatRunner | None]]) -> tuple[Extractor, FlatRunner | None]:
    """(runner, flat runner or None) for ``span``'s layout, cached in ``plans``."""
    if len(plans) >= _CACHE_MAX:
        plans.clear()
    varying = varying_keys(span)
    plan: tuple[Extractor, FlatRunner | None] | None = None
    if varying is None or Attr.OBSERVER in varying:
        plan = (_unplanned, None)  # the kind may change from span to span: dispatch each one
    else:
        kind = _kind(span)
        rd = span_reader(span) if kind is not None else None
        flat: FlatRunner | None = None
        if rd is None:
            if kind is not None and not reader_decided(span):  # the layout's first span: the plain extractor, planned later
                return (next(fn for name, _, fn in EXTRACTORS if name == kind), None)
        elif kind == "tap":
            flat = _plan_tap(span, topo, varying, rd)
        elif kind == "client":
            flat = _plan_client(span, topo, varying, rd)
        elif kind == "component":
            flat = _plan_component(span, topo, varying, rd)
        if kind is None:
            plan = (_skip, _skip_flat)
        elif flat is not None:
            plan = (_obs_runner(flat), flat)
        else:
            plan = (next(fn for name, _, fn in EXTRACTORS if name == kind), None)
    plans[span.layout] = plan
    return plan


def _obs_runner(flat: FlatRunner) -> Extractor:
    """An extractor (Obs into ``ex.obs``) from a flat runner."""

    def run(span: SpanRecord, topo: Topology, ex: Extracted) -> None:
        vals: list[int] = []
        uncs: list[int] = []
        shape = flat(span, ex, vals, uncs)
        unc, start, append = uncs[0], span.start_unix_ns, ex.obs.append
        for (p, observer, source, rank), t in zip(shape.slots, vals, strict=True):
            append(_new(Obs, (p, t, unc, observer, source, rank, start)))

    return run


def extract_flat(spans: list[SpanRecord], topo: Topology) -> tuple[Extracted, list[int], list[int], tuple[Shape, ...]] | None:
    """For a request whose every span is planned: (facts, the observations' times in order, each span's clock
    uncertainty, each span's Shape); None otherwise (use :func:`extract`)."""
    if EXTRACTORS != _DEFAULT_EXTRACTORS:
        return None
    plans = _plans(topo)
    flats = []
    for span in spans:
        if span.__class__ is not CompactSpan:
            return None
        flat = (plans.get(span.layout) or _plan(span, topo, plans))[1]
        if flat is None:
            return None
        flats.append(flat)
    ex = Extracted()
    vals: list[int] = []
    uncs: list[int] = []
    shapes = tuple([flat(span, ex, vals, uncs) for flat, span in zip(flats, spans)])
    return ex, vals, uncs, shapes


def _common_plan(span: CompactSpan, observer: str, rd: SpanReader) -> Callable[[tuple, Extracted, int], None]:
    """:func:`_common` for one layout, on the values ``rd`` reads; only the attributes the layout has are looked at."""
    keys = set(span.attrs)
    has_rid, has_st, has_oc, has_fd = Attr.REQUEST_ID in keys, Attr.HTTP_STATUS in keys, Attr.OUTCOME in keys, Attr.FIREWALL_DECISION in keys
    p_rid, p_st, p_oc, p_fd = rd.pos(Attr.REQUEST_ID), rd.pos(Attr.HTTP_STATUS), rd.pos(Attr.OUTCOME), rd.pos(Attr.FIREWALL_DECISION)
    labels = tuple((rd.pos(k), k[_LABEL_LEN:]) for k in span.attrs if k.startswith(_LABEL))
    p_run = rd.pos(Attr.RUN_ID) if Attr.RUN_ID in keys else None
    has_tok = Attr.GENAI_INPUT_TOKENS in keys or Attr.GENAI_OUTPUT_TOKENS in keys
    p_tin, p_tout = rd.pos(Attr.GENAI_INPUT_TOKENS), rd.pos(Attr.GENAI_OUTPUT_TOKENS)
    fd_wins = observer.startswith("component")

    def common(src: tuple, ex: Extracted, offset: int) -> None:
        if has_rid:
            rid = src[p_rid]
            if rid:
                ex.request_ids.append(str(rid))
        if has_st:
            st = src[p_st]
            if st.__class__ is not int:
                st = _i(st)
            if st is not None:
                ex.http_status[observer] = st
        if has_oc:
            oc = src[p_oc]
            if oc:
                ex.outcome[observer] = str(oc)
        if has_fd:
            fd = src[p_fd]
            if fd and (ex.firewall_decision is None or fd_wins):
                ex.firewall_decision = str(fd)
        if labels:
            setlabel = ex.labels.setdefault
            for p, name in labels:
                setlabel(name, str(src[p]))
        if p_run is not None:
            run_id = src[p_run]
            if run_id:
                ex.labels.setdefault("run_id", str(run_id))
        if has_tok:
            tin, tout = src[p_tin], src[p_tout]
            if tin.__class__ is not int:
                tin = _i(tin)
            if tout.__class__ is not int:
                tout = _i(tout)
            if tin is not None or tout is not None:
                ex.tokens[observer] = (tin, tout)
        start = src[0]
        s = start - offset
        if start and (ex.start_ns is None or s < ex.start_ns):
            ex.start_ns = s

    return common


def _begin_plan(span: CompactSpan, observer: str, varying: set[str], rd: SpanReader) -> Callable[[SpanRecord, Extracted, list], tuple[tuple, int]]:
    """What every planned span does first: read its values by position, take its clock (the same for every span
    of the layout unless offset or uncertainty vary), record the facts every span carries and its uncertainty.
    Returns ``begin(span, ex, uncs) -> (values, clock offset)``."""
    read = rd.read
    common = _common_plan(span, observer, rd)
    fixed_clock = None if Attr.CLOCK_OFFSET_NS in varying or Attr.CLOCK_UNCERTAINTY_NS in varying else _clock(span)
    p_off, p_unc = rd.pos(Attr.CLOCK_OFFSET_NS), rd.pos(Attr.CLOCK_UNCERTAINTY_NS)

    def begin(span: SpanRecord, ex: Extracted, uncs: list) -> tuple[tuple, int]:
        src = read(span)  # type: ignore[arg-type]
        if fixed_clock is None:
            offset, unc = _i(src[p_off]) or 0, max(0, _i(src[p_unc]) or 0)
        else:
            offset, unc = fixed_clock
        common(src, ex, offset)
        uncs.append(unc)
        return src, offset

    return begin


def _add_shifted(vals: list, times: tuple, offset: int) -> None:
    """Append observation times moved onto the collector's clock."""
    if offset:
        vals += [t - offset for t in times]
    else:
        vals += times


def _plan_tap(span: CompactSpan, topo: Topology, varying: set[str], rd: SpanReader) -> FlatRunner | None:
    if any(k in varying for k in _SHAPE_TAP):
        return None
    keys = set(span.attrs)
    link, ds, dsk, us, usk = _tap_link(span, topo)
    observer = f"tap:{link}"
    begin = _begin_plan(span, observer, varying, rd)
    points = _tap_points(ds, dsk, us, usk)
    names = tuple(e[0] for e in span.events)
    intermediary = dsk != ComponentKind.CLIENT
    skip_received = intermediary and any(n == TapEvent.REQUEST_BODY_RECEIVED for n in names)
    emits: list[tuple[int, str]] = []  # (event index, point), in event order
    give_ups: list[int] = []
    engine_ends: list[int] = []
    first: dict[str, int] = {}  # event -> index of its first occurrence
    to_engine = usk == ComponentKind.ENGINE
    for i, name in enumerate(names):
        ev = _TAP_EVENTS.get(name)
        if ev is None:
            continue
        first.setdefault(name, i)
        p = points[ev]
        if p is not None:
            if ev is TapEvent.REQUEST_RECEIVED and skip_received:
                continue  # an intermediary has let the request go when its last byte arrived (below)
            emits.append((i, p))
        elif ev is TapEvent.REQUEST_BODY_RECEIVED and intermediary:
            emits.append((i, point(ds, Role.IN_EXIT)))
        elif ev is TapEvent.DOWNSTREAM_CLOSED:
            give_ups.append(i)
        elif ev in _ENGINE_END_EVENTS and to_engine:
            engine_ends.append(i)
    emit_times = tuple_getter(tuple(2 + i for i, _ in emits))  # event i's time is at 2 + i
    give_ups_at = tuple(2 + i for i in give_ups)
    engine_ends_at = tuple(2 + i for i in engine_ends)
    plain = Shape(tuple((p, observer, "tap", RANK_TAP) for _, p in emits))
    with_prefill = Shape(plain.slots + ((point(us, Role.EXEC_START), observer, "llamacpp", RANK_TELEMETRY),))
    i_rr, i_rf = first.get(TapEvent.REQUEST_RECEIVED), first.get(TapEvent.REQUEST_FORWARDED)
    i_fr, i_ff = first.get(TapEvent.FIRST_TOKEN_RECEIVED), first.get(TapEvent.FIRST_TOKEN_FORWARDED)
    req_pair = (2 + i_rr, 2 + i_rf) if i_rr is not None and i_rf is not None else None
    ft_pair = (2 + i_fr, 2 + i_ff) if i_fr is not None and i_ff is not None else None
    p_req = rd.pos(Attr.OVERHEAD_REQUEST_NS) if Attr.OVERHEAD_REQUEST_NS in keys else None
    p_ft = rd.pos(Attr.OVERHEAD_FIRST_TOKEN_NS) if Attr.OVERHEAD_FIRST_TOKEN_NS in keys else None
    has_up, has_down = Attr.GAP_MEAN_MS in keys, Attr.GAP_FWD_MEAN_MS in keys
    gap_values = itemgetter(*(rd.pos(k) for k in (Attr.GAP_COUNT, Attr.GAP_MEAN_MS, Attr.GAP_P99_MS, Attr.GAP_MAX_MS,
                                                  Attr.GAP_FWD_MEAN_MS, Attr.GAP_FWD_P99_MS, Attr.GAP_FWD_MAX_MS)))
    p_ce = rd.pos(Attr.CONTENT_EVENTS) if Attr.CONTENT_EVENTS in keys else None
    p_prompt = rd.pos(Attr.ENGINE_PROMPT_MS) if to_engine and Attr.ENGINE_PROMPT_MS in keys and i_fr is not None else None
    first_at = None if i_fr is None else 2 + i_fr
    engine_n = (rd.pos(Attr.ENGINE_PROMPT_N), rd.pos(Attr.ENGINE_PREDICTED_N)) if to_engine else None

    def flat(span: SpanRecord, ex: Extracted, vals: list, uncs: list) -> Shape:
        src, offset = begin(span, ex, uncs)
        attempts = ex.attempts
        attempts[link] = attempts.get(link, 0) + 1
        start = src[0]
        _add_shifted(vals, emit_times(src), offset)
        for p in give_ups_at:
            _give_up(ex, ds, src[p] - offset)
        for p in engine_ends_at:
            tc = src[p] - offset
            ex.engine_end = tc if ex.engine_end is None else max(ex.engine_end, tc)
        req = None if p_req is None else src[p_req]
        if req.__class__ is not int:
            req = _i(req)
        if req is None and req_pair is not None:
            req = (src[req_pair[1]] - offset) - (src[req_pair[0]] - offset)
        ft = None if p_ft is None else src[p_ft]
        if ft.__class__ is not int:
            ft = _i(ft)
        if ft is None and ft_pair is not None:
            ft = (src[ft_pair[1]] - offset) - (src[ft_pair[0]] - offset)
        prev = ex.tap_overhead.get(link)
        if prev is None or start >= prev[2]:
            ex.tap_overhead[link] = (req, ft, start)
            if has_up or has_down:  # _gap, for both sides at once
                cnt, m_up, p99_up, max_up, m_down, p99_down, max_down = gap_values(src)
                cnt = _gap_count(cnt)
                up = _gap_stats(cnt, m_up, p99_up, max_up) if has_up else None
                down = _gap_stats(cnt, m_down, p99_down, max_down) if has_down else None
                if up or down:
                    ex.gaps[link] = _new(LinkGaps, (up, down))
            if p_ce is not None:
                ce = src[p_ce]
                if ce.__class__ is not int:
                    ce = _i(ce)
                if ce is not None:
                    ex.content_events[link] = ce
        shape = plain
        if p_prompt is not None:
            prompt_ms = _f(src[p_prompt])
            if prompt_ms is not None:
                # llama.cpp timings: prefill took prompt_ms and ended when the first token came out
                vals.append((src[first_at] - offset) - round(prompt_ms * 1e6))
                shape = with_prefill
        if engine_n is not None:
            pn, dn = _i(src[engine_n[0]]), _i(src[engine_n[1]])
            if (pn is not None or dn is not None) and observer not in ex.tokens:
                ex.tokens[observer] = (pn, dn)
        return shape

    return flat


def _plan_client(span: CompactSpan, topo: Topology, varying: set[str], rd: SpanReader) -> FlatRunner | None:
    client = topo.client.name
    observer = f"client:{span.service or client}"
    begin = _begin_plan(span, observer, varying, rd)
    source = "aiperf" if span.service == "aiperf" else "client"
    aiperf = source == "aiperf"
    names = tuple(e[0] for e in span.events)
    emits = tuple((i, point(client, _CLIENT_ROLES[n])) for i, n in enumerate(names) if n in _CLIENT_ROLES)
    emit_times = tuple_getter(tuple(2 + i for i, _ in emits))
    shape = Shape(tuple((p, observer, source, RANK_COMPONENT) for _, p in emits))
    gave_up_at = tuple(2 + i for i, n in enumerate(names) if n not in _CLIENT_ROLES and n in _CLIENT_GAVE_UP)

    def flat(span: SpanRecord, ex: Extracted, vals: list, uncs: list) -> Shape:
        src, offset = begin(span, ex, uncs)
        if aiperf and observer in ex.tokens:
            ex.tokenizer_counted.add(observer)  # AIPerf counts tokens with its tokenizer
        _add_shifted(vals, emit_times(src), offset)
        for p in gave_up_at:
            _give_up(ex, client, src[p] - offset)
        return shape

    return flat


def _plan_component(span: CompactSpan, topo: Topology, varying: set[str], rd: SpanReader) -> FlatRunner | None:
    if any(k in varying for k in _SHAPE_COMPONENT):
        return None
    a = span.attrs
    comp = str(a.get(Attr.COMPONENT) or span.name[len(SPAN_COMPONENT_PREFIX) :].lstrip(".") or span.service)
    observer = f"component:{comp}"
    begin = _begin_plan(span, observer, varying, rd)
    engine = a.get(Attr.COMPONENT_KIND) == ComponentKind.ENGINE or comp == topo.engine.name
    p_after = rd.pos(Attr.ENGINE_TOKENS_AFTER_DISCONNECT) if Attr.ENGINE_TOKENS_AFTER_DISCONNECT in a else None
    names = tuple(e[0] for e in span.events)
    emits: list[tuple[int, str, bool]] = []  # (event index, point, the engine's last token)
    timeouts: list[int] = []
    for i, name in enumerate(names):
        role = _ROLES.get(name)
        if role is not None:
            emits.append((i, point(comp, role), role == Role.LAST_TOKEN and engine))
        elif name == TapEvent.TIMEOUT.value:
            timeouts.append(i)
    emit_times = tuple_getter(tuple(2 + i for i, _, _ in emits))
    last_at = tuple(2 + i for i, _, last in emits if last)
    timeouts_at = tuple(2 + i for i in timeouts)
    shape = Shape(tuple((p, observer, "component", RANK_COMPONENT) for _, p, _ in emits))

    def flat(span: SpanRecord, ex: Extracted, vals: list, uncs: list) -> Shape:
        src, offset = begin(span, ex, uncs)
        if p_after is not None:
            after = _i(src[p_after])
            if after is not None:
                ex.engine_tokens_after_disconnect = after
        _add_shifted(vals, emit_times(src), offset)
        for p in last_at:
            tc = src[p] - offset
            ex.engine_end = tc if ex.engine_end is None else max(ex.engine_end, tc)
        for p in timeouts_at:  # the component's own timeout toward its upstream fired
            _give_up(ex, comp, src[p] - offset)
        end = src[1]
        if engine and end:
            end -= offset
            ex.engine_end = end if ex.engine_end is None else max(ex.engine_end, end)
        return shape

    return flat
