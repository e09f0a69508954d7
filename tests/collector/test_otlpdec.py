"""The C decoder (collector/_otlpdec.c) against its Python reference (collector.compact.decode_compact_reference).

On generated requests, and on those requests mutated byte-wise, truncated, given overlong varints, wrong wire
types, groups and extra fields, ``decode_compact`` (C, handing back to the reference whatever it is not sure of)
must give exactly what the reference gives: the same spans (trace id, layout, packed numbers, per-span values)
or the same exception with the same message. Run under ``PYTHONMALLOC=debug`` too (see docs/benchmarks.md).
"""

from __future__ import annotations

import os
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from deltatap.collector import compact
from deltatap.collector.spans import OtlpDecodeError
from deltatap.core import native

from otlpfactory import default_stack, request
from test_compact import key_values, requests, varied_requests

pytestmark = pytest.mark.skipif(compact._acc is None, reason="the C decoder is not built or DELTATAP_NATIVE turns it off: the reference runs")


def view(spans):
    """Everything a compact span holds, comparable (repr: 1 and True, nan and nan told apart and alike)."""
    out = []
    for s in spans:
        lay = s.layout
        out.append((s.trace_id, lay.name, lay.service, lay.kind, lay.status_code, lay.rooted, repr(lay.fixed), lay.packed_keys, lay.other_keys,
                    lay.event_names, lay.struct.format, s.packed, repr(s.others), type(s).__name__))
    return out


def outcome(fn, data):
    try:
        return ("ok", view(fn(data)))
    except OtlpDecodeError as exc:
        return ("OtlpDecodeError", str(exc))
    except Exception as exc:  # noqa: BLE001 - whatever the reference does, the accelerated path must do the same
        return (type(exc).__name__, str(exc))


def assert_same(data: bytes) -> None:
    want = outcome(compact.decode_compact_reference, data)
    assert outcome(compact.decode_compact, data) == want
    direct = compact._acc.decode(data)  # the C decoder alone: the reference's spans, or None (not sure)
    if direct is not None:
        assert want[0] == "ok" and view(direct) == want[1]


def test_the_accelerator_is_registered_and_used():
    assert native.status()["deltatap.collector._otlpdec"] == "used"


def test_canonical_requests_are_decoded_in_c():
    """The receivers' everyday requests never go back to the reference."""
    spans, _ = default_stack()
    for data in (request(spans).SerializeToString(), request(spans, service="svc").SerializeToString()):
        got = compact._acc.decode(data)
        assert got is not None
        assert view(got) == view(compact.decode_compact_reference(data))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests())
def test_generated_requests(req):
    assert_same(req.SerializeToString())


@st.composite
def well_formed(draw):
    """Requests whose every KeyValue has a value and every key is non-empty: never handed back."""
    req = ExportTraceServiceRequest()
    rs = ResourceSpans()
    rs.resource.attributes.extend(kv for kv in draw(key_values(4)) if kv.key and kv.HasField("value"))
    ss = ScopeSpans()
    for _ in range(draw(st.integers(1, 4))):
        sp = Span(trace_id=draw(st.binary(min_size=16, max_size=16)), span_id=draw(st.binary(min_size=8, max_size=8)),
                  parent_span_id=draw(st.sampled_from([b"", b"\x03" * 8])), name=draw(st.sampled_from(["deltatap.tap edge", "x", "", "\u00e9"])),
                  kind=draw(st.integers(0, 5)), start_time_unix_nano=draw(st.integers(0, 2**64 - 1)))
        sp.attributes.extend(kv for kv in draw(key_values(12)) if kv.key and kv.HasField("value"))
        for name in draw(st.lists(st.sampled_from(["a", "deltatap.tap.request_received", "\u00e9v"]), max_size=4)):
            sp.events.add(name=name, time_unix_nano=draw(st.integers(1, 2**64 - 1)))
        ss.spans.append(sp)
    rs.scope_spans.append(ss)
    req.resource_spans.append(rs)
    return req


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(well_formed())
def test_well_formed_requests_stay_in_c(req):
    data = req.SerializeToString()
    got = compact._acc.decode(data)
    assert got is not None
    assert view(got) == view(compact.decode_compact_reference(data))


# ---- malformed and adversarial bytes -------------------------------------------------------------

def _varint(v: int) -> bytes:
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


_JUNK = [b"\xff" * 11, b"\x80" * 10 + b"\x01", b"\x0b", b"\x0c", b"\x0f", b"\x0e", b"\x00", b"\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\x7f",
         b"\x0a\x7f", b"\x12\x05ab", b"\x1d\x01", b"\x21\x01\x02", b"\x7a\x00", b"\xf8\xff\xff\xff\xff\x1f\x00",
         b"\x0a\x02\xc3\x28", b"\x18\x80\x80\x80\x80\x80\x80\x80\x80\x80\x02", b"\x10\x01\x0a\x01x", b"\x22\x00"]


def _bases() -> list[bytes]:
    out = [req.SerializeToString() for _, req in varied_requests()]
    for i in range(4):
        spans, _ = default_stack(rid=f"r{i}", fp=f"fp{i}", split_at="gw-fw" if i % 2 else None, inner_rid=f"in{i}" if i % 2 else None)
        out.append(request(spans, service=f"svc{i}").SerializeToString())
    return out


_BASES = _bases()


@st.composite
def mutated(draw):
    """A valid request (fixed ones, cheap to draw, or generated ones) with 1-4 byte-wise mutations."""
    base = draw(st.one_of(*[st.sampled_from(_BASES)] * 4, requests().map(lambda r: r.SerializeToString())))
    data = bytearray(base)
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "set", "insert", "delete", "truncate", "junk", "wiretype"]))
        if not data:
            break
        i = draw(st.integers(0, len(data) - 1))
        if op == "flip":
            data[i] ^= 1 << draw(st.integers(0, 7))
        elif op == "set":
            data[i] = draw(st.integers(0, 255))
        elif op == "insert":
            data[i:i] = draw(st.binary(min_size=1, max_size=4))
        elif op == "delete":
            del data[i:i + draw(st.integers(1, 4))]
        elif op == "truncate":
            del data[i:]
        elif op == "junk":
            data[i:i] = draw(st.sampled_from(_JUNK))
        else:  # the low 3 bits of a byte: a tag's wire type, if it is one
            data[i] = (data[i] & 0xF8) | draw(st.integers(0, 7))
    return bytes(data)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_mutated_requests(data):
    assert_same(data)


@st.composite
def hand_built(draw):
    """A span's wire form written field by field, with odd but valid (or invalid) encodings at every level."""
    def field(num, wt, payload=b""):
        return _varint(num << 3 | wt) + payload

    def ld(num, body):
        return field(num, 2, _varint(len(body)) + body)

    def anyv():
        kind = draw(st.sampled_from(["s", "i", "d", "b", "long_s", "dup", "empty", "bad"]))
        if kind == "s":
            return ld(1, draw(st.text(max_size=10)).encode())
        if kind == "long_s":
            return ld(1, b"y" * draw(st.integers(120, 300)))
        if kind == "i":
            return field(3, 0, _varint(draw(st.integers(0, 2**64 - 1))))
        if kind == "d":
            return field(4, 1, struct.pack("<d", draw(st.floats(allow_nan=True))))
        if kind == "b":
            return field(2, 0, _varint(draw(st.integers(0, 2**64 - 1))))
        if kind == "dup":  # two oneof members: the last wins
            return field(3, 0, b"\x05") + ld(1, b"s")
        if kind == "empty":
            return b""
        return draw(st.binary(max_size=6))

    def attrs():
        out = b""
        for key in draw(st.lists(st.sampled_from(["deltatap.request_id", "deltatap.link", "http.response.status_code", "deltatap.label.x", "zzz"]), max_size=6)):
            out += ld(9, ld(1, key.encode()) + ld(2, anyv()))
        return out

    sp = ld(1, draw(st.sampled_from([b"\x01" * 16, b"\x02" * 15]))) + ld(2, os.urandom(8))
    extras = draw(st.lists(st.sampled_from(["parent", "parent_long", "name", "name_twice", "kind", "kind_neg", "start", "status", "status_twice", "event",
                                            "event_noname", "unknown_varint", "unknown_fixed32", "unknown_ld", "packed_times"]), max_size=8))
    for e in extras:
        sp += {
            "parent": ld(4, b"\x03" * 8), "parent_long": ld(4, b"\x04" * 12), "name": ld(5, b"deltatap.tap edge"), "name_twice": ld(5, b"a") + ld(5, b"b"),
            "kind": field(6, 0, b"\x02"), "kind_neg": field(6, 0, _varint(2**64 - 1)), "start": field(7, 1, b"\x01" * 8),
            "status": ld(15, field(3, 0, b"\x02")), "status_twice": ld(15, field(3, 0, b"\x02")) + ld(15, ld(2, b"msg")),
            "event": ld(11, field(1, 1, b"\x02" * 8) + ld(2, b"deltatap.tap.request_received")), "event_noname": ld(11, field(1, 1, b"\x02" * 8)),
            "unknown_varint": field(12, 0, b"\x07"), "unknown_fixed32": field(13, 5, b"abcd"), "unknown_ld": ld(14, b"zz"),
            "packed_times": ld(11, ld(1, b"\x02" * 8) + ld(2, b"e")),
        }[e]
    sp += attrs()
    res = ld(1, ld(1, ld(1, b"service.name") + ld(2, anyv())))
    return ld(1, res + ld(2, ld(1, b"scope") + ld(2, sp)) + ld(3, b"schema"))


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hand_built())
def test_hand_built_encodings(data):
    assert_same(data)


def test_edge_cases():
    spans, _ = default_stack()
    good = request(spans).SerializeToString()
    for data in (b"", b"\x0a\x00", bytearray(good), memoryview(good), "not bytes", None, good[: len(good) // 2], good + b"\x0a", good + b"\xff" * 11, b"\x0a\xff\xff\xff",
                 good.replace(b"deltatap", b"delta\xfftap", 1)):
        assert_same(data)
    # KeyValues split oddly: a key without a value beside an empty key (the slim view's one blind spot) stays equal too
    spans[1].attributes.append(KeyValue(key=""))
    spans[1].attributes.append(KeyValue(key="deltatap.label.y", value=AnyValue(string_value="v")))
    assert_same(request(spans).SerializeToString())
