"""The collector's compact span form and its decoders (OTLP protobuf, OTLP JSON).

Every input (OTLP/gRPC, OTLP/HTTP protobuf or JSON, offline OTLP JSON, Jaeger JSON, AIPerf records)
becomes :class:`SpanRecord` objects: ids as lowercase hex, times in Unix ns, attributes as a plain
dict (resource attributes under the span's own: a span's attribute wins), events as
``(name, unix_ns, attrs-or-None)`` tuples. Decoding is a pure function of the input; a malformed
request raises :class:`OtlpDecodeError` whose message says what is wrong and where.
"""

from __future__ import annotations

import base64
import binascii
import sys
from dataclasses import dataclass
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest


class OtlpDecodeError(ValueError):
    """The input is not valid OTLP trace data; the message names the offending field."""


@dataclass(slots=True)
class SpanRecord:
    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    start_unix_ns: int
    end_unix_ns: int
    attrs: dict[str, Any]
    events: list[tuple[str, int, dict[str, Any] | None]]
    kind: int = 0
    status_code: int = 0  # 0 unset, 1 ok, 2 error
    service: str = ""


_intern = sys.intern

# --------------------------------------------------------------------------------------------
# protobuf
# --------------------------------------------------------------------------------------------


def _pb_value(v: Any) -> Any:
    which = v.WhichOneof("value")
    if which is None:
        return None
    if which == "array_value":
        return [_pb_value(x) for x in v.array_value.values]
    if which == "kvlist_value":
        return {kv.key: _pb_value(kv.value) for kv in v.kvlist_value.values}
    return getattr(v, which)


def _pb_attrs(kvs: Any) -> dict[str, Any]:
    return {_intern(kv.key): _pb_value(kv.value) for kv in kvs}


def decode_request(req: ExportTraceServiceRequest) -> list[SpanRecord]:
    """Spans of one ExportTraceServiceRequest message."""
    out: list[SpanRecord] = []
    for ri, rs in enumerate(req.resource_spans):
        res_attrs = _pb_attrs(rs.resource.attributes)
        service = str(res_attrs.get("service.name", ""))
        for si, ss in enumerate(rs.scope_spans):
            for k, sp in enumerate(ss.spans):
                tid, sid = sp.trace_id, sp.span_id
                if len(tid) != 16 or len(sid) != 8:
                    raise OtlpDecodeError(
                        f"resourceSpans[{ri}].scopeSpans[{si}].spans[{k}]: traceId must be 16 bytes and spanId 8 bytes "
                        f"(got {len(tid)} and {len(sid)})"
                    )
                attrs = dict(res_attrs) if res_attrs else {}
                for kv in sp.attributes:
                    attrs[_intern(kv.key)] = _pb_value(kv.value)
                events = [(_intern(e.name), e.time_unix_nano, _pb_attrs(e.attributes) if len(e.attributes) else None) for e in sp.events]
                out.append(
                    SpanRecord(
                        tid.hex(), sid.hex(), sp.parent_span_id.hex(), sp.name, sp.start_time_unix_nano, sp.end_time_unix_nano,
                        attrs, events, sp.kind, sp.status.code, service,
                    )
                )
    return out


def decode_protobuf(body: bytes) -> list[SpanRecord]:
    """Spans of a serialized ExportTraceServiceRequest (OTLP/HTTP ``application/x-protobuf``)."""
    req = ExportTraceServiceRequest()
    try:
        req.ParseFromString(body)
    except Exception as exc:  # google.protobuf.message.DecodeError and friends
        raise OtlpDecodeError(f"body is not a protobuf ExportTraceServiceRequest: {exc}") from None
    return decode_request(req)


# --------------------------------------------------------------------------------------------
# JSON (OTLP/HTTP JSON and the OpenTelemetry Collector's file exporter)
# --------------------------------------------------------------------------------------------

_KIND_NAMES = {"SPAN_KIND_UNSPECIFIED": 0, "SPAN_KIND_INTERNAL": 1, "SPAN_KIND_SERVER": 2, "SPAN_KIND_CLIENT": 3, "SPAN_KIND_PRODUCER": 4, "SPAN_KIND_CONSUMER": 5}
_STATUS_NAMES = {"STATUS_CODE_UNSET": 0, "STATUS_CODE_OK": 1, "STATUS_CODE_ERROR": 2}


def _get(d: dict, camel: str, snake: str, default: Any = None) -> Any:
    v = d.get(camel)
    if v is None:
        v = d.get(snake, default)
    return default if v is None else v


def json_id(value: Any, nbytes: int, where: str) -> str:
    """An OTLP JSON id: hex (the OTLP spec, the Collector's file exporter) or base64 (protobuf's
    canonical JSON, e.g. ``MessageToJson``), told apart by length. Empty -> ``""``."""
    if value in (None, ""):
        return ""
    if not isinstance(value, str):
        raise OtlpDecodeError(f"{where}: expected a hex string, got {type(value).__name__}")
    if len(value) == 2 * nbytes:
        try:
            bytes.fromhex(value)
            return value.lower()
        except ValueError:
            pass
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) != nbytes:
        raise OtlpDecodeError(f"{where}: {value!r} is not a {nbytes}-byte id (hex or base64)")
    return raw.hex()


def _json_value(v: Any, where: str) -> Any:
    if not isinstance(v, dict):
        raise OtlpDecodeError(f"{where}: expected an AnyValue object like {{\"stringValue\": ...}}")
    if not v:
        return None
    (key, val), = list(v.items())[:1]
    if key in ("stringValue", "string_value", "boolValue", "bool_value"):
        return val
    if key in ("intValue", "int_value"):
        return int(val)
    if key in ("doubleValue", "double_value"):
        return float(val)
    if key in ("bytesValue", "bytes_value"):
        return base64.b64decode(val)
    if key in ("arrayValue", "array_value"):
        return [_json_value(x, where) for x in (val or {}).get("values", [])]
    if key in ("kvlistValue", "kvlist_value"):
        return _json_attrs((val or {}).get("values", []), where)
    raise OtlpDecodeError(f"{where}: unknown AnyValue field {key!r}")


def _json_attrs(kvs: Any, where: str) -> dict[str, Any]:
    if not isinstance(kvs, list):
        raise OtlpDecodeError(f"{where}.attributes: expected a list of {{key, value}}")
    out: dict[str, Any] = {}
    for i, kv in enumerate(kvs):
        if not isinstance(kv, dict) or "key" not in kv:
            raise OtlpDecodeError(f"{where}.attributes[{i}]: expected {{\"key\": ..., \"value\": {{...}}}}")
        out[_intern(kv["key"])] = _json_value(kv.get("value") or {}, f"{where}.attributes[{i}]")
    return out


def _enum(v: Any, names: dict[str, int]) -> int:
    if isinstance(v, str):
        return names.get(v, 0)
    return int(v or 0)


def decode_json(doc: Any) -> list[SpanRecord]:
    """Spans of one OTLP JSON ExportTraceServiceRequest object (``{"resourceSpans": [...]}``)."""
    if not isinstance(doc, dict):
        raise OtlpDecodeError("OTLP JSON: expected an object with \"resourceSpans\"")
    rss = _get(doc, "resourceSpans", "resource_spans", [])
    if not isinstance(rss, list):
        raise OtlpDecodeError("resourceSpans: expected a list")
    out: list[SpanRecord] = []
    for ri, rs in enumerate(rss):
        w = f"resourceSpans[{ri}]"
        if not isinstance(rs, dict):
            raise OtlpDecodeError(f"{w}: expected an object")
        res_attrs = _json_attrs((rs.get("resource") or {}).get("attributes", []), f"{w}.resource")
        service = str(res_attrs.get("service.name", ""))
        for si, ss in enumerate(_get(rs, "scopeSpans", "scope_spans", []) or _get(rs, "instrumentationLibrarySpans", "instrumentation_library_spans", [])):
            for k, sp in enumerate(ss.get("spans", []) if isinstance(ss, dict) else []):
                ws = f"{w}.scopeSpans[{si}].spans[{k}]"
                if not isinstance(sp, dict):
                    raise OtlpDecodeError(f"{ws}: expected an object")
                tid = json_id(_get(sp, "traceId", "trace_id"), 16, f"{ws}.traceId")
                sid = json_id(_get(sp, "spanId", "span_id"), 8, f"{ws}.spanId")
                if not tid or not sid:
                    raise OtlpDecodeError(f"{ws}: traceId and spanId are required")
                try:
                    start = int(_get(sp, "startTimeUnixNano", "start_time_unix_nano", 0))
                    end = int(_get(sp, "endTimeUnixNano", "end_time_unix_nano", 0))
                except (TypeError, ValueError):
                    raise OtlpDecodeError(f"{ws}: startTimeUnixNano/endTimeUnixNano must be integers") from None
                attrs = dict(res_attrs)
                attrs.update(_json_attrs(sp.get("attributes", []), ws))
                events = []
                for j, ev in enumerate(sp.get("events", []) or []):
                    we = f"{ws}.events[{j}]"
                    try:
                        t = int(_get(ev, "timeUnixNano", "time_unix_nano", 0))
                    except (TypeError, ValueError):
                        raise OtlpDecodeError(f"{we}.timeUnixNano: must be an integer") from None
                    ea = _json_attrs(ev.get("attributes", []), we) if ev.get("attributes") else None
                    events.append((_intern(str(ev.get("name", ""))), t, ea))
                status = sp.get("status") or {}
                out.append(
                    SpanRecord(
                        tid, sid, json_id(_get(sp, "parentSpanId", "parent_span_id"), 8, f"{ws}.parentSpanId"),
                        str(sp.get("name", "")), start, end, attrs, events, _enum(sp.get("kind", 0), _KIND_NAMES),
                        _enum(status.get("code", 0), _STATUS_NAMES), service,
                    )
                )
    return out
