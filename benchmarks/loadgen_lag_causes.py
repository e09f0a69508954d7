"""Why an open-loop send is late: deltatap's load generator at ``--rate`` Poisson for ``--seconds``, run in-process
with instruments on, against benchmarks/loadgen_vs_aiperf.py's raw-asyncio engine and an OTLP/HTTP span sink
(benchmarks/tap_sink.py), each in its own process.

Per run it records every garbage-collector pause (``gc.callbacks``), every span-batch encode of the export thread
(the encoder is one call per batch that holds the GIL: the event loop's thread cannot run meanwhile), every firing
of the send clock's timer with the event loop thread's run-queue wait so far (``/proc/thread-self/schedstat``: time
runnable but not given a CPU, i.e. taken by other work on the host), and then attributes each late send (schedule lag
> ``--late-ms``) to what took the larger part of its lag, if that was at least half of it: GC pauses, span encodes,
or the OS (the loop's thread waiting for a CPU between the timer firings around it); else ``other`` (the loop itself
was busy: reads, other requests' work, a backlog of late sends).

Variants, each in a fresh process, alternating run by run (``--repeat``):

* ``now``: the load generator as it is (collector off while sending, 64-span export batches);
* ``gc``: the collector left on while sending (frozen at the start only, as before session 17);
* ``batch512``: export batches of 512 spans (the span processor's default, as before session 17);
* ``before``: both;
* ``latedue``: as ``now`` but a send that comes due while the loop handles reads waits for the timer's own wake (the
  open loop's ``H1Pool.before_read`` hook a no-op: ``SendClock.release_due`` as before session 20);
* ``noslice``: as ``now`` but the event loop thread keeps the system's scheduler slice while sending
  (``loadgen.runner.SEND_SLICE_NS`` 0, as before session 20).

    .venv/bin/python benchmarks/loadgen_lag_causes.py [--rate 1000] [--seconds 10] [--repeat 2]

Writes benchmarks/results/loadgen_lag_causes.json. Compare within one run: other work on the machine moves every
figure (the run-queue wait says how much).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
RESULTS = HERE / "results" / "loadgen_lag_causes.json"
VARIANTS = ("now", "gc", "batch512", "before", "latedue", "noslice")


def overlap_ns(a: int, b: int, spans: list[tuple[int, int]]) -> int:
    """How much of [a, b] the intervals ``spans`` cover (they do not overlap each other)."""
    return sum(max(0, min(b, e) - max(a, s)) for s, e in spans)


def one_run(url: str, sink: str, workload: str, variant: str, rate: float, seconds: float, late_ms: float) -> dict:
    """One instrumented run in this process (a fresh one per run)."""
    import deltatap.telemetry.otlp_export as otlp_export
    from deltatap.core.clock import mono_ns, to_unix_ns
    from deltatap.loadgen import run as run_mod
    from deltatap.loadgen import runner as runner_mod
    from deltatap.loadgen.options import LoadOptions
    from deltatap.net import aio

    pauses: list[tuple[int, int]] = []
    started: list[int] = []

    def on_gc(phase: str, _info: dict) -> None:
        if phase == "start":
            started.append(mono_ns())
        elif started:
            pauses.append((started.pop(), mono_ns()))

    encodes: list[tuple[int, int, int]] = []
    encode = otlp_export.encode_export_request

    def timed_encode(spans):  # type: ignore[no-untyped-def]
        t0 = mono_ns()
        body = encode(spans)
        encodes.append((t0, mono_ns(), len(spans)))
        return body

    otlp_export.encode_export_request = timed_encode
    fires: list[int] = []
    waits: list[int] = []
    fire = runner_mod.SendClock._fire
    stat = open("/proc/thread-self/schedstat", "rb", buffering=0) if Path("/proc/thread-self/schedstat").exists() else None

    def timed_fire(self) -> None:  # type: ignore[no-untyped-def]
        fires.append(mono_ns())
        if stat is not None:
            stat.seek(0)
            waits.append(int(stat.read().split()[1]))
        fire(self)

    runner_mod.SendClock._fire = timed_fire
    if variant in ("gc", "before"):
        @contextlib.contextmanager
        def collector_on():  # (as before session 17: frozen at the start, the collector left on)
            gc.collect()
            gc.freeze()
            try:
                yield
            finally:
                gc.unfreeze()

        run_mod.send_phase_gc = collector_on
    if variant == "noslice":  # the loop thread's scheduler slice left at the system's default (before session 20)
        runner_mod.SEND_SLICE_NS = 0
    if variant == "latedue":
        runner_mod.SendClock.release_due = lambda self: None  # type: ignore[method-assign]
    telemetry = runner_mod.load_telemetry(sink)
    if variant in ("batch512", "before"):
        telemetry.processor.max_batch = 512
    gc.callbacks.append(on_gc)
    opts = LoadOptions(target=url, model="engine", workload=workload, rate=rate, requests=int(rate * seconds), arrival="poisson",
                       progress=False, gpu=False, seed=1, write_requests=False)
    try:
        res = aio.run(run_mod.run_load(opts, telemetry))
    finally:
        gc.callbacks.remove(on_gc)
        telemetry.shutdown()
    off = to_unix_ns(0)
    recs = res.records
    planned = np.array([r["planned_send_unix_ns"] - off for r in recs])
    sent = np.array([r["send_unix_ns"] - off for r in recs])
    lag_ms = (sent - planned) / 1e6
    first, last = planned.min(), sent.max()
    in_run = [(a, b) for a, b in pauses if first <= b and a <= last]
    enc_in_run = [(a, b, n) for a, b, n in encodes if first <= b and a <= last]
    fire_t, wait_t = np.array(fires), np.array(waits)
    causes = {"gc": 0, "span_encode": 0, "os_cpu_wait": 0, "other": 0}
    enc_spans = [(a, b) for a, b, _n in enc_in_run]
    for i in np.nonzero(lag_ms > late_ms)[0]:
        a, b = int(planned[i]), int(sent[i])
        took = {"gc": overlap_ns(a, b, in_run), "span_encode": overlap_ns(a, b, enc_spans), "os_cpu_wait": 0}
        if len(wait_t):
            j0, j1 = max(0, int(np.searchsorted(fire_t, a)) - 1), min(len(fire_t) - 1, int(np.searchsorted(fire_t, b)))
            took["os_cpu_wait"] = int(wait_t[j1] - wait_t[j0])
        cause = max(took, key=lambda k: took[k])
        causes[cause if took[cause] >= (b - a) / 2 else "other"] += 1
    run = res.summary["run"]
    gc_ms = [(b - a) / 1e6 for a, b in in_run]
    enc_ms = [(b - a) / 1e6 for a, b, _n in enc_in_run]
    return {
        "variant": variant, "requests": len(recs),
        "send_lag_ms": {"p50": float(np.percentile(lag_ms, 50)), "p99": float(np.percentile(lag_ms, 99)), "max": float(lag_ms.max())},
        "late_sends": int((lag_ms > late_ms).sum()), "late_ms": late_ms, "late_causes": causes,
        "gc_pauses_while_sending": len(in_run), "gc_pause_max_ms": max(gc_ms, default=0.0),
        "span_encodes_while_sending": len(enc_in_run), "span_encode_max_ms": max(enc_ms, default=0.0),
        "span_encode_p50_ms": float(np.median(enc_ms)) if enc_ms else 0.0,
        "send_phase_cpu_us_per_request": run["send_phase_cpu_us_per_request"], "send_phase_cpu_wait_s": run.get("send_phase_cpu_wait_s"),
        "load_average": os.getloadavg()[0],
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rate", type=float, default=1000.0)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--repeat", type=int, default=2, help="runs of each variant, alternating")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, from {', '.join(VARIANTS)}")
    p.add_argument("--late-ms", type=float, default=1.0, help="a send later than this is attributed to a cause")
    p.add_argument("--out", default=str(RESULTS))
    p.add_argument("--one", nargs=4, help=argparse.SUPPRESS)  # (internal: URL SINK WORKLOAD VARIANT, one run, JSON on stdout)
    a = p.parse_args()
    if a.one:
        print(json.dumps(one_run(*a.one, a.rate, a.seconds, a.late_ms)))
        return 0
    variants = a.variants.split(",")
    bad = [v for v in variants if v not in VARIANTS]
    if bad:
        p.error(f"--variants {','.join(bad)}: choose from {', '.join(VARIANTS)}")
    from loadgen_vs_aiperf import Engine, Sink, write_workload

    result: dict = {"benchmark": "loadgen_lag_causes", "when_unix_s": time.time(), "cpus": os.cpu_count(), "rate": a.rate,
                    "seconds": a.seconds, "load_average_start": os.getloadavg(), "runs": []}
    with tempfile.TemporaryDirectory(prefix="lg-lag-") as td:
        tmp = Path(td)
        engine, sink = Engine(2.0, 3.0), Sink(tmp)
        workload = write_workload(tmp, 4)
        try:
            for _rep in range(a.repeat):
                for v in variants:
                    proc = subprocess.run([sys.executable, __file__, "--rate", str(a.rate), "--seconds", str(a.seconds), "--late-ms",
                                           str(a.late_ms), "--one", engine.url, sink.url, str(workload), v],
                                          capture_output=True, text=True, timeout=600)
                    if proc.returncode != 0:
                        raise RuntimeError(f"variant {v} failed: {proc.stderr[-2000:]}")
                    r = json.loads(proc.stdout.strip().splitlines()[-1])
                    result["runs"].append(r)
                    lag, c = r["send_lag_ms"], r["late_causes"]
                    print(f"{v:<9} lag p50 {lag['p50']:.3f} p99 {lag['p99']:.2f} max {lag['max']:.1f} ms; late {r['late_sends']}: gc {c['gc']}"
                          f" encode {c['span_encode']} os {c['os_cpu_wait']} other {c['other']}; gc pauses {r['gc_pauses_while_sending']}"
                          f" (max {r['gc_pause_max_ms']:.1f} ms), encodes {r['span_encodes_while_sending']} (p50 {r['span_encode_p50_ms']:.2f},"
                          f" max {r['span_encode_max_ms']:.1f} ms); cpu/req {r['send_phase_cpu_us_per_request']:.0f} us,"
                          f" cpu wait {r['send_phase_cpu_wait_s'] or 0:.2f} s; load {r['load_average']:.1f}", flush=True)
        finally:
            engine.stop()
            sink.stop()
    med = {}
    for v in variants:
        runs = [r for r in result["runs"] if r["variant"] == v]
        med[v] = {k: float(np.median([f(r) for r in runs])) for k, f in {
            "send_lag_p99_ms": lambda r: r["send_lag_ms"]["p99"], "late_sends": lambda r: r["late_sends"],
            "late_gc": lambda r: r["late_causes"]["gc"], "late_span_encode": lambda r: r["late_causes"]["span_encode"],
            "late_os_cpu_wait": lambda r: r["late_causes"]["os_cpu_wait"], "late_other": lambda r: r["late_causes"]["other"],
            "gc_pause_max_ms": lambda r: r["gc_pause_max_ms"], "span_encode_max_ms": lambda r: r["span_encode_max_ms"],
            "send_phase_cpu_us_per_request": lambda r: r["send_phase_cpu_us_per_request"],
            "send_phase_cpu_wait_s": lambda r: r["send_phase_cpu_wait_s"] or 0.0}.items()}
    result["median"] = med
    result["load_average_end"] = os.getloadavg()
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(med, indent=2))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
