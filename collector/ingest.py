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
* ``guidellm`` - GuideLLM's benchmarks JSON (``--output kind=json``): each request becomes a client-side record
  (send = ``request_start``, first / last token = ``first_token_iteration`` / ``last_token_iteration``, end =
  ``request_end``; GuideLLM's token counts). GuideLLM sends no correlation header, so each is matched by send
  time to the request the taps and components saw (:func:`match_by_time`), then joined like the load
  generator's records.
* ``rows`` - a rows file written by the collector (.parquet, .csv, .jsonl).
* ``sketches`` - ``sketches.json`` of another collector or run: merged into the aggregate.
* ``records`` - the load generator's ``records.jsonl`` (docs/records.md): each measured record becomes
  the client span the load generator would have exported (``client.send`` = T_submit, first and last
  token, end), so it joins the taps' spans of the same request on its trace id or ``x-request-id``; a
  ``run.json`` beside it supplies the clock offset measured with ``--clock-sync``. A record whose
  request is already in a rows file (or whose client span is among the spans) is not counted twice.

A directory is read as what it holds: a collector's output directory (a rows file, else
``sketches.json``; span files) or a load generator's (``records.jsonl``, ``run.json``);
:attr:`Loaded.found` says in one line per input what was used.

Each reader is detected from the file's first record; a file no reader recognises, or one that cannot
be read at all (binary, a ``.parquet`` that is not Parquet), is one clear ConfigError naming the file
and what was expected.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deltatap.collector.deltas import RESIDUAL, SYSTEM_TTFT, TAP
from deltatap.collector.rows import DeltaValue, PointObs, Row, TokenSource, delta_defs
from deltatap.collector.sinks import ROW_FORMATS, read_rows
from deltatap.collector.sketches import SKETCH_FORMAT, Aggregator
from deltatap.collector.spans import OtlpDecodeError, SpanRecord, decode_json
from deltatap.core.config import ConfigError, read_yaml, validate
from deltatap.core.topology import Topology, default_topology
from deltatap.core.vocab import SPAN_CLIENT, Attr, ClientEvent, Observer, Outcome, Role, point
from deltatap.loadgen.records import RECORD_VERSION

AIPERF_SERVICE = "aiperf"


@dataclass
class Loaded:
    spans: list[SpanRecord]
    rows: list[Row]
    aggregates: list[Aggregator]
    records: list[tuple[dict[str, Any], int, int]] = field(default_factory=list)  # (record, clock offset ns, uncertainty ns)
    found: list[str] = field(default_factory=list)  # one line per --from input: what it was and what was used


# --------------------------------------------------------------------------------------------
# reading JSON documents
# --------------------------------------------------------------------------------------------


EXPECTED = (
    "OTLP JSON (resourceSpans), Jaeger JSON (data[].spans), AIPerf profile_export.jsonl, the load generator's "
    "records.jsonl, a deltatap rows file (.parquet, .csv, .jsonl) or sketches.json"
)


def read_text(path: Path, expected: str = EXPECTED) -> str:
    """A file's text; a file that is not UTF-8 text is one ConfigError naming it and what was expected."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not a text file (byte {exc.start} is not UTF-8); expected {expected}") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror or exc})") from None


def read_json_object(path: Path, expected: str) -> dict[str, Any]:
    """A file holding one JSON object (``run.json``, ``summary.json``); anything else is one ConfigError naming
    the file and ``expected``."""
    try:
        doc = json.loads(read_text(path, expected))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON ({exc.msg}); expected {expected}") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: expected a JSON object, {expected}, got {type(doc).__name__}")
    return doc


def _documents(path: Path) -> Iterator[tuple[int, Any]]:
    text = read_text(path)
    if "\x00" in text:
        raise ConfigError(f"{path}: binary data, not a text file; expected {EXPECTED}")
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
# GuideLLM benchmarks JSON
# --------------------------------------------------------------------------------------------

GUIDELLM_SERVICE = "guidellm"
GUIDELLM_STATUS = {"successful": Outcome.OK.value, "errored": Outcome.HTTP_ERROR.value, "incomplete": Outcome.CLIENT_CANCEL.value}


def _is_guidellm(doc: Any) -> bool:
    if not isinstance(doc, dict) or not isinstance(doc.get("benchmarks"), list):
        return False
    md = doc.get("metadata")
    return (isinstance(md, dict) and "guidellm_version" in md) or any(
        isinstance(b, dict) and isinstance(b.get("requests"), dict) and "successful" in b["requests"] for b in doc["benchmarks"])


def _s_to_ns(v: Any) -> int | None:
    return None if v is None else int(round(float(v) * 1e9))


def guidellm_records(doc: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """Each request of a GuideLLM benchmarks JSON (``--output kind=json``: ``benchmarks[].requests.successful / errored
    / incomplete``, GenerativeRequestStats with ``info.timings`` in Unix seconds) as a client-side record in the load
    generator's record format (docs/records.md): send = ``request_start``, first token = ``first_token_iteration``,
    last token = ``last_token_iteration``, end = ``request_end``; token counts are GuideLLM's. GuideLLM sends no
    correlation header, so ``request_id`` is left empty for :func:`match_by_time`."""
    out = []
    for bi, bench in enumerate(doc.get("benchmarks") or []):
        reqs = bench.get("requests") if isinstance(bench, dict) else None
        if not isinstance(reqs, dict):
            raise ConfigError(f"{where}: benchmarks[{bi}] has no requests object (not a GuideLLM benchmarks JSON?)")
        strategy = ((bench.get("config") or {}).get("strategy") or {}).get("type_") if isinstance(bench.get("config"), dict) else None
        for key, status in GUIDELLM_STATUS.items():
            for ri, req in enumerate(reqs.get(key) or []):
                info = req.get("info") if isinstance(req, dict) else None
                t = info.get("timings") if isinstance(info, dict) else None
                if not isinstance(t, dict):
                    raise ConfigError(f"{where}: benchmarks[{bi}].requests.{key}[{ri}] has no info.timings")
                try:
                    start = _s_to_ns(t.get("request_start") if t.get("request_start") is not None else t.get("resolve_start"))
                    first, last = _s_to_ns(t.get("first_token_iteration")), _s_to_ns(t.get("last_token_iteration"))
                    end = _s_to_ns(t.get("request_end") if t.get("request_end") is not None else t.get("resolve_end"))
                except (TypeError, ValueError):
                    raise ConfigError(f"{where}: benchmarks[{bi}].requests.{key}[{ri}].info.timings: a time is not a number") from None
                if start is None:
                    continue
                rid = str(req.get("request_id") or info.get("request_id") or f"{bi}-{key}-{ri}")
                rec: dict[str, Any] = {
                    "request_id": "", "source_request_id": rid, "trace_id": hashlib.sha256(f"guidellm:{rid}".encode()).hexdigest()[:32],
                    "send_unix_ns": start, "request_written_unix_ns": start, "end_unix_ns": end, "status": status, "phase": "measure",
                    "service": GUIDELLM_SERVICE, "labels": {"guidellm_benchmark": str(bi)} | ({"guidellm_strategy": str(strategy)} if strategy else {}),
                }
                if status == Outcome.OK.value:
                    rec.update(first_token_unix_ns=first, last_token_unix_ns=last, http_status=200)
                elif info.get("error"):
                    rec["error_kind"] = str(info["error"])[:200]
                it, ot = (req.get("input_metrics") or {}).get("text_tokens"), (req.get("output_metrics") or {}).get("text_tokens")
                if it is not None:
                    rec["input_tokens"] = rec["usage_input_tokens"] = int(it)
                if ot is not None:
                    rec["output_tokens"] = rec["usage_output_tokens"] = int(ot)
                out.append(rec)
    return out


def read_guidellm(path: Path, out: Loaded) -> None:
    doc = _first(path)
    if not _is_guidellm(doc):
        raise ConfigError(f"{path}: not a GuideLLM benchmarks JSON (no benchmarks[].requests)")
    out.records.extend((rec, 0, 0) for rec in guidellm_records(doc, str(path)))


MATCH_TOLERANCE_NS = 1_000_000  # an entry stamp may precede the client's by this much (clock granularity)
MATCH_WINDOW_NS = 250_000_000  # and follow it by at most this much


def _entry_times(out: Loaded, claimed: set[str]) -> list[tuple[int, str]]:
    """(when the request first reached the system, its request id) of every request in the rows and the non-client
    spans that no client record or span claims yet."""
    first: dict[str, int] = {}
    for r in out.rows:
        rid = r.request_id
        if rid and rid not in claimed:
            ts = [p.unix_ns for p in r.points.values() if p.source != "client"]
            if ts:
                first[rid] = min(ts)
    for sp in out.spans:
        rid = sp.attrs.get(Attr.REQUEST_ID)
        if rid and rid not in claimed and sp.attrs.get(Attr.OBSERVER) != Observer.CLIENT.value:
            t = min([sp.start_unix_ns, *(e[1] for e in sp.events)])
            first[rid] = min(first.get(rid, t), t)
    return sorted((t, rid) for rid, t in first.items())


def match_by_time(out: Loaded) -> tuple[int, int]:
    """Give each client record without a request id (GuideLLM's) the request it sent: in send order, the first
    request not yet claimed that reached the system (a tap or the first component) no earlier than
    :data:`MATCH_TOLERANCE_NS` before the send and no later than :data:`MATCH_WINDOW_NS` after it. Clocks must be
    one (same host) or synchronised. Returns (matched, unmatched)."""
    pending = sorted((rec for rec, _, _ in out.records if not rec.get("request_id")), key=lambda r: r["send_unix_ns"])
    if not pending:
        return 0, 0
    claimed = {str(rec.get("request_id")) for rec, _, _ in out.records if rec.get("request_id")}
    claimed |= {str(s.attrs.get(Attr.REQUEST_ID)) for s in out.spans if s.attrs.get(Attr.OBSERVER) == Observer.CLIENT.value and s.attrs.get(Attr.REQUEST_ID)}
    entries = _entry_times(out, claimed)
    j = matched = 0
    for rec in pending:
        t0 = rec["send_unix_ns"]
        while j < len(entries) and entries[j][0] < t0 - MATCH_TOLERANCE_NS:
            j += 1
        if j < len(entries) and entries[j][0] <= t0 + MATCH_WINDOW_NS:
            rec["request_id"] = entries[j][1]
            matched += 1
            j += 1
    return matched, len(pending) - matched


# --------------------------------------------------------------------------------------------
# the load generator's records.jsonl
# --------------------------------------------------------------------------------------------

LOADGEN_SERVICE = "deltatap-loadgen"


def _is_records(doc: Any) -> bool:
    return isinstance(doc, dict) and "request_id" in doc and "trace_id" in doc and "send_unix_ns" in doc and "chunk_unix_ns" in doc


def _clock_of(run_json: Path) -> tuple[int, int]:
    """(offset ns, uncertainty ns) the load generator measured with --clock-sync, from its run.json; (0, 0) without."""
    if not run_json.is_file():
        return 0, 0
    sync = (read_json_object(run_json, "the load generator's run.json").get("clock") or {}).get("sync") or {}
    return int(sync.get("offset_ns") or 0), int(sync.get("uncertainty_ns") or 0)


# the integer fields of a record that the reports read (docs/records.md: times are integers of Unix ns, or null)
_RECORD_INTS = ("http_status", "usage_input_tokens", "usage_output_tokens")


def check_record(doc: Any, where: str) -> None:
    """One record of records.jsonl as docs/records.md defines it: a format version this deltatap reads, and
    integers (or null) where the reports compute with them. Raises one ConfigError naming ``where`` (FILE:LINE)."""
    if not _is_records(doc):
        raise ConfigError(f"{where}: not a load-generator record (no request_id, trace_id, send_unix_ns, chunk_unix_ns; docs/records.md)")
    v = doc.get("v", RECORD_VERSION)
    if v != RECORD_VERSION:
        raise ConfigError(f"{where}: records format v{v!r}; this deltatap reads v{RECORD_VERSION} (docs/records.md)")
    for k, val in doc.items():
        if not (k.endswith("_unix_ns") or k in _RECORD_INTS) or val is None:
            continue
        vals = val if k == "chunk_unix_ns" and isinstance(val, list) else [val]
        if k == "chunk_unix_ns" and not isinstance(val, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in vals):
            shown = repr(val) if len(repr(val)) <= 40 else repr(val)[:37] + "..."
            raise ConfigError(f"{where}: {k}: expected {'a list of integers' if k == 'chunk_unix_ns' else 'an integer or null'}, got {shown} (docs/records.md)")
    if not isinstance(doc.get("status", ""), str):
        raise ConfigError(f"{where}: status: expected a string, got {doc['status']!r} (docs/records.md)")


def read_records(path: Path, out: Loaded) -> None:
    offset, unc = _clock_of(path.parent / "run.json")
    for i, doc in _documents(path):
        check_record(doc, f"{path}:{i}" if i else str(path))  # i == 0: the whole file is one document
        if doc.get("phase", "measure") == "measure":
            out.records.append((doc, offset, unc))


def record_span(rec: dict[str, Any], offset_ns: int = 0, uncertainty_ns: int = 0) -> SpanRecord | None:
    """The client span the load generator exports for this record (loadgen/runner.py), rebuilt from the record."""
    t0 = rec.get("request_written_unix_ns") or rec.get("send_unix_ns")
    if t0 is None or not rec.get("trace_id"):
        return None
    status = str(rec.get("status") or Outcome.OK.value)
    end = rec.get("end_unix_ns")
    events: list[tuple[str, int, dict | None]] = [(ClientEvent.SEND.value, int(t0), None)]
    for name, key in ((ClientEvent.FIRST_TOKEN, "first_token_unix_ns"), (ClientEvent.LAST_TOKEN, "last_token_unix_ns")):
        if rec.get(key) is not None:
            events.append((name.value, int(rec[key]), None))
    if end is not None:
        if status == Outcome.CLIENT_CANCEL:
            events.append((ClientEvent.CANCEL.value, int(end), None))
        elif status != Outcome.OK:
            events.append((ClientEvent.ERROR.value, int(end), {Attr.ERROR_CAUSE: rec.get("error_kind") or ""}))
        events.append((ClientEvent.END.value, int(end), None))
    service = str(rec.get("service") or LOADGEN_SERVICE)  # GuideLLM's records name their own
    attrs: dict[str, Any] = {Attr.OBSERVER: Observer.CLIENT.value, Attr.REQUEST_ID: str(rec.get("request_id") or ""),
                             Attr.OUTCOME: status, "service.name": service}
    if rec.get("http_status") is not None:
        attrs[Attr.HTTP_STATUS] = int(rec["http_status"])
    if rec.get("usage_input_tokens") is not None:
        attrs[Attr.GENAI_INPUT_TOKENS] = int(rec["usage_input_tokens"])
    if rec.get("usage_output_tokens") is not None:
        attrs[Attr.GENAI_OUTPUT_TOKENS] = int(rec["usage_output_tokens"])
    if rec.get("error_kind"):
        attrs[Attr.ERROR_CAUSE] = rec["error_kind"]
    for k, v in (rec.get("labels") or {}).items():
        attrs[Attr.LABEL_PREFIX + str(k)] = v
    attrs[Attr.LABEL_PREFIX + "phase"] = rec.get("phase", "measure")
    if offset_ns or uncertainty_ns:
        attrs[Attr.CLOCK_OFFSET_NS] = offset_ns
        attrs[Attr.CLOCK_UNCERTAINTY_NS] = uncertainty_ns
    start = int(rec.get("planned_send_unix_ns") or t0)
    sid = str(rec.get("span_id") or hashlib.sha256(f"record:{rec.get('trace_id')}".encode()).hexdigest()[:16])
    return SpanRecord(str(rec["trace_id"]), sid, "", SPAN_CLIENT, start, int(end) if end is not None else start, attrs, events, 3, 0, service)


def _join_into_row(row: Row, rec: dict[str, Any], topo: Topology, offset_ns: int, unc_ns: int) -> None:
    """Put the client's own points of ``rec`` into a row that has only a tap's approximation of them, or none
    (the load generator exported no spans), and recompute the point deltas and the residual they enter."""
    c = topo.client.name
    observer = "client:loadgen"
    mine = set()
    for role, key in ((Role.SEND, "request_written_unix_ns"), (Role.FIRST_TOKEN_RECEIVED, "first_token_unix_ns"),
                      (Role.LAST_TOKEN_RECEIVED, "last_token_unix_ns"), (Role.END, "end_unix_ns")):
        v = rec.get(key) if key != "request_written_unix_ns" else rec.get(key) or rec.get("send_unix_ns")
        if v is not None:
            row.points[point(c, role)] = PointObs(int(v) - offset_ns, unc_ns, observer, "client")  # the client's own stamp beats a tap's
            mine.add(point(c, role))
    defs = delta_defs(topo)
    for d in defs:
        if d.end and (d.end in mine or d.start in mine) and d.end in row.points and d.start in row.points:
            e, s = row.points[d.end], row.points[d.start]
            same = e.observer == s.observer
            row.deltas[d.name] = DeltaValue(e.unix_ns - s.unix_ns, 0 if same else e.uncertainty_ns + s.uncertainty_ns, same)
    total = row.deltas.get(SYSTEM_TTFT)
    if total is not None:
        row.deltas.pop(RESIDUAL, None)
        terms = [row.deltas.get(d.name) for d in defs if d.contributes and d.phase != TAP]
        terms += [row.deltas[d.name] for d in defs if d.phase == TAP and d.name in row.deltas]
        if all(t is not None for t in terms):
            row.deltas[RESIDUAL] = DeltaValue(total.ns - sum(t.ns for t in terms), total.error_bound_ns + sum(t.error_bound_ns for t in terms), False)
    if row.tokens_out is None and rec.get("output_tokens") is not None:
        row.tokens_out, row.tokens_source = int(rec["output_tokens"]), TokenSource.TOKENIZER
    if row.tokens_in is None and rec.get("input_tokens") is not None:
        row.tokens_in = int(rec["input_tokens"])
    for k, v in (rec.get("labels") or {}).items():
        row.labels.setdefault(str(k), v)


def _join_records(out: Loaded, topo: Topology) -> tuple[int, int, int]:
    """Join each record: into its request's row when the row lacks the client's own points, else (no row) as a
    client span for the pipeline; a record already in a row or among the spans is not counted twice.
    Returns (joined into rows, joined as client spans, already present)."""
    by_id: dict[str, Row] = {}
    for r in out.rows:
        for key in (r.request_id, r.trace_id, *r.trace_ids):
            if key:
                by_id.setdefault(key, r)
    spans = {(s.trace_id, s.span_id) for s in out.spans}
    send = point(topo.client.name, Role.SEND)
    into_rows = as_spans = dup = 0
    for rec, offset, unc in out.records:
        row = by_id.get(rec.get("request_id") or "") or by_id.get(rec.get("trace_id") or "")
        if row is not None:
            if send in row.points and row.points[send].source not in ("", "tap"):  # the client's own stamps are in already
                dup += 1
            else:
                _join_into_row(row, rec, topo, offset, unc)
                into_rows += 1
            continue
        if (rec.get("trace_id"), rec.get("span_id")) in spans:
            dup += 1
            continue
        sp = record_span(rec, offset, unc)
        if sp is not None:
            out.spans.append(sp)
            as_spans += 1
    return into_rows, as_spans, dup


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
    except (KeyError, ValueError, TypeError, AttributeError) as exc:
        raise ConfigError(f"{path}: bad sketch file ({exc})") from None


# --------------------------------------------------------------------------------------------
# registry
# --------------------------------------------------------------------------------------------

Reader = Callable[[Path, Loaded], None]
FORMATS: dict[str, tuple[Callable[[Any], bool], Reader]] = {
    "otlp-json": (_is_otlp, read_otlp_json),
    "jaeger": (_is_jaeger, read_jaeger),
    "aiperf": (_is_aiperf, read_aiperf),
    "guidellm": (_is_guidellm, read_guidellm),
    "records": (_is_records, read_records),
    "rows": (_is_rows_record, read_rows_file),
    "sketches": (_is_sketches, read_sketches),
}
WHAT = {"otlp-json": "OTLP JSON spans", "jaeger": "Jaeger spans", "aiperf": "AIPerf records", "guidellm": "GuideLLM requests", "records": "load-generator records",
        "rows": "rows", "sketches": "sketches"}


def detect(path: Path) -> str:
    if path.suffix.lower() in (".parquet", ".csv"):
        return "rows"
    doc = _first(path)
    for name, (match, _) in FORMATS.items():
        if match(doc):
            return name
    raise ConfigError(f"{path}: unrecognised input; expected {EXPECTED}")


# --------------------------------------------------------------------------------------------
# directories: a collector's or a load generator's output
# --------------------------------------------------------------------------------------------

# what the collector and the load generator write besides their inputs for a report (outputs of a report)
_DERIVED = {"summary.json", "stats.json", "decomposition.json", "report.json", "requests.jsonl", "warmup.jsonl", "run.json"}


def _load_dir(d: Path, out: Loaded) -> str:
    """Read what a report needs from a collector's or a load generator's output directory; one line saying what."""
    used: list[str] = []
    skipped: list[str] = []
    rows_file = next((d / n for n in ("rows.parquet", "rows.jsonl", "rows.csv") if (d / n).is_file()), None)
    if rows_file is not None:
        before = len(out.rows)
        read_rows_file(rows_file, out)
        used.append(f"{rows_file.name} ({len(out.rows) - before} rows)")
    sketches = d / "sketches.json"
    if sketches.is_file():
        if rows_file is None:
            read_sketches(sketches, out)
            used.append(f"{sketches.name} ({out.aggregates[-1].rows} requests, aggregate only)")
        else:
            skipped.append(f"{sketches.name} (the same requests as {rows_file.name})")
    records = d / "records.jsonl"
    if records.is_file():
        before = len(out.records)
        read_records(records, out)
        used.append(f"records.jsonl ({len(out.records) - before} measured requests, as client-side records)")
    for f in sorted(d.iterdir()):
        if not f.is_file() or f.suffix.lower() not in (".json", ".jsonl") or f.name in _DERIVED or f in (rows_file, sketches, records):
            continue
        try:
            fmt = detect(f)
        except ConfigError:
            skipped.append(f"{f.name} (not an input)")
            continue
        if fmt in ("otlp-json", "jaeger", "aiperf"):
            if rows_file is not None:
                skipped.append(f"{f.name} ({WHAT[fmt]}: the rows file holds these requests already)")
                continue
            before = len(out.spans)
            FORMATS[fmt][1](f, out)
            used.append(f"{f.name} ({len(out.spans) - before} {WHAT[fmt]})")
        else:
            skipped.append(f"{f.name} ({WHAT[fmt]}, not used: {'a rows file' if rows_file else 'one per directory'} is)")
    if (d / "run.json").is_file():
        skipped.append("run.json (run metadata: `deltatap summary` shows it)")
    kind = "collector output" if rows_file is not None or sketches.is_file() else "load-generator output" if records.is_file() else None
    if kind is None or not used:
        raise ConfigError(
            f"--from {d}: neither a collector's output directory (rows.parquet / rows.jsonl / rows.csv, sketches.json, span files) "
            f"nor a load generator's (records.jsonl); name the input files instead"
        )
    if kind == "collector output" and records.is_file():
        kind = "collector and load-generator output"
    line = f"--from {d}: {kind}; using {', '.join(used)}"
    return line + (f"; not used: {', '.join(skipped)}" if skipped else "")


def load(paths: list[str | Path], topology: Topology | None = None) -> Loaded:
    out = Loaded([], [], [])
    for p in map(Path, paths):
        if not p.exists():
            raise ConfigError(f"--from {p}: file not found")
        if p.is_dir():
            out.found.append(_load_dir(p, out))
            continue
        fmt = detect(p)
        if fmt == "rows" and p.suffix.lower() not in ROW_FORMATS:
            raise ConfigError(f"{p}: a rows file must end in .parquet, .csv or .jsonl")
        before = len(out.records)
        FORMATS[fmt][1](p, out)
        if fmt == "records":
            out.found.append(f"--from {p}: load-generator records; using {len(out.records) - before} measured requests as client-side records")
        elif fmt == "guidellm":
            out.found.append(f"--from {p}: GuideLLM benchmarks JSON; using {len(out.records) - before} requests as client-side records")
    matched, unmatched = match_by_time(out)
    if matched or unmatched:
        out.found.append(f"GuideLLM requests matched by send time to the requests the taps and components saw: {matched}"
                         + (f"; {unmatched} with no request reaching the system within {MATCH_WINDOW_NS // 1_000_000} ms (kept as client-only rows)" if unmatched else ""))
    if out.records:
        into_rows, as_spans, dup = _join_records(out, topology or default_topology())
        parts = [f"{into_rows} joined into their rows (client points added)"] if into_rows else []
        parts += [f"{as_spans} as client spans"] if as_spans else []
        parts += [f"{dup} already in the rows or spans (not counted twice)"] if dup else []
        what = "load-generator records" if all(not rec.get("service") for rec, _, _ in out.records) else "client-side records"
        out.found.append(f"{what}: {', '.join(parts) or 'none usable'}")
    return out


# --------------------------------------------------------------------------------------------
# topologies for offline use
# --------------------------------------------------------------------------------------------

# Topologies for offline use (reports, the collector): tap addresses are optional.
#
# A topology file names where each tap listens (``tap.listen``) because ``deltatap tap`` and ``deltatap stack``
# must bind there. Reading recorded spans or rows never binds anything: the collector and every report
# only need the chain of components, which links are tapped, the correlation header and the timeouts.
# :func:`load_topology_offline` accepts a tapped link without ``listen`` (``tap: {}``, or ``tap:`` with only
# an upstream or a timeout) by filling in :data:`UNBOUND`, an address nothing ever listens on, and is
# otherwise exactly :func:`deltatap.core.topology.load_topology` (same validation, same messages).

UNBOUND = "0.0.0.0:0"  # stands for "no listen address given": an offline topology never binds it


def load_topology_offline(path: str | Path | None) -> Topology:
    """The topology in ``path`` (a whole file, or the ``topology:`` section of a larger one), taps' ``listen`` optional."""
    if path is None:
        return default_topology()
    data: Any = read_yaml(path)
    source = str(path)
    if isinstance(data, dict) and "topology" in data and "components" not in data:
        data, source = data["topology"], f"{path} [topology]"
    if isinstance(data, dict) and isinstance(data.get("links"), list):
        data = copy.deepcopy(data)
        for link in data["links"]:
            if isinstance(link, dict) and "tap" in link and (link["tap"] is None or isinstance(link["tap"], dict)):
                tap = link["tap"]
                if tap is None:
                    continue  # `tap:` with nothing: the link is not tapped, as before
                if tap.get("listen") is None:
                    tap["listen"] = UNBOUND
    return validate(Topology, data, source)
