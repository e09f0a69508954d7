"""OTLP receivers: gRPC (``TraceService/Export``) and HTTP (``POST /v1/traces``, protobuf and JSON).

Protobuf (gRPC, HTTP) decodes into :class:`~collector.compact.CompactSpan` (only what the
decomposition reads, packed), JSON into :class:`~collector.spans.SpanRecord`; both hand the spans to one callback
(``on_spans(spans, serialized_request_or_None)``: the protobuf bytes as received, for forwarding); invalid input is refused with a message that says what
is wrong: gRPC ``INVALID_ARGUMENT``, HTTP 400 with a ``google.rpc.Status`` body (JSON for JSON
requests), 415 for an unsupported content type or content coding, 413 for a body over
:data:`~collector.bodies.MAX_BODY` as received or as inflated (:mod:`collector.bodies` reads and inflates it under
that limit; serve the app with :func:`app_runner`, which leaves the inflating to it). The HTTP app also answers ``GET /v1/clock`` (the
NTP-style exchange of :mod:`deltatap.core.clocksync`; the receive time is stamped first thing in the
handler), ``GET /metrics`` and ``GET /healthz``.
"""

from __future__ import annotations

import errno
import logging
import json
import os
import socket
from collections.abc import Callable

import grpc
from aiohttp import web
from google.rpc import status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from deltatap.collector.bodies import ACCEPTED_CODINGS, MAX_BODY, BodyReader, Refusal, parse_coding
from deltatap.collector.compact import CompactSpan, decode_compact
from deltatap.collector.spans import OtlpDecodeError, SpanRecord, decode_json
from deltatap.core.clock import now_unix_ns
from deltatap.core.clocksync import CLOCK_PATH, clock_answer

log = logging.getLogger("deltatap.collector")
OnSpans = Callable[[list[SpanRecord] | list[CompactSpan], bytes | None], None]  # spans, the serialized request (None for JSON)
OnError = Callable[[str], None]
TRACES_PATH = "/v1/traces"
MAX_MESSAGE = MAX_BODY
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


_READ_CHUNK = 1024 * 1024  # read the body in up to 1 MiB pieces (aiohttp's default is 64 KiB)
_GRPC_CODES = {400: 3, 413: 8, 415: 3}  # INVALID_ARGUMENT, RESOURCE_EXHAUSTED


def _status_body(message: str, as_json: bool, code: int = 3) -> tuple[bytes, str]:
    if as_json:
        return json.dumps({"code": code, "message": message}).encode(), "application/json"
    return status_pb2.Status(code=code, message=message).SerializeToString(), "application/x-protobuf"


def _refused(refusal: Refusal, as_json: bool) -> web.Response:
    body, bt = _status_body(refusal.message, as_json, _GRPC_CODES.get(refusal.status, 3))
    resp = web.Response(status=refusal.status, body=body, content_type=bt)
    if refusal.status == 415:
        resp.headers["Accept-Encoding"] = ACCEPTED_CODINGS
    if refusal.status == 413:
        resp.force_close()  # the rest of the body is read and dropped (aiohttp's lingering close), never inflated
    return resp


async def _read_body(request: web.Request, coding: str) -> bytes | Refusal:
    reader = BodyReader(coding, MAX_BODY)
    refusal = reader.check_declared(request.content_length)
    if refusal is not None:
        return refusal
    grow = getattr(request.content, "set_read_chunk_size", None)  # newer aiohttp; older ones read 64 KiB at a time
    if grow is not None:
        grow(_READ_CHUNK)
    while chunk := await request.content.readany():
        refusal = reader.feed(chunk)
        if refusal is not None:
            return refusal
    return reader.finish()


def http_app(on_spans: OnSpans, on_error: OnError, metrics: Callable[[], bytes] | None = None) -> web.Application:
    async def traces(request: web.Request) -> web.Response:
        ctype = request.content_type.lower()
        as_json = ctype == "application/json"
        if not as_json and ctype not in _PROTOBUF_TYPES:
            on_error("http")
            body, bt = _status_body(f"unsupported Content-Type {ctype!r}; OTLP/HTTP takes application/x-protobuf or application/json", False)
            return web.Response(status=415, body=body, content_type=bt)
        coding = parse_coding(request.headers.get("Content-Encoding", ""))
        data = coding if isinstance(coding, Refusal) else await _read_body(request, coding)
        if isinstance(data, Refusal):
            on_error("http")
            log.warning("OTLP/HTTP export from %s refused (%d): %s", request.remote, data.status, data.message)
            return _refused(data, as_json)
        try:
            if as_json:
                try:
                    doc = json.loads(data)
                except (ValueError, UnicodeDecodeError, RecursionError) as exc:  # (RecursionError: nested too deep)
                    raise OtlpDecodeError(f"body is not JSON ({exc})") from None
                spans, req = decode_json(doc), None
            else:
                spans, req = decode_compact(data), data
        except OtlpDecodeError as exc:
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

    app = web.Application(client_max_size=MAX_BODY)
    app.router.add_post(TRACES_PATH, traces)
    app.router.add_get(CLOCK_PATH, clock)
    app.router.add_get("/metrics", metrics_handler)
    app.router.add_get("/healthz", healthz)
    return app


def app_runner(app: web.Application) -> web.AppRunner:
    """The runner that serves :func:`http_app` (and :func:`metrics_app`): no access log, and aiohttp does not
    inflate request bodies itself (its inflater would run ahead of the handler's limit, and it answers an
    unknown coding with a logged traceback): :mod:`collector.bodies` does, under :data:`MAX_BODY`."""
    return web.AppRunner(app, access_log=None, auto_decompress=False)


def metrics_app(metrics: Callable[[], bytes]) -> web.Application:
    async def handler(request: web.Request) -> web.Response:
        return web.Response(body=metrics(), content_type="text/plain", charset="utf-8")

    app = web.Application()
    app.router.add_get("/metrics", handler)
    return app
