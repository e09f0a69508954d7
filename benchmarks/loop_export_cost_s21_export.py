"""CPU on the event loop's thread per batch of 64 tap-sized span records (38 attributes, 12 events) exported over
OTLP/HTTP by deltatap.telemetry.otlp_loop.LoopSpanProcessor to benchmarks/tap_sink.py (on_end of the 64, encoding,
the request's write, the answer), against the encoding alone (``time.thread_time``: not the time spent waiting).
Session 21, task "export":

    .venv/bin/python benchmarks/loop_export_cost_s21_export.py   # -> benchmarks/results/loop_export_cost_s21_export.json
"""
import json
import asyncio, os, subprocess, sys, time, statistics
HERE = os.path.dirname(os.path.abspath(__file__)); sys.path.insert(0, HERE); sys.path.insert(0, os.path.dirname(HERE))
import uvloop
from tap_overhead import free_port, wait_port
from deltatap.telemetry.tracer import setup_telemetry
from deltatap.telemetry.otlp_encode import encode_export_request
from opentelemetry.sdk.resources import Resource
from deltatap.telemetry.spans import SpanOrigin, span_record, KIND_SERVER
origin = SpanOrigin(Resource.create({"service.name": "deltatap-tap-edge", "deltatap.link": "edge"}))
def rec(i):
    attrs = {f"deltatap.attr{j}": (j * i if j % 3 == 0 else (f"value-{j}-{i}" if j % 3 == 1 else j / 3.0)) for j in range(38)}
    events = [(f"ev{j}", 1_700_000_000_000_000_000 + j * 1000 + i, None) for j in range(12)]
    return span_record(origin, "deltatap.tap edge", KIND_SERVER, (i << 64) | 5, i, attrs, events, 1_700_000_000_000_000_000, 1_700_000_000_100_000_000)
recs = [rec(i) for i in range(1, 65)]
port = free_port()
sink = subprocess.Popen([sys.executable, os.path.join(HERE, "tap_sink.py"), "--port", str(port), "--out", "/dev/null"], stdout=subprocess.DEVNULL)
wait_port(port, sink, "sink")
async def main():
    tel = setup_telemetry("t", otlp=f"http://127.0.0.1:{port}", on_loop=True)
    p = tel.processor
    orig = p._settle
    box = {}
    def settle(*a):
        orig(*a); box["ev"].set()
    p._settle = settle
    loop_cpu, enc_cpu = [], []
    for rnd in range(200):
        box["ev"] = asyncio.Event()
        t0 = time.thread_time_ns()
        for r in recs:
            p.on_end(r)
        await box["ev"].wait()
        loop_cpu.append(time.thread_time_ns() - t0)
        t0 = time.thread_time_ns(); encode_export_request(recs); enc_cpu.append(time.thread_time_ns() - t0)
    out = {"command": "python benchmarks/loop_export_cost_s21_export.py", "batches": len(loop_cpu), "spans_per_batch": len(recs),
           "loop_cpu_us_per_batch_median": round(statistics.median(loop_cpu) / 1000, 1),
           "encode_cpu_us_per_batch_median": round(statistics.median(enc_cpu) / 1000, 1),
           "exported": tel.stats.spans_exported, "loadavg_1m": os.getloadavg()[0]}
    print(out)
    with open(os.path.join(HERE, "results", "loop_export_cost_s21_export.json"), "w") as f:
        json.dump(out, f, indent=1)
    await asyncio.to_thread(tel.shutdown)
uvloop.run(main())
sink.terminate()
