"""The live path's compact span: decoded once from protobuf, holding only what the decomposition reads.

The receivers (OTLP/gRPC, OTLP/HTTP protobuf) turn each span into a :class:`CompactSpan` instead of a
full :class:`~collector.spans.SpanRecord`: it keeps the attributes the collector reads
(:data:`ATTRS_READ`, ``deltatap.label.*`` and ``service.name``; a span's attribute wins over its
resource's) and drops the rest; event attributes are dropped (no extractor reads them). While a
trace is open its spans sit in memory in packed form:

* a :class:`Layout`, shared by every span of the same shape (name, service, kind, status, root or
  not, attribute keys and value types, the values of low-cardinality string attributes such as
  links, kinds and outcome, event names), found in a bounded cache;
* one ``bytes`` of numbers (span and parent ids, start, end and event times, numeric attributes)
  packed with the layout's precompiled :class:`struct.Struct`;
* a tuple of the per-request values (request id, body fingerprint, firewall decision, labels,
  non-scalar values), strings deduplicated through a bounded cache so one request's id and body
  fingerprint are held once for all its spans.

``attrs`` and ``events`` unpack on first use and keep the result, so a compact span reads exactly like a
``SpanRecord``; the joiner and the compiled span kinds (:mod:`deltatap.collector.kinds`) read
:meth:`Layout.values` by position instead (the layout says where).

The receivers call :func:`decode_compact` on the request bytes (the slim wire view below);
:func:`decode_request_compact` takes an already parsed request (tests, and the slim view's fallback).
"""

from __future__ import annotations

import itertools
import struct
import sys
from collections.abc import Callable
from operator import itemgetter
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from deltatap.collector import kinds
from deltatap.collector.spans import OtlpDecodeError, _pb_value
from deltatap.core import native
from deltatap.core.vocab import Attr

# the C decoder of the hot path (collector/_otlpdec.c); None: the Python below runs (it is the definition)
_acc = native.load("deltatap.collector._otlpdec", __name__)

# every attribute the collector reads: derived from the registered span kinds (collector.kinds.attrs_read)
ATTRS_READ: frozenset[str] = kinds.attrs_read()
# string attributes that differ per request: held per span; every other string is part of the Layout
_PER_SPAN: frozenset[str] = frozenset({Attr.REQUEST_ID, Attr.BODY_FINGERPRINT, Attr.FIREWALL_DECISION, Attr.STAMP_BOUNDS})
_LABEL = Attr.LABEL_PREFIX
_CACHE_MAX = 65_536
_intern = sys.intern


class Layout:
    """The shape shared by many spans: name, service, kind, status, the low-cardinality string
    attributes (links, kinds, outcomes: their values are part of the shape), which attribute each
    packed number and each per-span value is, and the event names."""

    __slots__ = ("name", "service", "kind", "status_code", "rooted", "fixed", "packed_keys", "other_keys", "event_names", "struct", "n_events",
                 "positions", "none", "_tail", "_numbers", "_n_packed")

    def __init__(self, name: str, service: str, kind: int, status_code: int, rooted: bool, fixed: tuple[tuple[str, Any], ...],
                 packed: tuple[tuple[str, str], ...], other_keys: tuple[str, ...], event_names: tuple[str, ...]) -> None:
        self.name, self.service, self.kind, self.status_code, self.rooted = name, service, kind, status_code, rooted
        self.fixed = fixed
        self.packed_keys = tuple(k for k, _ in packed)
        self.other_keys = other_keys
        self.event_names = event_names
        self.n_events = len(event_names)
        # span id, parent span id, start, end, event times (fixed64 in OTLP), then the numeric attributes
        codes = "Q" * (2 + len(event_names)) + "".join(t for _, t in packed)
        self.struct = struct.Struct("<8s8s" + codes)
        # values(span): (start, end, event times..., numbers..., per-span values..., string constants..., None)
        n_packed = 2 + self.n_events + len(packed)
        pos = {k: 2 + self.n_events + i for i, k in enumerate(self.packed_keys)}
        pos.update((k, n_packed + j) for j, k in enumerate(other_keys))
        pos.update((k, n_packed + len(other_keys) + j) for j, (k, _) in enumerate(fixed))
        self.positions, self.none = pos, n_packed + len(other_keys) + len(fixed)
        self._tail = (*(v for _, v in fixed), None)
        self._numbers = struct.Struct("<16x" + codes).unpack
        self._n_packed = n_packed

    def values(self, span: CompactSpan) -> tuple:
        """A span of this layout as one tuple, each attribute at :attr:`positions` (absent: :attr:`none`)."""
        return self._numbers(span.packed) + span.others + self._tail

    def start_and(self, head: Any, p: int, q: int) -> Callable[[CompactSpan], tuple] | None:
        """A reader of (``head``, start, value at position ``p``, value at ``q``) of :meth:`values`, which unpacks no
        other number; None when ``p`` or ``q`` is a packed number (then read :meth:`values`)."""
        n, tail = self._n_packed, self._tail
        n_others = len(self.other_keys)
        if p < n or q < n:
            return None
        a, b = p - n, q - n
        va = None if a < n_others else tail[a - n_others]
        vb = None if b < n_others else tail[b - n_others]
        return lambda span: (head, _START(span.packed)[0], span.others[a] if a < n_others else va, span.others[b] if b < n_others else vb)


_START = struct.Struct("<16xQ").unpack_from  # a span's start: the first number after its span and parent ids
_LAYOUTS: dict[tuple, Layout] = {}
_VALUES: dict[Any, Any] = {}


def _layout(key: tuple) -> Layout:
    lay = _LAYOUTS.get(key)
    if lay is None:
        if len(_LAYOUTS) >= _CACHE_MAX:
            _LAYOUTS.clear()
        lay = _LAYOUTS[key] = Layout(*key)
    return lay


def _shared(v: Any) -> Any:
    """One object per distinct string value (bounded): repeated values are held once."""
    got = _VALUES.get(v)
    if got is None:
        if len(_VALUES) >= _CACHE_MAX:
            _VALUES.clear()
        _VALUES[v] = got = v
    return got


class CompactSpan:
    """A span as the live collector holds it; reads like :class:`~collector.spans.SpanRecord`."""

    __slots__ = ("trace_id", "layout", "packed", "others", "_attrs", "_events", "_times")

    def __init__(self, trace_id: str, layout: Layout, packed: bytes, others: tuple) -> None:
        self.trace_id = trace_id
        self.layout = layout
        self.packed = packed
        self.others = others
        self._attrs: dict[str, Any] | None = None
        self._events: list[tuple[str, int, None]] | None = None
        self._times: tuple[int, int] | None = None  # (start, end), once unpacked

    # the SpanRecord interface ------------------------------------------------------------------
    @property
    def span_id(self) -> str:
        return self.packed[:8].hex()

    @property
    def parent_span_id(self) -> str:
        return "" if self.layout.rooted else self.packed[8:16].hex()

    @property
    def name(self) -> str:
        return self.layout.name

    @property
    def service(self) -> str:
        return self.layout.service

    @property
    def kind(self) -> int:
        return self.layout.kind

    @property
    def status_code(self) -> int:
        return self.layout.status_code

    @property
    def start_unix_ns(self) -> int:
        if self._times is None:
            self._unpack()
        return self._times[0]  # type: ignore[index]

    @property
    def end_unix_ns(self) -> int:
        if self._times is None:
            self._unpack()
        return self._times[1]  # type: ignore[index]

    def _unpack(self) -> None:
        lay = self.layout
        vals = lay.struct.unpack(self.packed)
        self._times = (vals[2], vals[3])
        n = 4 + lay.n_events
        self._events = [(nm, t, None) for nm, t in zip(lay.event_names, vals[4:n])]
        attrs = dict(lay.fixed)
        attrs.update(zip(lay.packed_keys, vals[n:]))
        attrs.update(zip(lay.other_keys, self.others))
        self._attrs = attrs

    @property
    def attrs(self) -> dict[str, Any]:
        if self._attrs is None:
            self._unpack()
        return self._attrs  # type: ignore[return-value]

    @property
    def events(self) -> list[tuple[str, int, None]]:
        if self._events is None:
            self._unpack()
        return self._events  # type: ignore[return-value]


_KEEP: dict[str, bool] = {}
_SEEN_KINDS = [kinds.version()]  # the registry's version the attribute caches were made for


def _follow_kinds() -> None:
    """A newly registered span kind may read more attributes: forget which ones were kept."""
    global ATTRS_READ
    if _SEEN_KINDS[0] != kinds.version():
        _SEEN_KINDS[0] = kinds.version()
        ATTRS_READ = kinds.attrs_read()
        _KEEP.clear()
        _KPLANS.clear()
        _LAST_KEYS.clear()
        _SPLANS.clear()
        _C_KPLANS.clear()
        _C_RES.clear()
        _C_PLANS.clear()
        if _acc is not None:
            _acc.reset()


def _keep(key: str) -> bool:
    if len(_KEEP) >= _CACHE_MAX:
        _KEEP.clear()
    keep = _KEEP[key] = key in ATTRS_READ or key.startswith(_LABEL)
    return keep


def _read_attrs(kvs: Any, into: dict[str, tuple[str, Any]]) -> None:
    """(struct code, value) of each attribute the collector reads; code "" for a non-numeric value."""
    known = _KEEP
    for kv in kvs:
        k = kv.key
        keep = known.get(k)
        if keep is None:
            keep = _keep(k)
        if keep:
            v = kv.value
            which = v.WhichOneof("value")
            if which == "string_value":
                into[_intern(k)] = ("", _shared(v.string_value))
            elif which == "int_value":
                into[_intern(k)] = ("q", v.int_value)
            elif which == "double_value":
                into[_intern(k)] = ("d", v.double_value)
            elif which == "bool_value":
                into[_intern(k)] = ("?", v.bool_value)
            else:  # arrays, kvlists, bytes (rare), or no value
                into[_intern(k)] = ("", None if which is None else _pb_value(v))


def decode_request_compact(req: ExportTraceServiceRequest) -> list[CompactSpan]:
    """Compact spans of one parsed ExportTraceServiceRequest (tests, and the fallback of :func:`decode_compact`)."""
    _follow_kinds()
    out: list[CompactSpan] = []
    append = out.append
    tids: dict[bytes, str] = {}
    for ri, rs in enumerate(req.resource_spans):
        res: dict[str, tuple[str, Any]] = {}
        _read_attrs(rs.resource.attributes, res)
        svc = res.get("service.name")
        service = "" if svc is None else str(svc[1])
        for si, ss in enumerate(rs.scope_spans):
            for k, sp in enumerate(ss.spans):
                tid, sid = sp.trace_id, sp.span_id
                if len(tid) != 16 or len(sid) != 8:
                    raise _bad_ids(ri, si, k, tid, sid)
                attrs = dict(res) if res else {}
                _read_attrs(sp.attributes, attrs)
                fixed, packed_k, packed_v, other_k, other_v = [], [], [], [], []
                for key, (code, v) in attrs.items():
                    if code:
                        packed_k.append((key, code))
                        packed_v.append(v)
                    elif key in _PER_SPAN or key.startswith(_LABEL) or not isinstance(v, str):
                        other_k.append(key)
                        other_v.append(v)
                    else:
                        fixed.append((key, v))
                names, times = [], []
                for e in sp.events:
                    names.append(e.name)
                    times.append(e.time_unix_nano)
                parent = sp.parent_span_id
                lay = _layout((sp.name, service, sp.kind, sp.status.code, not parent, tuple(fixed), tuple(packed_k), tuple(other_k), tuple(names)))
                hx = tids.get(tid)
                if hx is None:
                    hx = tids[tid] = tid.hex()
                packed = lay.struct.pack(sid, parent, sp.start_time_unix_nano, sp.end_time_unix_nano, *times, *packed_v)
                append(CompactSpan(hx, lay, packed, tuple(other_v)))
    return out


def _bad_ids(ri: int, si: int, k: int, tid: bytes, sid: bytes) -> OtlpDecodeError:
    return OtlpDecodeError(
        f"resourceSpans[{ri}].scopeSpans[{si}].spans[{k}]: traceId must be 16 bytes and spanId 8 bytes "
        f"(got {len(tid)} and {len(sid)})"
    )


# --------------------------------------------------------------------------------------------
# the hot path: a slim wire view of the request, decoded through plans cached per shape
# --------------------------------------------------------------------------------------------
#
# Parsing into the generated OTLP classes and walking every KeyValue costs ~0.6 us per attribute
# (a wrapper object per KeyValue and per AnyValue, a WhichOneof per value). The slim view below is
# wire-compatible with opentelemetry-proto's trace/v1 messages but declares only what is read, and
# declares a span's repeated ``attributes`` and ``events`` as ONE message each: protobuf merges
# repeated occurrences of a singular message field, concatenating its repeated fields, so a span's
# attributes arrive as two parallel lists (every key, every raw AnyValue) and its events as two
# (every time, every name), built in C. What depends only on the span's shape (which keys are kept,
# where they go, the Layout) is worked out once per shape and cached; per span only the raw values of
# kept attributes are decoded (through a bounded cache: most repeat). The keys of a span are compared
# (in C) with those of the last span of the same name, whose key plan is reused when they are equal:
# materializing them as Python bytes costs more than the comparison. A field left out on the wire
# (a KeyValue without value, an event without name) would misalign the parallel lists: their lengths
# are checked, and a request where they differ is decoded by :func:`decode_request_compact` instead.
# What the lengths cannot show is two such omissions that cancel out in one span: a KeyValue with an
# empty key (invalid in OpenTelemetry: keys must be non-empty) beside one without a value, or an event
# with time 0 beside one with an empty name; such a span's values would be read against the wrong keys.


def _slim_request_class() -> Any:
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    F = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(name="deltatap/collector/slim_trace.proto", package="deltatap.slim", syntax="proto3")
    rep, opt = F.LABEL_REPEATED, F.LABEL_OPTIONAL

    def message(name: str, *fields: tuple[int, str, int, int, str | None]) -> None:
        m = fdp.message_type.add(name=name)
        for number, fname, ftype, label, tname in fields:
            f = m.field.add(name=fname, number=number, type=ftype, label=label)
            if tname:
                f.type_name = ".deltatap.slim." + tname

    # KeyValue{string key = 1; AnyValue value = 2}, merged: keys as bytes (no per-key UTF-8 object; checked once per shape)
    message("Attrs", (1, "key", F.TYPE_BYTES, rep, None), (2, "value", F.TYPE_BYTES, rep, None))
    # Span.Event{fixed64 time_unix_nano = 1; string name = 2; ...}, merged
    message("Events", (1, "time", F.TYPE_FIXED64, rep, None), (2, "name", F.TYPE_BYTES, rep, None))
    message("Status", (3, "code", F.TYPE_INT32, opt, None))
    message("Span", (1, "trace_id", F.TYPE_BYTES, opt, None), (2, "span_id", F.TYPE_BYTES, opt, None),
            (4, "parent_span_id", F.TYPE_BYTES, opt, None), (5, "name", F.TYPE_STRING, opt, None), (6, "kind", F.TYPE_INT32, opt, None),
            (7, "start", F.TYPE_FIXED64, opt, None), (8, "end", F.TYPE_FIXED64, opt, None), (9, "attributes", F.TYPE_MESSAGE, opt, "Attrs"),
            (11, "events", F.TYPE_MESSAGE, opt, "Events"), (15, "status", F.TYPE_MESSAGE, opt, "Status"))
    message("Resource", (1, "attributes", F.TYPE_MESSAGE, opt, "Attrs"))
    message("ScopeSpans", (2, "spans", F.TYPE_MESSAGE, rep, "Span"))
    message("ResourceSpans", (1, "resource", F.TYPE_MESSAGE, opt, "Resource"), (2, "scope_spans", F.TYPE_MESSAGE, rep, "ScopeSpans"))
    message("Request", (1, "resource_spans", F.TYPE_MESSAGE, rep, "ResourceSpans"))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("deltatap.slim.Request"))


_SlimRequest = _slim_request_class()


class _Misaligned(Exception):
    """A span's parallel lists differ in length: decode the request the long way."""


def tuple_getter(idx: tuple[int, ...]) -> Any:
    """idx -> a function returning the tuple of those items (itemgetter, but always a tuple)."""
    if not idx:
        return lambda seq: ()
    if len(idx) == 1:
        i = idx[0]
        return lambda seq: (seq[i],)
    return itemgetter(*idx)


def _utf8(b: bytes, what: str) -> str:
    try:
        return _intern(b.decode("utf-8"))
    except UnicodeDecodeError:
        raise OtlpDecodeError(f"{what} {b[:40]!r} is not valid UTF-8") from None


class _KeyPlan:
    """Per tuple of attribute keys: which are kept (the last of duplicate keys wins), in two groups:
    shape-forming (their string values are part of the Layout) and per-span (request id, body
    fingerprint, decision, labels: their values are held per span)."""

    __slots__ = ("keys", "get_n", "get_p", "n_norm", "norm_idx", "per_idx")

    def __init__(self, raw_keys: tuple[bytes, ...]) -> None:
        last: dict[str, int] = {}
        for i, rk in enumerate(raw_keys):
            k = _utf8(rk, "attribute key")
            if k in ATTRS_READ or k.startswith(_LABEL):
                last.pop(k, None)
                last[k] = i
        norm = [(k, i) for k, i in last.items() if k not in _PER_SPAN and not k.startswith(_LABEL)]
        per = [(k, i) for k, i in last.items() if k in _PER_SPAN or k.startswith(_LABEL)]
        self.keys = tuple(k for k, _ in norm) + tuple(k for k, _ in per)
        self.n_norm = len(norm)
        self.norm_idx = tuple(i for _, i in norm)
        self.per_idx = tuple(i for _, i in per)
        self.get_n = tuple_getter(self.norm_idx)
        self.get_p = tuple_getter(self.per_idx)


_KPLANS: dict[tuple[bytes, ...], _KeyPlan] = {}
_LAST_KEYS: dict[str, tuple[list[bytes], tuple[bytes, ...], _KeyPlan]] = {}  # span name -> its last span's keys and their plan


def _key_plan(raw_keys: tuple[bytes, ...]) -> _KeyPlan:
    if len(_KPLANS) >= 4096:
        _KPLANS.clear()
    kp = _KPLANS[raw_keys] = _KeyPlan(raw_keys)
    return kp


# the shape of a value: the string itself for a string (part of the Layout), else one of these (never
# equal to a string, nor to each other: 1 == True == 1.0 in Python, so no numbers here)
_OTHER = object()  # neither a number nor a string (arrays, kvlists, bytes, none)
_SHAPE_INT, _SHAPE_DOUBLE, _SHAPE_BOOL = object(), object(), object()
_S_DOUBLE = struct.Struct("<d")


def _varint(b: bytes, i: int) -> tuple[int, int]:
    """(value, index after it) of the varint at b[i]; IndexError when it runs past the end."""
    v = shift = 0
    while True:
        c = b[i]
        i += 1
        v |= (c & 0x7F) << shift
        if c < 0x80:
            return v, i
        shift += 7
        if shift > 63:  # (a 10-byte varint's value: its low 64 bits, as protobuf reads it; see _value's ints)
            raise OtlpDecodeError("varint longer than 10 bytes in an attribute value")


def _any_value(raw: bytes) -> tuple[str, Any, Any]:
    """(struct code, value, shape) of a serialized AnyValue: code "" for non-numbers; the shape is the
    string itself for strings, _SHAPE_INT / _SHAPE_DOUBLE / _SHAPE_BOOL for numbers, _OTHER otherwise."""
    n = len(raw)
    try:
        if n == 0:
            return ("", None, _OTHER)
        tag = raw[0]
        if tag == 0x0A:  # string_value
            ln, i = _varint(raw, 1)
            if i + ln == n:
                s = _shared(raw[i:].decode("utf-8"))
                return ("", s, s)
        elif tag == 0x18:  # int_value (int64, two's complement)
            v, i = _varint(raw, 1)
            if i == n:
                v &= 0xFFFF_FFFF_FFFF_FFFF  # (bits past 64 in a 10th byte: dropped, as protobuf does)
                return ("q", v - (1 << 64) if v >= 1 << 63 else v, _SHAPE_INT)
        elif tag == 0x21 and n == 9:  # double_value
            return ("d", _S_DOUBLE.unpack_from(raw, 1)[0], _SHAPE_DOUBLE)
        elif tag == 0x10:  # bool_value
            v, i = _varint(raw, 1)
            if i == n:
                return ("?", v != 0, _SHAPE_BOOL)
    except (IndexError, UnicodeDecodeError):
        pass
    # arrays, kvlists, bytes, repeated or unusual encodings: the generated class decides
    try:
        av = AnyValue.FromString(raw)
    except Exception as exc:
        raise OtlpDecodeError(f"attribute value is not an AnyValue ({exc})") from None
    which = av.WhichOneof("value")
    if which == "string_value":
        return ("", _shared(av.string_value), av.string_value)
    if which == "int_value":
        return ("q", av.int_value, _SHAPE_INT)
    if which == "double_value":
        return ("d", av.double_value, _SHAPE_DOUBLE)
    if which == "bool_value":
        return ("?", av.bool_value, _SHAPE_BOOL)
    return ("", None if which is None else _pb_value(av), _OTHER)


_VALUES_RAW: dict[bytes, tuple[str, Any, Any]] = {}
_VALUES_RAW_MAX = 4096  # the values that repeat are few; per-request ones (ids, timings) only pass through


def _value(raw: bytes) -> tuple[str, Any, Any]:
    """:func:`_any_value` with the common encodings inline (a cache miss: per-request numbers and ids
    land here, a dozen per tap span), cached unless a double or an int of 16384 or more (those
    rarely repeat)."""
    n = len(raw)
    if n == 9 and raw[0] == 0x21:
        return ("d", _S_DOUBLE.unpack_from(raw, 1)[0], _SHAPE_DOUBLE)
    got = None
    if n >= 2:
        tag, b1 = raw[0], raw[1]
        if tag == 0x18:  # int_value: varints of up to 4 bytes inline (< 2**28)
            if n == 2:
                if b1 < 0x80:
                    got = ("q", b1, _SHAPE_INT)
            elif b1 >= 0x80 and raw[-1] < 0x80:
                if n == 3:
                    got = ("q", (b1 & 0x7F) | raw[2] << 7, _SHAPE_INT)
                elif n == 4 and raw[2] >= 0x80:  # >= 16384: durations in ns, sizes; rarely repeat, not cached
                    return ("q", (b1 & 0x7F) | (raw[2] & 0x7F) << 7 | raw[3] << 14, _SHAPE_INT)
                elif n == 5 and raw[2] >= 0x80 and raw[3] >= 0x80:
                    return ("q", (b1 & 0x7F) | (raw[2] & 0x7F) << 7 | (raw[3] & 0x7F) << 14 | raw[4] << 21, _SHAPE_INT)
        elif tag == 0x0A and b1 == n - 2 and b1 < 0x80:  # string_value shorter than 128 bytes
            try:
                st = _shared(raw[2:].decode("utf-8"))
                got = ("", st, st)
            except UnicodeDecodeError:
                pass
    if got is None:
        got = _any_value(raw)
        if got[2] is _OTHER:  # lists and dicts are mutable: never shared
            return got
    if len(_VALUES_RAW) >= _VALUES_RAW_MAX:
        _VALUES_RAW.clear()
    _VALUES_RAW[raw] = got
    return got


class _SpanPlan:
    """Per span shape: its Layout and where its packed numbers and per-span values come from."""

    __slots__ = ("layout", "get_packed", "get_other", "res_packed", "res_other", "packed_idx", "other_idx")

    def __init__(self, layout: Layout, packed_idx: tuple[int, ...], other_idx: tuple[int, ...], res_packed: tuple, res_other: tuple) -> None:
        self.layout = layout
        self.packed_idx, self.other_idx = packed_idx, other_idx
        self.get_packed = tuple_getter(packed_idx)
        self.get_other = tuple_getter(other_idx)
        # the resource's numbers and non-scalar values: constants of this plan, held per span like the
        # span's own (a Layout key holds no numbers: 1 == True == 1.0 would merge layouts)
        self.res_packed = res_packed
        self.res_other = res_other


_SPLANS: dict[tuple, _SpanPlan] = {}
_CODE, _VAL, _SHAPE = itemgetter(0), itemgetter(1), itemgetter(2)


def _span_plan(key: tuple, kp: _KeyPlan, res: tuple[tuple[str, str, Any], ...], service: str, name: str,
               kind: int, status: int, rooted: bool, dec: list[tuple[str, Any, Any]], raw_names: tuple[bytes, ...]) -> _SpanPlan:
    own = set(kp.keys)
    fixed: list[tuple[str, Any]] = []
    packed: list[tuple[str, str]] = []
    packed_idx: list[int] = []
    other: list[str] = []
    other_idx: list[int] = []
    res_other_k: list[str] = []
    res_other_v: list[Any] = []
    attrs: dict[str, tuple[int, str, Any]] = {}  # resource first, then the span's own (a span's attribute wins), in order
    for k, code, v in res:
        if k not in own:
            attrs[k] = (-1, code, v)
    for i, (k, (code, v, _)) in enumerate(zip(kp.keys, dec)):
        attrs[k] = (i, code, v)
    res_packed: list[tuple[str, str]] = []
    res_packed_v: list[Any] = []
    for k, (i, code, v) in attrs.items():
        if i < 0:  # the resource's: strings are part of the layout, numbers and the rest constants added per span
            if isinstance(v, str):
                fixed.append((k, v))
            elif code:
                res_packed.append((k, code))
                res_packed_v.append(v)
            else:
                res_other_k.append(k)
                res_other_v.append(v)
        elif code == "" and i < kp.n_norm and isinstance(v, str):
            fixed.append((k, v))  # shape-forming strings are part of the layout
        elif code:
            packed.append((k, code))
            packed_idx.append(i)
        else:
            other.append(k)
            other_idx.append(i)
    names = tuple(_utf8(n, "event name") for n in raw_names)
    lay = _layout((name, service, kind, status, rooted, tuple(fixed), tuple(packed + res_packed), tuple(other + res_other_k), names))
    sp = _SpanPlan(lay, tuple(packed_idx), tuple(other_idx), tuple(res_packed_v), tuple(res_other_v))
    if key is not None:
        if len(_SPLANS) >= _CACHE_MAX:
            _SPLANS.clear()
        _SPLANS[key] = sp
    return sp


def _resource(rs: Any) -> tuple[tuple[tuple[str, str, Any], ...], str, tuple]:
    """Kept resource attributes as (key, code, value), the service name, and a hashable key of them."""
    a = rs.resource.attributes
    raw_keys, raw_vals = tuple(a.key), tuple(a.value)
    if len(raw_keys) != len(raw_vals):
        raise _Misaligned
    items, service = _resource_items(raw_keys, raw_vals)
    return items, service, (raw_keys, raw_vals)


def _resource_items(raw_keys: tuple[bytes, ...], raw_vals: tuple[bytes, ...]) -> tuple[tuple[tuple[str, str, Any], ...], str]:
    kp = _KPLANS.get(raw_keys) or _key_plan(raw_keys)
    raws = kp.get_n(raw_vals) + kp.get_p(raw_vals)
    items = tuple((k, *_any_value(r)[:2]) for k, r in zip(kp.keys, raws))
    service = next((str(v) for k, _, v in items if k == "service.name"), "")
    return items, service


def decode_compact(data: bytes) -> list[CompactSpan]:
    """Compact spans of one serialized ExportTraceServiceRequest (the receivers' hot path).

    Raises :class:`OtlpDecodeError` when ``data`` is not a valid request. With the C decoder built
    (collector/_otlpdec.c), it decodes; whatever it is not sure of (every malformed request among them) it
    hands back to :func:`decode_compact_reference`, which is also what it must equal."""
    if _acc is not None:
        _follow_kinds()
        got = _acc.decode(data)
        if got is not None:
            return got
    return decode_compact_reference(data)


def decode_compact_reference(data: bytes) -> list[CompactSpan]:
    """:func:`decode_compact` in Python: the definition the C decoder is tested against."""
    try:
        req = _SlimRequest.FromString(data)
    except Exception as exc:
        raise OtlpDecodeError(f"not a protobuf ExportTraceServiceRequest ({exc})") from None
    try:
        return _decode_slim(req)
    except _Misaligned:
        try:
            full = ExportTraceServiceRequest.FromString(data)
        except Exception as exc:
            raise OtlpDecodeError(f"not a protobuf ExportTraceServiceRequest ({exc})") from None
        return decode_request_compact(full)


def _decode_slim(req: Any) -> list[CompactSpan]:
    _follow_kinds()
    out: list[CompactSpan] = []
    append = out.append
    tids: dict[bytes, str] = {}
    kplans_get, splans_get, vals_get, last_keys_get, dbl = _KPLANS.get, _SPLANS.get, _VALUES_RAW.get, _LAST_KEYS.get, _S_DOUBLE.unpack_from
    for ri, rs in enumerate(req.resource_spans):
        res, service, res_key = _resource(rs)
        for si, ss in enumerate(rs.scope_spans):
            for k, sp in enumerate(ss.spans):
                tid, sid = sp.trace_id, sp.span_id
                if len(tid) != 16 or len(sid) != 8:
                    raise _bad_ids(ri, si, k, tid, sid)
                a = sp.attributes
                name = sp.name
                ak = a.key
                last = last_keys_get(name)
                if last is not None and ak == last[0]:  # the keys of this name's last span (compared in C, not copied)
                    raw_keys, kp = last[1], last[2]
                else:
                    lk = ak[:]  # (a slice copies a repeated field faster than iterating it)
                    raw_keys = tuple(lk)
                    kp = kplans_get(raw_keys) or _key_plan(raw_keys)
                    if len(_LAST_KEYS) >= 4096:
                        _LAST_KEYS.clear()
                    _LAST_KEYS[name] = (lk, raw_keys, kp)
                vals = a.value
                if len(vals) != len(raw_keys):
                    raise _Misaligned
                raws = kp.get_n(vals)
                dn = list(map(vals_get, raws))
                if None in dn:
                    dn = [d or (("d", dbl(r, 1)[0], _SHAPE_DOUBLE) if len(r) == 9 and r[0] == 0x21 else _value(r)) for d, r in zip(dn, raws)]  # doubles inline
                raws = kp.get_p(vals)
                if raws:
                    dp = list(map(vals_get, raws))
                    if None in dp:
                        dp = [d or _value(r) for d, r in zip(dp, raws)]
                    ps = tuple(map(_CODE, dp))
                else:
                    dp, ps = (), ()
                ev = sp.events
                raw_names = tuple(ev.name[:])
                times = ev.time[:]
                if len(times) != len(raw_names):
                    raise _Misaligned
                parent = sp.parent_span_id
                kind, status = sp.kind, sp.status.code
                key = (kp, res_key, name, kind, status, not parent, tuple(map(_SHAPE, dn)), ps, raw_names)
                plan = splans_get(key)
                if plan is None:
                    plan = _span_plan(key, kp, res, service, name, kind, status, not parent, [*dn, *dp], raw_names)
                values = list(map(_VAL, dn))
                if dp:
                    values += map(_VAL, dp)
                hx = tids.get(tid)
                if hx is None:
                    hx = tids[tid] = tid.hex()
                packed = plan.layout.struct.pack(sid, parent, sp.start, sp.end, *times, *plan.get_packed(values), *plan.res_packed)
                others = plan.get_other(values)
                if plan.res_other:
                    others += plan.res_other
                append(CompactSpan(hx, plan.layout, packed, others))
    return out


# --------------------------------------------------------------------------------------------
# the C decoder's side (collector/_otlpdec.c): it walks the wire and builds each span; what depends on a
# shape is built here, by the functions above, on a cache miss, and cached in these dicts (keyed by bytes
# the C side builds: the raw keys; the resource's raw keys and values; a span's whole plan signature)
# --------------------------------------------------------------------------------------------

_C_KPLANS: dict[bytes, tuple] = {}
_C_RES: dict[bytes, tuple] = {}
_C_PLANS: dict[bytes, tuple] = {}
_SERIAL = itertools.count(1)  # names a key plan or a resource in a signature (never reused, unlike id())


def _c_key_plan(raw_keys: tuple[bytes, ...]) -> tuple[_KeyPlan, int, tuple[int, ...], tuple[int, ...]]:
    kp = _KPLANS.get(raw_keys) or _key_plan(raw_keys)
    return kp, next(_SERIAL), kp.norm_idx, kp.per_idx


def _c_resource(raw_keys: tuple[bytes, ...], raw_vals: tuple[bytes, ...]) -> tuple[int, tuple, str]:
    items, service = _resource_items(raw_keys, raw_vals)
    return next(_SERIAL), items, service


def _c_span_plan(kp: _KeyPlan, res: tuple, service: str, name: str, kind: int, status: int, rooted: bool,
                 dec: list[tuple[str, Any, Any]], raw_names: tuple[bytes, ...]) -> tuple:
    plan = _span_plan(None, kp, res, service, name, kind, status, rooted, dec, raw_names)
    lay = plan.layout
    codes = lay.struct.format[len("<8s8s") + 2 + lay.n_events:].encode("ascii")  # the packed numbers' struct codes
    return lay, plan.packed_idx, plan.other_idx, plan.res_packed, plan.res_other, codes


if _acc is not None:
    _acc.configure(CompactSpan, _C_KPLANS, _C_RES, _C_PLANS, _VALUES, _c_key_plan, _c_resource, _c_span_plan, _value,
                   _SHAPE_INT, _SHAPE_DOUBLE, _SHAPE_BOOL, _OTHER, "", "q", "d", "?", OtlpDecodeError, _CACHE_MAX, 4096, _CACHE_MAX)
