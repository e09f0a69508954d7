"""OTLP receivers: gRPC (``TraceService/Export``) and HTTP (``POST /v1/traces``, protobuf and JSON).

Protobuf (gRPC, HTTP) decodes into :class:`~collector.compact.CompactSpan` (only what the
decomposition reads, packed), JSON into :class:`~collector.spans.SpanRecord`; both hand the spans to one callback
(``on_spans(spans, serialized_request_or_None)``: the protobuf bytes as received, for forwarding); invalid input is refused with a message that says what
is wrong: gRPC ``INVALID_ARGUMENT``, HTTP 400 with a ``google.rpc.Status`` body (JSON for JSON
requests), 415 for an unsupported content type. The HTTP app also answers ``GET /v1/clock`` (the
NTP-style exchange of :mod:`deltatap.core.clocksync`; the receive time is stamped first thing in the
handler), ``GET /metrics`` and ``GET /healthz``.
"""

from __future__ import annotations

import errno
import gzip
import json
import os
import socket
import zlib
from collections.abc import Callable

import grpc
from aiohttp import web
from google.rpc import status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from deltatap.collector.compact import CompactSpan, decode_compact
from deltatap.collector.spans import OtlpDecodeError, SpanRecord, decode_json
from deltatap.core.clock import now_unix_ns
from deltatap.core.clocksync import CLOCK_PATH, clock_answer

OnSpans = Callable[[list[SpanRecord] | list[CompactSpan], bytes | None], None]  # spans, the serialized request (None for JSON)
OnError = Callable[[str], None]
TRACES_PATH = "/v1/traces"
MAX_MESSAGE = 64 * 1024 * 1024
_EXPORT_METHOD = "Export"
_SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"

# --------------------------------------------------------------------------------------------
# gRPC
# --------------------------------------------------------------------------------------------


def grpc_handler(on_spans: OnSpans, on_error: OnError) -> grpc.GenericRpcHandler:
    empty = ExportTraceServiceResponse().SerializeToString()

    async def export(raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        try:
            spans = decode_compact(raw)
        except OtlpDecodeError as exc:
            on_error("grpc")
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"invalid OTLP trace export: {exc}")
        on_spans(spans, raw)
        return empty

    handler = grpc.unary_unary_rpc_method_handler(export, request_deserializer=None, response_serializer=None)
    return grpc.method_handlers_generic_handler(_SERVICE, {_EXPORT_METHOD: handler})


def check_bindable(host: str, port: int) -> None:
    """Raise OSError (errno and strerror set, e.g. "Address already in use") when ``host:port`` cannot be bound.

    gRPC's C core reports a failed bind on stderr itself (an ``add_port.cc`` log line) and then raises a
    RuntimeError that does not say why; binding a plain socket first gives the reason, and no C-core noise.
    Port 0 (any free port) always binds."""
    if port == 0:
        return
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise OSError(errno.EADDRNOTAVAIL, f"cannot resolve {host!r} ({exc.strerror})") from None
    family, kind, proto, _, addr = infos[0]
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC does: a port in TIME_WAIT is free
        s.bind(addr)


async def start_grpc(listen: tuple[str, int], on_spans: OnSpans, on_error: OnError) -> tuple[grpc.aio.Server, int]:
    host, port = listen
    check_bindable(host, port)
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", MAX_MESSAGE), ("grpc.so_reuseport", 0)])
    server.add_generic_rpc_handlers((grpc_handler(on_spans, on_error),))
    try:
        bound = server.add_insecure_port(f"{host}:{port}" if ":" not in host else f"[{host}]:{port}")
    except RuntimeError:  # grpcio >= 1.60 raises instead of returning 0 (lost a race after check_bindable)
        bound = 0
    if bound == 0:
        raise OSError(errno.EADDRINUSE, os.strerror(errno.EADDRINUSE))
    await server.start()
    return server, bound


# --------------------------------------------------------------------------------------------
# HTTP
# --------------------------------------------------------------------------------------------

_PROTOBUF_TYPES = {"application/x-protobuf", "application/protobuf", "application/octet-stream"}


def _status_body(message: str, as_json: bool) -> tuple[bytes, str]:
    if as_json:
        return json.dumps({"code": 3, "message": message}).encode(), "application/json"
    return status_pb2.Status(code=3, message=message).SerializeToString(), "application/x-protobuf"


def _decompress(body: bytes, encoding: str) -> bytes:
    enc = encoding.lower().strip()
    if enc in ("", "identity"):
        return body
    if enc == "gzip":
        return gzip.decompress(body) if body[:2] == b"\x1f\x8b" else body  # aiohttp may have inflated it already
    if enc == "deflate":
        try:
            return zlib.decompress(body)
        except zlib.error:
            return body
    raise OtlpDecodeError(f"Content-Encoding {encoding!r} is not supported; use gzip or none")


def http_app(on_spans: OnSpans, on_error: OnError, metrics: Callable[[], bytes] | None = None) -> web.Application:
    async def traces(request: web.Request) -> web.Response:
        ctype = request.content_type.lower()
        as_json = ctype == "application/json"
        if not as_json and ctype not in _PROTOBUF_TYPES:
            on_error("http")
            body, bt = _status_body(f"unsupported Content-Type {ctype!r}; OTLP/HTTP takes application/x-protobuf or application/json", False)
            return web.Response(status=415, body=body, content_type=bt)
        raw = await request.read()
        try:
            data = _decompress(raw, request.headers.get("Content-Encoding", ""))
            if as_json:
                try:
                    doc = json.loads(data)
                except (ValueError, UnicodeDecodeError) as exc:
                    raise OtlpDecodeError(f"body is not JSON ({exc})") from None
                spans, req = decode_json(doc), None
            else:
                spans, req = decode_compact(data), data
        except (OtlpDecodeError, OSError, EOFError) as exc:
            on_error("http")
            body, bt = _status_body(f"invalid OTLP trace export: {exc}", as_json)
            return web.Response(status=400, body=body, content_type=bt)
        on_spans(spans, req)
        if as_json:
            return web.Response(body=b"{}", content_type="application/json")
        return web.Response(body=ExportTraceServiceResponse().SerializeToString(), content_type="application/x-protobuf")

    async def clock(request: web.Request) -> web.Response:
        received = now_unix_ns()  # first thing: the exchange's T2
        return web.Response(body=clock_answer(received), content_type="application/json")

    async def metrics_handler(request: web.Request) -> web.Response:
        return web.Response(body=metrics() if metrics else b"", content_type="text/plain", charset="utf-8")

    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    app = web.Application(client_max_size=MAX_MESSAGE)
    app.router.add_post(TRACES_PATH, traces)
    app.router.add_get(CLOCK_PATH, clock)
    app.router.add_get("/metrics", metrics_handler)
    app.router.add_get("/healthz", healthz)
    return app


def metrics_app(metrics: Callable[[], bytes]) -> web.Application:
    async def handler(request: web.Request) -> web.Response:
        return web.Response(body=metrics(), content_type="text/plain", charset="utf-8")

    app = web.Application()
    app.router.add_get("/metrics", handler)
    return app
