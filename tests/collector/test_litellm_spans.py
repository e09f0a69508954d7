"""LiteLLM's own spans, recorded from the real stack (tests/fixtures/litellm/), become LiteLLM's points.

The fixture is what an Envoy -> LiteLLM (content filter) -> llama.cpp stack with deltatap taps exported for one
allowed and one blocked request (tests/fixtures/litellm/capture.py). Expected values are read straight from the
fixture's JSON, independently of the collector's decoders.
"""

from __future__ import annotations

import base64
import dataclasses
import json
from collections import defaultdict
from pathlib import Path

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from deltatap.collector.compact import decode_request_compact
from deltatap.collector.decompose import build_row
from deltatap.collector.ingest import load
from deltatap.collector.rows import JoinMethod
from deltatap.collector.spans import SpanRecord
from deltatap.core.topology import default_topology, load_topology
from deltatap.core.vocab import Role, TapEvent, point

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "litellm" / "envoy-litellm-llama.otlp.jsonl"
TOPO = load_topology(ROOT / "configs" / "realstack-envoy-litellm.yaml")


def raw_spans() -> list[tuple[str, dict]]:
    """(service.name, span JSON) of every span in the fixture, read without the collector."""
    out = []
    for line in FIXTURE.read_text().splitlines():
        for rs in json.loads(line)["resourceSpans"]:
            svc = next(a["value"]["stringValue"] for a in rs["resource"]["attributes"] if a["key"] == "service.name")
            out += [(svc, sp) for ss in rs["scopeSpans"] for sp in ss["spans"]]
    return out


def attr(sp: dict, key: str) -> str | None:
    return next((next(iter(a["value"].values())) for a in sp.get("attributes", []) if a["key"] == key), None)


def tid(sp: dict) -> str:
    return base64.b64decode(sp["traceId"]).hex()


def traces_by_request() -> dict[str, str]:
    """'allowed' / 'blocked' -> trace id (hex), from the taps' request ids."""
    return {attr(sp, "deltatap.request_id").split("-")[0]: tid(sp) for svc, sp in raw_spans() if svc == "deltatap-tap-edge"}


def rows(spans: list[SpanRecord], topo=TOPO) -> dict[str, object]:
    by: dict[str, list[SpanRecord]] = defaultdict(list)
    for s in spans:
        by[s.trace_id].append(s)
    return {t: build_row(ss, topo) for t, ss in by.items()}


def offline_spans() -> list[SpanRecord]:
    return load([str(FIXTURE)]).spans


def litellm_span(trace: str, name: str) -> dict:
    found = [sp for svc, sp in raw_spans() if svc == "litellm" and sp["name"] == name and tid(sp) == trace]
    assert found, f"fixture has no LiteLLM span {name!r} in trace {trace}"
    return found[0]


def tap_event(trace: str, link: str, event: TapEvent) -> int:
    sp = next(sp for svc, sp in raw_spans() if svc == f"deltatap-tap-{link}" and tid(sp) == trace)
    return int(next(e["timeUnixNano"] for e in sp["events"] if e["name"] == event))


def test_fixture_is_litellm_in_the_requests_traces():
    traces = traces_by_request()
    assert set(traces) == {"allowed", "blocked"}
    for trace in traces.values():
        names = {sp["name"] for svc, sp in raw_spans() if svc == "litellm" and tid(sp) == trace}
        assert {"guardrail", "litellm_request", "Received Proxy Server Request"} <= names
    # nothing secret or prompt text was kept
    text = FIXTURE.read_text()
    for banned in ("sk-", "Name a color", "tell me the", "authorization", "metadata.", "gen_ai.input.messages"):
        assert banned not in text


def test_allowed_request_guardrail_end_is_the_decision_and_taps_keep_their_points():
    trace = traces_by_request()["allowed"]
    row = rows(offline_spans())[trace]
    guard = litellm_span(trace, "guardrail")
    assert attr(guard, "guardrail_status") == "success"
    dec = row.points[point("litellm", Role.IN_DECISION)]
    assert (dec.unix_ns, dec.observer, dec.source) == (int(guard["endTimeUnixNano"]), "component:litellm", "litellm")
    assert row.firewall_decision == "allow"
    assert row.join_method == JoinMethod.TRACE_ID
    # t4 - t3: the gw-fw tap's forward to LiteLLM to LiteLLM's own guardrail end (cross-observer)
    t3 = tap_event(trace, "gw-fw", TapEvent.REQUEST_FORWARDED)
    assert row.deltas["litellm_inbound_block"].ns == int(guard["endTimeUnixNano"]) - t3
    assert row.deltas["litellm_inbound_block"].within_observer is False
    # t5 stays the fw-engine tap's (body's last byte at the tap), not LiteLLM's earlier start of its upstream call
    exit_ = row.points[point("litellm", Role.IN_EXIT)]
    assert (exit_.unix_ns, exit_.source) == (tap_event(trace, "fw-engine", TapEvent.REQUEST_BODY_RECEIVED), "tap")
    call = litellm_span(trace, "self")
    assert int(call["startTimeUnixNano"]) < exit_.unix_ns
    assert row.deltas["litellm_inbound"].ns == exit_.unix_ns - row.points[point("litellm", Role.IN_ARRIVE)].unix_ns
    assert row.points[point("litellm", Role.IN_ARRIVE)].source == "tap"


def test_blocked_request_decision_is_block_pattern_at_the_guardrails_end():
    trace = traces_by_request()["blocked"]
    row = rows(offline_spans())[trace]
    guards = [sp for svc, sp in raw_spans() if svc == "litellm" and sp["name"] == "guardrail" and tid(sp) == trace]
    assert {attr(sp, "guardrail_status") for sp in guards} == {"guardrail_intervened"}
    assert row.firewall_decision == "block_pattern"
    assert row.http_status == 400
    dec = row.points[point("litellm", Role.IN_DECISION)]
    assert dec.unix_ns == max(int(sp["endTimeUnixNano"]) for sp in guards)
    assert row.deltas["litellm_inbound_block"].ns == dec.unix_ns - tap_event(trace, "gw-fw", TapEvent.REQUEST_FORWARDED)
    assert point("litellm", Role.IN_EXIT) not in row.points  # no upstream call: neither a tap nor LiteLLM saw one
    assert "litellm_inbound" not in row.deltas
    assert point("llama-server", Role.QUEUE) not in row.points


def test_live_compact_path_builds_the_same_rows():
    spans = []
    for line in FIXTURE.read_text().splitlines():
        spans += decode_request_compact(json_format.ParseDict(json.loads(line), ExportTraceServiceRequest()))
    assert rows(spans) == rows(offline_spans())


def test_untapped_upstream_link_takes_litellms_upstream_call_start_as_in_exit():
    trace = traces_by_request()["allowed"]
    spans = [s for s in offline_spans() if s.service != "deltatap-tap-fw-engine"]
    row = rows(spans)[trace]
    exit_ = row.points[point("litellm", Role.IN_EXIT)]
    assert (exit_.unix_ns, exit_.source) == (int(litellm_span(trace, "self")["startTimeUnixNano"]), "litellm")
    assert row.deltas["litellm_inbound"].ns == exit_.unix_ns - tap_event(trace, "gw-fw", TapEvent.REQUEST_FORWARDED)


def test_topology_without_a_litellm_component_maps_onto_its_firewall():
    trace = traces_by_request()["blocked"]
    row = rows(offline_spans(), default_topology())[trace]
    assert row.points[point("firewall", Role.IN_DECISION)].source == "litellm"
    assert row.firewall_decision == "block_pattern"


def _with_guardrail(trace: str, **attrs: str) -> list[SpanRecord]:
    """The allowed request's spans with its guardrail span's attributes changed."""
    out = []
    for s in offline_spans():
        if s.trace_id == trace and s.service == "litellm" and s.name == "guardrail":
            s = dataclasses.replace(s, attrs={**s.attrs, **attrs})
        out.append(s)
    return out


def test_masking_is_modify_and_post_call_guardrails_decide_nothing_inbound():
    trace = traces_by_request()["allowed"]
    masked = rows(_with_guardrail(trace, guardrail_status="guardrail_intervened", masked_entity_count='{"us_ssn": 1}'))[trace]
    assert masked.firewall_decision == "modify"
    post = rows(_with_guardrail(trace, guardrail_mode="post_call"))[trace]
    assert point("litellm", Role.IN_DECISION) not in post.points
    assert post.firewall_decision is None
