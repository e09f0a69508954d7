"""Forwarding to another OTLP endpoint (Jaeger, an OpenTelemetry Collector), bounded and non-blocking.

``--forward`` takes ``grpc://HOST:PORT`` or ``http://HOST:PORT`` (``/v1/traces`` appended). Received
export requests (serialized ExportTraceServiceRequest bytes) and the collector's re-exported
decomposition spans go into a bounded queue that one task drains; a full queue or a failing target
drops the batch and counts its spans (``deltatap_collector_forward_dropped_total``), so a slow
Jaeger never slows the receivers.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from deltatap.core.config import ConfigError

log = logging.getLogger("deltatap.collector")


def parse_target(url: str, flag: str = "--forward") -> tuple[str, str]:
    """(transport, address): ("grpc", "host:port") or ("http", "http://host:port/v1/traces")."""
    if url.startswith("grpc://"):
        return "grpc", url[len("grpc://") :].rstrip("/")
    if url.startswith(("http://", "https://")):
        return "http", url if url.rstrip("/").endswith("/v1/traces") else url.rstrip("/") + "/v1/traces"
    raise ConfigError(f"{flag} {url!r}: use grpc://HOST:PORT or http://HOST:PORT")


class Forwarder:
    def __init__(self, url: str, on_drop: Callable[[int], None], max_queue: int = 1000, timeout_s: float = 5.0, flag: str = "--forward") -> None:
        self.transport, self.address = parse_target(url, flag)
        self.on_drop = on_drop
        self.timeout_s = timeout_s
        self.queue: asyncio.Queue[tuple[bytes, int]] = asyncio.Queue(max_queue)
        self.sent_spans = 0
        self._task: asyncio.Task | None = None
        self._channel = None
        self._session = None
        self._warned = False

    def submit(self, payload: bytes, spans: int) -> None:
        try:
            self.queue.put_nowait((payload, spans))
        except asyncio.QueueFull:
            self.on_drop(spans)

    async def start(self) -> None:
        if self.transport == "grpc":
            import grpc

            self._channel = grpc.aio.insecure_channel(self.address)
            self._call = self._channel.unary_unary(
                "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
                request_serializer=lambda b: b,
                response_deserializer=lambda b: b,
            )
        else:
            import aiohttp

            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        self._task = asyncio.create_task(self._run(), name="deltatap-forward")

    async def _send(self, payload: bytes) -> None:
        if self.transport == "grpc":
            await self._call(payload, timeout=self.timeout_s)
        else:
            async with self._session.post(self.address, data=payload, headers={"Content-Type": "application/x-protobuf"}) as resp:
                if resp.status >= 300:
                    raise ConnectionError(f"HTTP {resp.status}")
                await resp.read()

    async def _run(self) -> None:
        while True:
            payload, n = await self.queue.get()
            try:
                await self._send(payload)
                self.sent_spans += n
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # target down or refusing: drop, count, warn once
                self.on_drop(n)
                if not self._warned:
                    log.warning("forwarding to %s failed (%s); dropping and counting, traffic is unaffected", self.address, exc)
                    self._warned = True
            finally:
                self.queue.task_done()

    async def close(self, drain_s: float = 2.0) -> None:
        if self._task is not None:
            try:
                await asyncio.wait_for(self.queue.join(), drain_s)
            except asyncio.TimeoutError:
                pass
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        if self._channel is not None:
            await self._channel.close()
        if self._session is not None:
            await self._session.close()
