"""A component's own span (``deltatap.observer = component``, name ``deltatap.stack.<component>``): events named
by :class:`deltatap.core.vocab.Role` values are that component's *true* points; ``timeout`` is its own timeout
toward its upstream firing (it gave up). The engine's last token, and its span's end, end the engine's stream."""

from __future__ import annotations

from deltatap.collector.kinds import common
from deltatap.collector.kinds.model import RANK_COMPONENT, Edge, Emit, Fact, GiveUp, Into, Match, Site, SpanKind, SpanView
from deltatap.core.topology import Topology
from deltatap.core.vocab import SPAN_COMPONENT_PREFIX, Attr, ComponentKind, Observer, Role, TapEvent, point


def site(view: SpanView, topo: Topology) -> Site:
    comp = str(view.get(Attr.COMPONENT) or view.name[len(SPAN_COMPONENT_PREFIX):].lstrip(".") or view.service)
    engine = view.get(Attr.COMPONENT_KIND) == ComponentKind.ENGINE or comp == topo.engine.name
    events: dict[str, Emit | GiveUp] = {r.value: Emit(point(comp, r), engine_end=engine and r is Role.LAST_TOKEN) for r in Role}
    events[TapEvent.TIMEOUT.value] = GiveUp(comp)
    return Site(f"component:{comp}", "component", RANK_COMPONENT, events, edges=(Edge("end", None, engine_end=True),) if engine else (),
                component=comp, decides=True)


KIND = SpanKind("component", (Match(observer=Observer.COMPONENT), Match(name_prefix=SPAN_COMPONENT_PREFIX + ".")), site,
                (Attr.OBSERVER, Attr.COMPONENT, Attr.COMPONENT_KIND),
                facts=(*common.FACTS, Fact(Attr.ENGINE_TOKENS_AFTER_DISCONNECT, Into.AFTER_DISCONNECT)))
