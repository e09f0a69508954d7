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

``attrs`` and ``events`` unpack on first use (when the trace closes) and keep the result, so the
extractors of :mod:`collector.points` read a compact span exactly like a ``SpanRecord``.
"""

from __future__ import annotations

import struct
import sys
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from collector.litellm_spans import ATTRS as LITELLM_ATTRS
from collector.spans import OtlpDecodeError, _pb_value
from deltatap.vocab import Attr

# every attribute collector.points and collector.join read (keep in step with them)
ATTRS_READ: frozenset[str] = frozenset({
    Attr.OBSERVER, Attr.LINK, Attr.DOWNSTREAM, Attr.DOWNSTREAM_KIND, Attr.UPSTREAM, Attr.UPSTREAM_KIND,
    Attr.REQUEST_ID, Attr.BODY_FINGERPRINT, Attr.HTTP_STATUS, Attr.OUTCOME, Attr.FIREWALL_DECISION, Attr.RUN_ID,
    Attr.GENAI_INPUT_TOKENS, Attr.GENAI_OUTPUT_TOKENS, Attr.CLOCK_OFFSET_NS, Attr.CLOCK_UNCERTAINTY_NS,
    Attr.OVERHEAD_REQUEST_NS, Attr.OVERHEAD_FIRST_TOKEN_NS, Attr.GAP_COUNT, Attr.GAP_MEAN_MS, Attr.GAP_P99_MS,
    Attr.GAP_MAX_MS, Attr.GAP_FWD_MEAN_MS, Attr.GAP_FWD_P99_MS, Attr.GAP_FWD_MAX_MS, Attr.CONTENT_EVENTS,
    Attr.ENGINE_PROMPT_MS, Attr.ENGINE_PROMPT_N, Attr.ENGINE_PREDICTED_N, Attr.COMPONENT, Attr.COMPONENT_KIND,
    Attr.ENGINE_TOKENS_AFTER_DISCONNECT, Attr.VLLM_TIME_IN_QUEUE, Attr.VLLM_TTFT, Attr.VLLM_PREFILL, Attr.VLLM_DECODE,
    Attr.VLLM_INFERENCE, "service.name", *LITELLM_ATTRS,
})
# string attributes that differ per request: held per span; every other string is part of the Layout
_PER_SPAN: frozenset[str] = frozenset({Attr.REQUEST_ID, Attr.BODY_FINGERPRINT, Attr.FIREWALL_DECISION})
_LABEL = Attr.LABEL_PREFIX
_CACHE_MAX = 65_536
_intern = sys.intern


class Layout:
    """The shape shared by many spans: name, service, kind, status, the low-cardinality string
    attributes (links, kinds, outcomes: their values are part of the shape), which attribute each
    packed number and each per-span value is, and the event names."""

    __slots__ = ("name", "service", "kind", "status_code", "rooted", "fixed", "packed_keys", "other_keys", "event_names", "struct", "n_events")

    def __init__(self, name: str, service: str, kind: int, status_code: int, rooted: bool, fixed: tuple[tuple[str, Any], ...],
                 packed: tuple[tuple[str, str], ...], other_keys: tuple[str, ...], event_names: tuple[str, ...]) -> None:
        self.name, self.service, self.kind, self.status_code, self.rooted = name, service, kind, status_code, rooted
        self.fixed = fixed
        self.packed_keys = tuple(k for k, _ in packed)
        self.other_keys = other_keys
        self.event_names = event_names
        self.n_events = len(event_names)
        # span id, parent span id, start, end, event times (fixed64 in OTLP), then the numeric attributes
        self.struct = struct.Struct("<8s8s" + "Q" * (2 + len(event_names)) + "".join(t for _, t in packed))


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
    """Compact spans of one ExportTraceServiceRequest (the receivers' hot path)."""
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
                    raise OtlpDecodeError(
                        f"resourceSpans[{ri}].scopeSpans[{si}].spans[{k}]: traceId must be 16 bytes and spanId 8 bytes "
                        f"(got {len(tid)} and {len(sid)})"
                    )
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
