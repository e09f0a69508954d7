"""OTLP span encoding and export: the OpenTelemetry SDK's path against deltatap's, side by side in one run.

1. **Encode**, CPU µs per span: ``encode_spans(spans).SerializeToString()`` (the SDK exporters' encoder:
   protobuf objects per span, event, attribute) against :func:`deltatap.otlp_encode.encode_export_request`
   (bytes written directly), on batches of ``--batch`` spans, rounds alternating between the two. Two span
   shapes: a tap's span built by the tap's own code (``deltatap.proxy.record.attributes`` over a real SSE stream of 32
   tokens, ``deltatap.proxy.spans.emit``: 44 attributes, 10 events), and a span made through the SDK tracer with 30
   attributes and 20 events (5 of them with attributes), like a component's own span.
2. **Export**, CPU µs per span of this process (all threads, grpc's included) for ``exporter.export(batch)``
   to a local ``deltatap collect`` running in its own process: the SDK's OTLPSpanExporter (gRPC and HTTP)
   against deltatap's OtlpGrpcExporter / OtlpHttpExporter (what ``make_exporter`` returns), rounds rotating
   through the four.

    .venv/bin/python benchmarks/otlp_encode.py [--batch 512] [--rounds 15] [--export-batches 4]

Writes benchmarks/results/otlp_encode.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tap_overhead import free_port, stop_all, wait_port  # noqa: E402

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans  # noqa: E402
from opentelemetry.sdk.resources import Resource  # noqa: E402
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402
from opentelemetry.trace import SpanKind  # noqa: E402

from deltatap import __version__  # noqa: E402
from deltatap.core.clock import mono_ns  # noqa: E402
from deltatap.core.clocksync import ClockEstimate  # noqa: E402
from deltatap.telemetry.otlp_encode import encode_export_request  # noqa: E402
from deltatap.core.sse import StreamObserver  # noqa: E402
from deltatap.telemetry.tracer import make_exporter  # noqa: E402
from deltatap.proxy.record import TapRecord, attributes  # noqa: E402
from deltatap.proxy.spans import begin, emit  # noqa: E402
from deltatap.telemetry.spans import SpanOrigin, SpanRecord  # noqa: E402

HERE = Path(__file__).resolve().parent
MODEL = "llama-3.1-8b-instruct"


def _sse(tokens: int, i: int) -> list[bytes]:
    head = f'data: {{"id":"chatcmpl-{i}","object":"chat.completion.chunk","model":"{MODEL}","choices":[{{"index":0,'.encode()
    out = [head + b'"delta":{"role":"assistant"}}]}\n\n']
    out += [head + b'"delta":{"content":" tok%d"}}]}\n\n' % k for k in range(tokens)]
    out.append(head + b'"delta":{},"finish_reason":"stop"}],"usage":{"prompt_tokens":120,"completion_tokens":%d}}\n\n' % tokens)
    out.append(b"data: [DONE]\n\n")
    return out


def tap_spans(n: int) -> list[ReadableSpan]:
    """``n`` spans as a tap builds them: a TapRecord filled as the tap fills it, the tap's attributes and emit()."""
    res = Resource.create({"service.name": "deltatap-tap", "service.version": __version__})
    out: list[ReadableSpan] = []
    tel = types.SimpleNamespace(provider=types.SimpleNamespace(resource=res), processor=types.SimpleNamespace(on_end=out.append),
                                origin=SpanOrigin(res))
    for i in range(n):
        t = mono_ns()
        rec = TapRecord(received=t, method="POST", path="/v1/chat/completions", client_address="127.0.0.1", request_id=f"req-{i:08d}",
                        head=t + 10_000, body_received=t + 20_000 + i, forwarded=t + 200_000 + 7 * i, response_headers=t + 5_000_000,
                        response_headers_forwarded=t + 5_100_000, status=200, request_bytes=812 + i % 97, fingerprint=f"{i:032x}",
                        request_capture=json.dumps({"model": MODEL, "max_tokens": 64, "stream": True}).encode())
        obs = StreamObserver("openai-chat")
        rec.stream = obs
        tt = t + 20_000_000
        for chunk in _sse(32, i):
            obs.feed(chunk, tt)
            rec.chunks += 1
            rec.response_bytes += len(chunk)
            obs.forwarded(tt + 50_000 + i % 1000)
            tt += 20_000_000 + (i * 7919) % 1_000_000
        rec.response_end, rec.end = tt, tt + 60_000
        attrs = attributes(rec, link="edge", downstream="client", downstream_kind="client", upstream="gateway", upstream_kind="envoy",
                           upstream_host="127.0.0.1", upstream_port=8080, correlation_header="x-request-id",
                           clock=ClockEstimate(-12_345, 40_000, 80_000, 8), labels={"workload": "chat"})
        emit(tel, "tap edge", begin({}), rec, attrs)
    return out


def tracer_spans(n: int) -> list[ReadableSpan]:
    """``n`` spans made through the SDK tracer: 30 attributes, 20 events (every fourth with 2 attributes)."""
    mem = InMemorySpanExporter()
    tp = TracerProvider(resource=Resource.create({"service.name": "deltatap-stack", "service.version": __version__}))
    tp.add_span_processor(SimpleSpanProcessor(mem))
    tracer = tp.get_tracer("deltatap", __version__)
    template = dict(list(tap_spans(1)[0].attributes.items())[:30])
    for i in range(n):
        attrs = dict(template)
        attrs["deltatap.request_id"] = f"req-{i:08d}"
        span = tracer.start_span("gateway", kind=SpanKind.SERVER, attributes=attrs)
        for k in range(20):
            span.add_event(f"point.{k}", {"deltatap.attempt": k, "deltatap.retries": 0} if k % 4 == 0 else None)
        span.end()
    tp.shutdown()
    return list(mem.get_finished_spans())


def sdk_encode(spans) -> bytes:
    return encode_spans(spans).SerializeToString()


def encode_rounds(spans: list[ReadableSpan], rounds: int) -> dict:
    """CPU µs per span of each encoder, rounds alternating (the first of each discarded as warm-up)."""
    # the SDK's encoder gets the SDK span a tap's record stands for (built here, outside the timing)
    sdk_in = [s.readable() if isinstance(s, SpanRecord) else s for s in spans]
    assert sdk_encode(sdk_in) == encode_export_request(spans), "the two encoders disagree"
    fns = {"sdk": lambda _spans: sdk_encode(sdk_in), "deltatap": encode_export_request}
    per: dict[str, list[float]] = {k: [] for k in fns}
    for r in range(rounds + 1):
        for name, fn in (fns.items() if r % 2 == 0 else reversed(fns.items())):
            t0 = time.thread_time_ns()
            fn(spans)
            us = (time.thread_time_ns() - t0) / 1e3 / len(spans)
            if r:
                per[name].append(us)
    out = {name: {"median_us_per_span": round(statistics.median(v), 2), "min_us_per_span": round(min(v), 2)} for name, v in per.items()}
    out["speedup_median"] = round(out["sdk"]["median_us_per_span"] / out["deltatap"]["median_us_per_span"], 2)
    out["bytes_per_span"] = round(len(encode_export_request(spans)) / len(spans), 1)
    return out


def sdk_exporters(grpc_endpoint: str, http_url: str) -> dict:
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

    return {
        "sdk_grpc": GrpcExporter(endpoint=grpc_endpoint.replace("grpc://", "http://"), insecure=True, timeout=10),
        "sdk_http": HttpExporter(endpoint=http_url + "/v1/traces", timeout=10),
    }


def export_rounds(batches: list[list[ReadableSpan]], rounds: int) -> dict:
    port_grpc, port_http = free_port(), free_port()
    out_dir = tempfile.mkdtemp(prefix="otlp-encode-bench-")
    collector = subprocess.Popen(
        [sys.executable, "-m", "deltatap.app.cli", "collect", "--otlp-grpc", f"127.0.0.1:{port_grpc}", "--otlp-http", f"127.0.0.1:{port_http}",
         "--metrics", "none", "--out", out_dir, "--rows-format", "jsonl", "--orphan-wait-s", "1", "--grace-s", "0.5"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        wait_port(port_grpc, collector, "collector")
        wait_port(port_http, collector, "collector")
        grpc_endpoint, http_url = f"grpc://127.0.0.1:{port_grpc}", f"http://127.0.0.1:{port_http}"
        exporters = sdk_exporters(grpc_endpoint, http_url)
        exporters["deltatap_grpc"] = make_exporter(grpc_endpoint)
        exporters["deltatap_http"] = make_exporter(http_url)
        n_spans = sum(len(b) for b in batches)
        cpu: dict[str, list[float]] = {k: [] for k in exporters}
        wall: dict[str, list[float]] = {k: [] for k in exporters}
        names = list(exporters)
        # the SDK's exporters get the SDK spans the tap's records stand for (built here, outside the timing)
        sdk_batches = [[s.readable() if isinstance(s, SpanRecord) else s for s in b] for b in batches]
        for r in range(rounds + 1):
            for name in names[r % len(names):] + names[: r % len(names)]:  # rotate the order each round
                exp = exporters[name]
                c0, w0 = time.process_time_ns(), time.perf_counter_ns()
                for batch in sdk_batches if name.startswith("sdk") else batches:
                    if exp.export(batch) != SpanExportResult.SUCCESS:
                        raise RuntimeError(f"{name}: export failed {getattr(exp, 'last_error', '')}")
                c1, w1 = time.process_time_ns(), time.perf_counter_ns()
                if r:  # round 0 warms channels and connections up
                    cpu[name].append((c1 - c0) / 1e3 / n_spans)
                    wall[name].append((w1 - w0) / 1e3 / n_spans)
        for exp in exporters.values():
            exp.shutdown()
    finally:
        stop_all([collector])
    out = {name: {"cpu_median_us_per_span": round(statistics.median(cpu[name]), 1), "cpu_min_us_per_span": round(min(cpu[name]), 1),
                  "wall_median_us_per_span": round(statistics.median(wall[name]), 1)} for name in exporters}
    out["cpu_ratio_grpc"] = round(out["sdk_grpc"]["cpu_median_us_per_span"] / out["deltatap_grpc"]["cpu_median_us_per_span"], 2)
    out["cpu_ratio_http"] = round(out["sdk_http"]["cpu_median_us_per_span"] / out["deltatap_http"]["cpu_median_us_per_span"], 2)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=512, help="spans per export request (BoundedSpanProcessor's max batch: 512)")
    p.add_argument("--rounds", type=int, default=15, help="measured rounds per encoder / exporter (default 15)")
    p.add_argument("--export-batches", type=int, default=4, help="batches per exporter per round (default 4)")
    p.add_argument("--out", default=str(HERE / "results" / "otlp_encode.json"))
    args = p.parse_args()
    load_start = os.getloadavg()
    taps = tap_spans(args.batch * args.export_batches)
    shapes = {
        "tap_span_44_attributes_10_events": taps[: args.batch],
        "tracer_span_30_attributes_20_events": tracer_spans(args.batch),
    }
    encode = {}
    for name, spans in shapes.items():
        encode[name] = encode_rounds(spans, args.rounds)
        print(name, json.dumps(encode[name]), flush=True)
    batches = [taps[i : i + args.batch] for i in range(0, len(taps), args.batch)]
    export = export_rounds(batches, max(3, args.rounds // 2))
    print("export (tap spans)", json.dumps(export), flush=True)
    result = {
        "command": "benchmarks/otlp_encode.py " + " ".join(sys.argv[1:]),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "batch": args.batch,
        "rounds": args.rounds,
        "load_average_at_start": load_start,
        "load_average_at_end": os.getloadavg(),
        "encode_cpu_us_per_span": encode,
        "export_cpu_us_per_span_tap_spans": export,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
