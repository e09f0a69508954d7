"""The load generator's client span (events ``client.*``), or an AIPerf record turned into one
(:mod:`deltatap.collector.ingest`, service ``aiperf``: its token counts come from AIPerf's tokenizer)."""

from __future__ import annotations

from deltatap.collector.kinds import common
from deltatap.collector.kinds.model import RANK_COMPONENT, Emit, GiveUp, Match, Site, SpanKind, SpanView
from deltatap.core.topology import Topology
from deltatap.core.vocab import SPAN_CLIENT, Attr, ClientEvent, Observer, Role, point

ROLES = {ClientEvent.SEND: Role.SEND, ClientEvent.FIRST_TOKEN: Role.FIRST_TOKEN_RECEIVED,
         ClientEvent.LAST_TOKEN: Role.LAST_TOKEN_RECEIVED, ClientEvent.END: Role.END}


def site(view: SpanView, topo: Topology) -> Site:
    client = topo.client.name
    aiperf = view.service == "aiperf"
    events: dict[str, Emit | GiveUp] = {ev.value: Emit(point(client, role)) for ev, role in ROLES.items()}
    events.update({ev.value: GiveUp(client) for ev in (ClientEvent.CANCEL, ClientEvent.ERROR)})
    return Site(f"client:{view.service or client}", "aiperf" if aiperf else "client", RANK_COMPONENT, events,
                component=client, tokenizer=aiperf, bounds=True)


KIND = SpanKind("client", (Match(observer=Observer.CLIENT), Match(name=SPAN_CLIENT)), site, (Attr.OBSERVER,), facts=common.FACTS,
                reads=(Attr.STAMP_BOUNDS,))
