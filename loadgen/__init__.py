"""The load generator: arrivals, workloads, SSE client, client spans (t0, t12).

In-process API (``deltatap demo`` and the accuracy tests call it)::

    from deltatap.loadgen import LoadOptions, run_load
    from deltatap.telemetry.tracer import setup_telemetry

    telemetry = setup_telemetry("deltatap-loadgen", otlp="grpc://127.0.0.1:4317")
    result = await run_load(
        LoadOptions(target="http://127.0.0.1:9100", workload="synthetic-uniform", rate=50, requests=500,
                    headers={"Authorization": "Bearer ..."}, out="runs/r1", progress=False),
        telemetry,
    )
    result.summary["metrics_ms"]["ttft"]["p99"]   # AIPerf-style metrics (loadgen/summary.py)
    result.records                                # per-request dicts, schema in docs/records.md

``LoadOptions`` (loadgen/options.py) takes exactly one load shape - ``rate`` (open loop, ``arrival``
poisson|uniform|bursty), ``concurrency`` (closed loop) or ``batch`` (barrier batches) - plus
``requests`` and/or ``duration_s``. ``workload`` is a registered name, a YAML path or a mapping
(``{"workload": NAME, "params": {...}, "labels": {...}}``). Outputs under ``out``: records.jsonl,
summary.json, run.json, requests.jsonl (the exact plan, replayable with workload ``replay``) and
warmup.jsonl.
"""

from deltatap.loadgen.options import LoadOptions
from deltatap.loadgen.run import LoadAborted, LoadResult, run_load

__all__ = ["LoadAborted", "LoadOptions", "LoadResult", "run_load"]
