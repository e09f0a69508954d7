"""encode_export_request's batch of one SpanOrigin (session 27): the records of one observer are written as one
resource and scope group without the per-span grouping; the bytes are those of the grouping (and of the SDK's
encoder) for every batch, also where the origins are distinct objects of equal resources (merged by equality, as
the SDK merges them), mixed with SDK spans, or not a list. And the export queue's batches (``_take_batch``): the
oldest ``max_batch`` spans, in order, whatever the queue holds."""

from __future__ import annotations

import collections

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource

from deltatap.telemetry import otlp_encode
from deltatap.telemetry.otlp_encode import _py_span_fields, encode_export_request
from deltatap.telemetry.spans import SpanOrigin, SpanRecord, span_record
from deltatap.telemetry.tracer import NullExporter, QueuedSpanProcessor
from otlp_spans import varied_spans

RES = {"service.name": "deltatap-tap", "deltatap.link": "edge"}
ORIGIN = SpanOrigin(Resource.create(RES))
TWIN = SpanOrigin(Resource.create(RES))  # another object, an equal resource and the same scope: one group with ORIGIN's
OTHER = SpanOrigin(Resource.create({"service.name": "deltatap-loadgen"}), None)


def rec(origin: SpanOrigin, i: int) -> SpanRecord:
    return span_record(origin, f"s{i}", 2, 1000 + i, 2000 + i, {"i": i, "k": "v" * (i % 5), "b": i % 2 == 0, "f": i / 3},
                       [("e", 5 + i, None), ("x", 6 + i, {"a": i})], 10 + i, 20 + i, parent_span_id=None if i % 3 else 77 + i,
                       parent_remote=i % 2 == 0, status_code=i % 3, status_description="err" if i % 3 == 2 else None)


def sdk_bytes(spans) -> bytes:
    return encode_spans([s.readable() if type(s) is SpanRecord else s for s in spans]).SerializeToString()


def grouped(spans) -> bytes:
    """The general grouping's bytes for the same spans (a container that is not a list or tuple takes it)."""
    return encode_export_request(collections.deque(spans))  # (not a list or tuple: the general grouping)


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("n", [1, 2, 64, 130])
def test_one_origin_batch_is_the_grouped_batch(monkeypatch, native, n):
    if not native:
        monkeypatch.setattr(otlp_encode, "_span_fields", _py_span_fields)
    spans = [rec(ORIGIN, i) for i in range(n)]
    want = sdk_bytes(spans)
    assert encode_export_request(spans) == want
    assert encode_export_request(tuple(spans)) == want
    assert grouped(spans) == want


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(["origin", "twin", "other", "sdk"]), min_size=1, max_size=12))
def test_any_mix_of_origins_and_sdk_spans(kinds):
    sdk = varied_spans()
    pick = {"origin": lambda i: rec(ORIGIN, i), "twin": lambda i: rec(TWIN, i), "other": lambda i: rec(OTHER, i),
            "sdk": lambda i: sdk[i % len(sdk)]}
    spans = [pick[k](i) for i, k in enumerate(kinds)]
    want = sdk_bytes(spans)
    assert encode_export_request(spans) == want
    assert grouped(spans) == want


def test_one_origin_batch_asks_no_resource_hash(monkeypatch):
    """The batch of one origin is written without the grouping's dicts: the Resource's hash (a JSON dump) is not asked;
    a batch of two origins with equal resources is grouped by equality, and asks it."""
    hashed = []
    monkeypatch.setattr(Resource, "__hash__", lambda self: hashed.append(self) or 0)
    encode_export_request([rec(ORIGIN, i) for i in range(3)])
    assert hashed == []
    encode_export_request([rec(ORIGIN, 0), rec(TWIN, 1)])
    assert hashed


def test_empty_batch():
    assert encode_export_request([]) == b"" == encode_export_request(())


@pytest.mark.parametrize("max_batch", [-1, 0, 1, 5, 64])
@pytest.mark.parametrize("queued", [0, 1, 5, 63, 64, 65, 200])
def test_take_batch_takes_the_oldest_in_order(max_batch, queued):
    p = QueuedSpanProcessor(NullExporter(), max_batch=max_batch)
    p._queue.extend(range(queued))
    taken: list = []
    for _ in range(queued + 2):
        batch = p._take_batch()
        assert type(batch) is list and len(batch) == min(max(max_batch, 0), queued - len(taken))
        taken += batch
    assert taken == list(range(queued)) if max_batch > 0 else taken == [] and list(p._queue) == list(range(queued))
