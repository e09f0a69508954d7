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
  into one (:mod:`collector.ingest`);
* ``component`` - a component's own span (``deltatap.observer = component``): events named by
  :class:`deltatap.vocab.Role` values are that component's *true* points;
* ``vllm`` - vLLM's ``llm_request`` span: ``gen_ai.latency.*`` seconds relative to the span start
  (the request's arrival in the engine) give queue, prefill start, first and last token;
* ``litellm`` - LiteLLM proxy's own spans (service.name ``litellm``): the guardrail's end is the
  component's ``in.decision`` (t4) and its status the firewall decision (:mod:`collector.litellm_spans`).

Every observation is shifted onto the collector's clock (``t - deltatap.clock.offset_ns``) and
carries that observer's ``deltatap.clock.uncertainty_ns``. ``rank`` orders sources when several
observe one point: a component's own stamp (0) beats engine telemetry (1) beats a tap (2) beats a
component's approximate stamp (3). The observation types live in :mod:`collector.observations`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from collector.litellm_spans import extract_litellm, is_litellm
from collector.observations import RANK_COMPONENT, RANK_TAP, RANK_TELEMETRY, Extracted, Obs
from collector.observations import as_float as _f
from collector.observations import as_int as _i
from collector.observations import clock as _clock
from collector.rows import GapStats, LinkGaps
from collector.spans import SpanRecord
from deltatap.topology import Topology
from deltatap.vocab import SPAN_CLIENT, SPAN_COMPONENT_PREFIX, SPAN_TAP, Attr, ClientEvent, ComponentKind, Observer, Role, TapEvent, point, tap_point

__all__ = ["EXTRACTORS", "RANK_COMPONENT", "RANK_TAP", "RANK_TELEMETRY", "Extracted", "Obs", "extract", "span_kind"]


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


def _gap(a: dict, count_key: str | None, mean: str, p99: str, mx: str) -> GapStats | None:
    m = _f(a.get(mean))
    if m is None:
        return None
    cnt = _i(a.get(count_key)) if count_key else None
    return GapStats(cnt if cnt is not None else 0, round(m * 1e6), _ms_ns(a.get(p99)), _ms_ns(a.get(mx)))


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
        elif ev is TapEvent.REQUEST_BODY_RECEIVED and intermediary:
            obs_append(Obs(point(ds, Role.IN_EXIT), tc, unc, observer, "tap", RANK_TAP, start))
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
    for name, t, _ in span.events:
        role = _CLIENT_ROLES.get(name)
        if role is not None:
            ex.obs.append(Obs(point(client, role), t - offset, unc, observer, source, RANK_COMPONENT, span.start_unix_ns))
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


def span_kind(span: SpanRecord) -> str | None:
    for name, match, _ in EXTRACTORS:
        if match(span):
            return name
    return None


def extract(spans: list[SpanRecord], topo: Topology) -> Extracted:
    """Observations and facts of every span of one request (spans no extractor knows are ignored)."""
    ex = Extracted()
    for span in spans:
        for _, match, fn in EXTRACTORS:
            if match(span):
                fn(span, topo, ex)
                break
    return ex
