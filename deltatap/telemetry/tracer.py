"""OpenTelemetry set-up shared by the taps, the load generator and the reference stack.

Export is asynchronous and bounded: finished spans go into a fixed-size queue that a background
thread drains into the exporter (:class:`BoundedSpanProcessor`), or, with ``setup_telemetry(..., on_loop=True)``
and an OTLP/HTTP endpoint, the running event loop itself (:class:`deltatap.telemetry.otlp_loop.LoopSpanProcessor`:
no thread, no GIL hand-offs; ``deltatap tap`` does). A full queue drops the span and counts it; a dead or slow
collector therefore costs the traffic nothing. The counts are exported on ``/metrics`` and logged.

Every span handed to the processor is accounted for exactly once (:class:`ExportStats`): exported, dropped
with a reason (:data:`DROP_REASONS`), or still queued (waiting, or in the batch being exported), so
``ended == exported + dropped + queued`` holds in every :meth:`ExportStats.snapshot`. Shutdown is bounded by a
deadline (``shutdown_deadline_s`` of :func:`setup_telemetry`, else ``$DELTATAP_SPAN_SHUTDOWN_S``, else
:data:`DEFAULT_SHUTDOWN_DEADLINE_S`): the queue is exported until then, and whatever is still queued at the
deadline (an export in flight included) is counted as dropped with reason ``shutdown_deadline``.

Exporter selection, first match wins: the ``exporter`` argument (a SpanExporter, for tests), the
``--otlp`` flag value, then the standard ``OTEL_EXPORTER_OTLP_*`` environment variables:

* ``none`` - record nothing (spans are still built, so stamping cost is unchanged)
* ``grpc://host:port`` or ``http://host:4317`` with protocol grpc - OTLP/gRPC
* ``http://host:4318`` (protocol ``http/protobuf``) - OTLP/HTTP protobuf, ``/v1/traces`` appended
* ``file:PATH`` - OTLP JSON lines, the OpenTelemetry Collector file exporter's format

``https://`` endpoints use TLS. The gRPC and HTTP exporters are deltatap's own
(:mod:`deltatap.telemetry.otlp_export`): they send the bytes :mod:`deltatap.telemetry.otlp_encode` writes directly, a few times
cheaper than the SDK exporters' protobuf objects. They also read ``OTEL_EXPORTER_OTLP_[TRACES_]HEADERS``,
``..._COMPRESSION`` (gzip or none) and ``..._CERTIFICATE`` / ``..._CLIENT_CERTIFICATE`` / ``..._CLIENT_KEY``.
"""

from __future__ import annotations

import collections
import logging
import os
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.util.re import parse_env_headers

from deltatap import __version__
from deltatap.core.vocab import INSTRUMENTATION_SCOPE
from deltatap.telemetry.spans import SpanOrigin

log = logging.getLogger("deltatap.telemetry.tracer")


EXPORT_SWITCH_INTERVAL_S = 0.0005

# Spans per OTLP export batch, for every process that exports (the tap, the load generator, the collector's
# re-export). The export thread (or the tap's loop: otlp_loop) encodes a batch in one C call
# (deltatap/telemetry/_otlpenc.c) that holds the GIL throughout: 512 spans held the event loop's thread for 2-4 ms, long enough to delay any stamp, send or forward due
# in that time (a p99 effect at a few hundred requests per second); 64 hold it for ~0.25-0.5 ms, at ~16 exports
# a second per 1000 spans/s.
EXPORT_BATCH = 64

SHUTDOWN_DEADLINE_ENV = "DELTATAP_SPAN_SHUTDOWN_S"
EXPORT_ON_LOOP_ENV = "DELTATAP_EXPORT_ON_LOOP"  # "0": setup_telemetry(on_loop=True) keeps the export thread (A/B, fallback)
DEFAULT_SHUTDOWN_DEADLINE_S = 5.0

# Why a span was dropped (the ``reason`` label of ``deltatap_tap_spans_dropped_total``):
DROP_REASONS = (
    "queue_full",  # the export queue held max_queue spans (the collector is slower than the traffic)
    "export_failed",  # the exporter gave up on its batch (refused, unavailable after retries, 4xx/5xx, exception)
    "export_timeout",  # the exporter's own timeout expired on its batch (a collector that accepts and never answers)
    "shutdown_deadline",  # still queued (or being exported) when the shutdown deadline passed
    "after_shutdown",  # ended after shutdown had begun
)


class TelemetryConfigError(ValueError):
    """A bad exporter setting; the message names the flag or variable."""


@dataclass(frozen=True)
class SpanCounts:
    """One consistent reading of :class:`ExportStats`: ``ended == exported + dropped + queued``."""

    ended: int
    exported: int
    queued: int
    dropped_by_reason: dict[str, int]

    @property
    def dropped(self) -> int:
        return sum(self.dropped_by_reason.values())

    @property
    def unaccounted(self) -> int:
        """Spans neither exported, dropped nor queued: always 0."""
        return self.ended - self.exported - self.dropped - self.queued


@dataclass
class ExportStats:
    """Counters of the bounded export path; read by ``/metrics`` and the shutdown log line.

    Every change happens under ``lock`` and keeps ``spans_ended == spans_exported + spans_dropped +
    spans_queued``; read several counters together with :meth:`snapshot`.
    """

    spans_ended: int = 0
    spans_exported: int = 0
    spans_queued: int = 0  # waiting in the queue, or in the batch being exported
    dropped: dict[str, int] = field(default_factory=lambda: dict.fromkeys(DROP_REASONS, 0))  # reason -> spans
    export_failures: int = 0  # failed export batches
    last_error: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def spans_dropped(self) -> int:
        return sum(self.dropped.values())

    @property
    def queued(self) -> int:
        return self.spans_queued

    @property
    def spans_dropped_queue_full(self) -> int:
        return self.dropped["queue_full"]

    @property
    def spans_dropped_export_failed(self) -> int:
        return self.dropped["export_failed"]

    def snapshot(self) -> SpanCounts:
        with self.lock:
            return SpanCounts(self.spans_ended, self.spans_exported, self.spans_queued, dict(self.dropped))


def shutdown_deadline(value: float | None = None) -> float:
    """The shutdown deadline in seconds: ``value``, else ``$DELTATAP_SPAN_SHUTDOWN_S``, else the default."""
    if value is None:
        raw = os.environ.get(SHUTDOWN_DEADLINE_ENV, "").strip()
        if not raw:
            return DEFAULT_SHUTDOWN_DEADLINE_S
        try:
            value = float(raw)
        except ValueError:
            raise TelemetryConfigError(f"{SHUTDOWN_DEADLINE_ENV}: {raw!r} is not a number of seconds (e.g. 5)") from None
        what = SHUTDOWN_DEADLINE_ENV
    else:
        what = "shutdown_deadline_s"
    if not value >= 0 or value == float("inf"):
        raise TelemetryConfigError(f"{what}: must be a finite number of seconds >= 0 (got {value})")
    return float(value)


class QueuedSpanProcessor(SpanProcessor):
    """The bounded queue and its accounting, shared by the export thread (:class:`BoundedSpanProcessor`) and the
    event loop's export (:class:`deltatap.telemetry.otlp_loop.LoopSpanProcessor`).

    ``on_end`` never blocks: it appends to a deque under the stats lock or, when the queue is full, counts the span
    as dropped (``queue_full``). Each batch stays counted as queued until its export returns
    (:meth:`_settle`); then it is counted as exported or dropped (``export_failed`` / ``export_timeout``); what is
    left at the shutdown deadline is counted by :meth:`_drop_left` (``shutdown_deadline``).
    """

    def __init__(
        self,
        exporter: SpanExporter,
        max_queue: int = 20_000,
        max_batch: int = EXPORT_BATCH,
        schedule_delay_s: float = 0.5,
        stats: ExportStats | None = None,
        shutdown_deadline_s: float = DEFAULT_SHUTDOWN_DEADLINE_S,
    ) -> None:
        self.exporter = exporter
        self.max_queue = max_queue
        self.max_batch = max_batch
        self.schedule_delay_s = schedule_delay_s
        self.shutdown_deadline_s = shutdown_deadline_s
        self.stats = stats or ExportStats()
        self._queue: collections.deque[ReadableSpan] = collections.deque()
        self._lock = self.stats.lock  # one lock for the queue and every counter (on_end takes it as is: no Python-level call)
        self._cond = threading.Condition(self._lock)
        self._batch: list[ReadableSpan] | None = None  # being exported; still counted as queued
        self._shutdown = False  # no more spans taken
        self._closed = False
        self._shutdown_lock = threading.Lock()

    def on_start(self, span, parent_context=None) -> None:  # noqa: D401 - SDK interface
        return None

    def on_end(self, span: ReadableSpan) -> None:
        st = self.stats
        with self._lock:
            st.spans_ended += 1
            if self._shutdown:
                st.dropped["after_shutdown"] += 1
                return
            if len(self._queue) >= self.max_queue:
                st.dropped["queue_full"] += 1
                return
            self._queue.append(span)
            st.spans_queued += 1
            self._queued(len(self._queue))

    def _queued(self, n: int) -> None:
        """Called under the lock (``_cond``'s) after a span was queued, ``n`` spans now waiting: wake the exporting side."""

    def _take_batch(self) -> list[ReadableSpan]:
        """(Under the lock.) Up to ``max_batch`` spans off the queue, oldest first; they stay counted as queued."""
        queue = self._queue
        if len(queue) <= self.max_batch:  # (the usual: the whole queue, in one copy, not a Python step per span)
            batch = list(queue)
            queue.clear()
            return batch
        pop = queue.popleft
        return [pop() for _ in range(max(self.max_batch, 0))]

    def _outcome(self, result: SpanExportResult | None, exc: BaseException | None = None) -> tuple[bool, str, str]:
        """``(ok, drop reason, error)`` of an export that returned ``result`` or raised ``exc``."""
        if exc is not None:
            return False, "export_failed", f"{type(exc).__name__}: {exc}"
        if result == SpanExportResult.SUCCESS:
            return True, "", ""
        err = getattr(self.exporter, "last_error", "") or "exporter returned FAILURE"
        return False, getattr(self.exporter, "last_reason", "") or "export_failed", err

    def _settle(self, batch: list[ReadableSpan], ok: bool, reason: str, err: str) -> None:
        """Count ``batch`` (the one being exported) as exported, or dropped with ``reason``; a batch already counted
        at the shutdown deadline is left alone (its late result is ignored)."""
        st = self.stats
        with self._cond:
            if self._batch is not batch:  # abandoned at the shutdown deadline: already counted
                return
            self._batch = None
            st.spans_queued -= len(batch)
            if ok:
                st.spans_exported += len(batch)
                return
            first = st.export_failures == 0
            st.export_failures += 1
            st.dropped[reason if reason in st.dropped else "export_failed"] += len(batch)
            st.last_error = err
        if first:
            log.warning("span export failed (%s); %d spans dropped; traffic is unaffected", err, len(batch))

    def _drop_left(self, deadline_s: float) -> int:
        """Count every span still queued or being exported as dropped (``shutdown_deadline``); how many."""
        st = self.stats
        with self._cond:
            left = len(self._queue) + len(self._batch or ())
            self._queue.clear()
            self._batch = None
            st.spans_queued -= left
            st.dropped["shutdown_deadline"] += left
            self._cond.notify_all()
        if left:
            log.warning("span export: shutdown deadline (%.1f s) passed; %d spans still queued dropped", deadline_s, left)
        return left


class BoundedSpanProcessor(QueuedSpanProcessor):
    """Queue spans (bounded) and export them in batches from one daemon thread.

    :meth:`shutdown` exports what is queued until its deadline and counts the rest as dropped
    (``shutdown_deadline``); an export still in flight then is abandoned (its late result is ignored)
    and the exporter is shut down, which ends its network wait.
    """

    def __init__(self, exporter: SpanExporter, **kwargs) -> None:
        super().__init__(exporter, **kwargs)
        self._abandoned = False  # the shutdown deadline passed: the thread must stop
        self._flush_requests: list[threading.Event] = []
        self._thread = threading.Thread(target=self._run, name="deltatap-span-export", daemon=True)
        self._thread.start()

    def _queued(self, n: int) -> None:
        if n >= self.max_batch:
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._queue and not self._shutdown and not self._flush_requests:
                    self._cond.wait(self.schedule_delay_s)
                if self._abandoned:
                    return
                batch = self._take_batch()
                self._batch = batch or None
                flushes = self._flush_requests if not self._queue else []
                if flushes:
                    self._flush_requests = []
                done = self._shutdown and not self._queue
            if batch:
                self._export(batch)
            for ev in flushes:
                ev.set()
            if done:
                return

    def _export(self, batch: list[ReadableSpan]) -> None:
        try:
            outcome = self._outcome(self.exporter.export(batch))
        except Exception as exc:  # exporter bugs must not kill the thread
            outcome = self._outcome(None, exc)
        self._settle(batch, *outcome)

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        ev = threading.Event()
        with self._cond:
            if self._shutdown or not self._thread.is_alive():
                return not self._queue and self._batch is None
            self._flush_requests.append(ev)
            self._cond.notify()
        return ev.wait(timeout_millis / 1000)

    def shutdown(self, deadline_s: float | None = None) -> None:
        """Export what is queued for at most ``deadline_s`` (default: :attr:`shutdown_deadline_s`), count what is
        left as dropped (``shutdown_deadline``), shut the exporter down. Later calls return at once."""
        with self._shutdown_lock:
            if self._closed:
                return
            deadline_s = self.shutdown_deadline_s if deadline_s is None else deadline_s
            with self._cond:
                self._shutdown = True
                self._cond.notify_all()
            self._thread.join(timeout=max(deadline_s, 0.0))
            if self._thread.is_alive():
                self._abandoned = True  # (read by the thread under the lock _drop_left takes and notifies)
                self._drop_left(deadline_s)
            try:
                self.exporter.shutdown()  # ends an export in flight (closes its connection)
            except Exception:  # pragma: no cover - best effort
                log.debug("exporter shutdown failed", exc_info=True)
            self._thread.join(timeout=0.5)
            self._closed = True


class OtlpJsonFileExporter(SpanExporter):
    """Append spans as OTLP JSON lines (one ExportTraceServiceRequest per line), like the
    OpenTelemetry Collector's file exporter, so ``deltatap report --from`` can read them."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = self.path.open("a", encoding="utf-8")
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        from google.protobuf.json_format import MessageToJson
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        from deltatap.telemetry.otlp_encode import encode_export_request

        line = MessageToJson(ExportTraceServiceRequest.FromString(encode_export_request(spans)), indent=None)
        with self._lock:
            self._fh.write(line + "\n")
            self._fh.flush()
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        with self._lock:
            self._fh.close()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True


class NullExporter(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


def make_exporter(otlp: str | None = None, protocol: str | None = None, timeout_s: float = 5.0) -> SpanExporter:
    """Build the span exporter from a ``--otlp`` value or the standard OTEL_* variables."""
    env = os.environ
    target = otlp or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    proto = (protocol or env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "").lower()
    if env.get("OTEL_TRACES_EXPORTER", "").lower() == "none" and not otlp:
        return NullExporter()
    if not target or target == "none":
        return NullExporter()
    if target.startswith("file:"):
        path = target[len("file:") :]
        if not path.strip():
            raise TelemetryConfigError("--otlp file: needs a path to write the spans to, e.g. file:spans.jsonl")
        return OtlpJsonFileExporter(path)
    if target.startswith("grpc://"):
        target, proto = "http://" + target[len("grpc://") :], "grpc"
    if not target.startswith(("http://", "https://")):
        raise TelemetryConfigError(
            f"--otlp / OTEL_EXPORTER_OTLP_ENDPOINT: {target!r} is not an endpoint; "
            "use grpc://HOST:4317, http://HOST:4318, file:PATH or none"
        )
    if not proto:
        proto = "grpc" if target.rstrip("/").endswith(":4317") else "http/protobuf"
    if proto not in ("grpc", "http/protobuf", "http"):
        raise TelemetryConfigError(
            f"OTLP protocol {proto!r} is not supported; use grpc or http/protobuf "
            "(OTEL_EXPORTER_OTLP_PROTOCOL / --otlp-protocol)"
        )
    from deltatap.telemetry import otlp_export

    headers = parse_env_headers(_env("HEADERS") or "", liberal=True)
    compression = (_env("COMPRESSION") or "none").strip().lower()
    if compression not in ("none", "gzip") and not (compression == "deflate" and proto != "grpc"):
        raise TelemetryConfigError(
            f"OTEL_EXPORTER_OTLP_COMPRESSION: {compression!r} is not supported; use gzip or none"
            + (" (or deflate over OTLP/HTTP)" if proto != "grpc" else "")
        )
    ca, client_cert, client_key = _env("CERTIFICATE"), _env("CLIENT_CERTIFICATE"), _env("CLIENT_KEY")
    if proto == "grpc":
        creds = None
        if target.startswith("https://") and (ca or client_cert):
            creds = grpc_credentials(ca, client_cert, client_key)
        return otlp_export.OtlpGrpcExporter(target, timeout_s=timeout_s, headers=headers, compression=compression, credentials=creds)
    endpoint = target if target.rstrip("/").endswith("/v1/traces") else target.rstrip("/") + "/v1/traces"
    context = otlp_export.ssl_context(ca, client_cert, client_key) if target.startswith("https://") else None
    return otlp_export.OtlpHttpExporter(endpoint, timeout_s=timeout_s, headers=headers, compression=compression, context=context)


def _env(name: str) -> str | None:
    """``OTEL_EXPORTER_OTLP_TRACES_<name>``, else ``OTEL_EXPORTER_OTLP_<name>``."""
    return os.environ.get(f"OTEL_EXPORTER_OTLP_TRACES_{name}") or os.environ.get(f"OTEL_EXPORTER_OTLP_{name}") or None


def grpc_credentials(ca: str | None, client_cert: str | None, client_key: str | None):
    """TLS credentials for gRPC from PEM files (``OTEL_EXPORTER_OTLP_CERTIFICATE`` / ``CLIENT_*``)."""
    import grpc

    def read(path: str | None) -> bytes | None:
        return Path(path).read_bytes() if path else None

    return grpc.ssl_channel_credentials(root_certificates=read(ca), private_key=read(client_key), certificate_chain=read(client_cert))


@dataclass
class Telemetry:
    """A tracer provider plus the bounded processor feeding it, created and closed in one place."""

    provider: TracerProvider
    processor: QueuedSpanProcessor  # BoundedSpanProcessor, or otlp_loop.LoopSpanProcessor (on_loop=True)
    origin: SpanOrigin = field(init=False)  # the resource and scope of the SpanRecords handed to the processor

    def __post_init__(self) -> None:
        self.origin = SpanOrigin(self.provider.resource)

    @property
    def tracer(self):
        return self.provider.get_tracer(INSTRUMENTATION_SCOPE, __version__)

    @property
    def stats(self) -> ExportStats:
        return self.processor.stats

    def shutdown(self, deadline_s: float | None = None) -> None:
        """Export what is queued for at most ``deadline_s`` (default: the processor's shutdown deadline), then
        close; spans still queued then are counted as dropped (``shutdown_deadline``)."""
        self.processor.shutdown(deadline_s)
        self.provider.shutdown()  # shuts the processor down again: a no-op
        c = self.stats.snapshot()
        if c.dropped:
            reasons = ", ".join(f"{r} {n}" for r, n in c.dropped_by_reason.items() if n)
            log.warning("spans dropped: %d of %d (%s; last error: %s)", c.dropped, c.ended, reasons, self.stats.last_error or "-")


def setup_telemetry(
    service_name: str,
    *,
    exporter: SpanExporter | None = None,
    otlp: str | None = None,
    protocol: str | None = None,
    max_queue: int = 20_000,
    resource_attributes: dict[str, str] | None = None,
    shutdown_deadline_s: float | None = None,
    on_loop: bool = False,
) -> Telemetry:
    """Create a private TracerProvider (never the global one: several observers may share a
    process in tests and in ``deltatap demo``). ``shutdown_deadline_s``: how long :meth:`Telemetry.shutdown`
    may go on exporting (default ``$DELTATAP_SPAN_SHUTDOWN_S``, else 5 s).

    ``on_loop``: called on a running asyncio event loop, export OTLP/HTTP from that loop, with no export thread
    (:class:`deltatap.telemetry.otlp_loop.LoopSpanProcessor`; ``deltatap tap`` does); other exports (gRPC, file)
    keep the thread, and so does every export with ``$DELTATAP_EXPORT_ON_LOOP`` set to ``0``."""
    deadline = shutdown_deadline(shutdown_deadline_s)
    attrs = {"service.name": service_name, "service.version": __version__}
    attrs.update(resource_attributes or {})
    provider = TracerProvider(resource=Resource.create(attrs))
    exp = exporter or make_exporter(otlp, protocol)
    processor: QueuedSpanProcessor
    if on_loop and _http_exporter(exp) and os.environ.get(EXPORT_ON_LOOP_ENV, "").strip() != "0":
        import asyncio

        from deltatap.telemetry.otlp_loop import LoopSpanProcessor

        processor = LoopSpanProcessor(exp, asyncio.get_running_loop(), max_queue=max_queue, shutdown_deadline_s=deadline)
    else:
        # The export thread encodes while holding the GIL; with CPython's default 5 ms switch interval the event
        # loop's thread (where every stamp is taken) could wait that long for it. A short interval bounds the delay
        # the export path can add to a stamp. (A process exporting on its loop has no such thread.)
        if sys.getswitchinterval() > EXPORT_SWITCH_INTERVAL_S:
            sys.setswitchinterval(EXPORT_SWITCH_INTERVAL_S)
        processor = BoundedSpanProcessor(exp, max_queue=max_queue, shutdown_deadline_s=deadline)
    provider.add_span_processor(processor)
    return Telemetry(provider=provider, processor=processor)


def _http_exporter(exporter: SpanExporter) -> bool:
    from deltatap.telemetry.otlp_export import OtlpHttpExporter

    return isinstance(exporter, OtlpHttpExporter)
