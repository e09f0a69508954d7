"""Envoy's own spans (``tracing`` with an OpenTelemetry provider): one per request Envoy proxied, span name
``ingress`` / ``egress`` (or the route's ``decorator``), attribute ``component = proxy`` with ``node_id``,
``upstream_cluster``, ``http.status_code``, ``guid:x-request-id`` (recorded in
``tests/fixtures/litellm/envoy-litellm-llama.otlp.jsonl``).

Envoy starts the span when it has read the request's headers and ends it when it has written the response's
last byte: its start approximates ``<comp>.in.arrive`` and its end ``<comp>.out.last_out``. Both have the
fallback rank: a tap beside Envoy observes those points better (a tap's stamps wins), so they only fill them
on a link nobody tapped. The component: the topology's component named as the span's ``node_id`` or service,
else its first gateway. Envoy states no clock offset: its spans are read on the collector's clock.
"""

from __future__ import annotations

from deltatap.collector.kinds.model import RANK_FALLBACK, Edge, Match, Site, SpanKind, SpanView
from deltatap.core.topology import Topology
from deltatap.core.vocab import ComponentKind, Role, point

SOURCE = "envoy"
COMPONENT, NODE_ID, UPSTREAM_CLUSTER = "component", "node_id", "upstream_cluster"


def site(view: SpanView, topo: Topology) -> Site | None:
    names = {c.name for c in topo.components}
    comp = next((n for n in (view.get(NODE_ID), view.service) if n in names), None)
    if comp is None:
        comp = next((c.name for c in topo.components if c.kind == ComponentKind.GATEWAY), None)
    if comp is None:
        return None
    return Site(f"component:{comp}", SOURCE, RANK_FALLBACK, component=comp,
                edges=(Edge("start", point(comp, Role.IN_ARRIVE)), Edge("end", point(comp, Role.OUT_LAST_OUT))))


KIND = SpanKind("envoy", (Match(has=UPSTREAM_CLUSTER),), site, (COMPONENT, NODE_ID), common=False, reads=(UPSTREAM_CLUSTER,))
