"""deltatap's OTLP/gRPC and OTLP/HTTP exporters over real loopback sockets: a round trip through the collector's
receivers, an unreachable collector, retries, error answers, kept-alive connections, headers, gzip and TLS."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import ssl
import subprocess

import grpc
import pytest
from aiohttp import web
from google.rpc import status_pb2
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace.export import SpanExportResult

from deltatap.collector import CollectorOptions, PipelineOptions, start_collector
from deltatap.telemetry.otlp_export import EXPORT_METHOD, OtlpGrpcExporter, OtlpHttpExporter
from deltatap.telemetry.tracer import make_exporter, setup_telemetry
from otlp_spans import tap_spans, varied_spans
from tests.conftest import free_port


def by_span_id(requests: list[ExportTraceServiceRequest]) -> dict[bytes, tuple]:
    """span id -> (resource, scope, scope schema URL, span): what must arrive, whatever the batching."""
    out = {}
    for req in requests:
        for rs in req.resource_spans:
            for ss in rs.scope_spans:
                for sp in ss.spans:
                    out[sp.span_id] = (rs.resource.SerializeToString(deterministic=True), ss.scope.SerializeToString(deterministic=True), ss.schema_url, sp)
    return out


class Sink:
    """An OTLP/HTTP endpoint on 127.0.0.1 that keeps every request; ``answers`` scripts the first responses."""

    def __init__(self, answers: list[web.Response] | None = None, ssl_context: ssl.SSLContext | None = None, **runner_kwargs) -> None:
        self.bodies: list[bytes] = []
        self.headers: list = []
        self.peers: list[tuple] = []
        self.answers = list(answers or [])
        self.ssl_context = ssl_context
        self.runner_kwargs = runner_kwargs

    async def _traces(self, request: web.Request) -> web.Response:
        self.bodies.append(await request.read())  # aiohttp inflates a gzip body
        self.headers.append(request.headers.copy())  # case-insensitive
        self.peers.append(request.transport.get_extra_info("peername"))
        if self.answers:
            return self.answers.pop(0)
        return web.Response(body=b"", content_type="application/x-protobuf")

    async def __aenter__(self) -> Sink:
        app = web.Application(client_max_size=1 << 26)
        app.router.add_post("/v1/traces", self._traces)
        self.runner = web.AppRunner(app, access_log=None, **self.runner_kwargs)
        await self.runner.setup()
        self.site = web.TCPSite(self.runner, "127.0.0.1", 0, ssl_context=self.ssl_context)
        await self.site.start()
        self.port = self.site._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        return self

    async def __aexit__(self, *exc) -> None:
        await self.runner.cleanup()

    def requests(self) -> list[ExportTraceServiceRequest]:
        return [ExportTraceServiceRequest.FromString(b) for b in self.bodies]


async def wait_for(cond, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond() and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("transport", ["grpc", "http"])
async def test_spans_arrive_intact_through_the_collectors_receivers(transport):
    """Exporter -> collector receiver (decoded and counted) -> the collector forwards what it received -> sink."""
    spans = varied_spans() + tap_spans(40, first_id=1000)
    async with Sink() as sink:
        rc = await start_collector(CollectorOptions(otlp_grpc="127.0.0.1:0", otlp_http="127.0.0.1:0", forward=sink.url,
                                                    pipeline=PipelineOptions(grace_s=0.05, join_hold_s=0.05)))
        try:
            endpoint = rc.otlp_grpc_endpoint if transport == "grpc" else rc.otlp_http_url
            tel = setup_telemetry("t", otlp=endpoint)
            assert isinstance(tel.processor.exporter, OtlpGrpcExporter if transport == "grpc" else OtlpHttpExporter)
            tel.processor.max_batch = 16  # several export requests on one channel / connection
            for span in spans:
                tel.processor.on_end(span)
            await asyncio.to_thread(tel.shutdown)
            assert tel.stats.spans_exported == len(spans) and tel.stats.export_failures == 0
            await wait_for(lambda: sum(len(by_span_id([r])) for r in sink.requests()) >= len(spans))
            assert rc.stats()["spans_received"] == len(spans)
        finally:
            await rc.close()
    got = by_span_id(sink.requests())
    want = by_span_id([encode_spans(spans)])
    assert len(want) == len(spans)
    assert got == want


@pytest.mark.parametrize("scheme", ["grpc", "http"])
def test_unreachable_collector_fails_counted_and_logged_without_hanging(scheme, caplog):
    port = free_port()  # nothing listens there
    tel = setup_telemetry("t", otlp=f"{scheme}://127.0.0.1:{port}")
    spans = tap_spans(10)
    with caplog.at_level(logging.WARNING, logger="deltatap.telemetry.tracer"):
        for span in spans:
            tel.processor.on_end(span)
        assert tel.processor.force_flush(30_000)  # the export gave up (retries bounded by the timeout)
    assert tel.stats.export_failures == 1 and tel.stats.spans_dropped_export_failed == 10 and tel.stats.spans_exported == 0
    transport = "OTLP/gRPC" if scheme == "grpc" else "OTLP/HTTP"
    assert f"{transport} export to" in tel.stats.last_error and str(port) in tel.stats.last_error
    assert ("UNAVAILABLE" if scheme == "grpc" else "ConnectionRefusedError") in tel.stats.last_error
    assert "attempt 3" in tel.stats.last_error  # the first try and two retries
    lines = [r.getMessage() for r in caplog.records if r.name == "deltatap.telemetry.tracer"]
    assert any(line.startswith(f"span export failed ({transport} export to") and "10 spans dropped" in line for line in lines), lines
    tel.shutdown()


async def test_http_retries_unavailable_answers_on_one_kept_alive_connection():
    spans = tap_spans(3)
    async with Sink(answers=[web.Response(status=503), web.Response(status=429)]) as sink:
        exp = OtlpHttpExporter(sink.url + "/v1/traces", timeout_s=10)
        try:
            assert await asyncio.to_thread(exp.export, spans) == SpanExportResult.SUCCESS
            assert await asyncio.to_thread(exp.export, spans) == SpanExportResult.SUCCESS
        finally:
            exp.shutdown()
    assert len(sink.bodies) == 4 and len(set(sink.bodies)) == 1
    assert len(set(sink.peers)) == 1  # one TCP connection for all four requests
    h = sink.headers[0]
    assert h["Content-Type"] == "application/x-protobuf" and h["User-Agent"].startswith("deltatap/")
    assert sink.requests()[0] == encode_spans(spans)


async def test_http_error_answer_is_not_retried_and_its_message_is_kept():
    status = status_pb2.Status(code=3, message="invalid OTLP trace export: no good").SerializeToString()
    async with Sink(answers=[web.Response(status=400, body=status, content_type="application/x-protobuf")]) as sink:
        exp = OtlpHttpExporter(sink.url + "/v1/traces")
        try:
            assert await asyncio.to_thread(exp.export, tap_spans(1)) == SpanExportResult.FAILURE
        finally:
            exp.shutdown()
    assert len(sink.bodies) == 1
    assert exp.last_error == f"OTLP/HTTP export to {sink.url}/v1/traces: HTTP 400 Bad Request: invalid OTLP trace export: no good, attempt 1"


async def test_http_reconnects_when_the_collector_closed_the_idle_connection():
    async with Sink(keepalive_timeout=0.05) as sink:
        exp = OtlpHttpExporter(sink.url + "/v1/traces")
        try:
            assert await asyncio.to_thread(exp.export, tap_spans(1)) == SpanExportResult.SUCCESS
            await wait_for(lambda: False, timeout=0.5)  # the server closes the idle connection meanwhile
            assert await asyncio.to_thread(exp.export, tap_spans(1)) == SpanExportResult.SUCCESS
        finally:
            exp.shutdown()
    assert len(sink.bodies) == 2 and len(set(sink.peers)) == 2


async def test_headers_and_gzip_from_the_environment(monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer%20secret,x-tenant=a")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "gzip")
    spans = tap_spans(2)
    async with Sink() as sink:
        exp = make_exporter(sink.url)
        try:
            assert await asyncio.to_thread(exp.export, spans) == SpanExportResult.SUCCESS
        finally:
            exp.shutdown()
    h = sink.headers[0]
    assert h["authorization"] == "Bearer secret" and h["x-tenant"] == "a" and h["Content-Encoding"] == "gzip"
    assert sink.requests()[0] == encode_spans(spans)


class GrpcSink:
    """An OTLP/gRPC endpoint on 127.0.0.1 keeping every request and its metadata; ``codes`` scripts the first answers."""

    def __init__(self, codes: list[grpc.StatusCode] | None = None, credentials: grpc.ServerCredentials | None = None) -> None:
        self.bodies: list[bytes] = []
        self.metadata: list[dict[str, str]] = []
        self.codes = list(codes or [])
        self.credentials = credentials

    async def _export(self, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        self.bodies.append(raw)
        self.metadata.append(dict(context.invocation_metadata()))
        if self.codes:
            await context.abort(self.codes.pop(0), "scripted answer")
        return b""

    async def __aenter__(self) -> GrpcSink:
        self.server = grpc.aio.server()
        service, method = EXPORT_METHOD.strip("/").split("/")
        handler = grpc.unary_unary_rpc_method_handler(self._export, request_deserializer=None, response_serializer=None)
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, {method: handler}),))
        if self.credentials is not None:
            self.port = self.server.add_secure_port("127.0.0.1:0", self.credentials)
        else:
            self.port = self.server.add_insecure_port("127.0.0.1:0")
        await self.server.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.server.stop(None)


async def test_grpc_retries_unavailable_not_invalid_argument_and_sends_headers(monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "authorization=Bearer%20secret")
    spans = tap_spans(2)
    async with GrpcSink(codes=[grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNAVAILABLE]) as sink:
        exp = make_exporter(f"grpc://127.0.0.1:{sink.port}")
        try:
            assert await asyncio.to_thread(exp.export, spans) == SpanExportResult.SUCCESS
            sink.codes = [grpc.StatusCode.INVALID_ARGUMENT]
            assert await asyncio.to_thread(exp.export, spans) == SpanExportResult.FAILURE
        finally:
            exp.shutdown()
    assert len(sink.bodies) == 4  # two retries then success; the refused one is not retried
    assert ExportTraceServiceRequest.FromString(sink.bodies[0]) == encode_spans(spans)
    assert sink.metadata[0]["authorization"] == "Bearer secret" and sink.metadata[0]["user-agent"].startswith("deltatap/")
    assert exp.last_error == f"OTLP/gRPC export to 127.0.0.1:{sink.port}: INVALID_ARGUMENT (scripted answer), attempt 1"


@pytest.fixture
def certificate(tmp_path):
    """A self-signed certificate for 127.0.0.1 (cert.pem, key.pem), made with the openssl command."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is not installed")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=30,
    )
    return cert, key


async def test_https_and_grpc_over_tls_verify_the_collector(certificate, monkeypatch):
    cert, key = certificate
    spans = tap_spans(2)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)
    grpc_creds = grpc.ssl_server_credentials([(key.read_bytes(), cert.read_bytes())])
    async with Sink(ssl_context=server_ctx) as sink, GrpcSink(credentials=grpc_creds) as gsink:
        https_url = f"https://127.0.0.1:{sink.port}"
        grpcs_url = f"https://127.0.0.1:{gsink.port}"
        # without the CA the self-signed collector is refused, with a clear reason
        untrusted = [make_exporter(https_url), make_exporter(grpcs_url, protocol="grpc")]
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_CERTIFICATE", str(cert))
        trusted = [make_exporter(https_url), make_exporter(grpcs_url, protocol="grpc")]
        with contextlib.ExitStack() as stack:
            for exp in untrusted + trusted:
                stack.callback(exp.shutdown)
            for exp in untrusted:
                exp.timeout_s = 2.0
                assert await asyncio.to_thread(exp.export, spans) == SpanExportResult.FAILURE
            assert "CERTIFICATE_VERIFY_FAILED" in untrusted[0].last_error
            assert "UNAVAILABLE" in untrusted[1].last_error
            for exp in trusted:
                assert await asyncio.to_thread(exp.export, spans) == SpanExportResult.SUCCESS
    assert [ExportTraceServiceRequest.FromString(b) for b in sink.bodies] == [encode_spans(spans)]
    assert [ExportTraceServiceRequest.FromString(b) for b in gsink.bodies] == [encode_spans(spans)]
