"""Span kinds on the real stack's recording (tests/fixtures/litellm/): Envoy's own span fills its component's points
on a link nobody tapped, LiteLLM's spans are recognised under a renamed OTEL_SERVICE_NAME, and the registry
refuses what it cannot use with one clear line."""

from __future__ import annotations

import dataclasses
import json
from collections import defaultdict

import pytest
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from deltatap.collector import kinds
from deltatap.collector.compact import decode_compact
from deltatap.collector.decompose import Decomposer
from deltatap.collector.ingest import load

from test_litellm_spans import FIXTURE, TOPO, raw_spans, tid, traces_by_request


def _by_trace(spans):
    by = defaultdict(list)
    for s in spans:
        by[s.trace_id].append(s)
    return by


def _envoy_span(trace: str) -> dict:
    return next(sp for svc, sp in raw_spans() if svc == "envoy-gateway" and tid(sp) == trace)


def test_envoys_span_fills_its_components_points_only_where_no_tap_saw_them():
    dec = Decomposer(TOPO)
    by = _by_trace(load([str(FIXTURE)]).spans)
    for trace in traces_by_request().values():
        env = _envoy_span(trace)
        tapped = dec.build_row(by[trace])
        assert tapped.points["envoy.in.arrive"].source == "tap"  # the edge tap's forward is a better stamp
        untapped = dec.build_row([s for s in by[trace] if s.name != "deltatap.tap edge"])
        assert untapped.points["envoy.in.arrive"] == (int(env["startTimeUnixNano"]), 0, "component:envoy", "envoy")
        assert untapped.points["envoy.out.last_out"] == (int(env["endTimeUnixNano"]), 0, "component:envoy", "envoy")


def _renamed_wire(service: str) -> list[bytes]:
    out = []
    for line in FIXTURE.read_text().splitlines():
        doc = json.loads(line)
        for rs in doc["resourceSpans"]:
            for a in rs["resource"]["attributes"]:
                if a["key"] == "service.name" and a["value"].get("stringValue") == "litellm":
                    a["value"]["stringValue"] = service
        out.append(json_format.ParseDict(doc, ExportTraceServiceRequest()).SerializeToString())
    return out


def test_litellms_spans_are_read_under_a_renamed_service():
    original, renamed = Decomposer(TOPO), Decomposer(TOPO)
    want = {t: original.build_row(ss) for t, ss in _by_trace(load([str(FIXTURE)]).spans).items()}
    offline = [dataclasses.replace(s, service="acme-llm-proxy") if s.service == "litellm" else s for s in load([str(FIXTURE)]).spans]
    assert {t: renamed.build_row(ss) for t, ss in _by_trace(offline).items()} == want
    live = [s for data in _renamed_wire("acme-llm-proxy") for s in decode_compact(data)]
    got = {t: renamed.build_row(ss) for t, ss in _by_trace(live).items()}
    assert got == want
    blocked = want[traces_by_request()["blocked"]]
    assert blocked.firewall_decision == "block_pattern" and blocked.points["litellm.in.decision"].source == "litellm"


def test_the_registry_refuses_what_it_cannot_use():
    with pytest.raises(TypeError, match="register\\(\\) takes a SpanKind, not dict"):
        kinds.register({"name": "x"})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no span kind named 'nope'; registered: \\['tap', 'client'"):
        kinds.register(dataclasses.replace(kinds.registered()[0], name="tap2"), before="nope")
    assert [k.name for k in kinds.registered()] == ["tap", "client", "component", "litellm", "vllm", "envoy"]
