"""OTLP span exporters that send :func:`deltatap.otlp_encode.encode_export_request`'s bytes as they are.

* :class:`OtlpGrpcExporter` — OTLP/gRPC: one persistent grpcio channel, the ``TraceService/Export`` method
  called with identity (de)serializers, so no protobuf object is built on either side.
* :class:`OtlpHttpExporter` — OTLP/HTTP protobuf: ``POST`` of the bytes (``Content-Type:
  application/x-protobuf``) on one persistent ``http.client`` connection, reopened when the collector closed it.

Both bound each export by ``timeout_s`` (connection, every retry and its wait included), retry a few times
with a short backoff when the collector is unavailable (gRPC ``UNAVAILABLE``; HTTP connection errors, 429, 502,
503, 504), and never raise: a failed export returns ``FAILURE`` and leaves the reason in ``last_error`` and its
kind in ``last_reason`` (``export_timeout`` when the timeout expired waiting for the collector, else
``export_failed``), which :class:`deltatap.telemetry.BoundedSpanProcessor` counts and logs. ``shutdown`` never
waits for an export in flight: it ends it (the gRPC channel is closed, the HTTP socket shut down).
"""

from __future__ import annotations

import gzip
import http.client
import json
import socket
import ssl
import threading
import time
import zlib
from collections.abc import Mapping, Sequence
from urllib.parse import urlsplit

import grpc
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from deltatap import __version__
from deltatap.telemetry.otlp_encode import encode_export_request

EXPORT_METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
USER_AGENT = f"deltatap/{__version__}"
RETRIES = 2  # attempts after the first
BACKOFF_S = 0.1  # before the first retry, doubled before each next one
_HTTP_RETRY_STATUS = frozenset((429, 502, 503, 504))


def _identity(b: bytes) -> bytes:
    return b


class _Base(SpanExporter):
    def __init__(self, timeout_s: float, retries: int, backoff_s: float) -> None:
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.last_error = ""
        self.last_reason = ""  # of the last failure: "export_timeout" or "export_failed"
        self._stop = threading.Event()  # set by shutdown: ends a backoff wait at once

    def retry_delay(self, attempt: int, deadline: float) -> float | None:
        """The wait before retry ``attempt + 1`` of an export due by ``deadline`` (``time.monotonic``); None when
        there is no retry left, no time for it, or a shutdown (the thread's and the event loop's exports both ask)."""
        delay = self.backoff_s * (2**attempt)
        if attempt >= self.retries or self._stop.is_set() or time.monotonic() + delay >= deadline:
            return None
        return delay

    def _wait_before_retry(self, attempt: int, deadline: float) -> bool:
        """Sleep before retry ``attempt + 1``; False when there is no retry left, no time, or a shutdown."""
        delay = self.retry_delay(attempt, deadline)
        return delay is not None and not self._stop.wait(delay)

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True  # nothing is buffered here

    def _failed(self, error: str, timeout: bool = False) -> SpanExportResult:
        self.last_error = error
        self.last_reason = "export_timeout" if timeout else "export_failed"
        return SpanExportResult.FAILURE


class OtlpGrpcExporter(_Base):
    """OTLP/gRPC to ``endpoint`` (``http://HOST:PORT`` plaintext, ``https://HOST:PORT`` TLS)."""

    def __init__(
        self,
        endpoint: str,
        *,
        timeout_s: float = 5.0,
        headers: Mapping[str, str] | None = None,
        compression: str | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        retries: int = RETRIES,
        backoff_s: float = BACKOFF_S,
    ) -> None:
        super().__init__(timeout_s, retries, backoff_s)
        url = urlsplit(endpoint if "://" in endpoint else "http://" + endpoint)
        self.target = url.netloc
        self.secure = url.scheme == "https"
        self._metadata = tuple((k.lower(), v) for k, v in (headers or {}).items()) or None
        options = [
            ("grpc.primary_user_agent", USER_AGENT),
            # reconnect soon after the collector comes back (grpc's default backoff grows to 2 minutes)
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.min_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 2000),
        ]
        comp = grpc.Compression.Gzip if compression == "gzip" else grpc.Compression.NoCompression
        if self.secure:
            creds = credentials or grpc.ssl_channel_credentials()
            self._channel = grpc.secure_channel(self.target, creds, options=options, compression=comp)
        else:
            self._channel = grpc.insecure_channel(self.target, options=options, compression=comp)
        self._export = self._channel.unary_unary(EXPORT_METHOD, request_serializer=_identity, response_deserializer=_identity)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._stop.is_set():
            return self._failed("exporter is shut down")
        body = encode_export_request(spans)
        deadline = time.monotonic() + self.timeout_s
        attempt = 0
        while True:
            try:
                self._export(body, timeout=max(deadline - time.monotonic(), 0.001), metadata=self._metadata)
                return SpanExportResult.SUCCESS
            except grpc.RpcError as exc:
                code = exc.code() if hasattr(exc, "code") else None
                details = exc.details() if hasattr(exc, "details") else str(exc)
                name = code.name if code is not None else type(exc).__name__
                error = f"OTLP/gRPC export to {self.target}: {name} ({details}), attempt {attempt + 1}"
                if code is not grpc.StatusCode.UNAVAILABLE or not self._wait_before_retry(attempt, deadline):
                    return self._failed(error, timeout=code is grpc.StatusCode.DEADLINE_EXCEEDED)
                self.last_error = error
            except Exception as exc:  # noqa: BLE001 - the export thread must go on
                return self._failed(f"OTLP/gRPC export to {self.target}: {type(exc).__name__}: {exc}")
            attempt += 1

    def shutdown(self) -> None:
        self._stop.set()
        self._channel.close()


def ssl_context(ca_file: str | None = None, client_cert: str | None = None, client_key: str | None = None) -> ssl.SSLContext:
    """Server verification against ``ca_file`` (default: the system's CAs), plus a client certificate for mTLS."""
    ctx = ssl.create_default_context(cafile=ca_file)
    if client_cert:
        ctx.load_cert_chain(client_cert, client_key)
    return ctx


def _error_message(content_type: str | None, data: bytes) -> str:
    """The message of an OTLP/HTTP error answer (a google.rpc.Status, protobuf or JSON), else its first bytes."""
    ctype = (content_type or "").lower()
    try:
        if "protobuf" in ctype:
            from google.rpc import status_pb2

            return status_pb2.Status.FromString(data).message
        if "json" in ctype:
            return str(json.loads(data).get("message", ""))
    except Exception:  # noqa: BLE001 - fall back to the raw text
        pass
    return data[:200].decode("utf-8", "replace").strip()


class OtlpHttpExporter(_Base):
    """OTLP/HTTP protobuf ``POST`` to ``url`` (the full ``.../v1/traces`` URL, http or https)."""

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 5.0,
        headers: Mapping[str, str] | None = None,
        compression: str | None = None,
        context: ssl.SSLContext | None = None,
        retries: int = RETRIES,
        backoff_s: float = BACKOFF_S,
    ) -> None:
        super().__init__(timeout_s, retries, backoff_s)
        self.url = url
        u = urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"{url!r} is not an http(s) URL")
        self._https = u.scheme == "https"
        self._host = u.hostname
        self._port = u.port or (443 if self._https else 80)
        self._path = (u.path or "/") + (f"?{u.query}" if u.query else "")
        self._context = context if context is not None else (ssl_context() if self._https else None)
        self._compression = compression if compression in ("gzip", "deflate") else None
        self._headers = {"Content-Type": "application/x-protobuf", "User-Agent": USER_AGENT}
        if self._compression:
            self._headers["Content-Encoding"] = self._compression
        self._headers.update(headers or {})
        self._conn: http.client.HTTPConnection | None = None
        self._lock = threading.Lock()

    def _connection(self, timeout: float) -> tuple[http.client.HTTPConnection, bool]:
        """The persistent connection (opened now if there is none) and whether it served a request before."""
        conn = self._conn
        if conn is not None and conn.sock is not None:
            conn.sock.settimeout(timeout)
            return conn, True
        if conn is None:
            if self._https:
                conn = http.client.HTTPSConnection(self._host, self._port, timeout=timeout, context=self._context)
            else:
                conn = http.client.HTTPConnection(self._host, self._port, timeout=timeout)
            self._conn = conn
        conn.timeout = timeout
        return conn, False

    def _drop_connection(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def encode_body(self, spans: Sequence[ReadableSpan]) -> bytes:
        """The request body for ``spans``: the encoded export request, compressed as configured."""
        return self.compress(encode_export_request(spans))

    @property
    def compressed(self) -> bool:
        return self._compression is not None

    def compress(self, body: bytes) -> bytes:
        """``body`` compressed as configured (gzip level 6, deflate, or as it is); zlib releases the GIL meanwhile."""
        if self._compression == "gzip":
            return gzip.compress(body, compresslevel=6)
        if self._compression == "deflate":
            return zlib.compress(body)
        return body

    def request_head(self, content_length: int) -> bytes:
        """The request line and headers ``http.client`` writes for one export ``POST`` of ``content_length`` bytes,
        byte for byte (the event loop's exporter, :mod:`deltatap.telemetry.otlp_loop`, writes these)."""
        given = {k.lower() for k in self._headers}
        lines = [f"POST {self._path} HTTP/1.1"]
        if "host" not in given:
            host = f"[{self._host}]" if ":" in self._host else self._host
            lines.append(f"Host: {host}" if self._port == (443 if self._https else 80) else f"Host: {host}:{self._port}")
        if "accept-encoding" not in given:
            lines.append("Accept-Encoding: identity")
        if "content-length" not in given:
            lines.append(f"Content-Length: {content_length}")
        lines += [f"{k}: {v}" for k, v in self._headers.items()]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    def connection_error(self, exc: BaseException, attempt: int) -> str:
        """``last_error`` of an attempt that ended with ``exc`` (connection refused or reset, timed out...)."""
        text = "timed out" if isinstance(exc, TimeoutError) and not str(exc) else str(exc)
        return f"OTLP/HTTP export to {self.url}: {type(exc).__name__}: {text}, attempt {attempt + 1}"

    def answer_error(self, status: int, reason: str, content_type: str | None, data: bytes, attempt: int) -> str:
        """``last_error`` of an attempt the collector answered with a non-2xx ``status``."""
        return f"OTLP/HTTP export to {self.url}: HTTP {status} {reason}: {_error_message(content_type, data)}, attempt {attempt + 1}"

    @staticmethod
    def retry_status(status: int) -> bool:
        """Whether an answer with ``status`` is retried (429, 502, 503, 504)."""
        return status in _HTTP_RETRY_STATUS

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return self.export_within(spans, self.timeout_s)

    def export_within(self, spans: Sequence[ReadableSpan], timeout_s: float) -> SpanExportResult:
        """:meth:`export` bounded by ``timeout_s`` instead of the exporter's timeout."""
        if self._stop.is_set():
            return self._failed("exporter is shut down")
        body = self.encode_body(spans)
        deadline = time.monotonic() + timeout_s
        attempt = 0
        with self._lock:
            while True:
                conn, reused = self._connection(max(deadline - time.monotonic(), 0.001))
                try:
                    conn.request("POST", self._path, body, self._headers)
                    resp = conn.getresponse()
                    data = resp.read()
                except (OSError, http.client.HTTPException) as exc:
                    self._drop_connection()
                    if self._stop.is_set():  # shutdown ended this export
                        return self._failed(f"OTLP/HTTP export to {self.url}: ended by shutdown, attempt {attempt + 1}")
                    self.last_error = self.connection_error(exc, attempt)
                    stale = reused and isinstance(exc, (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError))
                    if stale and attempt < self.retries:  # the collector closed the idle keep-alive connection
                        attempt += 1
                        continue  # reconnect at once
                    if isinstance(exc, TimeoutError) or not self._wait_before_retry(attempt, deadline):
                        return self._failed(self.last_error, timeout=isinstance(exc, TimeoutError))
                    attempt += 1
                    continue
                if 200 <= resp.status < 300:
                    return SpanExportResult.SUCCESS
                self.last_error = self.answer_error(resp.status, resp.reason, resp.getheader("Content-Type"), data, attempt)
                if not self.retry_status(resp.status) or not self._wait_before_retry(attempt, deadline):
                    return self._failed(self.last_error)
                attempt += 1

    def shutdown(self) -> None:
        self._stop.set()
        conn = self._conn
        sock = conn.sock if conn is not None else None
        if sock is not None:  # wake an export blocked in connect/send/recv now, without waiting for its lock
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._lock.acquire(timeout=1.0):
            try:
                self._drop_connection()
            finally:
                self._lock.release()
