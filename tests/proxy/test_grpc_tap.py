"""The gRPC tap (``deltatap tap --protocol grpc``) in front of real grpcio servers (``grpc.aio``) defined here, with
grpcio clients: what a client sees through the tap is what it sees directly (messages, metadata, trailers, status,
deadline, cancellation), and the span's stamps agree with the server's own send times."""

from __future__ import annotations

import asyncio
import struct

import grpc
import pytest
from tap_helpers import event_times, wait_spans

from deltatap.collector.decompose import extract
from deltatap.collector.spans import SpanRecord
from deltatap.core.clock import mono_ns, to_unix_ns
from deltatap.core.topology import default_topology
from deltatap.core.vocab import Attr, Outcome, TapEvent
from tests.proxy.kserve_proto import STREAM_INFER, stream_response

MS = 1_000_000
TOL_NS = 2 * MS  # a read stamp within this of the server's send (as the HTTP/1.1 span tests ask)
SERVICE = "deltatap.test.Echo"
TRACE_KEYS = {"traceparent", "tracestate", "x-request-id"}  # what the tap adds or replaces (docs/tap.md)


def _ident(b: bytes) -> bytes:
    return b


class Server:
    """A grpcio server with the test's methods; each records what it saw and when it sent (same process clock)."""

    def __init__(self) -> None:
        self.metadata: list[list[tuple[str, str | bytes]]] = []
        self.sent: list[list[int]] = []  # per server-streaming call: mono_ns just before each message was written
        self.cancelled: list[int] = []
        self.got: list[list[int]] = []  # per client-streaming call: mono_ns as each request message was handed over
        self.server: grpc.aio.Server | None = None
        self.port = 0

    async def unary(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        self.metadata.append(list(context.invocation_metadata() or ()))
        if request == b"fail-now":  # no metadata sent first: a trailers-only answer (one HEADERS frame)
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, "no")
        await context.send_initial_metadata((("x-initial", "i-1"), ("x-initial-bin", b"\x00\xff")))
        if request.startswith(b"fail"):
            context.set_trailing_metadata((("x-why", "asked"),))
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "bad thing: ü 100%")
        context.set_trailing_metadata((("x-trailer", "t-1"), ("x-trailer-bin", b"\x01\x02\x03")))
        return b"echo:" + request

    async def stream(self, request: bytes, context: grpc.aio.ServicerContext) -> None:
        n, gap_ms = struct.unpack(">Id", request)
        sent: list[int] = []
        self.sent.append(sent)
        for i in range(n):
            if i:
                await asyncio.sleep(gap_ms / 1000)
            sent.append(mono_ns())
            await context.write(b"m%d" % i)

    async def slow(self, request: bytes, context: grpc.aio.ServicerContext) -> None:
        try:
            await context.write(b"first")
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            self.cancelled.append(mono_ns())
            raise

    async def collect(self, requests, context: grpc.aio.ServicerContext) -> bytes:
        parts = [r async for r in requests]
        return b"%d:" % len(parts) + b"|".join(parts)

    async def collect_timed(self, requests, context: grpc.aio.ServicerContext) -> bytes:
        got: list[int] = []
        self.got.append(got)
        n = 0
        async for r in requests:
            got.append(mono_ns())
            n += len(r)
        return b"%d" % n

    async def bidi(self, requests, context: grpc.aio.ServicerContext):
        async for r in requests:
            yield b"pong:" + r

    async def kserve(self, requests, context: grpc.aio.ServicerContext):
        rid = "r1"
        if dict(context.invocation_metadata() or ()).get("x-compress") == "gzip":
            context.set_compression(grpc.Compression.Gzip)
            rid += "-" * 300  # (grpcio sends a message uncompressed when gzip would not make it smaller)
        async for _ in requests:
            sent: list[int] = []
            self.sent.append(sent)
            texts = [None, "", "  ", "Hello", " world", ""]
            for i, text in enumerate(texts):
                if i:
                    await asyncio.sleep(0.01)
                sent.append(mono_ns())
                await context.write(stream_response(text, final=i == len(texts) - 1, rid=rid))

    async def start(self) -> None:
        h = grpc
        echo = h.method_handlers_generic_handler(SERVICE, {
            "Unary": h.unary_unary_rpc_method_handler(self.unary, _ident, _ident),
            "Stream": h.unary_stream_rpc_method_handler(self.stream, _ident, _ident),
            "Slow": h.unary_stream_rpc_method_handler(self.slow, _ident, _ident),
            "Collect": h.stream_unary_rpc_method_handler(self.collect, _ident, _ident),
            "CollectTimed": h.stream_unary_rpc_method_handler(self.collect_timed, _ident, _ident),
            "Bidi": h.stream_stream_rpc_method_handler(self.bidi, _ident, _ident),
        })
        kserve = h.method_handlers_generic_handler("inference.GRPCInferenceService", {
            "ModelStreamInfer": h.stream_stream_rpc_method_handler(self.kserve, _ident, _ident),
        })
        self.server = grpc.aio.server()
        self.server.add_generic_rpc_handlers([echo, kserve])
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        await self.server.start()


@pytest.fixture
async def server():
    s = Server()
    await s.start()
    yield s
    await s.server.stop(0)


@pytest.fixture
async def tapped(server, make_tap):
    """(server, channel straight to it, channel through a gRPC tap in front of it)."""
    tap = await make_tap(f"http://127.0.0.1:{server.port}", protocol="grpc")
    direct = grpc.aio.insecure_channel(f"127.0.0.1:{server.port}")
    via = grpc.aio.insecure_channel(f"127.0.0.1:{tap.port}")
    yield server, direct, via
    await direct.close()
    await via.close()


def _call(channel: grpc.aio.Channel, kind: str, method: str):
    return getattr(channel, kind)(f"/{SERVICE}/{method}", request_serializer=_ident, response_deserializer=_ident)


def _user_metadata(md) -> list[tuple[str, str | bytes]]:
    return [(k, v) for k, v in md if k not in TRACE_KEYS and not k.startswith(("grpc-", ":")) and k != "user-agent"]


async def test_server_streaming_stamps_match_the_server_send_times(tapped, span_exporter, telemetry):
    server, _direct, via = tapped
    n, gap_ms = 6, 20.0
    got = [m async for m in _call(via, "unary_stream", "Stream")(struct.pack(">Id", n, gap_ms), timeout=10)]
    assert got == [b"m%d" % i for i in range(n)]
    (span,) = await wait_spans(span_exporter, telemetry, 1)
    ev = event_times(span)
    sent = server.sent[-1]
    a = span.attributes
    assert a[Attr.RPC_SYSTEM] == "grpc" and a[Attr.RPC_SERVICE] == SERVICE and a[Attr.RPC_METHOD] == "Stream"
    assert a[Attr.STREAM_FORMAT] == "grpc-message" and a[Attr.FIRST_TOKEN_SOURCE] == "message"
    assert a[Attr.EVENTS] == n and a[Attr.CONTENT_EVENTS] == n and a[Attr.GRPC_MESSAGE_BYTES] == sum(len(m) for m in got)
    assert a[Attr.RPC_GRPC_STATUS] == 0 and a[Attr.OUTCOME] == Outcome.OK and a[Attr.HTTP_STATUS] == 200
    assert Attr.GENAI_OUTPUT_TOKENS not in a  # messages of an undecoded method are not tokens
    # the tap read each message after the server began writing it, and within the tolerance of it
    for name, t_sent in ((TapEvent.FIRST_MESSAGE_RECEIVED, sent[0]), (TapEvent.FIRST_TOKEN_RECEIVED, sent[0]),
                         (TapEvent.LAST_MESSAGE_RECEIVED, sent[-1]), (TapEvent.LAST_TOKEN_RECEIVED, sent[-1])):
        assert 0 <= ev[name] - to_unix_ns(t_sent) <= TOL_NS, (name, (ev[name] - to_unix_ns(t_sent)) / MS)
    # the gaps between messages as the tap saw them: the server's, within the tolerance
    server_gaps_ms = [(b - a_) / MS for a_, b in zip(sent, sent[1:])]
    assert a[Attr.GAP_COUNT] == n - 1
    assert abs(a[Attr.GAP_MEAN_MS] - sum(server_gaps_ms) / len(server_gaps_ms)) <= TOL_NS / MS
    assert a[Attr.GAP_MAX_MS] >= gap_ms - TOL_NS / MS
    order = [TapEvent.REQUEST_RECEIVED, TapEvent.REQUEST_FORWARDED, TapEvent.RESPONSE_HEADERS, TapEvent.FIRST_MESSAGE_RECEIVED,
             TapEvent.FIRST_TOKEN_FORWARDED, TapEvent.LAST_MESSAGE_RECEIVED, TapEvent.LAST_TOKEN_FORWARDED, TapEvent.RESPONSE_TRAILERS]
    assert all(ev[x] <= ev[y] for x, y in zip(order, order[1:])), [(str(x), ev.get(x)) for x in order]
    # the collector reads the span with the same model as an HTTP/1.1 tap's: the engine's first and last token
    rec = SpanRecord("0" * 32, "0" * 16, "", span.name, span.start_time, span.end_time, dict(a),
                     [(e.name, e.timestamp, None) for e in span.events])
    points = {o.point: o.unix_ns for o in extract([rec], default_topology()).obs}
    assert points["engine.first_token"] == ev[TapEvent.FIRST_TOKEN_RECEIVED]
    assert points["engine.last_token"] == ev[TapEvent.LAST_TOKEN_RECEIVED]
    assert points["firewall.out.first_in"] == ev[TapEvent.FIRST_TOKEN_FORWARDED]


async def test_unary_metadata_and_trailers_unchanged(tapped, span_exporter, telemetry):
    server, direct, via = tapped
    md = (("x-tenant", "a"), ("x-tenant", "b"), ("x-blob-bin", b"\x00\x80\xff"), ("x-request-id", "rid-7"))
    results = []
    for ch in (direct, via):
        call = _call(ch, "unary_unary", "Unary")(b"hello", metadata=md, timeout=10)
        reply = await call
        results.append((reply, list(await call.initial_metadata()), list(await call.trailing_metadata()), await call.code()))
    assert results[0][0] == results[1][0] == b"echo:hello"
    # what the server got and what the client got back: the same through the tap as directly
    assert _user_metadata(server.metadata[1]) == _user_metadata(server.metadata[0])
    assert ("x-blob-bin", b"\x00\x80\xff") in server.metadata[1] and ("x-request-id", "rid-7") in server.metadata[1]
    assert _user_metadata(results[1][1]) == _user_metadata(results[0][1]) == [("x-initial", "i-1"), ("x-initial-bin", b"\x00\xff")]
    assert _user_metadata(results[1][2]) == _user_metadata(results[0][2]) == [("x-trailer", "t-1"), ("x-trailer-bin", b"\x01\x02\x03")]
    assert results[1][3] == grpc.StatusCode.OK
    (span,) = await wait_spans(span_exporter, telemetry, 1)
    a = span.attributes
    assert a[Attr.RPC_METHOD] == "Unary" and a[Attr.EVENTS] == 1 and a[Attr.REQUEST_ID] == "rid-7"
    assert a[Attr.OUTCOME] == Outcome.OK and a[Attr.BODY_BYTES_IN] == 5 + len(b"hello")


async def test_non_ok_status_passed_through_and_recorded(tapped, span_exporter, telemetry):
    _server, direct, via = tapped
    errors = []
    for ch in (direct, via):
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await _call(ch, "unary_unary", "Unary")(b"fail", timeout=10)
        e = info.value
        errors.append((e.code(), e.details(), _user_metadata(e.trailing_metadata())))
    assert errors[1] == errors[0] == (grpc.StatusCode.INVALID_ARGUMENT, "bad thing: ü 100%", [("x-why", "asked")])
    (span,) = await wait_spans(span_exporter, telemetry, 1)
    a = span.attributes
    assert a[Attr.RPC_GRPC_STATUS] == 3 and a[Attr.ERROR_TYPE] == "INVALID_ARGUMENT"
    assert a[Attr.OUTCOME] == Outcome.HTTP_ERROR and a[Attr.EVENTS] == 0
    assert TapEvent.RESPONSE_TRAILERS in event_times(span)


async def test_trailers_only_answer(tapped, span_exporter, telemetry):
    _server, direct, via = tapped
    codes = []
    for ch in (direct, via):
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await _call(ch, "unary_unary", "Unary")(b"fail-now", timeout=10)
        codes.append((info.value.code(), info.value.details()))
    assert codes[1] == codes[0] == (grpc.StatusCode.PERMISSION_DENIED, "no")
    (span,) = await wait_spans(span_exporter, telemetry, 1)
    a, ev = span.attributes, event_times(span)
    assert a[Attr.RPC_GRPC_STATUS] == 7 and a[Attr.ERROR_TYPE] == "PERMISSION_DENIED" and a[Attr.OUTCOME] == Outcome.HTTP_ERROR
    assert TapEvent.RESPONSE_HEADERS in ev and TapEvent.RESPONSE_TRAILERS not in ev  # the status came in the headers


async def test_client_and_bidi_streaming(tapped, span_exporter, telemetry):
    _server, _direct, via = tapped
    reply = await _call(via, "stream_unary", "Collect")(iter([b"a", b"bb", b"ccc"]), timeout=10)
    assert reply == b"3:a|bb|ccc"
    call = _call(via, "stream_stream", "Bidi")(timeout=10)
    for i in range(4):  # one at a time: each answer comes back before the next request message goes
        await call.write(b"p%d" % i)
        assert await call.read() == b"pong:p%d" % i
    await call.done_writing()
    assert await call.read() == grpc.aio.EOF and await call.code() == grpc.StatusCode.OK
    spans = await wait_spans(span_exporter, telemetry, 2)
    by = {s.attributes[Attr.RPC_METHOD]: s.attributes for s in spans}
    assert by["Collect"][Attr.EVENTS] == 1 and by["Collect"][Attr.BODY_BYTES_IN] == 3 * 5 + 6
    assert by["Bidi"][Attr.EVENTS] == 4 and by["Bidi"][Attr.OUTCOME] == Outcome.OK


async def test_deadline_exceeded(tapped, span_exporter, telemetry):
    server, _direct, via = tapped
    call = _call(via, "unary_stream", "Slow")(b"", timeout=0.3)
    assert await call.read() == b"first"
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call.read()
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    for _ in range(100):  # the server's handler is cancelled at its deadline (grpc-timeout passed on by the tap)
        if server.cancelled:
            break
        await asyncio.sleep(0.02)
    assert server.cancelled
    (span,) = await wait_spans(span_exporter, telemetry, 1)
    assert span.attributes[Attr.OUTCOME] == Outcome.TIMEOUT


async def test_client_cancel_reaches_the_server(tapped, span_exporter, telemetry):
    server, _direct, via = tapped
    call = _call(via, "unary_stream", "Slow")(b"", timeout=30)
    assert await call.read() == b"first"
    t_cancel = mono_ns()
    call.cancel()
    for _ in range(100):
        if server.cancelled:
            break
        await asyncio.sleep(0.02)
    assert server.cancelled and server.cancelled[0] >= t_cancel
    (span,) = await wait_spans(span_exporter, telemetry, 1)
    a = span.attributes
    assert a[Attr.OUTCOME] == Outcome.CLIENT_CANCEL and TapEvent.DOWNSTREAM_CLOSED in event_times(span)


@pytest.mark.parametrize("compress", ["", "gzip"])
async def test_kserve_stream_infer_first_content_token(tapped, span_exporter, telemetry, compress):
    server, _direct, via = tapped
    md = (("x-compress", compress),) if compress else None
    call = via.stream_stream(STREAM_INFER, request_serializer=_ident, response_deserializer=_ident)(timeout=10, metadata=md)
    await call.write(b"")  # (an empty ModelInferRequest: the server below does not read it)
    got = [await call.read() for _ in range(6)]
    await call.done_writing()
    assert await call.read() == grpc.aio.EOF
    assert len(got) == 6
    (span,) = await wait_spans(span_exporter, telemetry, 1)
    ev, a, sent = event_times(span), span.attributes, server.sent[-1]
    assert a[Attr.STREAM_FORMAT] == "kserve-v2" and a[Attr.FIRST_TOKEN_SOURCE] == "content"
    assert a[Attr.RPC_SERVICE] == "inference.GRPCInferenceService" and a[Attr.RPC_METHOD] == "ModelStreamInfer"
    assert a[Attr.EVENTS] == 6 and a[Attr.CONTENT_EVENTS] == 3 and a[Attr.GENAI_OUTPUT_TOKENS] == 3
    assert a[Attr.GENAI_RESPONSE_MODEL] == "llm" and a[Attr.GENAI_RESPONSE_ID] == "r1" + ("-" * 300 if compress else "")
    # the first message is the empty one; the first content token is "Hello" (the 4th), 30 ms later
    assert 0 <= ev[TapEvent.FIRST_MESSAGE_RECEIVED] - to_unix_ns(sent[0]) <= TOL_NS
    assert 0 <= ev[TapEvent.FIRST_TOKEN_RECEIVED] - to_unix_ns(sent[3]) <= TOL_NS
    assert 0 <= ev[TapEvent.LAST_TOKEN_RECEIVED] - to_unix_ns(sent[4]) <= TOL_NS
    assert ev[TapEvent.FIRST_TOKEN_RECEIVED] - ev[TapEvent.FIRST_MESSAGE_RECEIVED] >= 25 * MS
    assert a[Attr.OUTCOME] == Outcome.OK and Attr.GRPC_UNDECODABLE not in a
    # gzip-compressed messages (grpc-encoding: gzip) are decompressed for the decoding: the same content found
    assert a.get(Attr.GRPC_COMPRESSED, 0) == (6 if compress else 0)


async def test_tls_upstream_with_alpn_h2(self_signed, make_tap, span_exporter, telemetry):
    cert, key = self_signed
    s = Server()
    s.server = grpc.aio.server()
    creds = grpc.ssl_server_credentials([(open(key, "rb").read(), open(cert, "rb").read())])
    handler = grpc.method_handlers_generic_handler(SERVICE, {"Stream": grpc.unary_stream_rpc_method_handler(s.stream, _ident, _ident)})
    s.server.add_generic_rpc_handlers([handler])
    port = s.server.add_secure_port("127.0.0.1:0", creds)
    await s.server.start()
    try:
        tap = await make_tap(f"https://127.0.0.1:{port}", protocol="grpc", verify_tls=False)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{tap.port}") as ch:
            got = [m async for m in _call(ch, "unary_stream", "Stream")(struct.pack(">Id", 3, 1.0), timeout=10)]
        assert got == [b"m0", b"m1", b"m2"]
        (span,) = await wait_spans(span_exporter, telemetry, 1)
        assert span.attributes[Attr.EVENTS] == 3 and span.attributes[Attr.RPC_GRPC_STATUS] == 0
    finally:
        await s.server.stop(0)


async def test_http1_to_a_grpc_tap_is_closed_and_counted(server, make_tap, span_exporter, telemetry):
    tap = await make_tap(f"http://127.0.0.1:{server.port}", protocol="grpc")
    reader, writer = await asyncio.open_connection("127.0.0.1", tap.port)
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert await asyncio.wait_for(reader.read(), 5) == b""  # closed, nothing answered
    writer.close()
    assert tap.tap.counters.not_http2 == 1
    assert await wait_spans(span_exporter, telemetry, 1, timeout_s=0.2) == []


async def test_client_streaming_request_messages_stamped(tapped, span_exporter, telemetry):
    """Each request message's arrival and forwarding: the first and the last lie between the client's send and the
    server's receipt of that message (causal order only: no timing figure), with the count and payload bytes."""
    server, _direct, via = tapped
    msgs = [b"x" * 10, b"y" * 2000, b"z" * 30, b"w" * 7]
    sent: list[int] = []

    async def requests():
        for i, m in enumerate(msgs):
            if i:
                await asyncio.sleep(0.03)
            sent.append(mono_ns())
            yield m

    reply = await _call(via, "stream_unary", "CollectTimed")(requests(), timeout=10)
    assert reply == b"%d" % sum(map(len, msgs))
    (span,) = await wait_spans(span_exporter, telemetry, 1)
    ev, a, got = event_times(span), span.attributes, server.got[-1]
    assert a[Attr.GRPC_REQUEST_MESSAGES] == len(msgs) and a[Attr.GRPC_REQUEST_MESSAGE_BYTES] == sum(map(len, msgs))
    assert len(got) == len(msgs)
    first = (TapEvent.FIRST_REQUEST_MESSAGE_RECEIVED, TapEvent.FIRST_REQUEST_MESSAGE_FORWARDED)
    last = (TapEvent.LAST_REQUEST_MESSAGE_RECEIVED, TapEvent.LAST_REQUEST_MESSAGE_FORWARDED)
    for (rcv, fwd), t_sent, t_got in ((first, sent[0], got[0]), (last, sent[-1], got[-1])):
        assert to_unix_ns(t_sent) <= ev[rcv] <= ev[fwd] <= to_unix_ns(t_got), (rcv, [(ev[x] - to_unix_ns(t_sent)) / MS for x in (rcv, fwd)])
    # the request phase spans the client's sending: its last message came after its first, the sleeps apart
    assert ev[TapEvent.LAST_REQUEST_MESSAGE_RECEIVED] - ev[TapEvent.FIRST_REQUEST_MESSAGE_RECEIVED] >= sent[-1] - got[0]
    assert ev[TapEvent.LAST_REQUEST_MESSAGE_FORWARDED] <= ev[TapEvent.RESPONSE_HEADERS]
    assert a[Attr.OUTCOME] == Outcome.OK


async def test_bidi_request_messages_counted_and_unary_has_one(tapped, span_exporter, telemetry):
    _server, _direct, via = tapped
    assert await _call(via, "unary_unary", "Unary")(b"hello", timeout=10) == b"echo:hello"
    call = _call(via, "stream_stream", "Bidi")(timeout=10)
    for i in range(3):
        await call.write(b"p%d" % i)
        assert await call.read() == b"pong:p%d" % i
    await call.done_writing()
    assert await call.read() == grpc.aio.EOF
    by = {s.attributes[Attr.RPC_METHOD]: s for s in await wait_spans(span_exporter, telemetry, 2)}
    u, b = by["Unary"].attributes, by["Bidi"].attributes
    assert (u[Attr.GRPC_REQUEST_MESSAGES], u[Attr.GRPC_REQUEST_MESSAGE_BYTES]) == (1, 5)
    assert (b[Attr.GRPC_REQUEST_MESSAGES], b[Attr.GRPC_REQUEST_MESSAGE_BYTES]) == (3, 6)
    ev = event_times(by["Bidi"])
    # bidi: the last request message went after the first response message came back (one at a time above)
    assert ev[TapEvent.FIRST_REQUEST_MESSAGE_FORWARDED] <= ev[TapEvent.FIRST_MESSAGE_RECEIVED] <= ev[TapEvent.LAST_REQUEST_MESSAGE_RECEIVED]


async def test_grpc_spans_through_collect_and_report(server, tmp_path):
    """A gRPC tap's spans exported over OTLP to a collector in this process (``deltatap collect``'s service), then its
    output directory through ``deltatap report``: each call is a row with the engine's first token and the outcome
    its grpc-status gives."""
    import json
    import subprocess
    import sys

    from deltatap.collector.pipeline import PipelineOptions
    from deltatap.collector.service import CollectorOptions, start_collector
    from deltatap.proxy import TapOptions, start_tap
    from deltatap.telemetry.tracer import setup_telemetry

    topo = default_topology()
    out = tmp_path / "collect"
    collector = await start_collector(CollectorOptions(otlp_grpc=None, otlp_http="127.0.0.1:0", metrics=None, topology=topo, out_dir=out,
                                                       rows_format="jsonl", pipeline=PipelineOptions(grace_s=0.3)))
    tel = setup_telemetry("deltatap-tap-fw-engine", otlp=collector.otlp_http_url)
    tap = None
    try:
        tap = await start_tap(TapOptions(link="fw-engine", upstream=f"http://127.0.0.1:{server.port}", listen_port=0, admin_port=None,
                                         protocol="grpc"), tel)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{tap.port}") as ch:
            call = ch.stream_stream(STREAM_INFER, request_serializer=_ident, response_deserializer=_ident)(timeout=10)
            await call.write(b"")
            assert len([await call.read() for _ in range(6)]) == 6
            await call.done_writing()
            assert await call.read() == grpc.aio.EOF
            with pytest.raises(grpc.aio.AioRpcError):
                await _call(ch, "unary_unary", "Unary")(b"fail", timeout=10)
        await tap.close(1)
        tap = None
        await asyncio.to_thread(tel.processor.force_flush, 5_000)
        for _ in range(200):
            if len(collector.rows()) >= 2:
                break
            await asyncio.sleep(0.05)
        rows = collector.rows()
    finally:
        if tap is not None:
            await tap.close(0)
        await asyncio.to_thread(tel.shutdown)
        files = await collector.close()
    assert len(rows) == 2, rows
    by = {r.outcome: r for r in rows}
    ok, bad = by[Outcome.OK], by[Outcome.HTTP_ERROR]
    sent = server.sent[-1]
    t7 = ok.t("t7")
    assert t7 is not None and 0 <= t7.unix_ns - to_unix_ns(sent[3]) <= TOL_NS  # the first *content* message ("Hello")
    assert ok.t("t6") is not None and ok.t("t6").unix_ns <= to_unix_ns(sent[0]) <= t7.unix_ns
    assert ok.t("t8") is not None and ok.t("t9") is not None and ok.tokens_out == 3
    assert ok.deltas, ok  # engine-side deltas from the one tap (firewall outbound first token...)
    assert bad.t("t7") is None and bad.http_status == 200  # an error status: no token, the HTTP status of a gRPC answer
    # the collector's output directory through `deltatap report`: the same two requests, by outcome
    assert files
    proc = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "deltatap.app.cli", "report", "--from", str(out), "--format", "json"],
                                   capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    rep = json.loads(proc.stdout)
    assert rep["tap_fw-engine_request"]["count"] == 2 and rep["tap_fw-engine_first_token"]["count"] == 1
    # the bidi call's request point is the request message the answers respond to, not the client's end of stream
    # (after the answers): the engine's TTFT and time to last token are not negative
    assert rep["engine_ttft"]["count"] == 1 and rep["engine_ttft"]["min_ms"] >= 0 and rep["engine_ttlt"]["min_ms"] >= 0


async def test_a_topology_file_starts_a_grpc_tap(server, tmp_path, telemetry, span_exporter, capsys):
    """``links[].tap.protocol: grpc`` in a topology file: the tap it starts (``deltatap tap --config FILE --link L``'s
    options) is a gRPC tap; a bad value is one line from the CLI, as is a gRPC tap asked of the reference stack."""
    from deltatap.app.cli import main
    from deltatap.core.topology import load_topology
    from deltatap.proxy import options_from_topology, start_tap
    from deltatap.proxy.options import require_http_tap

    cfg = tmp_path / "grpc.yaml"
    cfg.write_text(f"""
components:
  - {{name: client, kind: client}}
  - {{name: triton, kind: engine, url: "http://127.0.0.1:{server.port}"}}
links:
  - {{name: edge, downstream: client, upstream: triton, tap: {{listen: "127.0.0.1:0", protocol: grpc}}}}
""")
    topo = load_topology(cfg)
    opts = options_from_topology(topo, "edge", admin_port=None)
    assert opts.protocol == "grpc"
    tap = await start_tap(opts, telemetry)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{tap.port}") as ch:
            assert await _call(ch, "unary_unary", "Unary")(b"hi", timeout=10) == b"echo:hi"
        reader, writer = await asyncio.open_connection("127.0.0.1", tap.port)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert await asyncio.wait_for(reader.read(), 5) == b""  # an HTTP/1.1 client: closed, as --protocol grpc does
        writer.close()
        assert tap.tap.counters.not_http2 == 1
    finally:
        await tap.close(1)
    (span,) = await wait_spans(span_exporter, telemetry, 1)
    assert span.attributes[Attr.RPC_METHOD] == "Unary" and span.attributes[Attr.LINK] == "edge"
    with pytest.raises(Exception, match="links\\[edge\\].tap.protocol is 'grpc'.*speaks HTTP"):
        require_http_tap(topo, "edge")
    cfg.write_text(cfg.read_text().replace("protocol: grpc", "protocol: grcp"))
    capsys.readouterr()
    assert main(["tap", "--config", str(cfg), "--link", "edge", "--no-admin"]) == 2
    err = capsys.readouterr().err
    assert "links.0.tap.protocol: must be one of http, grpc (got 'grcp')" in err and "Traceback" not in err


@pytest.mark.parametrize("argv", [["stack", "all", "--taps", "--ephemeral", "--config"], ["demo", "--out", "{out}", "--config"]])
def test_the_reference_stack_refuses_a_grpc_tap_in_one_line(argv, tmp_path, capsys):
    """``deltatap stack all --taps`` and ``deltatap demo`` put taps between HTTP components: a topology asking for a gRPC
    tap there is one line and exit status 2, before anything starts."""
    from deltatap.app.cli import main
    from deltatap.core.config import find_config

    text = find_config("demo").read_text()
    assert text.count('tap: {listen: "127.0.0.1:9300"') == 1
    cfg = tmp_path / "demo.yaml"
    cfg.write_text(text.replace('tap: {listen: "127.0.0.1:9300"', 'tap: {protocol: grpc, listen: "127.0.0.1:9300"'))
    assert main([a.replace("{out}", str(tmp_path / "out")) for a in argv] + [str(cfg)]) == 2
    err = capsys.readouterr().err.strip()
    assert "links[fw-engine].tap.protocol is 'grpc'" in err and "speaks HTTP" in err and len(err.splitlines()) == 1, err
