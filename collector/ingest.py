"""Offline inputs for ``deltatap report --from FILE...``, one small reader per format (a registry).

* ``otlp-json`` - OTLP JSON: the OpenTelemetry Collector's file exporter (one ExportTraceServiceRequest
  per line; ids hex) and deltatap's own ``--otlp file:PATH`` (the same, ids base64); a single
  pretty-printed document works too.
* ``jaeger`` - Jaeger's trace JSON (``{"data": [{"traceID", "spans", "processes"}]}``, the UI's
  download and ``/api/traces``): times are microseconds, so points carry 1 us resolution.
* ``aiperf`` - AIPerf's ``profile_export.jsonl``: each record becomes a client span (t0 =
  ``request_start_ns``, t12 = t0 + ``time_to_first_token``, last token = ``request_end_ns``) carrying
  ``x_request_id`` as its correlation id, so it joins the taps' spans of the same request; token
  counts are AIPerf's tokenizer counts.
* ``rows`` - a rows file written by the collector (.parquet, .csv, .jsonl).
* ``sketches`` - ``sketches.json`` of another collector or run: merged into the aggregate.

Each reader is detected from the file's first record; a file no reader recognises is a clear error.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deltatap.collector.rows import Row
from deltatap.collector.sinks import ROW_FORMATS, read_rows
from deltatap.collector.sketches import SKETCH_FORMAT, Aggregator
from deltatap.collector.spans import OtlpDecodeError, SpanRecord, decode_json
from deltatap.core.config import ConfigError
from deltatap.core.vocab import Attr, ClientEvent, Observer, Outcome

AIPERF_SERVICE = "aiperf"


@dataclass
class Loaded:
    spans: list[SpanRecord]
    rows: list[Row]
    aggregates: list[Aggregator]


# --------------------------------------------------------------------------------------------
# reading JSON documents
# --------------------------------------------------------------------------------------------


def _documents(path: Path) -> Iterator[tuple[int, Any]]:
    text = path.read_text(encoding="utf-8")
    stripped = text.strip()
    if not stripped:
        return
    try:
        yield 0, json.loads(stripped)
        return
    except json.JSONDecodeError:
        pass
    for i, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                yield i, json.loads(line)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{path}:{i}: not JSON ({exc.msg})") from None


def _first(path: Path) -> Any:
    for _, doc in _documents(path):
        return doc
    raise ConfigError(f"{path}: empty file")


# --------------------------------------------------------------------------------------------
# OTLP JSON
# --------------------------------------------------------------------------------------------


def _is_otlp(doc: Any) -> bool:
    return isinstance(doc, dict) and ("resourceSpans" in doc or "resource_spans" in doc)


def read_otlp_json(path: Path, out: Loaded) -> None:
    for i, doc in _documents(path):
        try:
            out.spans.extend(decode_json(doc))
        except OtlpDecodeError as exc:
            raise ConfigError(f"{path}{':' + str(i) if i else ''}: {exc}") from None


# --------------------------------------------------------------------------------------------
# Jaeger JSON
# --------------------------------------------------------------------------------------------


def _is_jaeger(doc: Any) -> bool:
    return isinstance(doc, dict) and isinstance(doc.get("data"), list) and all(isinstance(t, dict) and "spans" in t for t in doc["data"][:1])


def _jaeger_tags(tags: Any) -> dict[str, Any]:
    out = {}
    for t in tags or []:
        v, typ = t.get("value"), t.get("type", "string")
        if typ == "int64":
            v = int(v)
        elif typ == "float64":
            v = float(v)
        elif typ == "bool":
            v = v in (True, "true")
        out[str(t.get("key"))] = v
    return out


_JAEGER_KIND = {"internal": 1, "server": 2, "client": 3, "producer": 4, "consumer": 5}


def _jaeger_id(v: Any, n: int) -> str:
    s = str(v or "").lower()
    return s.rjust(2 * n, "0") if s else ""


def read_jaeger(path: Path, out: Loaded) -> None:
    for _, doc in _documents(path):
        for ti, trace in enumerate(doc.get("data", [])):
            procs = {k: _jaeger_tags(p.get("tags")) | {"service.name": p.get("serviceName", "")} for k, p in (trace.get("processes") or {}).items()}
            for si, sp in enumerate(trace.get("spans", [])):
                where = f"{path}: data[{ti}].spans[{si}]"
                try:
                    start = int(sp["startTime"]) * 1000
                    end = start + int(sp.get("duration", 0)) * 1000
                    tid = _jaeger_id(sp["traceID"], 16)
                    sid = _jaeger_id(sp["spanID"], 8)
                except (KeyError, TypeError, ValueError) as exc:
                    raise ConfigError(f"{where}: missing or bad traceID/spanID/startTime ({exc})") from None
                parent = next((_jaeger_id(r.get("spanID"), 8) for r in sp.get("references") or [] if r.get("refType") == "CHILD_OF"), "")
                res = procs.get(sp.get("processID"), {})
                attrs = dict(res)
                attrs.update(_jaeger_tags(sp.get("tags")))
                events = []
                for log in sp.get("logs") or []:
                    fields = _jaeger_tags(log.get("fields"))
                    name = str(fields.pop("event", fields.pop("message", "")))
                    events.append((name, int(log["timestamp"]) * 1000, fields or None))
                kind = _JAEGER_KIND.get(str(attrs.get("span.kind", "")).lower(), 0)
                status = 2 if attrs.get("error") in (True, "true") or attrs.get("otel.status_code") == "ERROR" else 0
                out.spans.append(SpanRecord(tid, sid, parent, str(sp.get("operationName", "")), start, end, attrs, events, kind, status, str(res.get("service.name", ""))))


# --------------------------------------------------------------------------------------------
# AIPerf profile_export.jsonl
# --------------------------------------------------------------------------------------------


def _is_aiperf(doc: Any) -> bool:
    return isinstance(doc, dict) and isinstance(doc.get("metadata"), dict) and "request_start_ns" in doc["metadata"]


def _metric(metrics: dict, name: str) -> Any:
    m = metrics.get(name)
    return m.get("value") if isinstance(m, dict) else None


_UNIT_NS = {"ns": 1, "us": 1_000, "ms": 1_000_000, "s": 1_000_000_000, "sec": 1_000_000_000}


def _duration_ns(metrics: dict, name: str) -> int | None:
    m = metrics.get(name)
    if not isinstance(m, dict) or m.get("value") is None:
        return None
    return round(float(m["value"]) * _UNIT_NS.get(str(m.get("unit", "ms")), 1_000_000))


def aiperf_span(rec: dict, where: str) -> SpanRecord | None:
    md = rec["metadata"]
    rid = md.get("x_request_id")
    if not rid:
        return None
    if md.get("benchmark_phase", md.get("credit_phase", "profiling")) not in ("profiling", None):
        return None
    try:
        t0 = int(md["request_start_ns"])
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: metadata.request_start_ns is not an integer") from None
    metrics = rec.get("metrics") or {}
    err = rec.get("error")
    events: list[tuple[str, int, dict | None]] = [(ClientEvent.SEND.value, t0, None)]
    ttft = _duration_ns(metrics, "time_to_first_token")
    if ttft is not None:
        events.append((ClientEvent.FIRST_TOKEN.value, t0 + ttft, None))
    end = md.get("request_end_ns")
    if end is not None and err is None:
        events.append((ClientEvent.LAST_TOKEN.value, int(end), None))
    if md.get("was_cancelled") and md.get("cancellation_time_ns"):
        events.append((ClientEvent.CANCEL.value, int(md["cancellation_time_ns"]), None))
    elif err is not None and end is not None:
        events.append((ClientEvent.ERROR.value, int(end), None))
    if end is not None:
        events.append((ClientEvent.END.value, int(end), None))
    attrs: dict[str, Any] = {Attr.OBSERVER: Observer.CLIENT.value, Attr.REQUEST_ID: str(rid), "service.name": AIPERF_SERVICE}
    if err is not None:
        code = err.get("code") if isinstance(err, dict) else None
        attrs[Attr.OUTCOME] = Outcome.CLIENT_CANCEL.value if md.get("was_cancelled") else Outcome.HTTP_ERROR.value
        if isinstance(code, int):
            attrs[Attr.HTTP_STATUS] = code
    else:
        attrs[Attr.OUTCOME] = Outcome.OK.value
        attrs[Attr.HTTP_STATUS] = 200
    isl, osl = _metric(metrics, "input_sequence_length"), _metric(metrics, "output_sequence_length")
    if isl is not None:
        attrs[Attr.GENAI_INPUT_TOKENS] = int(isl)
    if osl is not None:
        attrs[Attr.GENAI_OUTPUT_TOKENS] = int(osl)
    tid = hashlib.sha256(f"aiperf:{rid}".encode()).hexdigest()[:32]
    return SpanRecord(tid, tid[:16], "", "aiperf.request", t0, int(end) if end is not None else t0, attrs, events, 3, 0, AIPERF_SERVICE)


def read_aiperf(path: Path, out: Loaded) -> None:
    for i, doc in _documents(path):
        if not _is_aiperf(doc):
            raise ConfigError(f"{path}:{i}: not an AIPerf profile_export record (no metadata.request_start_ns)")
        sp = aiperf_span(doc, f"{path}:{i}")
        if sp is not None:
            out.spans.append(sp)


# --------------------------------------------------------------------------------------------
# rows and sketches
# --------------------------------------------------------------------------------------------


def _is_rows_record(doc: Any) -> bool:
    return isinstance(doc, dict) and "schema_version" in doc and "trace_id" in doc


def read_rows_file(path: Path, out: Loaded) -> None:
    out.rows.extend(read_rows(path))


def _is_sketches(doc: Any) -> bool:
    return isinstance(doc, dict) and doc.get("format") == SKETCH_FORMAT


def read_sketches(path: Path, out: Loaded) -> None:
    try:
        out.aggregates.append(Aggregator.from_dict(_first(path)))
    except (KeyError, ValueError, TypeError) as exc:
        raise ConfigError(f"{path}: bad sketch file ({exc})") from None


# --------------------------------------------------------------------------------------------
# registry
# --------------------------------------------------------------------------------------------

Reader = Callable[[Path, Loaded], None]
FORMATS: dict[str, tuple[Callable[[Any], bool], Reader]] = {
    "otlp-json": (_is_otlp, read_otlp_json),
    "jaeger": (_is_jaeger, read_jaeger),
    "aiperf": (_is_aiperf, read_aiperf),
    "rows": (_is_rows_record, read_rows_file),
    "sketches": (_is_sketches, read_sketches),
}


def detect(path: Path) -> str:
    if path.suffix.lower() in (".parquet", ".csv"):
        return "rows"
    doc = _first(path)
    for name, (match, _) in FORMATS.items():
        if match(doc):
            return name
    raise ConfigError(
        f"{path}: unrecognised input; expected OTLP JSON (resourceSpans), Jaeger JSON (data[].spans), "
        "AIPerf profile_export.jsonl, a deltatap rows file or sketches.json"
    )


def load(paths: list[str | Path]) -> Loaded:
    out = Loaded([], [], [])
    for p in map(Path, paths):
        if not p.exists():
            raise ConfigError(f"--from {p}: file not found")
        if p.is_dir():
            raise ConfigError(f"--from {p}: is a directory; name the files (e.g. {p}/rows.parquet or {p}/sketches.json)")
        fmt = detect(p)
        if fmt == "rows" and p.suffix.lower() not in ROW_FORMATS:
            raise ConfigError(f"{p}: a rows file must end in .parquet, .csv or .jsonl")
        FORMATS[fmt][1](p, out)
    return out
