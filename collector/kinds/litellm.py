"""LiteLLM proxy's own spans (``callbacks: ["otel"]``) -> that component's points.

What LiteLLM 1.100's OpenTelemetry callback exports per request (recorded in
``tests/fixtures/litellm/envoy-litellm-llama.otlp.jsonl``), all in the request's trace when the caller
sent ``traceparent``: ``Received Proxy Server Request`` (its handler, a child of the caller's span),
``auth``, ``proxy_pre_call``, ``router``, ``litellm_request`` / ``raw_gen_ai_request`` (the whole call,
including the streamed response), ``guardrail`` (one per guardrail run: ``guardrail_name``,
``guardrail_mode``, ``guardrail_status``, ``masked_entity_count``, ``guardrail_response``), ``self`` with
``call_type = "<function> <- track_llm_api_timing"`` (the HTTP call to the upstream provider, from the
call until its response headers), FastAPI's ``POST /v1/chat/completions`` and, on a block,
``Failed Proxy Server Request``. Times are wall clock with microsecond resolution.

A span is LiteLLM's when its service is ``litellm`` (LiteLLM's default ``OTEL_SERVICE_NAME``), or, under any
other service name, when it is a ``guardrail`` span stating ``guardrail_mode`` or a ``self`` span stating
``call_type``. Two of them are points:

* ``guardrail`` whose mode inspects the request (``pre_call``, ``during_call``): its end is
  ``<comp>.in.decision`` (t4), the component's own truth (no tap can see it); when several guardrails
  run, the one ending last is kept. Its status is the firewall decision (:data:`DECISIONS`): ``success`` ->
  ``allow``, ``guardrail_intervened`` -> ``block_pattern`` (LiteLLM's guardrails match words, regexes,
  entities), or ``modify`` when it masked entities instead (``masked_entity_count`` not empty). A block
  outranks modify outranks allow.
* ``self`` of ``track_llm_api_timing``: its start is when LiteLLM began the call to its upstream, an
  approximation of ``<comp>.in.exit`` (t5); fallback rank: the fw-engine tap's stamp wins whenever that link
  is tapped, so it only fills t5 on an untapped link.

The component is the topology's component named ``litellm``, else its first firewall, else its first gateway.
"""

from __future__ import annotations

from deltatap.collector.kinds.model import RANK_COMPONENT, RANK_FALLBACK, Edge, Match, Site, SpanKind, SpanView
from deltatap.core.topology import Topology
from deltatap.core.vocab import ComponentKind, Role, point

SERVICE = SOURCE = "litellm"
GUARDRAIL_MODE, GUARDRAIL_STATUS, MASKED_ENTITY_COUNT, CALL_TYPE = "guardrail_mode", "guardrail_status", "masked_entity_count", "call_type"
INBOUND_MODES = frozenset({"pre_call", "during_call"})  # guardrail modes that inspect the request
UPSTREAM_CALL_SUFFIX = "<- track_llm_api_timing"
STRENGTH = {"allow": 0, "allow_after_analysis": 1, "modify": 2, "block_pattern": 3, "block_analysis": 3}


def decision(view: SpanView) -> str | None:
    """guardrail_status -> firewall decision; other statuses (guardrail_failed_to_respond, not_run) decide nothing."""
    status = str(view.get(GUARDRAIL_STATUS))
    if status == "success":
        return "allow"
    if status == "guardrail_intervened":
        masked = str(view.get(MASKED_ENTITY_COUNT) or "").strip()
        return "modify" if masked not in ("", "{}", "null", "None") else "block_pattern"
    return None


def component(topo: Topology) -> str | None:
    """The component LiteLLM's spans belong to: named ``litellm``, else the first firewall, else the first gateway."""
    names = [c.name for c in topo.components]
    return SERVICE if SERVICE in names else next(
        (c.name for kind in (ComponentKind.FIREWALL, ComponentKind.GATEWAY) for c in topo.components if c.kind == kind), None)


def site(view: SpanView, topo: Topology) -> Site | None:
    comp = component(topo)
    if comp is None:
        return None
    observer = f"component:{comp}"
    if view.name == "guardrail" and view.get(GUARDRAIL_MODE) in INBOUND_MODES:
        d = decision(view)
        return Site(observer, SOURCE, RANK_COMPONENT, edges=(Edge("end", point(comp, Role.IN_DECISION), attempt_is_time=True),),
                    component=comp, decision=None if d is None else (d, STRENGTH))
    if view.name == "self" and str(view.get(CALL_TYPE) or "").endswith(UPSTREAM_CALL_SUFFIX):
        return Site(observer, SOURCE, RANK_FALLBACK, edges=(Edge("start", point(comp, Role.IN_EXIT), attempt_is_time=True),), component=comp)
    return None


KIND = SpanKind("litellm", (Match(service=SERVICE), Match(name="guardrail", has=GUARDRAIL_MODE), Match(name="self", has=CALL_TYPE)), site,
                (GUARDRAIL_MODE, GUARDRAIL_STATUS, MASKED_ENTITY_COUNT, CALL_TYPE), common=False)
