"""LiteLLM proxy's own spans (``callbacks: ["otel"]``, service.name ``litellm``) -> that component's points.

What LiteLLM 1.100's OpenTelemetry callback exports per request (recorded in
``tests/fixtures/litellm/envoy-litellm-llama.otlp.jsonl``), all in the request's trace when the caller
sent ``traceparent``: ``Received Proxy Server Request`` (its handler, a child of the caller's span),
``auth``, ``proxy_pre_call``, ``router``, ``litellm_request`` / ``raw_gen_ai_request`` (the whole call,
including the streamed response), ``guardrail`` (one per guardrail run: ``guardrail_name``,
``guardrail_mode``, ``guardrail_status``, ``masked_entity_count``, ``guardrail_response``), ``self`` with
``call_type = "<function> <- track_llm_api_timing"`` (the HTTP call to the upstream provider, from the
call until its response headers), FastAPI's ``POST /v1/chat/completions`` and, on a block,
``Failed Proxy Server Request``. Times are wall clock with microsecond resolution (LiteLLM converts
``datetime`` values).

Two of them are points, one handler per span name (:data:`SPAN_HANDLERS`):

* ``guardrail`` whose mode inspects the request (``pre_call``, ``during_call``): its end is
  ``<comp>.in.decision`` (t4), the component's own truth (no tap can see it); when several guardrails
  run, the one ending last is kept (the decision is reached when the last one answers). Its status is
  the firewall decision (:data:`DECISIONS`): ``success`` -> ``allow``, ``guardrail_intervened`` ->
  ``block_pattern`` (LiteLLM's guardrails match words, regexes, entities), or ``modify`` when it masked
  entities instead (``masked_entity_count`` not empty). A block outranks modify outranks allow.
* ``self`` of ``track_llm_api_timing``: its start is when LiteLLM began the call to its upstream, an
  approximation of ``<comp>.in.exit`` (t5: the request body is written a little later). It has the
  fallback rank: the fw-engine tap's stamp (the body's last byte reaching the tap) wins whenever that
  link is tapped, so it only fills t5 on an untapped link.

The component is the topology's component named ``litellm``, else its first firewall, else its first
gateway. LiteLLM's spans carry no clock offset: they are read on the collector's clock (same host).
"""

from __future__ import annotations

from collections.abc import Callable

from deltatap.collector.observations import RANK_COMPONENT, RANK_FALLBACK, Extracted, Obs, clock
from deltatap.collector.spans import SpanRecord
from deltatap.core.topology import Topology
from deltatap.core.vocab import ComponentKind, Role, point

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

_COMPONENTS: dict[int, tuple[Topology, str | None]] = {}


def litellm_component(topo: Topology) -> str | None:
    """The component LiteLLM's spans belong to: named ``litellm``, else the first firewall, else the first gateway."""
    hit = _COMPONENTS.get(id(topo))
    if hit is None or hit[0] is not topo:
        names = [c.name for c in topo.components]
        comp = SERVICE if SERVICE in names else next(
            (c.name for kind in (ComponentKind.FIREWALL, ComponentKind.GATEWAY) for c in topo.components if c.kind == kind), None)
        hit = _COMPONENTS[id(topo)] = (topo, comp)
    return hit[1]


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
