"""vLLM's ``llm_request`` span: it starts at the request's arrival in the engine (``queue``, t6); its
``gen_ai.latency.*`` attributes, in seconds after that, give the prefill's start (t6a, after the time in queue),
the first token (t7) and the last (t8: queue + inference, or queue + prefill + decode), the end of its stream."""

from __future__ import annotations

from deltatap.collector.kinds import common
from deltatap.collector.kinds.model import RANK_COMPONENT, S, Derived, Edge, Match, Site, SpanKind, SpanView
from deltatap.core.topology import Topology
from deltatap.core.vocab import Attr, Role, point

SOURCE = "vllm"
QUEUE, TTFT, PREFILL, DECODE, INFERENCE = Attr.VLLM_TIME_IN_QUEUE, Attr.VLLM_TTFT, Attr.VLLM_PREFILL, Attr.VLLM_DECODE, Attr.VLLM_INFERENCE


def site(view: SpanView, topo: Topology) -> Site:
    engine = topo.engine.name
    return Site(f"component:{engine}", SOURCE, RANK_COMPONENT, {}, component=engine, decides=True,
                edges=(Edge("start", point(engine, Role.QUEUE)),),
                derived=(Derived(point(engine, Role.EXEC_START), "start", (((QUEUE, S, 1),),)),
                         Derived(point(engine, Role.FIRST_TOKEN), "start", (((TTFT, S, 1),),)),
                         Derived(point(engine, Role.LAST_TOKEN), "start", (((QUEUE, S, 1), (INFERENCE, S, 1)), ((QUEUE, S, 1), (PREFILL, S, 1), (DECODE, S, 1))),
                                 engine_end=True)))


KIND = SpanKind("vllm", (Match(name="llm_request"), Match(has=TTFT)), site, facts=common.FACTS, reads=(QUEUE, TTFT, PREFILL, DECODE, INFERENCE))
