"""OTLP trace export requests written as protobuf bytes directly, without building message objects.

:func:`encode_export_request` turns finished spans into the serialized
``opentelemetry.proto.collector.trace.v1.ExportTraceServiceRequest`` — the same message, field for field, as
``encode_spans(spans).SerializeToString()`` from ``opentelemetry-exporter-otlp-proto-common`` (spans grouped
by resource, then by instrumentation scope, in order of first appearance; the same span flags, status,
dropped counts and attribute value mapping; an attribute that cannot be encoded is skipped and logged, as
the SDK does). Fields are written in field-number order with proto3 defaults left out, which is what the
protobuf runtime writes, so the bytes are normally identical too (tests/kernel/test_otlp_encode.py).

Why: the SDK's encoder builds a protobuf object per span, event, attribute key-value and value, then
serializes them; for a tap span (~38 attributes, 10-20 events) that was about a quarter of the tap process's
CPU, spent in the export thread while it holds the GIL. Here the resource and scope are encoded once per
object, attribute keys and event names once per string, and each attribute is a few byte-string joins.

Spans come as SDK ``ReadableSpan`` objects or as :class:`deltatap.telemetry.spans.SpanRecord` tuples (what the
tap and the load generator hand the processor: no SDK object per request); a record is encoded from its fields
(:func:`_record_field`) into the bytes its ``readable()`` span gives. The spans of one scope are written in one
call, :func:`_span_fields`, which the optional C accelerator ``deltatap.telemetry._otlpenc`` replaces (one C call
per batch and scope; it writes records whose fields have the plain types and hands anything else back to the
Python here, so the output is the same byte for byte: tests/kernel/test_span_record.py; ``DELTATAP_NATIVE=0``
turns it off).

The wire format in brief: every field is a varint key ``(field_number << 3) | wire_type`` followed by a
varint (type 0), 8 little-endian bytes (type 1), 4 little-endian bytes (type 5), or a varint length and that
many bytes (type 2: strings, bytes, nested messages).
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind

from deltatap.core import native
from deltatap.telemetry.spans import SpanRecord

log = logging.getLogger("deltatap.telemetry.otlp_encode")

_pack_q = struct.Struct("<Q").pack  # fixed64
_pack_i = struct.Struct("<I").pack  # fixed32
_pack_d = struct.Struct("<d").pack  # double

_U64 = (1 << 64) - 1
_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1


def _varint_slow(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


# varints of 0..16383 (every length of a key-value, event or small span) by list index, and the 14-bit
# groups of larger numbers with both continuation bits set
_VAR_SMALL = 1 << 14
_VAR: list[bytes] = [_varint_slow(i) for i in range(_VAR_SMALL)]
_VAR14: list[bytes] = [bytes(((i & 0x7F) | 0x80, (i >> 7) | 0x80)) for i in range(_VAR_SMALL)]


def _varint(n: int) -> bytes:
    """Varint of 0 <= n < 2**64."""
    if n < _VAR_SMALL:
        return _VAR[n]
    if n < 1 << 28:
        return _VAR14[n & 0x3FFF] + _VAR[n >> 14]
    return _VAR14[n & 0x3FFF] + _varint(n >> 14)


# SpanKind -> Span field 6 (kind); the proto's enum is the API's value + 1 (0 is UNSPECIFIED)
_KIND_BY_VALUE = {k.value + 1: b"\x30" + _varint(k.value + 1) for k in SpanKind}  # a SpanRecord's kind (the proto's enum)
_KIND = {k: _KIND_BY_VALUE[k.value + 1] for k in SpanKind}
_STATUS_CODE = {0: b"", 1: b"\x18\x01", 2: b"\x18\x02"}  # Status.code: UNSET (the default, left out), OK, ERROR
# Span field 16 / Link field 6 (flags, fixed32): HAS_IS_REMOTE (0x100), plus IS_REMOTE (0x200) for a remote parent
_FLAGS_LOCAL = b"\x85\x01" + _pack_i(0x100)
_FLAGS_REMOTE = b"\x85\x01" + _pack_i(0x300)
_LINK_FLAGS_LOCAL = b"\x35" + _pack_i(0x100)
_LINK_FLAGS_REMOTE = b"\x35" + _pack_i(0x300)
_BOOL = {True: b"\x10\x01", False: b"\x10\x00"}  # AnyValue.bool_value (oneof: written even when false)

# Tags of the repeated KeyValue fields: Span.attributes = 9, Event.attributes = 3, Link.attributes = 4,
# Resource.attributes = 1, InstrumentationScope.attributes = 3, KeyValueList.values = 1.
_TAG_SPAN_ATTR = b"\x4a"
_TAG_EVENT_ATTR = b"\x1a"
_TAG_LINK_ATTR = b"\x22"
_TAG_RES_ATTR = b"\x0a"
_TAG_SCOPE_ATTR = b"\x1a"

_CACHE_MAX = 4096
_keys: dict[Any, bytes] = {}  # attribute key -> KeyValue.key field (tag, length, UTF-8) + KeyValue.value's tag
_events: dict[str, tuple[bytes, bytes]] = {}  # event name -> (prefix up to the timestamp, Event.name field)
_resources: dict[int, tuple[Any, bytes, bytes]] = {}  # id(Resource) -> (it, ResourceSpans.resource field, .schema_url field)
_scopes: dict[int, tuple[Any, bytes, bytes]] = {}  # id(scope) -> (it, ScopeSpans.scope field, .schema_url field)


def _str_field(tag: bytes, s: str | None) -> bytes:
    """A proto3 string field: nothing when empty."""
    if not s:
        return b""
    e = s.encode()
    return tag + _varint(len(e)) + e


def _key_field(key: Any) -> bytes | None:
    """KeyValue.key field followed by KeyValue.value's tag, cached per key; None for a key too long to cache."""
    e = key.encode()  # AttributeError / UnicodeEncodeError: the caller skips the attribute
    if len(e) > 4000:
        return None
    kb = b"\x0a" + _varint(len(e)) + e + b"\x12"
    if len(_keys) >= _CACHE_MAX:
        _keys.clear()
    _keys[key] = kb
    return kb


def _any_value(v: Any) -> bytes:
    """AnyValue body for any attribute value, mapped as the SDK's ``_encode_value`` maps it."""
    if v is None:
        return b""
    if isinstance(v, bool):
        return _BOOL[v]
    if isinstance(v, str):
        e = v.encode()
        return b"\x0a" + _varint(len(e)) + e
    if isinstance(v, int):
        if not _I64_MIN <= v <= _I64_MAX:
            raise ValueError(f"Value out of range: {v}")
        return b"\x18" + _varint(v & _U64)
    if isinstance(v, float):
        return b"\x21" + _pack_d(v)
    if isinstance(v, bytes):
        return b"\x3a" + _varint(len(v)) + v
    if isinstance(v, Sequence):
        parts = []
        for item in v:
            av = _any_value(item)
            parts.append(b"\x0a" + _varint(len(av)) + av)
        body = b"".join(parts)
        return b"\x2a" + _varint(len(body)) + body  # array_value (ArrayValue.values = 1)
    if isinstance(v, Mapping):
        parts = []
        for k, item in v.items():
            ke = str(k).encode()
            av = _any_value(item)
            kv = b"\x0a" + _varint(len(ke)) + ke + b"\x12" + _varint(len(av)) + av
            parts.append(b"\x0a" + _varint(len(kv)) + kv)
        body = b"".join(parts)
        return b"\x32" + _varint(len(body)) + body  # kvlist_value (KeyValueList.values = 1)
    raise TypeError(f"Invalid type {type(v)} of value {v}")


def _put_attributes(buf: bytearray, tag: bytes, attributes: Mapping[str, Any]) -> None:
    """Append one ``tag``-field KeyValue per attribute to ``buf``."""
    # Fast paths for an attribute whose key is cached (key <= 4000 bytes) and whose value is a str under 120
    # bytes, an int in 0..16383, a bool or a float: every length is then one table lookup. The rest, and any
    # error, goes through _put_attribute.
    var = _VAR
    keys = _keys
    join = b"".join
    for k, v in attributes.items():
        kb = keys.get(k)
        if kb is not None:
            t = type(v)
            if t is str:
                try:
                    e = v.encode()
                except UnicodeEncodeError:
                    _put_attribute(buf, tag, k, v)
                    continue
                n = len(e)
                if n < 120:
                    buf += join((tag, var[len(kb) + n + 3], kb, var[n + 2], b"\x0a", var[n], e))
                    continue
            elif t is int:
                if 0 <= v < _VAR_SMALL:
                    vb = var[v]
                    buf += join((tag, var[len(kb) + len(vb) + 2], kb, var[len(vb) + 1], b"\x18", vb))
                    continue
            elif t is bool:
                buf += join((tag, var[len(kb) + 3], kb, b"\x02\x10\x01" if v else b"\x02\x10\x00"))
                continue
            elif t is float:
                buf += join((tag, var[len(kb) + 10], kb, b"\x09\x21", _pack_d(v)))
                continue
        _put_attribute(buf, tag, k, v)


def _put_attribute(buf: bytearray, tag: bytes, k: Any, v: Any) -> None:
    try:
        kb = _keys.get(k) or _key_field(k)
        if kb is None:  # a very long key
            e = k.encode()
            kb = b"\x0a" + _varint(len(e)) + e + b"\x12"
        av = _any_value(v)
    except Exception as exc:  # as the SDK: log and leave the attribute out
        log.error("Failed to encode key %s: %s", k, exc)
        return
    avl = _varint(len(av))
    kvl = len(kb) + len(avl) + len(av)
    buf += b"".join((tag, _varint(kvl), kb, avl, av))


def _attributes_bytes(tag: bytes, attributes: Mapping[str, Any] | None) -> bytes:
    buf = bytearray()
    if attributes:
        _put_attributes(buf, tag, attributes)
    return bytes(buf)


def _resource_fields(resource: Any) -> tuple[bytes, bytes]:
    hit = _resources.get(id(resource))
    if hit is not None and hit[0] is resource:
        return hit[1], hit[2]
    body = _attributes_bytes(_TAG_RES_ATTR, resource.attributes)
    head = b"\x0a" + _varint(len(body)) + body  # ResourceSpans.resource (always present)
    tail = _str_field(b"\x1a", resource.schema_url)  # ResourceSpans.schema_url
    if len(_resources) >= 256:
        _resources.clear()
    _resources[id(resource)] = (resource, head, tail)  # holds the object: its id cannot be reused meanwhile
    return head, tail


def _scope_fields(scope: Any) -> tuple[bytes, bytes]:
    hit = _scopes.get(id(scope))
    if hit is not None and hit[0] is scope:
        return hit[1], hit[2]
    if scope is None:
        head, tail = b"\x0a\x00", b""
    else:
        body = (
            _str_field(b"\x0a", scope.name)
            + _str_field(b"\x12", scope.version)
            + _attributes_bytes(_TAG_SCOPE_ATTR, scope.attributes)
        )
        head = b"\x0a" + _varint(len(body)) + body  # ScopeSpans.scope (always present)
        tail = _str_field(b"\x1a", scope.schema_url)
    if len(_scopes) >= 256:
        _scopes.clear()
    _scopes[id(scope)] = (scope, head, tail)
    return head, tail


def _event_head(name: str | None) -> tuple[bytes, bytes]:
    e = name.encode() if name else b""
    name_field = b"\x12" + _varint(len(e)) + e if e else b""
    # Span.events (11) + length, then Event.time_unix_nano's tag (1, fixed64): the 8 time bytes follow
    pair = (b"\x5a" + _varint(9 + len(name_field)) + b"\x09", name_field)
    if len(_events) >= _CACHE_MAX:
        _events.clear()
    _events[name] = pair
    return pair


def _event_field(ev: Any) -> bytes:
    """Span.events field for an event with attributes, dropped attributes or no timestamp."""
    buf = bytearray()
    t = ev.timestamp
    if t:
        buf += b"\x09" + _pack_q(t)
    buf += _str_field(b"\x12", ev.name)
    attrs = ev.attributes
    if attrs:
        _put_attributes(buf, _TAG_EVENT_ATTR, attrs)
    dropped = ev.dropped_attributes
    if dropped:
        buf += b"\x20" + _varint(dropped)
    return b"\x5a" + _varint(len(buf)) + buf


def _link_field(link: Any) -> bytes:
    ctx = link.context
    buf = bytearray(b"\x0a\x10")
    buf += ctx.trace_id.to_bytes(16, "big")
    buf += b"\x12\x08"
    buf += ctx.span_id.to_bytes(8, "big")
    attrs = link.attributes
    if attrs:
        _put_attributes(buf, _TAG_LINK_ATTR, attrs)
    dropped = link.dropped_attributes
    if dropped:
        buf += b"\x28" + _varint(dropped)
    buf += _LINK_FLAGS_REMOTE if ctx.is_remote else _LINK_FLAGS_LOCAL
    return b"\x6a" + _varint(len(buf)) + buf


def _span_field(span: ReadableSpan) -> bytes:
    """One ScopeSpans.spans field (tag 2, length, Span)."""
    ctx = span.context
    buf = bytearray(b"\x0a\x10")
    buf += ctx.trace_id.to_bytes(16, "big")
    buf += b"\x12\x08"
    buf += ctx.span_id.to_bytes(8, "big")
    ts = ctx.trace_state
    if ts:
        buf += _str_field(b"\x1a", ",".join([f"{k}={v}" for k, v in ts.items()]))
    parent = span.parent
    if parent:
        buf += b"\x22\x08"
        buf += parent.span_id.to_bytes(8, "big")
    name = span.name
    if name:
        e = name.encode()
        buf += b"\x2a" + _varint(len(e)) + e
    buf += _KIND[span.kind]
    t = span.start_time
    if t:
        buf += b"\x39" + _pack_q(t)
    t = span.end_time
    if t:
        buf += b"\x41" + _pack_q(t)
    attrs = span.attributes
    if attrs:
        _put_attributes(buf, _TAG_SPAN_ATTR, attrs)
    n = span.dropped_attributes
    if n:
        buf += b"\x50" + _varint(n)
    events = span.events
    if events:
        heads = _events
        for ev in events:
            t = ev.timestamp
            if t and not ev.attributes and not ev.dropped_attributes:
                name = ev.name
                pair = heads.get(name) or _event_head(name)
                buf += pair[0] + _pack_q(t) + pair[1]
            else:
                buf += _event_field(ev)
    n = span.dropped_events
    if n:
        buf += b"\x60" + _varint(n)
    links = span.links
    if links:
        for link in links:
            buf += _link_field(link)
    n = span.dropped_links
    if n:
        buf += b"\x70" + _varint(n)
    status = span.status
    if status is not None:
        st = _str_field(b"\x12", status.description)
        code = status.status_code.value
        if code:
            st += b"\x18" + _varint(code)
        buf += b"\x7a" + _varint(len(st)) + st  # Span.status: present even when empty
    buf += _FLAGS_REMOTE if parent and parent.is_remote else _FLAGS_LOCAL
    return b"\x12" + _varint(len(buf)) + buf


def _record_field(rec: SpanRecord) -> bytes:
    """One ScopeSpans.spans field for a :class:`SpanRecord`: the bytes :func:`_span_field` writes for
    ``rec.readable()``, read from the record's fields directly (no SpanContext, Event or Status object)."""
    _origin, name, kind, trace_id, span_id, ts, parent_id, remote, _flags, attrs, events, start, end, code, desc = rec
    buf = bytearray(b"\x0a\x10")
    buf += trace_id.to_bytes(16, "big")
    buf += b"\x12\x08"
    buf += span_id.to_bytes(8, "big")
    if ts:
        buf += _str_field(b"\x1a", ts)
    if parent_id is not None:
        buf += b"\x22\x08"
        buf += parent_id.to_bytes(8, "big")
    if name:
        e = name.encode()
        buf += b"\x2a" + _varint(len(e)) + e
    buf += _KIND_BY_VALUE[kind]
    if start:
        buf += b"\x39" + _pack_q(start)
    if end:
        buf += b"\x41" + _pack_q(end)
    if attrs:
        _put_attributes(buf, _TAG_SPAN_ATTR, attrs)
    if events:
        heads = _events
        for ev_name, t, ev_attrs in events:
            if t and not ev_attrs:
                pair = heads.get(ev_name) or _event_head(ev_name)
                buf += pair[0] + _pack_q(t) + pair[1]
            else:
                buf += _event_tuple_field(ev_name, t, ev_attrs)
    st = _str_field(b"\x12", desc) + _STATUS_CODE[code]
    buf += b"\x7a" + _varint(len(st)) + st  # Span.status: present even when empty
    buf += _FLAGS_REMOTE if parent_id is not None and remote else _FLAGS_LOCAL
    return b"\x12" + _varint(len(buf)) + buf


def _event_tuple_field(name: str, t: int, attrs: Mapping[str, Any] | None) -> bytes:
    """Span.events field for a record's event ``(name, unix_ns, attributes)`` (as :func:`_event_field`)."""
    buf = bytearray()
    if t:
        buf += b"\x09" + _pack_q(t)
    buf += _str_field(b"\x12", name)
    if attrs:
        _put_attributes(buf, _TAG_EVENT_ATTR, attrs)
    return b"\x5a" + _varint(len(buf)) + buf


def _any_span_field(span: Any) -> bytes:
    return _record_field(span) if type(span) is SpanRecord else _span_field(span)


def _py_span_fields(spans: list) -> bytes:
    """The ScopeSpans.spans fields of ``spans`` (records and ReadableSpans), joined (the accelerator's reference)."""
    return b"".join([_any_span_field(s) for s in spans])


def _attribute_fallback(tag: bytes, key: Any, value: Any) -> bytes:
    """One attribute field as :func:`_put_attributes` writes it (b"" when it is left out, and logged): the
    accelerator's way for a value it does not write itself (sequences, mappings, bytes, subclasses, errors)."""
    buf = bytearray()
    _put_attributes(buf, tag, {key: value})
    return bytes(buf)


_acc = native.load("deltatap.telemetry._otlpenc", __name__)
if _acc is not None:
    _acc.configure(SpanRecord, _any_span_field, _attribute_fallback, _attributes_bytes)
_span_fields = _acc.span_fields if _acc is not None else _py_span_fields


def encode_export_request(spans: Sequence[ReadableSpan | SpanRecord]) -> bytes:
    """A serialized ``ExportTraceServiceRequest`` holding ``spans`` (see the module docstring)."""
    record = SpanRecord
    if isinstance(spans, (list, tuple)) and spans and type(spans[0]) is record:
        # the usual batch: the records of one observer, all of one SpanOrigin (one resource, one scope): the grouping
        # below would make one group of them all, in their order; checked by identity, with no dict per span and no
        # Resource hash (a JSON dump of its attributes) per batch
        origin = spans[0][0]
        for span in spans:
            if type(span) is not record or span[0] is not origin:
                break
        else:
            return _request([(origin.resource, [(origin.scope or None, spans)])])
    # resource -> scope -> spans, grouped by equality as the SDK groups them; equality (and the Resource's costly
    # hash) is asked once per distinct (resource, scope) object pair, then identity serves
    # (a record's SpanOrigin, by identity too: a tap's spans all share one, found with one lookup per span)
    groups: dict[Any, dict[Any, list]] = {}
    by_id: dict[tuple[int, int], list] = {}
    by_origin: dict[int, list] = {}

    def group(res: Any, scope: Any) -> list:
        key = (id(res), id(scope))
        out = by_id.get(key)
        if out is None:
            out = by_id[key] = groups.setdefault(res, {}).setdefault(scope, [])
        return out

    for span in spans:
        if type(span) is record:
            origin = span[0]
            out = by_origin.get(id(origin))
            if out is None:
                out = by_origin[id(origin)] = group(origin.resource, origin.scope or None)
            out.append(span)
        else:
            group(span.resource, span.instrumentation_scope or None).append(span)
    return _request([(res, scopes.items()) for res, scopes in groups.items()])


def _request(groups: Sequence[tuple[Any, Any]]) -> bytes:
    """The ``ExportTraceServiceRequest`` of ``[(resource, [(scope, spans), ...]), ...]``, in that order."""
    # one join at the end: the lengths of nested messages are summed, never built by copying
    parts: list[bytes] = []
    for res, scopes in groups:
        res_head, res_tail = _resource_fields(res)
        rs: list[bytes] = [res_head]
        for scope, members in scopes:
            scope_head, scope_tail = _scope_fields(scope)
            encoded = _span_fields(members)
            rs.append(b"\x12" + _varint(len(scope_head) + len(encoded) + len(scope_tail)))  # ResourceSpans.scope_spans
            rs.append(scope_head)
            rs.append(encoded)
            rs.append(scope_tail)
        rs.append(res_tail)
        parts.append(b"\x0a" + _varint(sum(map(len, rs))))  # ExportTraceServiceRequest.resource_spans
        parts += rs
    return b"".join(parts)
