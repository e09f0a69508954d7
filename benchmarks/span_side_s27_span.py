"""The tap's per-request span work, stage by stage, in one process per tree, rounds alternating (issue 15, session 27).

What a tap does for each request of tap_overhead's maximum-rate phase (a one-token streamed chat, the record as
benchmarks/span_path_s24_rate.py builds it) on the span's side: ``begin`` (the span's ids and ``traceparent``, with
and without an incoming ``traceparent``), the attributes (:func:`deltatap.proxy.record.record_attributes`), the events
(:func:`deltatap.proxy.record.span_events`), ``emit`` (the record handed to a real
:class:`deltatap.telemetry.tracer.QueuedSpanProcessor`'s ``on_end``), the OTLP encode of a 64-span batch (per span),
and ``finish_total``: ``Tap.finish`` + ``_emit_finished`` + the encode, per request. Each stage: the best of
``--repeat`` timings of ``--n`` calls (ns), and Python function calls per call (cProfile: load-independent).

    .venv/bin/python benchmarks/span_side_s27_span.py --tree base=/tmp/s27base --tree new=. [--rounds 3] [--out R.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path


def child(n: int, repeat: int) -> dict:
    import cProfile
    import pstats

    sys.path.insert(0, str(Path(__file__).parent))
    from span_path_s24_rate import BODY, DONE, REQUEST, RESP_HEAD, RESPONSE, ROLE, TOKEN, USAGE

    from deltatap.core.sse import StreamObserver
    from deltatap.core.vocab import TapEvent
    from deltatap.net import h1
    from deltatap.proxy import record as R
    from deltatap.proxy.headers import trace_context
    from deltatap.proxy.options import TapOptions
    from deltatap.proxy.server import Tap
    from deltatap.proxy.spans import begin, emit
    from deltatap.telemetry.otlp_encode import encode_export_request
    from deltatap.telemetry.tracer import NullExporter, QueuedSpanProcessor, setup_telemetry

    t0 = 10_000_000_000

    def record():
        rec = R.TapRecord(received=t0, head=t0, method="POST", path="/v1/chat/completions", query="first_ms=0&tokens=1",
                          client_address="127.0.0.1", request_id="0" * 32, request_id_created=True)
        rec.bounds[str(TapEvent.REQUEST_RECEIVED)] = (0, 0)
        rec.body_received = t0 + 1000
        rec.forwarded = t0 + 20_000
        rec.bounds[str(TapEvent.REQUEST_FORWARDED)] = (0, 3000)
        rec.request_bytes, rec.request_capture, rec.fingerprint = len(BODY), bytearray(BODY), "f" * 32
        rec.response_headers, rec.response_headers_forwarded, rec.status = t0 + 300_000, t0 + 320_000, 200
        obs = StreamObserver(path="/v1/chat/completions")
        obs.feed(ROLE + TOKEN + USAGE + DONE, t0 + 300_000, 0)
        obs.forwarded(t0 + 330_000, 2000)
        obs.finish(t0 + 340_000, 0)
        obs.forwarded(t0 + 350_000, 0)
        rec.stream, rec.chunks, rec.response_bytes = obs, 5, len(RESPONSE) - len(RESP_HEAD)
        rec.response_end, rec.end = t0 + 340_000, t0 + 350_000
        return rec

    tel = setup_telemetry("deltatap-tap", exporter=NullExporter())
    q = QueuedSpanProcessor(NullExporter(), max_queue=1 << 40)
    tel.processor = q
    tap = Tap(TapOptions(upstream="http://127.0.0.1:9", link="fw-engine", admin_port=None), tel)
    tap._loop = None  # (finish emits at once)
    r = h1.Reader(True)
    r.feed(REQUEST + BODY)
    ctx = trace_context(r.head)
    ctx_tp = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    span = begin(ctx)
    rec = record()
    rec.outcome = rec.final_outcome()
    ov = rec.overheads()
    consts, clock = tap.span_constants, tap.clock
    attrs = R.record_attributes(rec, consts, clock, rec.outcome, ov)
    pool = [record() for _ in range(64)]

    def do_emit():
        emit(tel, "fw-engine", span, rec, attrs)
        q._queue.clear()

    def finish64():
        for p in pool:
            p.outcome = None
            tap.in_flight += 1
            tap.counters.in_flight += 1
            tap.finish(span, p)
        batch = list(q._queue)
        q._queue.clear()
        encode_export_request(batch)

    emit(tel, "fw-engine", span, rec, attrs)
    batch = list(q._queue) * 64
    q._queue.clear()
    stages = {  # name: (fn, calls per request)
        "begin": (lambda: begin(ctx), 1),
        "begin_traceparent": (lambda: begin(ctx_tp), 1),
        "record_attributes": (lambda: R.record_attributes(rec, consts, clock, rec.outcome, ov), 1),
        "span_events": (lambda: R.span_events(rec, 1_700_000_000_000_000_000), 1),
        "emit": (do_emit, 1),
        "encode_per_span": (lambda: encode_export_request(batch), 64),
        "finish_total": (finish64, 64),
    }
    out: dict = {}
    for name, (fn, per) in stages.items():
        m = max(1, n // per)
        best = float("inf")
        for _ in range(repeat):
            t = time.perf_counter_ns()
            for _ in range(m):
                fn()
            best = min(best, (time.perf_counter_ns() - t) / (m * per))
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(m):
            fn()
        prof.disable()
        out[name] = {"ns": round(best), "calls": round(pstats.Stats(prof).total_calls / (m * per), 2)}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tree", action="append", metavar="NAME=DIR", help="a source tree (twice or more); none: this checkout")
    p.add_argument("--n", type=int, default=20000)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out")
    a = p.parse_args()
    if a.child:
        print(json.dumps(child(a.n, a.repeat)))
        return
    sys.path.insert(0, str(Path(__file__).parent))
    from span_path_s24_rate import run_rounds, summarize
    from tap_cpu_ab import parse_trees, shim

    trees = parse_trees(a.tree or [f"checkout={Path(__file__).resolve().parent.parent}"])
    if trees is None:
        sys.exit(2)
    load = [os.getloadavg()[0]]
    results = run_rounds(Path(__file__), trees, a.n, a.repeat, a.rounds, shim)
    load.append(os.getloadavg()[0])
    summary = summarize(results)
    doc = {"load_avg_start_end": load, "n": a.n, "repeat": a.repeat, "rounds": a.rounds,
           "trees": {k: str(v) for k, v in trees.items()}, "summary": summary, "rounds_detail": results}
    print(json.dumps(summary, indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
