"""HTTP/2 through the tap: real h2 peers on 127.0.0.1 (a server built on ``h2``, curl with nghttp2, an h2 client).

What a client and the upstream see through the tap is compared with what they see directly (header lists, bodies,
trailers, resets); the tap's stamps are checked against the server's own write stamps (the truth tolerance of the
HTTP/1.1 span tests: within 2 ms, never before); no timing claim beyond that.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import shutil
import ssl

import h2.config
import h2.connection
import h2.errors
import h2.events
import hpack
import pytest
from h2_peer import H2Client, start_h2_peer
from tap_helpers import event_times, free_port, wait_spans

from deltatap.core.clock import to_unix_ns
from deltatap.core.vocab import Attr, TapEvent, parse_stamp_bounds

MS = 1_000_000
SSE_TAIL = "first_ms=40&gap_ms=5&n=5"


@pytest.fixture
async def peer():
    p = await start_h2_peer()
    yield p
    await p.close()


def req(port: int, path: str, method: bytes = b"POST", extra: list[tuple[bytes, bytes]] | None = None) -> list[tuple[bytes, bytes]]:
    return [(b":method", method), (b":path", path.encode()), (b":scheme", b"http"), (b":authority", f"127.0.0.1:{port}".encode()),
            *(extra or [])]


async def curl(url: str, *args: str) -> bytes:
    """``curl --http2-prior-knowledge ARGS URL`` (its exit status checked); ``ARGS`` may hold more URLs after ``--next``."""
    proc = await asyncio.create_subprocess_exec("curl", "-sS", "--http2-prior-knowledge", "--max-time", "10", url, *args,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 15)
    assert proc.returncode == 0, err.decode()
    return out


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
async def test_curl_prior_knowledge_sse_same_bytes_and_span_stamped_per_data_frame(peer, make_tap, span_exporter, telemetry):
    tap = await make_tap(peer.url)
    body = json.dumps({"model": "m", "messages": [], "max_tokens": 9, "stream": True})
    direct = await curl(f"{peer.url}/v1/chat/completions?{SSE_TAIL}", "-d", body)
    through = await curl(f"{tap.url}/v1/chat/completions?{SSE_TAIL}", "-d", body)
    assert through == direct and through.count(b"data: ") == 8
    (span,) = await wait_spans(span_exporter, telemetry, 1)
    ev = event_times(span)
    order = [TapEvent.REQUEST_RECEIVED, TapEvent.REQUEST_BODY_RECEIVED, TapEvent.REQUEST_FORWARDED, TapEvent.RESPONSE_HEADERS,
             TapEvent.RESPONSE_HEADERS_FORWARDED, TapEvent.FIRST_TOKEN_RECEIVED, TapEvent.FIRST_TOKEN_FORWARDED,
             TapEvent.LAST_TOKEN_RECEIVED, TapEvent.RESPONSE_END]
    assert set(map(str, order)) | {str(TapEvent.LAST_TOKEN_FORWARDED)} == {e.name for e in span.events}
    assert all(ev[x] <= ev[y] for x, y in zip(order, order[1:]))
    # the server's own write stamps: the tap read each token's DATA frame within 2 ms after it left, never before
    tokens = peer.log.token_written[-1]
    assert 0 <= ev[TapEvent.FIRST_TOKEN_RECEIVED] - to_unix_ns(tokens[0]) <= 2 * MS
    assert 0 <= ev[TapEvent.LAST_TOKEN_RECEIVED] - to_unix_ns(tokens[-1]) <= 2 * MS
    assert 0 <= ev[TapEvent.RESPONSE_HEADERS] - to_unix_ns(peer.log.head_written[-1]) <= 2 * MS
    assert ev[TapEvent.FIRST_TOKEN_RECEIVED] - ev[TapEvent.RESPONSE_HEADERS] >= 38 * MS
    a = span.attributes
    assert a[Attr.STREAM_FORMAT] == "openai-chat" and a[Attr.EVENTS] == 8 and a[Attr.CONTENT_EVENTS] == 5
    assert a[Attr.GAP_COUNT] == 4 and a[Attr.GAP_MAX_MS] >= 4
    assert a[Attr.HTTP_STATUS] == 200 and a[Attr.OUTCOME] == "ok" and a[Attr.HTTP_METHOD] == "POST"
    assert a[Attr.URL_PATH] == "/v1/chat/completions" and a[Attr.GENAI_REQUEST_MAX_TOKENS] == 9
    assert a[Attr.GENAI_OUTPUT_TOKENS] == 5 and a[Attr.BODY_BYTES_IN] == len(body) and a[Attr.BODY_BYTES_OUT] == len(through)
    assert a[Attr.OVERHEAD_FIRST_TOKEN_NS] == ev[TapEvent.FIRST_TOKEN_FORWARDED] - ev[TapEvent.FIRST_TOKEN_RECEIVED]
    assert a[Attr.CHUNKS] == 8  # one per DATA frame the upstream sent
    # the upstream's view: the request's header list as curl sent it (seen directly), plus the trace context
    direct_h, tapped_h = peer.log.requests
    assert [h for h in tapped_h if h[0] not in (b"traceparent", b"x-request-id", b":authority")] == \
        [h for h in direct_h if h[0] != b":authority"]
    assert dict(tapped_h)[b"x-request-id"].decode() == a[Attr.REQUEST_ID]
    assert dict(tapped_h)[b"traceparent"].decode().split("-")[2] == f"{span.context.span_id:016x}"


async def test_header_lists_pass_unchanged_but_the_trace_context(peer, make_tap, span_exporter, telemetry):
    tap = await make_tap(peer.url)
    parent = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    extra = [(b"x-tenant", b"a"), (b"cookie", b"a=1"), (b"x-tenant", b"b"), (b"cookie", b"b=2"), (b"traceparent", parent),
             (b"tracestate", b"k=v"), (b"x-request-id", b"rid-1"), (b"x-odd", b"\x80\xff caf\xe9"),
             hpack.NeverIndexedHeaderTuple(b"authorization", b"Bearer s3cret"), (b"accept", b"*/*")]
    c = await H2Client().connect("127.0.0.1", tap.port)
    try:
        r = await c.wait(c.request(req(tap.port, "/v1/chat/completions?first_ms=1&gap_ms=1&n=2", extra=extra)))
    finally:
        await c.close()
    assert r.status == 200 and r.headers == [(b":status", b"200"), (b"content-type", b"text/event-stream"), (b"x-upstream", b"h2-peer")]
    (got,) = peer.log.requests
    (span,) = await wait_spans(span_exporter, telemetry, 1)
    sent = req(tap.port, "/v1/chat/completions?first_ms=1&gap_ms=1&n=2", extra=extra)
    kept = [h for h in sent if h[0] not in (b"traceparent", b"tracestate")]
    assert got[: len(kept)] == kept  # order, duplicates, cookie crumbs, obs-text bytes, as sent
    assert isinstance(got[kept.index((b"authorization", b"Bearer s3cret"))], hpack.NeverIndexedHeaderTuple)
    tp = dict(got[len(kept):])
    assert set(tp) == {b"traceparent", b"tracestate"}  # the correlation header was there: none added
    assert tp[b"traceparent"].startswith(b"00-4bf92f3577b34da6a3ce929d0e0e4736-") and tp[b"traceparent"] != parent
    assert tp[b"tracestate"] == b"k=v"
    assert span.parent.span_id == 0x00F067AA0BA902B7 and span.attributes[Attr.REQUEST_ID] == "rid-1"


async def test_many_concurrent_streams_on_one_connection(peer, make_tap, span_exporter, telemetry):
    tap = await make_tap(peer.url)
    c = await H2Client().connect("127.0.0.1", tap.port)
    n = 60  # (over h2's default of 100 concurrent streams it would queue: 60 stay within)
    try:
        sids = [c.request(req(tap.port, f"/v1/chat/completions?first_ms={10 + i % 7}&gap_ms=2&n=3", extra=[(b"x-i", str(i).encode())]))
                for i in range(n)]
        replies = await asyncio.gather(*(c.wait(s) for s in sids))
    finally:
        await c.close()
    assert all(r.status == 200 and r.data.count(b"data: ") == 6 and r.reset is None for r in replies)
    assert peer.log.connections == 1  # one upstream connection for the one downstream connection
    spans = await wait_spans(span_exporter, telemetry, n)
    assert len(spans) == n
    ids = {s.attributes[Attr.REQUEST_ID] for s in spans}
    assert ids == {dict(h)[b"x-request-id"].decode() for h in peer.log.requests} and len(ids) == n
    assert all(s.attributes[Attr.CONTENT_EVENTS] == 3 and TapEvent.FIRST_TOKEN_FORWARDED in event_times(s) for s in spans)
    # every stamp's interval, where one is given, is a real one (a write that waited is bounded, never negative)
    assert all(b >= 0 and f >= 0 for s in spans for b, f in parse_stamp_bounds(s.attributes.get(Attr.STAMP_BOUNDS, "")).values())


async def test_large_bodies_trailers_and_103_both_ways(peer, make_tap, span_exporter, telemetry):
    tap = await make_tap(peer.url)
    body = random.Random(7).randbytes(300_000)  # beyond every initial window: flow control both ways
    trailers = [(b"x-checksum", b"abc"), (b"x-more", b"1")]
    c = await H2Client().connect("127.0.0.1", tap.port)
    try:
        sid = c.open(req(tap.port, "/echo", extra=[(b"x-early-hints", b"1"), (b"te", b"trailers")]))
        await c.send_body(sid, body, trailers)
        r = await c.wait(sid)
    finally:
        await c.close()
    assert bytes(r.data) == body and r.reset is None
    assert r.informational == [[(b":status", b"103"), (b"link", b"</a.css>; rel=preload")]]
    assert r.headers[0] == (b":status", b"200") and r.trailers == trailers and peer.log.trailers == [trailers]
    (span,) = await wait_spans(span_exporter, telemetry, 1)
    a = span.attributes
    assert a[Attr.BODY_BYTES_IN] == a[Attr.BODY_BYTES_OUT] == len(body) and a[Attr.OUTCOME] == "ok"


async def test_backpressure_a_client_that_stops_reading_stops_the_upstream(peer, make_tap):
    tap = await make_tap(peer.url)
    body = random.Random(3).randbytes(1_000_000)
    c = await H2Client(auto_ack=False).connect("127.0.0.1", tap.port)
    try:
        sid = c.open(req(tap.port, "/echo"))
        await c.send_body(sid, body)
        for _ in range(100):  # bounded: until the upstream is stopped by the windows
            await asyncio.sleep(0.02)
            if peer.log.echo_sent and len(c.replies[sid].data) >= 65_535:
                break
        await asyncio.sleep(0.2)
        sent = peer.log.echo_sent[0]
        # the client's window (64 KiB) plus the tap's own window toward the upstream (64 KiB), nothing more
        assert sent <= 2 * 65_535 and len(c.replies[sid].data) <= 65_535
        for _ in range(400):
            c.ack(sid)
            if c.replies[sid].done.is_set():
                break
            await asyncio.sleep(0.01)
        r = await c.wait(sid)
    finally:
        await c.close()
    assert bytes(r.data) == body


async def test_client_reset_reaches_the_upstream(peer, make_tap, span_exporter, telemetry):
    tap = await make_tap(peer.url)
    c = await H2Client().connect("127.0.0.1", tap.port)
    try:
        sid = c.request(req(tap.port, "/hang"))
        for _ in range(200):
            await asyncio.sleep(0.01)
            if c.replies[sid].headers is not None:
                break
        c.reset(sid, h2.errors.ErrorCodes.CANCEL)
        for _ in range(200):
            await asyncio.sleep(0.01)
            if peer.log.resets:
                break
    finally:
        await c.close()
    assert [code for code, _t in peer.log.resets] == [h2.errors.ErrorCodes.CANCEL]
    (span,) = await wait_spans(span_exporter, telemetry, 1)
    assert span.attributes[Attr.OUTCOME] == "client_cancel" and TapEvent.DOWNSTREAM_CLOSED in event_times(span)


async def test_upstream_reset_reaches_the_client(peer, make_tap, span_exporter, telemetry):
    tap = await make_tap(peer.url)
    c = await H2Client().connect("127.0.0.1", tap.port)
    try:
        r = await c.wait(c.request(req(tap.port, f"/reset?code={int(h2.errors.ErrorCodes.ENHANCE_YOUR_CALM)}")))
        r2 = await c.wait(c.request(req(tap.port, "/v1/chat/completions?first_ms=1&gap_ms=1&n=1")))  # the connection lives on
    finally:
        await c.close()
    assert r.reset == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM and r.status == 200 and r.data.startswith(b"data: ")
    assert r2.status == 200 and r2.reset is None
    spans = await wait_spans(span_exporter, telemetry, 2)
    bad = next(s for s in spans if s.attributes[Attr.URL_PATH] == "/reset")
    assert bad.attributes[Attr.ERROR_TYPE] == "upstream_reset" and "ENHANCE_YOUR_CALM" in bad.attributes[Attr.ERROR_CAUSE]


async def test_unreachable_upstream_answers_each_stream_with_502(make_tap, span_exporter, telemetry):
    port = free_port()
    tap = await make_tap(f"http://127.0.0.1:{port}")
    c = await H2Client().connect("127.0.0.1", tap.port)
    try:
        r = await c.wait(c.request(req(tap.port, "/v1/chat/completions")))
    finally:
        await c.close()
    assert r.status == 502 and json.loads(r.data)["error"]["type"] == "upstream_unreachable"
    (span,) = await wait_spans(span_exporter, telemetry, 1)
    assert span.attributes[Attr.OUTCOME] == "upstream_error"


async def test_tls_upstream_with_alpn_h2(self_signed, make_tap, span_exporter, telemetry):
    cert, key = self_signed
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    p = await start_h2_peer(ctx)
    try:
        tap = await make_tap(p.url, verify_tls=False)
        out = await curl(f"{tap.url}/v1/chat/completions?first_ms=1&gap_ms=1&n=2", "-d", "{}")
    finally:
        await p.close()
    assert out.count(b"data: ") == 5 and p.log.connections == 1
    (span,) = await wait_spans(span_exporter, telemetry, 1)
    assert span.attributes[Attr.OUTCOME] == "ok" and span.attributes[Attr.CONTENT_EVENTS] == 2


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
async def test_upstream_goaway_lets_the_stream_in_flight_finish(peer, make_tap, span_exporter, telemetry):
    tap = await make_tap(peer.url)
    urls = [f"/goaway?{SSE_TAIL}", f"/v1/chat/completions?{SSE_TAIL}"]
    direct = await curl(peer.url + urls[0], "-d", "{}", "--next", "--http2-prior-knowledge", "-d", "{}", peer.url + urls[1])
    assert peer.log.connections == 2  # curl opened a second connection after the GOAWAY
    through = await curl(tap.url + urls[0], "-d", "{}", "--next", "--http2-prior-knowledge", "-d", "{}", tap.url + urls[1])
    assert through == direct and through.count(b"data: [DONE]") == 2
    assert peer.log.connections == 4
    spans = await wait_spans(span_exporter, telemetry, 2)
    assert sorted(s.attributes[Attr.OUTCOME] for s in spans) == ["ok", "ok"]


async def test_upstream_connection_lost_ends_the_clients_connection_as_directly(peer, make_tap, span_exporter, telemetry):
    async def scenario(port: int) -> tuple:
        c = await H2Client().connect("127.0.0.1", port)
        try:
            started = c.request(req(port, "/hang"))
            for _ in range(200):
                await asyncio.sleep(0.01)
                if c.replies[started].headers is not None:
                    break
            closed = c.request(req(port, "/close"))
            r_closed, r_started = await c.wait(closed), await c.wait(started)
            await asyncio.wait_for(c.closed.wait(), 10)
        finally:
            await c.close()
        return (r_closed.headers, r_closed.reset, r_started.status, r_started.reset, bytes(r_started.data))

    direct = await scenario(peer.port)
    tap = await make_tap(peer.url)
    through = await scenario(tap.port)
    assert through == direct == (None, None, 200, None, b"")  # the connection simply ends, for both streams, both ways
    spans = await wait_spans(span_exporter, telemetry, 2)
    assert sorted(s.attributes[Attr.ERROR_TYPE] for s in spans) == ["upstream_closed", "upstream_closed"]
    assert all(s.attributes[Attr.OUTCOME] == "upstream_error" and TapEvent.UPSTREAM_CLOSED in event_times(s) for s in spans)


async def test_streams_beyond_the_upstreams_concurrency_limit_wait_for_it(make_tap, span_exporter, telemetry):
    p = await start_h2_peer(max_streams=3)
    try:
        tap = await make_tap(p.url)
        c = await H2Client().connect("127.0.0.1", tap.port)
        try:  # (opened before the upstream's SETTINGS reach the client through the tap)
            sids = [c.request(req(tap.port, "/v1/chat/completions?first_ms=5&gap_ms=1&n=2")) for _ in range(12)]
            replies = await asyncio.gather(*(c.wait(s) for s in sids))
            limit = c.conn.remote_settings.max_concurrent_streams
        finally:
            await c.close()
    finally:
        await p.close()
    assert all(r.status == 200 and r.reset is None and r.data.endswith(b"data: [DONE]\n\n") for r in replies)
    assert limit == 3  # the upstream's limit, mirrored as the tap's own
    assert len(await wait_spans(span_exporter, telemetry, 12)) == 12


async def test_tap_timeout_answers_504_or_resets_both_sides(peer, make_tap, span_exporter, telemetry):
    tap = await make_tap(peer.url, timeout_s=1.0)
    c = await H2Client().connect("127.0.0.1", tap.port)
    try:
        silent, begun = c.request(req(tap.port, "/silent")), c.request(req(tap.port, "/hang"))
        r_silent, r_begun = await c.wait(silent), await c.wait(begun)
    finally:
        await c.close()
    assert r_silent.status == 504 and json.loads(r_silent.data)["error"]["type"] == "upstream_timeout"
    assert r_begun.status == 200 and r_begun.reset == h2.errors.ErrorCodes.CANCEL
    assert sorted(code for code, _t in peer.log.resets) == [h2.errors.ErrorCodes.CANCEL] * 2  # the upstream's streams cancelled
    spans = await wait_spans(span_exporter, telemetry, 2)
    assert [s.attributes[Attr.OUTCOME] for s in spans] == ["timeout", "timeout"]


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
async def test_tls_toward_the_client_with_alpn_h2(peer, make_tap, self_signed, span_exporter, telemetry):
    cert, key = self_signed
    tap = await make_tap(peer.url, tls_cert=str(cert), tls_key=str(key))
    out = await curl(f"{tap.url}/v1/chat/completions?{SSE_TAIL}", "--cacert", str(cert), "-d", "{}", "-w", "\\n%{http_version}")
    assert out.endswith(b"data: [DONE]\n\n\n2") and out.count(b"data: ") == 8  # curl negotiated h2 with the tap
    ctx = ssl.create_default_context(cafile=str(cert))
    c = await H2Client().connect("127.0.0.1", tap.port, ssl_context=ctx)
    try:
        sids = [c.request(req(tap.port, "/v1/chat/completions?first_ms=5&gap_ms=1&n=2")) for _ in range(5)]
        replies = await asyncio.gather(*(c.wait(s) for s in sids))
    finally:
        await c.close()
    assert all(r.status == 200 and r.data.endswith(b"data: [DONE]\n\n") for r in replies)
    spans = await wait_spans(span_exporter, telemetry, 6)
    assert len(spans) == 6 and all(s.attributes[Attr.OUTCOME] == "ok" for s in spans)
    (curl_span,) = [s for s in spans if s.attributes[Attr.CONTENT_EVENTS] == 5]  # (the h2 client's streams carry 2)
    ev = event_times(curl_span)
    assert 0 <= ev[TapEvent.FIRST_TOKEN_RECEIVED] - to_unix_ns(peer.log.token_written[0][0]) <= 2 * MS


async def test_tls_tap_offers_h2_only_where_the_upstream_speaks_it(upstream, make_tap, self_signed):
    cert, key = self_signed
    tap = await make_tap(upstream.url, tls_cert=str(cert), tls_key=str(key))  # an aiohttp (HTTP/1.1) upstream
    ctx = ssl.create_default_context(cafile=str(cert))
    ctx.set_alpn_protocols(["h2", "http/1.1"])
    _r, w = await asyncio.open_connection("127.0.0.1", tap.port, ssl=ctx, server_hostname="localhost")
    try:
        assert w.get_extra_info("ssl_object").selected_alpn_protocol() == "http/1.1"
    finally:
        w.close()


async def test_a_preface_split_across_reads_is_still_http2_and_a_split_http1_request_still_http1(peer, upstream, make_tap):
    tap = await make_tap(peer.url)
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
    client.initiate_connection()
    client.send_headers(1, req(tap.port, "/v1/chat/completions?first_ms=1&gap_ms=1&n=1"), end_stream=True)
    wire = client.data_to_send()
    reader, writer = await asyncio.open_connection("127.0.0.1", tap.port)
    try:
        for piece in (wire[:1], wire[1:9], wire[9:30], wire[30:]):  # (the 24-byte preface in three reads)
            writer.write(piece)
            await writer.drain()
            await asyncio.sleep(0.02)
        got: list = []
        async with asyncio.timeout(10):
            while not any(isinstance(e, h2.events.StreamEnded) for e in got):
                data = await reader.read(65536)
                assert data, "the tap closed the connection"
                got += client.receive_data(data)
                writer.write(client.data_to_send())
    finally:
        writer.close()
    (resp,) = [e for e in got if isinstance(e, h2.events.ResponseReceived)]
    assert dict(resp.headers)[b":status"] == b"200"
    # an HTTP/1.1 request whose first read is the one byte it shares with the preface
    tap1 = await make_tap(upstream.url)
    reader, writer = await asyncio.open_connection("127.0.0.1", tap1.port)
    try:
        writer.write(b"P")
        await writer.drain()
        await asyncio.sleep(0.02)
        writer.write(b"OST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi")
        answer = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
    assert answer.startswith(b"HTTP/1.1 200") and b"x-body-len: 2" in answer.lower()


async def test_host_header_and_upstream_path_prefix_as_for_http1(peer, make_tap):
    tap = await make_tap(peer.url + "/v1", host_header="engine.internal")
    c = await H2Client().connect("127.0.0.1", tap.port)
    try:
        r = await c.wait(c.request(req(tap.port, "/chat/completions?first_ms=1&gap_ms=1&n=1", extra=[(b"host", f"127.0.0.1:{tap.port}".encode())])))
    finally:
        await c.close()
    assert r.status == 200
    (got,) = peer.log.requests
    h = dict(got)
    assert h[b":path"] == b"/v1/chat/completions?first_ms=1&gap_ms=1&n=1" and h[b":authority"] == b"engine.internal"
    assert b"host" not in h and [n for n, _v in got][:4] == [b":method", b":path", b":scheme", b":authority"]


async def test_tap_shutdown_sends_goaway_and_lets_streams_in_flight_finish(peer, make_tap, span_exporter, telemetry):
    tap = await make_tap(peer.url)
    c = await H2Client().connect("127.0.0.1", tap.port)
    try:
        sid = c.request(req(tap.port, "/v1/chat/completions?first_ms=1000&gap_ms=5&n=3"))
        for _ in range(200):
            await asyncio.sleep(0.01)
            if c.replies[sid].headers is not None:
                break
        closing = asyncio.ensure_future(tap.close(grace_s=5))
        for _ in range(200):
            await asyncio.sleep(0.01)
            if c.goaway is not None:
                break
        assert (c.goaway, c.goaway_last) == (h2.errors.ErrorCodes.NO_ERROR, sid)
        assert not c.replies[sid].done.is_set()  # told before its stream ended
        r = await c.wait(sid)
        await asyncio.wait_for(closing, 10)
    finally:
        await c.close()
    assert r.reset is None and r.data.endswith(b"data: [DONE]\n\n") and r.data.count(b'"content": "t') == 3
    (span,) = await wait_spans(span_exporter, telemetry, 1)
    assert span.attributes[Attr.OUTCOME] == "ok"


async def test_a_client_that_breaks_the_protocol_gets_goaway_and_one_log_line(peer, make_tap, caplog):
    caplog.set_level(logging.INFO, logger="deltatap.tap")
    tap = await make_tap(peer.url)
    reader, writer = await asyncio.open_connection("127.0.0.1", tap.port)
    try:
        writer.write(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x01\x00\x00\x00\x00\x00\x00x")  # (DATA on stream 0)
        got = await asyncio.wait_for(reader.read(), 10)  # (until the tap closes the connection)
    finally:
        writer.close()
    frames = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    frames.initiate_connection()
    events = frames.receive_data(got)
    assert any(isinstance(e, h2.events.ConnectionTerminated) and e.error_code == h2.errors.ErrorCodes.PROTOCOL_ERROR for e in events)
    assert [r.getMessage() for r in caplog.records if "broke the protocol" in r.getMessage()] and \
        not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL") or r.exc_info]
    assert peer.log.connections == 0  # nothing reached the upstream


async def test_connection_windows_enlarged_by_a_peer_are_mirrored_to_the_other(make_tap):
    p = await start_h2_peer(window=4 << 20)  # the upstream lets its client send 4 MiB on the connection
    try:
        tap = await make_tap(p.url)
        c = await H2Client().connect("127.0.0.1", tap.port, window=8 << 20)  # the client lets its server send 8 MiB
        try:
            r = await c.wait(c.request(req(tap.port, "/v1/chat/completions?first_ms=1&gap_ms=1&n=1")))
            for _ in range(100):  # (the upstream's WINDOW_UPDATE reaches the client through the tap)
                if c.conn.outbound_flow_control_window >= 4 << 20:
                    break
                await asyncio.sleep(0.01)
            client_may_send = c.conn.outbound_flow_control_window
        finally:
            await c.close()
    finally:
        await p.close()
    assert r.status == 200
    assert p.log.send_window[0] >= 8 << 20  # what the tap lets the upstream send: the client's 8 MiB, as directly
    assert client_may_send >= 4 << 20  # what the tap lets the client send: the upstream's 4 MiB


async def test_idle_h2_connection_gets_goaway_and_is_closed_after_the_header_timeout(peer, make_tap):
    """--header-timeout-s on HTTP/2: a connection with a stream open stays (however long the stream), one with no
    stream open that long gets GOAWAY NO_ERROR naming its last stream and is closed; counted as a header timeout."""
    tap = await make_tap(peer.url, header_timeout_s=0.5)
    c = await H2Client().connect("127.0.0.1", tap.port)
    try:
        sid = c.request(req(tap.port, "/v1/chat/completions?first_ms=1200&gap_ms=5&n=3"))  # (open longer than the timeout)
        r = await asyncio.wait_for(c.wait(sid), 10)
        assert r.reset is None and r.data.endswith(b"data: [DONE]\n\n") and c.goaway is None
        await asyncio.wait_for(c.closed.wait(), 10)
    finally:
        await c.close()
    assert (c.goaway, c.goaway_last) == (h2.errors.ErrorCodes.NO_ERROR, sid)
    assert tap.tap.counters.header_timeouts == 1 and not tap.tap.connections


async def test_h2_preface_without_settings_is_closed_at_the_header_timeout(peer, make_tap):
    tap = await make_tap(peer.url, header_timeout_s=0.5)
    reader, writer = await asyncio.open_connection("127.0.0.1", tap.port)
    try:
        writer.write(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")  # the preface, and never the SETTINGS frame that must follow
        t0 = asyncio.get_running_loop().time()
        await asyncio.wait_for(reader.read(), 10)  # (the tap's own SETTINGS, then the close)
        assert asyncio.get_running_loop().time() - t0 >= 0.4
    finally:
        writer.close()
    assert tap.tap.counters.header_timeouts == 1


async def test_tap_shutdown_does_not_wait_on_idle_h2_connections(peer, make_tap):
    tap = await make_tap(peer.url)
    c = await H2Client().connect("127.0.0.1", tap.port)
    try:
        sid = c.request(req(tap.port, "/v1/chat/completions?first_ms=1&gap_ms=1&n=1"))
        await asyncio.wait_for(c.wait(sid), 10)
        await asyncio.wait_for(tap.close(grace_s=30), 10)  # (done long before the grace period: nothing in flight)
        await asyncio.wait_for(c.closed.wait(), 10)
    finally:
        await c.close()
    assert c.goaway == h2.errors.ErrorCodes.NO_ERROR
