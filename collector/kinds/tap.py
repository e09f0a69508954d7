"""deltatap's tap spans (``deltatap.observer = tap``, name ``deltatap.tap <link>``).

Each event observes the point :func:`deltatap.core.vocab.tap_point` names for the link's two components. An
intermediary has let the request go when the tap read its body's last byte (``request.body_received`` is its
``in.exit``; the client's ``send`` stays the head's arrival, ``request.received``). ``downstream.closed``: the
downstream component gave up. The end of the engine's stream (``response.end``, ``upstream.closed``,
``upstream.error``) on the link to the engine. The tap's own overheads (ns; without them, forwarded - received),
gap statistics (ms) and content events come from the link's latest attempt. On the link to the engine the tap
also carries llama.cpp's timings (:mod:`deltatap.collector.kinds.llamacpp`). A tap that leaves out its link's
components is read against the topology.
"""

from __future__ import annotations

from deltatap.collector.kinds import common, llamacpp
from deltatap.collector.kinds.model import MS, RANK_TAP, Emit, EngineEnd, Fact, GiveUp, Into, Match, Site, SpanKind, SpanView
from deltatap.core.topology import Topology
from deltatap.core.vocab import SPAN_TAP, Attr, ComponentKind, Observer, Role, TapEvent, point, tap_point

_ENGINE_ENDS = (TapEvent.RESPONSE_END, TapEvent.UPSTREAM_CLOSED, TapEvent.UPSTREAM_ERROR)
SHAPE = (Attr.OBSERVER, Attr.LINK, Attr.DOWNSTREAM, Attr.DOWNSTREAM_KIND, Attr.UPSTREAM, Attr.UPSTREAM_KIND)


def link_of(view: SpanView) -> str:
    return str(view.get(Attr.LINK) or view.name[len(SPAN_TAP):].strip())


def site(view: SpanView, topo: Topology) -> Site:
    link = link_of(view)
    ds, us, dsk, usk = (view.get(k) for k in (Attr.DOWNSTREAM, Attr.UPSTREAM, Attr.DOWNSTREAM_KIND, Attr.UPSTREAM_KIND))
    if not (ds and us and dsk and usk):
        spec = next((x for x in topo.links if x.name == link), None)
        if spec is not None:
            ds, us = ds or spec.downstream, us or spec.upstream
            dsk, usk = dsk or topo.component(spec.downstream).kind, usk or topo.component(spec.upstream).kind
    ds, dsk, us, usk = str(ds or "downstream"), str(dsk or ""), str(us or "upstream"), str(usk or "")
    intermediary, to_engine = dsk != ComponentKind.CLIENT, usk == ComponentKind.ENGINE
    events: dict[str, Emit | GiveUp | EngineEnd] = {}
    for ev in TapEvent:
        p = tap_point(ev, ds, dsk, us, usk)
        if p is not None:
            events[ev.value] = Emit(p, unless=TapEvent.REQUEST_BODY_RECEIVED if ev is TapEvent.REQUEST_RECEIVED and intermediary else None)
        elif ev is TapEvent.REQUEST_BODY_RECEIVED and intermediary:
            events[ev.value] = Emit(point(ds, Role.IN_EXIT))
        elif ev is TapEvent.DOWNSTREAM_CLOSED:
            events[ev.value] = GiveUp(ds)
        elif ev in _ENGINE_ENDS and to_engine:
            events[ev.value] = EngineEnd()
    return Site(f"tap:{link}", "tap", RANK_TAP, events, link=link, component=ds, bounds=True,
                derived=llamacpp.derived(us) if to_engine else (), facts=llamacpp.FACTS if to_engine else (),
                values={"body_received": TapEvent.REQUEST_BODY_RECEIVED.value})


KIND = SpanKind(
    "tap", (Match(observer=Observer.TAP), Match(name_prefix=SPAN_TAP)), site, SHAPE,
    facts=(*common.FACTS,
           Fact(Attr.OVERHEAD_REQUEST_NS, Into.OVERHEAD_REQUEST, fallback=(TapEvent.REQUEST_RECEIVED, TapEvent.REQUEST_FORWARDED)),
           Fact(Attr.OVERHEAD_FIRST_TOKEN_NS, Into.OVERHEAD_FIRST_TOKEN, fallback=(TapEvent.FIRST_TOKEN_RECEIVED, TapEvent.FIRST_TOKEN_FORWARDED)),
           Fact(Attr.GAP_COUNT, Into.GAP_COUNT),
           Fact(Attr.GAP_MEAN_MS, Into.GAP_UP_MEAN, MS), Fact(Attr.GAP_P99_MS, Into.GAP_UP_P99, MS), Fact(Attr.GAP_MAX_MS, Into.GAP_UP_MAX, MS),
           Fact(Attr.GAP_FWD_MEAN_MS, Into.GAP_DOWN_MEAN, MS), Fact(Attr.GAP_FWD_P99_MS, Into.GAP_DOWN_P99, MS), Fact(Attr.GAP_FWD_MAX_MS, Into.GAP_DOWN_MAX, MS),
           Fact(Attr.CONTENT_EVENTS, Into.CONTENT_EVENTS)),
    reads=(Attr.STAMP_BOUNDS, Attr.BODY_FINGERPRINT, *llamacpp.ATTRS),
)
