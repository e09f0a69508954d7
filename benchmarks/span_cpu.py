"""CPU of a tap's per-request span work: the plain-record path against the SDK-object path it replaced, in one run.

Captures ``(span start, TapRecord)`` pairs from ``--requests`` real streamed exchanges through a tap running in this
process in front of the streaming mock upstream (benchmarks/tap_mock_upstream.py in its own process: a role event,
``--tokens`` content events ``--gap-ms`` apart, usage, [DONE]; every request carries a ``traceparent`` as a gateway
sends it, and a query string), then times the span work for every captured request with ``time.process_time``
(CPU, not wall time: the machine is shared), rounds alternating between the paths:

* ``begin`` — at request start: the incoming W3C context read and the span's ids drawn (``proxy.spans.begin``);
* ``loop`` — what ``Tap.finish`` does for the span on the event loop: the attributes
  (:func:`deltatap.proxy.record.attributes`) and the hand-off to the processor;
* ``export`` — what the export thread does: :func:`deltatap.telemetry.otlp_encode.encode_export_request` of the
  batches of ``--batch`` spans it takes from the queue.

Paths:

* ``records-c`` — this tree: a :class:`deltatap.telemetry.spans.SpanRecord` per request, encoded by the C
  accelerator ``deltatap.telemetry._otlpenc`` (when built);
* ``records-py`` — the same records, encoded by the Python reference (what ``DELTATAP_NATIVE=0`` runs);
* ``sdk-objects`` — the path before (issue 15): a ``ReadableSpan`` with ``Event`` and ``SpanContext`` objects per
  request (rebuilt here as ``proxy/spans.py`` built it, from the same W3C context), the query redacted per request
  (no cache), and the Python encoder's ``ReadableSpan`` path.

The three paths' OTLP bytes are checked equal before timing. The same three paths are then timed for the load
generator's client span (``client_span``: ``loadgen.runner.Runner._emit_span`` on records of streamed requests as the
runner fills them, against the ReadableSpan it built before, and the encoding).

    .venv/bin/python benchmarks/span_cpu.py [--requests 2000] [--rounds 7] [--tokens 8] [--batch 512]

Writes benchmarks/results/span_cpu.json.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tap_overhead import free_port, stop_all, wait_port  # noqa: E402

from opentelemetry import trace  # noqa: E402
from opentelemetry.sdk.trace import Event, ReadableSpan  # noqa: E402
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState  # noqa: E402
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator  # noqa: E402

from deltatap.core.clock import mono_ns, to_unix_ns  # noqa: E402
from deltatap.core.vocab import Outcome  # noqa: E402
from deltatap.net import aio  # noqa: E402
from deltatap.proxy import record as record_mod  # noqa: E402
from deltatap.proxy import server as server_mod  # noqa: E402
from deltatap.proxy.options import TapOptions  # noqa: E402
from deltatap.proxy.record import attributes, events  # noqa: E402
from deltatap.proxy.spans import begin, emit  # noqa: E402
from deltatap.telemetry import otlp_encode  # noqa: E402
from deltatap.telemetry.spans import SCOPE, new_trace_id, traceparent  # noqa: E402
from deltatap.telemetry.tracer import NullExporter, setup_telemetry  # noqa: E402

HERE = Path(__file__).resolve().parent
_W3C = TraceContextTextMapPropagator()


class _Keep:
    """A processor stand-in that keeps what it is handed (the timed code's hand-off, without the queue's lock)."""

    def __init__(self) -> None:
        self.spans: list = []
        self.on_end = self.spans.append


async def capture(n: int, tokens: int, gap_ms: float) -> tuple[list, object]:
    """``n`` exchanges through an in-process tap; the (tap, span start, record) of each as Tap.finish got them."""
    got: list = []
    finish = server_mod.Tap.finish

    def keep(self, span, rec):  # the benchmark's own hook on the real tap's hand-off
        got.append((self, span, rec))
        return finish(self, span, rec)

    server_mod.Tap.finish = keep
    up_port = free_port()
    up = subprocess.Popen([sys.executable, str(HERE / "tap_mock_upstream.py"), "--port", str(up_port)], stdout=subprocess.DEVNULL)
    tel = setup_telemetry("deltatap-tap", exporter=NullExporter())
    try:
        wait_port(up_port, up, "mock upstream")
        tap = await server_mod.start_tap(TapOptions(upstream=f"http://127.0.0.1:{up_port}", link="fw-engine", admin_port=None), tel)
        body = json.dumps({"model": "mock", "messages": [{"role": "user", "content": "hello"}], "max_tokens": tokens, "stream": True,
                           "stream_options": {"include_usage": True}}).encode()
        async with aiohttp.ClientSession() as s:
            for i in range(n):
                tp = f"00-{os.urandom(16).hex()}-{os.urandom(8).hex()}-01"
                async with s.post(f"{tap.url}/v1/chat/completions?first_ms=0&gap_ms={gap_ms}", data=body,
                                  headers={"Content-Type": "application/json", "traceparent": tp}) as r:
                    await r.read()
        await tap.close(grace_s=1)
    finally:
        server_mod.Tap.finish = finish
        stop_all([up])
    return got, tel


def _attrs(tap, rec) -> dict:
    o = tap.o
    return attributes(rec, link=o.link, downstream=o.downstream, downstream_kind=o.downstream_kind, upstream=o.upstream_name,
                      upstream_kind=o.upstream_kind, upstream_host=tap.upstream_host, upstream_port=tap.upstream_port,
                      correlation_header=o.correlation_header, clock=tap.clock, labels=o.labels, query_keep=o.query_keep,
                      fingerprint_key=tap.fp_key)


def sdk_begin(headers: dict, span_id: int) -> tuple[SpanContext, SpanContext | None, dict[str, str]]:
    """proxy/spans.py's begin before records: the incoming context through the W3C propagator, SpanContext objects."""
    parent = trace.get_current_span(_W3C.extract(headers)).get_span_context() if "traceparent" in headers else None
    if parent is not None and parent.is_valid:
        trace_id, flags, state = parent.trace_id, parent.trace_flags, parent.trace_state
    else:
        parent = None
        trace_id, flags, state = new_trace_id(), TraceFlags(TraceFlags.SAMPLED), TraceState()
    ctx = SpanContext(trace_id, span_id, is_remote=False, trace_flags=flags, trace_state=state)
    out = {"traceparent": traceparent(trace_id, span_id, flags)}
    if state:
        out["tracestate"] = state.to_header()
    return ctx, parent, out


def sdk_span(tel, name: str, ctx: SpanContext, parent: SpanContext | None, rec, attrs: dict) -> ReadableSpan:
    """proxy/spans.py's emit before records: a ReadableSpan with Event objects."""
    evs = events(rec)
    status = Status(StatusCode.UNSET)
    if rec.final_outcome() in (Outcome.UPSTREAM_ERROR, Outcome.TIMEOUT) or (rec.status or 0) >= 500:
        status = Status(StatusCode.ERROR, rec.failure.cause if rec.failure else f"HTTP {rec.status}")
    last = evs[-1][1] if evs else rec.received
    end = max(rec.end if rec.end is not None else last, last)
    return ReadableSpan(name=name, context=ctx, parent=parent, resource=tel.provider.resource, attributes=attrs,
                        events=tuple(Event(n, None, to_unix_ns(t)) for n, t in evs), kind=SpanKind.SERVER, status=status,
                        start_time=to_unix_ns(rec.received), end_time=to_unix_ns(end), instrumentation_scope=SCOPE)


def run_path(path: str, got: list, tel, batch: int) -> tuple[float, float, float, bytes]:
    """(begin CPU s, loop CPU s, export CPU s, the first batch's bytes) of one path over every captured request."""
    keep = _Keep()
    real = tel.processor
    tel.processor = keep
    sdk = path == "sdk-objects"
    gc.collect()  # every path starts from the same heap (the collector stays on: its cost is part of a path's)
    try:
        t0 = time.process_time()
        if sdk:
            begun = [sdk_begin(headers, start.span_id) for _tap, start, _rec, headers in got]
        else:
            for _tap, _start, _rec, headers in got:
                begin(headers)  # (fresh ids: timed only; the captured starts are emitted below)
        t1 = time.process_time()
        if sdk:
            for (tap, _start, rec, _headers), (ctx, parent, _out) in zip(got, begun):
                record_mod._redacted.clear()  # before: redact_query per request
                keep.on_end(sdk_span(tel, tap.span_name, ctx, parent, rec, _attrs(tap, rec)))
        else:
            for tap, start, rec, _headers in got:
                emit(tel, tap.span_name, start, rec, _attrs(tap, rec))
        t2 = time.process_time()
    finally:
        tel.processor = real
    spans = keep.spans
    fields = otlp_encode._span_fields
    otlp_encode._span_fields = otlp_encode._py_span_fields if path == "records-py" else fields
    gc.collect()
    try:
        t3 = time.process_time()
        first = b""
        for i in range(0, len(spans), batch):
            out = otlp_encode.encode_export_request(spans[i : i + batch])
            first = first or out
        t4 = time.process_time()
    finally:
        otlp_encode._span_fields = fields
    return t1 - t0, t2 - t1, t4 - t3, first


def client_records(n: int, tokens: int) -> list:
    """``n`` records of streamed requests as the load generator fills them (OK, ``tokens`` content events, usage)."""
    from deltatap.loadgen.records import RequestRecord

    t = mono_ns()
    out = []
    for i in range(n):
        b = t + i * 10_000_000
        out.append(RequestRecord(
            index=i, request_id=f"RUN-m{i}", trace_id=f"{i + 1:032x}", span_id=f"{i + 1:016x}", labels={"workload": "chat"}, max_tokens=tokens,
            planned_mono_ns=b, send_mono_ns=b + 1_000, written_mono_ns=b + 30_000, headers_mono_ns=b + 400_000,
            first_token_mono_ns=b + 2_000_000, last_token_mono_ns=b + 2_000_000 + tokens * 1_000_000, end_mono_ns=b + 2_100_000 + tokens * 1_000_000,
            stamp_bounds={"client.first_token": (0, 12_000)}, http_status=200, usage_input_tokens=128, usage_output_tokens=tokens,
            stream_format="openai-chat", transport_chunks=tokens + 3, sse_events=tokens + 3, content_events=tokens, finish_reason="stop",
        ))
    return out


def sdk_client_span(runner, trace_id: int, span_id: int, rec) -> ReadableSpan:
    """loadgen/runner.py's _emit_span before records (its attributes as now): SpanContext, Event and ReadableSpan objects."""
    from deltatap.core.vocab import SPAN_CLIENT, ClientEvent

    from deltatap.loadgen.runner import Runner

    attrs = Runner._span_attributes(runner, rec)  # the same attributes either way
    events = [(ClientEvent.SEND.value, to_unix_ns(rec.submit_mono_ns), None), (ClientEvent.FIRST_TOKEN.value, to_unix_ns(rec.first_token_mono_ns), None),
              (ClientEvent.LAST_TOKEN.value, to_unix_ns(rec.last_token_mono_ns), None)]
    end = to_unix_ns(rec.end_mono_ns)
    events.append((ClientEvent.END.value, end, None))
    ctx = SpanContext(trace_id, span_id, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    return ReadableSpan(name=SPAN_CLIENT, context=ctx, parent=None, resource=runner.telemetry.provider.resource, attributes=attrs,
                        events=tuple(Event(n, a, t) for n, t, a in events), kind=SpanKind.CLIENT, status=Status(StatusCode.UNSET),
                        start_time=to_unix_ns(rec.planned_mono_ns), end_time=end, instrumentation_scope=SCOPE)


def run_client_path(path: str, recs: list, runner, batch: int) -> tuple[float, float, bytes]:
    """(loop CPU s, export CPU s, the first batch's bytes) of the load generator's client span, one path."""
    from deltatap.loadgen.runner import Runner

    keep = _Keep()
    tel = runner.telemetry
    real = tel.processor
    tel.processor = keep
    gc.collect()
    try:
        t0 = time.process_time()
        if path == "sdk-objects":
            for i, rec in enumerate(recs):
                keep.on_end(sdk_client_span(runner, i + 1, i + 1, rec))
        else:
            emit_client = Runner._emit_span
            for i, rec in enumerate(recs):
                emit_client(runner, i + 1, i + 1, rec)
        t1 = time.process_time()
    finally:
        tel.processor = real
    fields = otlp_encode._span_fields
    otlp_encode._span_fields = otlp_encode._py_span_fields if path == "records-py" else fields
    gc.collect()
    try:
        t2 = time.process_time()
        first = b""
        for i in range(0, len(keep.spans), batch):
            out = otlp_encode.encode_export_request(keep.spans[i : i + batch])
            first = first or out
        t3 = time.process_time()
    finally:
        otlp_encode._span_fields = fields
    return t1 - t0, t3 - t2, first


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=7, help="rounds per path, alternating; medians reported")
    p.add_argument("--tokens", type=int, default=8)
    p.add_argument("--gap-ms", type=float, default=1.0)
    p.add_argument("--batch", type=int, default=512, help="spans per export batch (the processor's max_batch)")
    p.add_argument("--out", default=str(HERE / "results" / "span_cpu.json"))
    args = p.parse_args()
    got, tel = aio.run(capture(args.requests, args.tokens, args.gap_ms))
    # with the incoming context each request carried, for the SDK path's propagator
    got = [(tap, start, rec, {"traceparent": f"00-{start.trace_id:032x}-{start.parent_span_id:016x}-{start.trace_flags:02x}"})
           for tap, start, rec in got]
    paths = ["records-c", "records-py", "sdk-objects"] if otlp_encode._acc is not None else ["records-py", "sdk-objects"]
    firsts = {path: run_path(path, got, tel, args.batch)[3] for path in paths}  # warm-up, and the bytes compared
    assert len(set(firsts.values())) == 1, "the paths encode different bytes"
    runs: dict[str, list[tuple[float, float, float]]] = {path: [] for path in paths}
    for rnd in range(args.rounds):
        for path in paths[rnd % len(paths):] + paths[: rnd % len(paths)]:
            runs[path].append(run_path(path, got, tel, args.batch)[:3])
    n = len(got)
    out = {}
    for path, rs in runs.items():
        begin_us, loop_us, export_us = (statistics.median(r[k] for r in rs) / n * 1e6 for k in range(3))
        out[path] = {"begin_us_per_request": round(begin_us, 1), "loop_us_per_request": round(loop_us, 1),
                     "export_us_per_request": round(export_us, 1), "total_us_per_request": round(begin_us + loop_us + export_us, 1),
                     "rounds": [[round(x / n * 1e6, 1) for x in r] for r in rs]}
        print(f"{path}: {out[path]}", flush=True)
    # the load generator's client span, the same three paths (its _emit_span on the runner's real attributes)
    from types import SimpleNamespace

    from deltatap.core.vocab import Attr, Observer
    from deltatap.loadgen.runner import Runner

    runner = SimpleNamespace(telemetry=tel, _static_attrs={
        Attr.OBSERVER: Observer.CLIENT.value, Attr.RUN_ID: "RUN", Attr.CORRELATION_HEADER: "x-request-id", Attr.HTTP_METHOD: "POST",
        Attr.URL_PATH: "/v1/chat/completions", Attr.SERVER_ADDRESS: "127.0.0.1", Attr.SERVER_PORT: 8000, Attr.GENAI_OPERATION: "chat",
        Attr.GENAI_REQUEST_MODEL: "mock", Attr.STREAMING: True, Attr.CLOCK_OFFSET_NS: -1234, Attr.CLOCK_UNCERTAINTY_NS: 5678})
    runner._span_attributes = lambda rec: Runner._span_attributes(runner, rec)
    recs = client_records(len(got), args.tokens)
    cfirst = {path: run_client_path(path, recs, runner, args.batch)[2] for path in paths}
    assert len(set(cfirst.values())) == 1, "the client paths encode different bytes"
    cruns: dict[str, list[tuple[float, float]]] = {path: [] for path in paths}
    for rnd in range(args.rounds):
        for path in paths[rnd % len(paths):] + paths[: rnd % len(paths)]:
            cruns[path].append(run_client_path(path, recs, runner, args.batch)[:2])
    client = {}
    for path, rs in cruns.items():
        loop_us, export_us = (statistics.median(r[k] for r in rs) / n * 1e6 for k in range(2))
        client[path] = {"loop_us_per_request": round(loop_us, 1), "export_us_per_request": round(export_us, 1),
                        "total_us_per_request": round(loop_us + export_us, 1), "rounds": [[round(x / n * 1e6, 1) for x in r] for r in rs]}
        print(f"client {path}: {client[path]}", flush=True)
    tel.shutdown()
    sample = got[len(got) // 2]
    result = {
        "command": "python benchmarks/span_cpu.py " + " ".join(sys.argv[1:]),
        "what": "CPU microseconds per request (time.process_time, medians of the rounds) of a tap's span work: begin = "
                "the incoming W3C context and the span's ids at request start, loop = "
                "attributes + hand-off on the event loop (Tap.finish), export = encode_export_request in batches; "
                "records-c: SpanRecord + C encoder, records-py: SpanRecord + Python encoder, sdk-objects: ReadableSpan/"
                "Event/SpanContext per request + Python encoder (the path before), the same OTLP bytes",
        "requests": n, "tokens_per_stream": args.tokens, "batch": args.batch, "rounds": args.rounds,
        "attributes_per_span": len(_attrs(sample[0], sample[2])), "events_per_span": len(events(sample[2])),
        "bytes_per_span": round(len(firsts[paths[0]]) / min(args.batch, n), 1),
        "loadavg_1m": os.getloadavg()[0],
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "paths": out,
        "client_span": client,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
