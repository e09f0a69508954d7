"""CPU and Python calls per request of a tap's request-head work and of its exchange's end, source trees side by side in
one run.

What a tap's relay does with each request read before and after forwarding it, without the sockets: the request
reader frames the read (head and body, ``deltatap.net.h1.Reader.feed``), the incoming trace context is read and the
tap's span begun (``trace_context``, ``proxy.spans.begin``), the head rewritten (``rewrite_request_head``), the body
fingerprinted (``Fingerprinter``) — on a keep-alive connection, the same streamed chat request as
benchmarks/tap_cpu.py's client sends. Each tree runs in its own process (a shim puts the tree's ``deltatap`` first,
as benchmarks/tap_cpu_ab.py does), trees alternating within each round; figures: CPU microseconds per request
(process time, median of the rounds) and Python function calls per request (``sys.setprofile`` call events: the
Python frames the work enters). ``--native 0`` adds each tree again with ``DELTATAP_NATIVE=0`` (the Python reference).

The exchange's end (``end_*`` figures), in the same process: ``Tap.finish`` — counters and histograms, the span's
attributes and events, the hand-off to the real span processor (the export thread's CPU included: its exporter drops
the batches) — on records filled as the relay fills them for that request's streamed answer (8 content events and
usage, read 100 bytes at a time, the request body captured). Records are made before the clock starts.

    .venv/bin/python benchmarks/request_head_cpu.py --tree base=/tmp/deltatap-base --tree new=. [--native 0]

Writes benchmarks/results/request_head_cpu.json.
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
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from tap_cpu_ab import shim  # noqa: E402
from tap_overhead import BODY  # noqa: E402

# the request benchmarks/tap_cpu.py's aiohttp client sends (its header set and order)
REQUEST = (b"POST /v1/chat/completions?first_ms=0&gap_ms=1 HTTP/1.1\r\nHost: 127.0.0.1:40123\r\nContent-Type: application/json\r\n"
           b"Accept: */*\r\nAccept-Encoding: gzip, deflate\r\nUser-Agent: Python/3.11 aiohttp/3.9.5\r\nContent-Length: %d\r\n\r\n"
           % len(BODY)) + BODY

CHILD = r"""
import json, sys, time
from deltatap.core.fingerprint import Fingerprinter, resolve_key
from deltatap.net import h1
from deltatap.proxy.headers import rewrite_request_head, trace_context
from deltatap.proxy.spans import begin

request, n = bytes.fromhex(sys.argv[1]), int(sys.argv[2])
key = resolve_key(None)
reader = h1.Reader(True)
HEAD, BODY, END = h1.HEAD, h1.BODY, h1.END


def one():
    out = []
    fp = None
    for ev in reader.feed(request):
        kind = ev[0]
        if kind == HEAD:
            head = ev[3]
            span = begin(trace_context(head))
            out.append(rewrite_request_head(head, correlation_header=b"x-request-id", trace_headers=span.trace_headers)[0])
            fp = Fingerprinter(key)
        elif kind == BODY:
            fp.update(memoryview(request)[ev[1]:ev[2]])
    return fp.result(), out


one()
calls = 0


def count(frame, event, arg):
    global calls
    if event == "call":
        calls += 1


sys.setprofile(count)
for _ in range(100):
    one()
sys.setprofile(None)
calls_head = calls
assert reader.messages == 101 and not reader.opaque
t0 = time.process_time()
for _ in range(n):
    one()
cpu = time.process_time() - t0

# the exchange's end: Tap.finish (counters, histograms, the span's attributes and events, the hand-off to the real
# span processor, whose export thread drops the batches: NullExporter) on records filled as the relay fills them
import gc
from deltatap.core.clock import mono_ns
from deltatap.core.sse import StreamObserver
from deltatap.core.vocab import TapEvent
from deltatap.proxy.options import TapOptions
from deltatap.proxy.record import TapRecord
from deltatap.proxy.server import Tap
from deltatap.telemetry.tracer import NullExporter, setup_telemetry

tel = setup_telemetry("deltatap-tap", exporter=NullExporter())
tap = Tap(TapOptions(upstream="http://127.0.0.1:9", link="fw-engine", admin_port=None), tel)
CAPTURE = bytearray(request[request.index(b"\r\n\r\n") + 4:])
SSE = b"".join(b'data: {"id":"c1","model":"mock","choices":[{"index":0,"delta":{"content":"tok%d"}}]}\n\n' % i for i in range(8))
SSE = (b'data: {"id":"c1","model":"mock","choices":[{"index":0,"delta":{"role":"assistant"}}]}\n\n' + SSE
       + b'data: {"id":"c1","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
       + b'data: {"id":"c1","choices":[],"usage":{"prompt_tokens":8,"completion_tokens":8}}\n\ndata: [DONE]\n\n')


def record(i):
    t = mono_ns()
    rec = TapRecord(received=t, head=t, method="POST", path="/v1/chat/completions", query="first_ms=0&gap_ms=1",
                    client_address="127.0.0.1", request_id=f"{i:032x}", request_id_created=True)
    rec.bounds[TapEvent.REQUEST_RECEIVED] = (0, 0)
    rec.request_bytes, rec.request_capture, rec.fingerprint = len(CAPTURE), CAPTURE, "8082431dc89470685514de5fb722f46c"
    rec.body_received = t
    rec.bounds[TapEvent.REQUEST_BODY_RECEIVED] = (0, 0)
    rec.forwarded = t + 40_000
    rec.bounds[TapEvent.REQUEST_FORWARDED] = (0, 20_000)
    rec.status, rec.response_headers, rec.response_headers_forwarded = 200, t + 300_000, t + 340_000
    rec.bounds[TapEvent.RESPONSE_HEADERS] = (0, 0)
    rec.bounds[TapEvent.RESPONSE_HEADERS_FORWARDED] = (0, 15_000)
    obs = rec.stream = StreamObserver(path=rec.path)
    for k, cut in enumerate(range(0, len(SSE), 100)):
        obs.feed(SSE[cut:cut + 100], t + 400_000 + k * 1_000_000)
        obs.forwarded(t + 420_000 + k * 1_000_000, 0)
    obs.finish(t + 9_000_000)
    rec.response_end = rec.end = t + 9_000_000
    rec.bounds[TapEvent.RESPONSE_END] = (0, 0)
    rec.response_bytes, rec.chunks = len(SSE), 11
    return rec, begin(trace_context(head))


def end(pairs):
    for rec, span in pairs:
        tap.in_flight += 1
        tap.counters.in_flight += 1
        tap.finish(span, rec)


head = next(ev[3] for ev in h1.Reader(True).feed(request) if ev[0] == HEAD)
pairs = [record(i) for i in range(100)]
end(pairs[:10])
calls = 0
sys.setprofile(count)
end(pairs[10:])
sys.setprofile(None)
end_calls = calls / 90
m = min(n, 20000)
pairs = [record(i) for i in range(m)]
gc.collect()
tel.processor.force_flush()
t0 = time.process_time()
end(pairs)
tel.processor.force_flush()  # (the export thread's share: its CPU is the tap's too)
end_cpu = time.process_time() - t0
assert tap.counters.requests.get("ok") == m + 100, tap.counters.requests
print(json.dumps({"cpu_us": cpu / n * 1e6, "python_calls": calls_head / 100, "end_cpu_us": end_cpu / m * 1e6, "end_python_calls": end_calls}))
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tree", action="append", required=True, metavar="NAME=DIR", help="a source tree (once or more)")
    p.add_argument("--native", action="append", default=[], metavar="SETTING", help="also run each tree with DELTATAP_NATIVE=SETTING")
    p.add_argument("--requests", type=int, default=20000, help="requests per tree per round (default 20000)")
    p.add_argument("--rounds", type=int, default=5, help="rounds; figures are the median (default 5)")
    p.add_argument("--out", default=str(HERE / "results" / "request_head_cpu.json"))
    args = p.parse_args()
    out = Path(args.out).resolve()
    tmp = Path(tempfile.mkdtemp(prefix="deltatap-reqhead-"))
    runs: dict[str, tuple[Path, dict[str, str]]] = {}
    for spec in args.tree:
        name, _, folder = spec.partition("=")
        tree = Path(folder or ".").resolve()
        if not name or not (tree / "setup.py").is_file():
            print(f"--tree {spec}: give NAME=DIR with DIR a deltatap source tree (setup.py in it)", file=sys.stderr)
            return 2
        path = shim(tree, tmp / f"shim-{name}")
        runs[name] = (path, {})
        for setting in args.native:
            runs[f"{name}-native-{setting}"] = (path, {"DELTATAP_NATIVE": setting})
    samples: dict[str, list[dict]] = {name: [] for name in runs}
    for _ in range(args.rounds):
        for name, (path, env) in runs.items():
            got = subprocess.run([sys.executable, "-c", CHILD, REQUEST.hex(), str(args.requests)], capture_output=True, text=True,
                                 env={**os.environ, **env, "PYTHONPATH": str(path)}, cwd=tmp)
            if got.returncode:
                print(f"{name}: the measuring process failed:\n{got.stderr.strip()}", file=sys.stderr)
                return 1
            samples[name].append(json.loads(got.stdout))
    levels = {name: {"cpu_us_per_request": round(statistics.median(s["cpu_us"] for s in got), 2),
                     "cpu_us_rounds": [round(s["cpu_us"], 2) for s in got],
                     "python_calls_per_request": got[0]["python_calls"],
                     "end_cpu_us_per_request": round(statistics.median(s["end_cpu_us"] for s in got), 2),
                     "end_cpu_us_rounds": [round(s["end_cpu_us"], 2) for s in got],
                     "end_python_calls_per_request": round(got[0]["end_python_calls"], 2)} for name, got in samples.items()}
    result = {
        "command": "python benchmarks/request_head_cpu.py " + " ".join(sys.argv[1:]),
        "what": "a tap's request-head work per request without sockets (Reader.feed of head+body, trace_context, spans.begin, "
                "rewrite_request_head, Fingerprinter), one process per tree and round, trees alternating: CPU us per request "
                "(process time, median of rounds) and Python function calls per request; end_*: the exchange's end "
                "(Tap.finish on a streamed chat record: counters, span attributes and events, hand-off to the span "
                "processor, its export thread included)",
        "request_bytes": len(REQUEST),
        "trees": {spec.partition("=")[0]: str(Path(spec.partition("=")[2] or ".").resolve()) for spec in args.tree},
        "loadavg_1m": os.getloadavg()[0],
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "levels": levels,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: {"head": (v["cpu_us_per_request"], v["python_calls_per_request"]),
                          "end": (v["end_cpu_us_per_request"], v["end_python_calls_per_request"])} for k, v in levels.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
