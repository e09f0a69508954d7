"""The live path's compact spans read exactly like full SpanRecords for everything the decomposition uses."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue

from collector.compact import ATTRS_READ, decode_request_compact
from collector.decompose import build_row
from collector.spans import OtlpDecodeError, decode_request
from deltatap.topology import default_topology
from deltatap.vocab import Attr, Role, TapEvent

from otlpfactory import BASE, MS, component_span, default_stack, new_trace_id, request, tap_span, vllm_span

TOPO = default_topology()
ROOT = Path(__file__).resolve().parents[2]


def varied_requests():
    spans, t = default_stack()
    yield "default stack", request(spans)
    spans, t = default_stack(BASE + 10**9, rid="r2", fp="fp-2", split_at="gw-fw", inner_rid="r2-inner")
    yield "split trace", request(spans)
    tid = new_trace_id()
    fw = component_span(tid, "firewall", "firewall", {Role.IN_ARRIVE: BASE + 300_000, Role.IN_DECISION: BASE + 2 * MS, Role.IN_EXIT: BASE + 3 * MS},
                        {Attr.CLOCK_OFFSET_NS: -2 * MS, Attr.CLOCK_UNCERTAINTY_NS: 7_000, Attr.FIREWALL_DECISION: "allow", "deltatap.label.tenant": "t1"})
    eng = tap_span(tid, "fw-engine", {TapEvent.REQUEST_RECEIVED: BASE + 4 * MS, TapEvent.FIRST_TOKEN_RECEIVED: BASE + 40 * MS},
                   {Attr.ENGINE_PROMPT_MS: 12.5, Attr.ENGINE_PROMPT_N: 33, Attr.ENGINE_PREDICTED_N: 7, Attr.STREAMING: True, "unrelated.key": "dropped"})
    eng.attributes.append(KeyValue(key=Attr.GENAI_FINISH_REASONS, value=AnyValue(array_value=ArrayValue(values=[AnyValue(string_value="stop")]))))
    eng.events[0].attributes.append(KeyValue(key="x", value=AnyValue(int_value=1)))
    yield "component, llama.cpp, labels, arrays", request([fw, eng, vllm_span(tid, BASE + 5 * MS, 0.004, 0.045, 0.041, 0.09)], service="svc")


@pytest.mark.parametrize("what,req", list(varied_requests()))
def test_compact_spans_decompose_like_full_records(what, req):
    full, compact = decode_request(req), decode_request_compact(req)
    assert len(full) == len(compact)
    for f, c in zip(full, compact, strict=True):
        assert (c.trace_id, c.span_id, c.parent_span_id, c.name, c.service, c.kind, c.status_code, c.start_unix_ns, c.end_unix_ns) == (
            f.trace_id, f.span_id, f.parent_span_id, f.name, f.service, f.kind, f.status_code, f.start_unix_ns, f.end_unix_ns)
        assert c.attrs == {k: v for k, v in f.attrs.items() if k in ATTRS_READ or k.startswith(Attr.LABEL_PREFIX)}
        assert [(n, t) for n, t, _ in c.events] == [(n, t) for n, t, _ in f.events]
    assert build_row(compact, TOPO) == build_row(full, TOPO)


def test_every_attribute_the_collector_reads_is_kept():
    """A new Attr read in points/join/decompose must be added to ATTRS_READ, or live rows would lose it."""
    read = set()
    for f in ("points.py", "join.py", "decompose.py"):
        read |= set(re.findall(r"Attr\.([A-Z_0-9]+)", (ROOT / "collector" / f).read_text()))
    missing = sorted(n for n in read - {"LABEL_PREFIX"} if getattr(Attr, n) not in ATTRS_READ)
    assert missing == []


def test_compact_decoder_rejects_short_ids():
    spans, _ = default_stack()
    spans[1].span_id = b"\x01" * 4
    with pytest.raises(OtlpDecodeError, match="spanId 8 bytes"):
        decode_request_compact(request(spans))
