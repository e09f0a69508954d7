"""The collector: receives OTLP, joins traces, and decomposes every request into per-component deltas.

In-process API (the demo and the tests use it; ``deltatap collect`` is a shell over it)::

    from deltatap.collector import CollectorOptions, start_collector

    running = await start_collector(CollectorOptions(otlp_grpc="127.0.0.1:0", otlp_http="127.0.0.1:0", out_dir="out"))
    running.otlp_grpc_endpoint   # "grpc://127.0.0.1:PORT": pass as --otlp / setup_telemetry(otlp=...)
    running.otlp_http_url        # "http://127.0.0.1:PORT": OTLP/HTTP (/v1/traces), GET /v1/clock, /metrics
    ...                          # taps, load generator and components export here
    await running.drain()        # close every open trace now and emit its row
    rows = running.rows()        # list[collector.rows.Row] (the schema: collector/rows.py)
    running.aggregator.summaries()   # delta -> {p50_ms, ..., count, error_bound_ms}
    running.stats()              # spans, traces opened/closed/evicted, late spans, joins, ambiguity
    await running.close()        # stop, flush, write out_dir (rows file, summary, decomposition, sketches)

Offline: ``collector.ingest.load(paths)`` + ``collector.pipeline.Pipeline``; rows files:
``deltatap.collector.sinks.read_rows`` / ``write_rows``; the decomposition table: ``deltatap.collector.table``.
"""

from deltatap.collector.pipeline import Pipeline, PipelineOptions
from deltatap.collector.rows import Row
from deltatap.collector.service import CollectorOptions, RunningCollector, start_collector

__all__ = ["CollectorOptions", "Pipeline", "PipelineOptions", "Row", "RunningCollector", "start_collector"]
