"""OpenTelemetry set-up shared by the taps, the load generator and the reference stack.

Export is asynchronous and bounded: finished spans go into a fixed-size queue that a background
thread drains into the exporter. A full queue drops the span and counts it; a dead or slow
collector therefore costs the traffic nothing. The counts are exported on ``/metrics`` and logged.

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

log = logging.getLogger("deltatap.telemetry.tracer")


EXPORT_SWITCH_INTERVAL_S = 0.0005


class TelemetryConfigError(ValueError):
    """A bad exporter setting; the message names the flag or variable."""


@dataclass
class ExportStats:
    """Counters of the bounded export path; read by ``/metrics`` and the shutdown log line."""

    spans_ended: int = 0
    spans_exported: int = 0
    spans_dropped_queue_full: int = 0
    spans_dropped_export_failed: int = 0
    export_failures: int = 0
    last_error: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def spans_dropped(self) -> int:
        return self.spans_dropped_queue_full + self.spans_dropped_export_failed


class BoundedSpanProcessor(SpanProcessor):
    """Queue spans (bounded) and export them in batches from one daemon thread.

    ``on_end`` never blocks: it appends to a deque under a lock or, when the queue is full,
    increments ``spans_dropped_queue_full``.
    """

    def __init__(
        self,
        exporter: SpanExporter,
        max_queue: int = 20_000,
        max_batch: int = 512,
        schedule_delay_s: float = 0.5,
        stats: ExportStats | None = None,
    ) -> None:
        self.exporter = exporter
        self.max_queue = max_queue
        self.max_batch = max_batch
        self.schedule_delay_s = schedule_delay_s
        self.stats = stats or ExportStats()
        self._queue: collections.deque[ReadableSpan] = collections.deque()
        self._cond = threading.Condition()
        self._shutdown = False
        self._flush_requests: list[threading.Event] = []
        self._thread = threading.Thread(target=self._run, name="deltatap-span-export", daemon=True)
        self._thread.start()

    def on_start(self, span, parent_context=None) -> None:  # noqa: D401 - SDK interface
        return None

    def on_end(self, span: ReadableSpan) -> None:
        with self._cond:
            self.stats.spans_ended += 1
            if len(self._queue) >= self.max_queue or self._shutdown:
                self.stats.spans_dropped_queue_full += 1
                return
            self._queue.append(span)
            if len(self._queue) >= self.max_batch:
                self._cond.notify()

    def _take_batch(self) -> list[ReadableSpan]:
        batch: list[ReadableSpan] = []
        while self._queue and len(batch) < self.max_batch:
            batch.append(self._queue.popleft())
        return batch

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._queue and not self._shutdown and not self._flush_requests:
                    self._cond.wait(self.schedule_delay_s)
                batch = self._take_batch()
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

    def _export(self, batch: Sequence[ReadableSpan]) -> None:
        try:
            result = self.exporter.export(batch)
            ok = result == SpanExportResult.SUCCESS
            err = "" if ok else getattr(self.exporter, "last_error", "") or "exporter returned FAILURE"
        except Exception as exc:  # exporter bugs must not kill the thread
            ok, err = False, f"{type(exc).__name__}: {exc}"
        with self.stats.lock:
            if ok:
                self.stats.spans_exported += len(batch)
            else:
                first = self.stats.export_failures == 0
                self.stats.export_failures += 1
                self.stats.spans_dropped_export_failed += len(batch)
                self.stats.last_error = err
                if first:
                    log.warning("span export failed (%s); %d spans dropped; traffic is unaffected", err, len(batch))

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        ev = threading.Event()
        with self._cond:
            self._flush_requests.append(ev)
            self._cond.notify()
        return ev.wait(timeout_millis / 1000)

    def shutdown(self) -> None:
        with self._cond:
            self._shutdown = True
            self._cond.notify()
        self._thread.join(timeout=10)
        try:
            self.exporter.shutdown()
        except Exception:  # pragma: no cover - best effort
            pass


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
        return OtlpJsonFileExporter(target[len("file:") :])
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
    processor: BoundedSpanProcessor

    @property
    def tracer(self):
        return self.provider.get_tracer(INSTRUMENTATION_SCOPE, __version__)

    @property
    def stats(self) -> ExportStats:
        return self.processor.stats

    def shutdown(self) -> None:
        self.processor.force_flush(5_000)
        self.provider.shutdown()
        s = self.stats
        if s.spans_dropped:
            log.warning(
                "spans dropped: %d (queue full %d, export failed %d; last error: %s)",
                s.spans_dropped,
                s.spans_dropped_queue_full,
                s.spans_dropped_export_failed,
                s.last_error or "-",
            )


def setup_telemetry(
    service_name: str,
    *,
    exporter: SpanExporter | None = None,
    otlp: str | None = None,
    protocol: str | None = None,
    max_queue: int = 20_000,
    resource_attributes: dict[str, str] | None = None,
) -> Telemetry:
    """Create a private TracerProvider (never the global one: several observers may share a
    process in tests and in ``deltatap demo``)."""
    # The export thread encodes protobuf in Python while holding the GIL; with CPython's default
    # 5 ms switch interval the event loop's thread (where every stamp is taken) could wait that long
    # for it. A short interval bounds the delay the export path can add to a stamp.
    if sys.getswitchinterval() > EXPORT_SWITCH_INTERVAL_S:
        sys.setswitchinterval(EXPORT_SWITCH_INTERVAL_S)
    attrs = {"service.name": service_name, "service.version": __version__}
    attrs.update(resource_attributes or {})
    provider = TracerProvider(resource=Resource.create(attrs))
    processor = BoundedSpanProcessor(exporter or make_exporter(otlp, protocol), max_queue=max_queue)
    provider.add_span_processor(processor)
    return Telemetry(provider=provider, processor=processor)
