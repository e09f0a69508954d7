"""CPU per request of the tap's per-request Python outside the relay, stage by stage, in one process (issue 15).

What ``deltatap tap`` does for each request of tap_overhead's maximum-rate phase (a one-token streamed chat through
a pooled upstream connection) in the modules that are not the relay's: the request head's parse
(:class:`deltatap.net.h1.Reader`), its trace context and rewrite (:mod:`deltatap.proxy.headers`,
:func:`deltatap.proxy.spans.begin`), the response's framing, the record (:class:`deltatap.proxy.record.TapRecord`),
the tap's end of it (:meth:`deltatap.proxy.server.Tap.finish` and ``_emit_finished``: counters, attributes, events,
the span handed to the processor) and the OTLP encode of a 64-span batch (per span). Each stage: the best of
``--repeat`` timings of ``--n`` runs (ns per request), and the Python function calls per request (cProfile's count,
a load-independent figure). With ``--tree NAME=DIR`` (twice or more) every tree runs in its own process, rounds
alternating, the same stages and inputs (benchmarks/tap_cpu_ab.py's shims).

    .venv/bin/python benchmarks/span_path_s24_rate.py --tree base=/tmp/s24base --tree new=. [--out R.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BODY = json.dumps({"model": "mock", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4, "stream": True,
                   "stream_options": {"include_usage": True}}).encode()
REQUEST = (b"POST /v1/chat/completions?first_ms=0&tokens=1 HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nContent-Type: application/json\r\n"
           b"Accept: */*\r\nAccept-Encoding: gzip, deflate\r\nUser-Agent: Python/3.11 aiohttp/3.9.5\r\n"
           b"Content-Length: %d\r\n\r\n" % len(BODY))
ROLE = b'data: {"object":"chat.completion.chunk","model":"mock","choices":[{"index":0,"delta":{"role":"assistant","content":null}}]}\n\n'
TOKEN = b'data: {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": " tok0"}}]}\n\n'
USAGE = b'data: {"object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":8,"completion_tokens":1},"engine_ms":0.1}\n\n'
DONE = b"data: [DONE]\n\n"
RESP_HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
             b"Date: Wed, 25 Nov 2026 07:40:00 GMT\r\nServer: Python/3.11 aiohttp/3.9.5\r\n\r\n")


def _chunk(b: bytes) -> bytes:
    return b"%x\r\n" % len(b) + b + b"\r\n"


RESPONSE = RESP_HEAD + b"".join(_chunk(x) for x in (ROLE, TOKEN, USAGE, DONE)) + b"0\r\n\r\n"


def child(n: int, repeat: int) -> dict:
    """(In the tree's process.) Each stage's best ns per request and its Python calls per request."""
    import cProfile
    import pstats
    import types

    from deltatap.core.sse import StreamObserver
    from deltatap.core.vocab import TapEvent
    from deltatap.net import h1
    from deltatap.proxy.headers import rewrite_request_head, trace_context
    from deltatap.proxy.options import TapOptions
    from deltatap.proxy.record import TapRecord
    from deltatap.proxy.server import Tap
    from deltatap.proxy.spans import begin
    from deltatap.telemetry.otlp_encode import encode_export_request
    from deltatap.telemetry.tracer import NullExporter, setup_telemetry

    tel = setup_telemetry("deltatap-tap", exporter=NullExporter())
    kept: list = []
    tel.processor = types.SimpleNamespace(on_end=kept.append, stats=tel.processor.stats)
    tap = Tap(TapOptions(upstream="http://127.0.0.1:9", link="fw-engine", admin_port=None), tel)
    data = REQUEST + BODY
    t0 = 10_000_000_000

    def parse_request():
        r = h1.Reader(True)
        return r.feed(data), r

    def head_work():
        _ev, r = parse_request()
        head = r.head
        span = begin(trace_context(head))
        return head, span, rewrite_request_head(head, correlation_header=b"x-request-id", trace_headers=span.trace_headers)

    def parse_response():
        r = h1.Reader(False)
        r.expect(b"POST")
        return r.feed(RESPONSE)

    def record(span):
        rec = TapRecord(received=t0, head=t0, method="POST", path="/v1/chat/completions", query="first_ms=0&tokens=1",
                        client_address="127.0.0.1", request_id="0" * 32, request_id_created=True)
        rec.bounds[str(TapEvent.REQUEST_RECEIVED)] = (0, 0)
        rec.body_received = t0 + 1000
        rec.forwarded = t0 + 20_000
        rec.bounds[str(TapEvent.REQUEST_FORWARDED)] = (0, 3000)
        rec.request_bytes, rec.request_capture, rec.fingerprint = len(BODY), bytearray(BODY), "f" * 32
        rec.response_headers, rec.response_headers_forwarded, rec.status = t0 + 300_000, t0 + 320_000, 200
        obs = StreamObserver(path="/v1/chat/completions")
        body = ROLE + TOKEN + USAGE + DONE
        obs.feed(body, t0 + 300_000, 0)
        obs.forwarded(t0 + 330_000, 2000)
        obs.finish(t0 + 340_000, 0)
        obs.forwarded(t0 + 350_000, 0)
        rec.stream, rec.chunks, rec.response_bytes = obs, 5, len(RESPONSE) - len(RESP_HEAD)
        rec.response_end, rec.end = t0 + 340_000, t0 + 350_000
        return rec

    def finish(span, rec):
        tap.in_flight += 1
        tap.counters.in_flight += 1
        tap.finish(span, rec)
        tap._emit_finished()

    _h, span, _r = head_work()
    batch_spans = []
    for _ in range(64):
        finish(span, record(span))
    batch_spans = kept[-64:]

    def run_finish():
        rec = record(span)
        finish(span, rec)
        kept.pop()  # (the span goes, as an export lets it go: spans kept piling up would time the GC's walks over them)

    stages = {
        "request_parse": parse_request,
        "head_context_rewrite": head_work,  # (includes request_parse)
        "response_parse": parse_response,
        "record_build": lambda: record(span),  # (the record as the relay fills it, StreamObserver included)
        "record_and_finish": run_finish,  # (includes record_build)
        "encode_per_span": None,
    }
    out: dict = {}
    for name, fn in stages.items():
        if fn is None:
            m = max(1, n // 64)
            best = min(_timed(lambda: encode_export_request(batch_spans), m) for _ in range(repeat)) / 64
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(m):
                encode_export_request(batch_spans)
            prof.disable()
            calls = pstats.Stats(prof).total_calls / (m * 64)
        else:
            best = min(_timed(fn, n) for _ in range(repeat))
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(n):
                fn()
            prof.disable()
            calls = pstats.Stats(prof).total_calls / n
        kept.clear()
        out[name] = {"ns": round(best), "calls": round(calls, 2)}
    return out


def _timed(fn, n: int) -> float:
    t = time.perf_counter_ns()
    for _ in range(n):
        fn()
    return (time.perf_counter_ns() - t) / n


def run_rounds(script: Path, trees: dict[str, Path], n: int, repeat: int, rounds: int, shim) -> dict[str, list[dict]]:
    """``rounds`` rounds, the trees' order reversed every other one: ``script --child --n N --repeat R`` run with each
    tree first on the path (through ``shim``, tap_cpu_ab's); per tree, each round's stages as the child printed them."""
    results: dict[str, list[dict]] = {k: [] for k in trees}
    with tempfile.TemporaryDirectory() as tmp:
        shims = {k: shim(d, Path(tmp) / k) for k, d in trees.items()}
        for rnd in range(rounds):
            for name in (list(trees) if rnd % 2 == 0 else list(trees)[::-1]):
                env = {**os.environ, "PYTHONPATH": str(shims[name])}
                r = subprocess.run([sys.executable, str(script.resolve()), "--child", "--n", str(n), "--repeat", str(repeat)],
                                   env=env, capture_output=True, text=True, check=True, cwd=tmp)
                results[name].append(json.loads(r.stdout.strip().splitlines()[-1]))
                print(name, rnd, results[name][-1], flush=True)
    return results


def summarize(results: dict[str, list[dict]]) -> dict:
    """Per tree and stage: the best round's ns and the calls (the same every round)."""
    return {name: {st: {"ns_min": min(r[st]["ns"] for r in rs), "calls": rs[0][st]["calls"]} for st in rs[0]}
            for name, rs in results.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tree", action="append", metavar="NAME=DIR", help="a source tree (twice or more); none: this checkout")
    p.add_argument("--n", type=int, default=3000)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out")
    a = p.parse_args()
    if a.child:
        print(json.dumps(child(a.n, a.repeat)))
        return
    sys.path.insert(0, str(Path(__file__).parent))
    from tap_cpu_ab import shim

    trees = dict(t.split("=", 1) for t in (a.tree or [f"checkout={Path(__file__).resolve().parent.parent}"]))
    results = run_rounds(Path(__file__), {k: Path(d).resolve() for k, d in trees.items()}, a.n, a.repeat, a.rounds, shim)
    summary = summarize(results)
    doc = {"load_avg": os.getloadavg(), "n": a.n, "repeat": a.repeat, "rounds": a.rounds, "trees": trees, "summary": summary, "rounds_detail": results}
    print(json.dumps(summary, indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
