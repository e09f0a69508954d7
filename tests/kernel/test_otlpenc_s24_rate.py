"""deltatap.telemetry._otlpenc after its writes went in place (session 24, issue 15: one reservation per field, the
int64 fast path of its unsigned reads): the same bytes as the Python reference (otlp_encode._py_span_fields) where
the ints sit at the edges of int64 / uint64 (ids, times, attribute values, event times) and where fields' lengths
cross a varint's byte boundaries and the buffer's growth (keys and values of 0 to 16,385 bytes)."""

from __future__ import annotations

import itertools
import logging

import pytest

from deltatap.telemetry import otlp_encode
from deltatap.telemetry.otlp_encode import _py_span_fields
from deltatap.telemetry.spans import KIND_SERVER, SpanOrigin, span_record

ACC = otlp_encode._acc
pytestmark = pytest.mark.skipif(ACC is None, reason="deltatap.telemetry._otlpenc not built or DELTATAP_NATIVE off")

_EDGES = [0, 1, 127, 128, 2**62, 2**63 - 1, 2**63, 2**64 - 1, 2**64, -1, -(2**63), -(2**63) - 1]


def _both(spans: list) -> tuple[object, object]:
    def run(fn):
        try:
            return fn(spans)
        except Exception as exc:  # noqa: BLE001 - the accelerator must raise what the reference raises
            return type(exc).__name__

    return run(ACC.span_fields), run(_py_span_fields)


def test_ints_at_the_edges_of_int64_and_uint64(caplog):
    caplog.set_level(logging.CRITICAL)  # (the reference logs each attribute it leaves out)
    origin = SpanOrigin(None)
    spans = []
    for t, sid, attr in itertools.product(_EDGES, repeat=3):
        spans.append(span_record(origin, "s", KIND_SERVER, (1 << 127) | 5, sid, {"a": attr, "b": [attr, 1]}, [("e", t, None)], t, t,
                                 parent_span_id=t if t >= 0 else None, parent_remote=True))
    for r in spans:  # one by one (a fallback is per span) and all together
        c, p = _both([r])
        assert c == p, r
    c, p = _both(spans)
    assert c == p


@pytest.mark.parametrize("n", [0, 1, 126, 127, 128, 129, 511, 512, 16383, 16384, 16385])
def test_lengths_across_varint_boundaries_and_buffer_growth(n):
    origin = SpanOrigin(None)
    attrs = {"k" * n: "v" * n, "x": "é" * n, "i": n, "f": n / 3, "t": True, "l": ["w" * n, n]}
    spans = [span_record(origin, "n" * n, KIND_SERVER, n + 1, n + 2, attrs, [("e" * n, 10**18 + n, {"q": "r" * n})], 10**18, 10**18 + n,
                         trace_state="s=" + "t" * n, status_code=2, status_description="d" * n) for _ in range(3)]
    c, p = _both(spans)
    assert isinstance(c, bytes) and c == p


def test_records_of_several_origins_group_as_the_spans_they_stand_for():
    """encode_export_request finds a record's group by its SpanOrigin's identity: origins sharing a resource object,
    an equal resource in another object, another scope, interleaved, group as their ReadableSpans do."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    from deltatap.telemetry.otlp_encode import encode_export_request
    from deltatap.telemetry.spans import SCOPE

    r1, r1_again, r2 = Resource({"service.name": "a"}), Resource({"service.name": "a"}), Resource({"service.name": "b"})
    other = InstrumentationScope("other", "1")
    origins = [SpanOrigin(r1), SpanOrigin(r1), SpanOrigin(r1_again), SpanOrigin(r2), SpanOrigin(r1, other), SpanOrigin(r2, None)]
    records = [span_record(origins[i % len(origins)], f"s{i}", KIND_SERVER, i + 1, i + 1, {"i": i}, [("e", 10**18 + i, None)],
                           10**18, 10**18 + i) for i in range(3 * len(origins))]
    assert origins[0].scope is SCOPE
    mixed = records[:5] + [r.readable() for r in records[5:9]] + records[9:]
    want = encode_export_request([r.readable() for r in records])
    assert encode_export_request(records) == want
    assert encode_export_request(mixed) == want
