"""The running collector: receivers + pipeline + row sink + metrics + forwarding, created and closed in one place.

In-process API (the demo and the tests use it; ``deltatap collect`` is a thin shell over it)::

    running = await start_collector(CollectorOptions(otlp_grpc="127.0.0.1:0", otlp_http="127.0.0.1:0"))
    running.otlp_grpc_endpoint   # "grpc://127.0.0.1:PORT"  (a --otlp value for taps / loadgen)
    running.otlp_http_url        # "http://127.0.0.1:PORT"  (OTLP/HTTP; also the /v1/clock base URL)
    running.metrics_url          # "http://HOST:PORT/metrics" when a separate metrics port was asked for
    await running.drain()        # close every open trace now and emit its row
    running.rows()               # rows emitted so far (the last keep_rows)
    running.aggregator           # mergeable per-delta sketches
    await running.close()        # stop receiving, flush, write the out_dir files
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from deltatap.collector.forward import Forwarder, parse_target
from deltatap.collector.memory import Trimmer, trimmer
from deltatap.collector.metrics import CollectorMetrics
from deltatap.collector.outputs import note_senders, write_outputs, write_provenance
from deltatap.collector.pipeline import Pipeline, PipelineOptions
from deltatap.collector.receivers import app_runner, http_app, metrics_app, start_grpc
from deltatap.collector.reexport import decomposition_spans, encode_records
from deltatap.collector.rows import Row
from deltatap.collector.sinks import RowWriter
from deltatap.collector.sketches import Aggregator
from deltatap.collector.spans import SpanRecord
from deltatap.core.gc_pauses import settle
from deltatap.core.config import ConfigError, listen_error_line
from deltatap.core.topology import Topology, default_topology, parse_hostport

log = logging.getLogger("deltatap.collector")
ROWS_FORMATS = ("parquet", "csv", "jsonl")


@dataclass
class CollectorOptions:
    otlp_grpc: str | None = "127.0.0.1:4317"  # HOST:PORT, or None for no gRPC receiver
    otlp_http: str | None = "127.0.0.1:4318"
    metrics: str | None = None  # separate HOST:PORT for /metrics (it is also on the OTLP/HTTP port)
    topology: Topology | None = None
    pipeline: PipelineOptions = field(default_factory=PipelineOptions)
    out_dir: str | Path | None = None
    rows_format: str = "parquet"
    forward: str | None = None  # grpc://HOST:PORT or http://HOST:PORT
    reexport: bool = False  # send synthetic decomposition spans to ``forward``
    handoff: str | None = None  # shard mode: partial requests' spans go to this joining collector (docs/scaleout.md)
    tick_s: float = 0.05
    trim_s: float | None = None  # check RSS this often and hand freed heap back when it grew (collector.memory; deltatap collect: 1 s)

    def check(self) -> None:
        if self.rows_format not in ROWS_FORMATS:
            raise ConfigError(f"--rows-format {self.rows_format!r}: use one of {', '.join(ROWS_FORMATS)}")
        if self.handoff is not None:
            parse_target(self.handoff, "--handoff")
        if self.reexport and not self.forward:
            raise ConfigError("--reexport needs --forward grpc://HOST:PORT or http://HOST:PORT (where to send the decomposition spans)")
        for flag, v in (("--otlp-grpc", self.otlp_grpc), ("--otlp-http", self.otlp_http), ("--metrics", self.metrics)):
            if v is not None:
                try:
                    parse_hostport(v, flag)
                except ValueError as exc:
                    raise ConfigError(str(exc)) from None
        if self.otlp_grpc is None and self.otlp_http is None:
            raise ConfigError("no receiver: give --otlp-grpc and/or --otlp-http")


class RunningCollector:
    def __init__(self, options: CollectorOptions) -> None:
        self.options = options
        self.topology = options.topology or default_topology()
        self.pipeline = Pipeline(self.topology, options.pipeline)
        self.metrics = CollectorMetrics(self.pipeline.snapshot, self.pipeline.hist)
        self.otlp_grpc_endpoint: str | None = None
        self.otlp_http_url: str | None = None
        self.metrics_url: str | None = None
        self._grpc = None
        self._runners: list[web.AppRunner] = []
        self._tick_task: asyncio.Task | None = None
        self._forwarder: Forwarder | None = None
        self._handoff: Forwarder | None = None
        self.handoff_dropped = 0
        self._writer: RowWriter | None = None
        self._pending_rows: list[Row] = []
        self._last_write = time.monotonic()
        self._closed = False
        self.senders: dict[tuple, dict] = {}  # each sender's attributes, once, and the models asked for: provenance.json
        self.models: set[str] = set()
        self.trimmer: Trimmer | None = trimmer() if options.trim_s else None

    # ---- callbacks from the receivers --------------------------------------------------------
    def _on_spans(self, spans: list[SpanRecord], raw: Any) -> None:
        note_senders(spans, self.senders, self.models)
        self.pipeline.ingest(spans, time.monotonic())
        if self._forwarder is not None and spans:
            data = raw if raw is not None else encode_records(spans).SerializeToString()
            self._forwarder.submit(data, len(spans))

    def _on_error(self, transport: str) -> None:
        self.pipeline.decode_errors[transport] = self.pipeline.decode_errors.get(transport, 0) + 1

    def _on_rows(self, rows: list[Row]) -> None:
        if self._writer is not None:
            self._pending_rows.extend(rows)
        if self._forwarder is not None and self.options.reexport:
            req = decomposition_spans(rows, self.topology)
            n = sum(len(ss.spans) for rs in req.resource_spans for ss in rs.scope_spans)
            if n:
                self._forwarder.submit(req.SerializeToString(), n)

    def _drop(self, n: int) -> None:
        self.pipeline.forward_dropped += n

    def _hand_off(self, spans: list) -> None:
        by_service: dict[str, list] = {}
        for sp in spans:
            by_service.setdefault(sp.service, []).append(sp)
        req = ExportTraceServiceRequest()
        for group in by_service.values():
            req.resource_spans.extend(encode_records(group).resource_spans)
        assert self._handoff is not None
        self._handoff.submit(req.SerializeToString(), len(spans))

    def _drop_handoff(self, n: int) -> None:
        self.handoff_dropped += n

    # ---- lifecycle -----------------------------------------------------------------------------
    async def start(self) -> None:
        o = self.options
        o.check()
        self.pipeline.listeners.append(self._on_rows)
        if o.out_dir is not None:
            self._writer = RowWriter(Path(o.out_dir) / f"rows.{o.rows_format}", self.topology)
        if o.forward:
            self._forwarder = Forwarder(o.forward, self._drop)
            await self._forwarder.start()
        if o.handoff:
            self._handoff = Forwarder(o.handoff, self._drop_handoff, flag="--handoff")
            await self._handoff.start()
            self.pipeline.handoff = self._hand_off
        try:
            if o.otlp_grpc is not None:
                host, port = parse_hostport(o.otlp_grpc, "--otlp-grpc")
                try:
                    self._grpc, bound = await start_grpc((host, port), self._on_spans, self._on_error)
                except OSError as exc:  # one line, like --otlp-http and --metrics
                    raise ConfigError(listen_error_line("--otlp-grpc", host, port, exc)) from None
                self.otlp_grpc_endpoint = f"grpc://{host}:{bound}"
            if o.otlp_http is not None:
                host, port = parse_hostport(o.otlp_http, "--otlp-http")
                self.otlp_http_url = f"http://{host}:{await self._serve(http_app(self._on_spans, self._on_error, self.metrics.render), host, port, '--otlp-http')}"
            if o.metrics is not None:
                host, port = parse_hostport(o.metrics, "--metrics")
                self.metrics_url = f"http://{host}:{await self._serve(metrics_app(self.metrics.render), host, port, '--metrics')}/metrics"
        except BaseException:
            await self._stop_servers()
            raise
        self._tick_task = asyncio.create_task(self._ticker(), name="deltatap-collector-tick")

    async def _serve(self, app: web.Application, host: str, port: int, flag: str) -> int:
        runner = app_runner(app)
        await runner.setup()
        self._runners.append(runner)
        site = web.TCPSite(runner, host, port)
        try:
            await site.start()
        except OSError as exc:
            raise ConfigError(listen_error_line(flag, host, port, exc)) from None
        return site._server.sockets[0].getsockname()[1]

    async def _ticker(self) -> None:
        next_trim = time.monotonic()
        while True:
            await asyncio.sleep(self.options.tick_s)
            try:
                now = time.monotonic()
                self.pipeline.tick(now)
                self._write_rows(force=False)
                if self.trimmer is not None and now >= next_trim:
                    next_trim = now + (self.options.trim_s or 1.0)
                    self.trimmer.check()
            except Exception:  # a bad trace must not stop the collector
                log.exception("collector tick failed")

    def _write_rows(self, force: bool) -> None:
        if self._writer is None or not self._pending_rows:
            return
        now = time.monotonic()
        if force or len(self._pending_rows) >= 2000 or now - self._last_write >= 1.0:
            rows, self._pending_rows = self._pending_rows, []
            self._writer.write(rows)
            self._last_write = now

    async def drain(self) -> list[Row]:
        """Close every open trace and pending join now; returns the rows this produced."""
        rows = self.pipeline.flush(time.monotonic())
        self._write_rows(force=True)
        return rows

    def rows(self) -> list[Row]:
        return list(self.pipeline.kept)

    @property
    def aggregator(self) -> Aggregator:
        return self.pipeline.aggregator

    def stats(self) -> dict[str, Any]:
        s = self.pipeline.snapshot()
        if self._forwarder is not None:
            s["forwarded_spans"] = self._forwarder.sent_spans
        if self._handoff is not None:
            s["handoff_sent_spans"], s["handoff_dropped_spans"] = self._handoff.sent_spans, self.handoff_dropped
        return s

    async def _stop_servers(self) -> None:
        if self._grpc is not None:
            await self._grpc.stop(grace=0.5)
            self._grpc = None
        for r in self._runners:
            await r.cleanup()
        self._runners = []

    async def close(self) -> dict[str, Path]:
        """Stop receiving, emit every remaining row, write the output files; returns them by name."""
        if self._closed:
            return {}
        self._closed = True
        await self._stop_servers()
        if self._tick_task is not None:
            self._tick_task.cancel()
            try:
                await self._tick_task
            except asyncio.CancelledError:
                pass
        await self.drain()
        if self._forwarder is not None:
            await self._forwarder.close()
        if self._handoff is not None:
            await self._handoff.close(drain_s=10.0)
        written: dict[str, Path] = {}
        if self._writer is not None:
            self._writer.close()
            written["rows"] = self._writer.path
        if self.options.out_dir is not None:
            written.update(write_outputs(self.aggregator, self.topology, self.options.out_dir, self.stats()))
            written["provenance.json"] = write_provenance(self.options.out_dir, "collect", self.topology, self.senders, self.models)
        return written


def tune_gc(young: int = 1_000_000) -> None:
    """Garbage-collector settings for a process whose job is the collector (``deltatap collect``).

    Open traces are many long-lived objects; with CPython's default thresholds (a young
    collection every 700 allocations, a full one every 100 young ones) collecting them cost about
    as much as decoding and decomposing. This freezes what is alive at start-up (imports) out of
    every collection and runs a young collection every ``young`` allocations: a span lives until
    its trace closes, so nearly everything a young collection examines survives it, and what dies
    is freed by reference counting anyway (benchmarks/collector_throughput.py, 40k requests:
    about 27-30k spans/s joined at 200,000, 31-32k at 1,000,000; the RSS with 100k open traces is
    in docs/benchmarks.md). A young collection then pauses the loop for tens of ms. Process-wide:
    call it from a collector process, not from a library or test that shares the interpreter.
    The freeze (and the pause timing) is every long-running deltatap process's: :func:`deltatap.core.gc_pauses.settle`."""
    settle()
    gc.set_threshold(young, 20, 100)


async def start_collector(options: CollectorOptions | None = None) -> RunningCollector:
    rc = RunningCollector(options or CollectorOptions())
    await rc.start()
    return rc
