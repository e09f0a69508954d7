"""Bytes, headers and status codes pass through the tap unchanged."""

from __future__ import annotations

import asyncio
import hashlib
import threading

import aiohttp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from deltatap.telemetry.tracer import setup_telemetry
from deltatap.proxy import TapOptions, start_tap

from tap_helpers import payload, start_upstream


class Background:
    """An upstream and a tap on an event loop in a thread, for hypothesis-driven (sync) tests."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.telemetry = setup_telemetry("deltatap-test-bg", exporter=InMemorySpanExporter())
        self.upstream = self.call(start_upstream())
        self.tap = self.call(start_tap(TapOptions(link="edge", upstream=self.upstream.url, admin_port=None), self.telemetry))
        self.session = self.call(self._session())

    async def _session(self) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(auto_decompress=False, timeout=aiohttp.ClientTimeout(total=60))

    def call(self, coro, timeout: float = 60):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.call(self.session.close())
        self.call(self.tap.close(grace_s=1))
        self.call(self.upstream.runner.cleanup())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.telemetry.shutdown()


@pytest.fixture(scope="module")
def bg():
    b = Background()
    yield b
    b.close()


async def roundtrip(session, base: str, body_chunks: list[bytes], resp_chunks: list[int], *, seed: int, length: bool, method="POST"):
    async def gen():
        for c in body_chunks:
            yield c

    body = b"".join(body_chunks)
    headers = {"x-resp-chunks": ",".join(map(str, resp_chunks)), "x-resp-seed": str(seed)}
    if length:
        headers["Content-Length"] = str(len(body))
    data = gen() if body_chunks else None
    digest, n, pieces = hashlib.sha256(), 0, 0
    async with session.request(method, base + "/echo", data=data, headers=headers) as resp:
        async for chunk in resp.content.iter_any():
            digest.update(chunk)
            n += len(chunk)
            pieces += 1
        return resp.status, dict(resp.headers), digest.hexdigest(), n, hashlib.sha256(body).hexdigest(), len(body)


chunk_lists = st.lists(st.binary(min_size=0, max_size=3000), max_size=12)
resp_sizes = st.lists(st.integers(min_value=1, max_value=5000), max_size=12)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(body=chunk_lists, resp=resp_sizes, seed=st.integers(0, 2**16), length=st.booleans())
def test_bodies_byte_exact_both_directions(bg, body, resp, seed, length):
    for base in (bg.upstream.url, bg.tap.url):  # direct and through the tap must agree
        status, headers, got_sha, got_len, sent_sha, sent_len = bg.call(roundtrip(bg.session, base, body, resp, seed=seed, length=length))
        assert status == 200
        assert headers["x-body-sha256"] == sent_sha and int(headers["x-body-len"]) == sent_len
        assert got_sha == hashlib.sha256(payload(seed, sum(resp))).hexdigest() and got_len == sum(resp)


def test_many_tiny_chunks(bg):
    body = [bytes([i % 256]) for i in range(3000)]
    status, headers, got_sha, got_len, sent_sha, _ = bg.call(roundtrip(bg.session, bg.tap.url, body, [1] * 3000, seed=7, length=False))
    assert status == 200 and headers["x-body-sha256"] == sent_sha
    assert got_sha == hashlib.sha256(payload(7, 3000)).hexdigest() and got_len == 3000


def test_fifty_megabytes_each_way(bg):
    mb = 1 << 20
    body = [payload(i, mb) for i in range(50)]
    status, headers, got_sha, got_len, sent_sha, sent_len = bg.call(
        roundtrip(bg.session, bg.tap.url, body, [mb] * 50, seed=3, length=True), timeout=110
    )
    assert status == 200 and sent_len == 50 * mb
    assert headers["x-body-sha256"] == sent_sha and int(headers["x-body-len"]) == sent_len
    assert got_len == 50 * mb and got_sha == hashlib.sha256(payload(3, 50 * mb)).hexdigest()


def test_binary_and_empty_with_content_length_preserved(bg):
    async def go():
        async with bg.session.post(bg.tap.url + "/echo", data=bytes(range(256)) * 4, headers={"x-resp-chunks": "1024", "x-length": "1"}) as r:
            return r.status, r.headers.get("Content-Length"), r.headers.get("Transfer-Encoding"), await r.read()

    status, clen, te, body = bg.call(go())
    assert status == 200 and clen == "1024" and te is None and body == payload(0, 1024)
    sent = bg.upstream.log.headers[-1]
    assert ("Content-Length", "1024") in sent and not any(k.lower() == "transfer-encoding" for k, _ in sent)


async def test_headers_forwarded_as_sent_hop_by_hop_included(upstream, make_tap):
    """The downstream and upstream connections are paired for their life (one hop, as a direct connection): the
    hop-by-hop headers pass in both directions with the rest; only the trace context and the correlation id change."""
    tap = await make_tap(upstream.url, admin_port=None)
    headers = [
        ("X-Custom-Thing", "a"),
        ("X-Dup", "1"),
        ("X-Dup", "2"),
        ("Connection", "keep-alive, X-Hop"),
        ("X-Hop", "secret"),
        ("Keep-Alive", "timeout=5"),
        ("Authorization", "Bearer sk-test"),
        ("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
        ("tracestate", "vendor=1"),
    ]
    async with aiohttp.ClientSession() as s:
        async with s.get(tap.url + "/echo/path%2Fenc?q=1&q=2&x=%20", headers=headers) as r:
            assert r.status == 200
            assert r.headers.getall("Set-Cookie") == ["a=1", "b=2"]
            assert r.headers["x-upstream-hop"] == "must-not-pass" and "x-upstream-hop" in r.headers["Connection"]
    sent = upstream.log.headers[-1]
    names = [k.lower() for k, _ in sent]
    assert ("X-Custom-Thing", "a") in sent and [v for k, v in sent if k == "X-Dup"] == ["1", "2"]
    assert ("X-Hop", "secret") in sent and ("Keep-Alive", "timeout=5") in sent
    assert ("Authorization", "Bearer sk-test") in sent  # end-to-end: forwarded (never recorded)
    tp = dict((k.lower(), v) for k, v in sent)["traceparent"]
    assert tp.startswith("00-0af7651916cd43dd8448eb211c80319c-") and not tp.endswith("b7ad6b7169203331-01")
    assert dict((k.lower(), v) for k, v in sent)["tracestate"] == "vendor=1"
    assert "x-request-id" in names  # created when absent
    assert upstream.log.hosts[-1] == f"127.0.0.1:{tap.port}"  # Host preserved
    assert "user-agent" in names and "accept-encoding" in names  # the client's own, not added twice
    assert names.count("user-agent") == 1 and names.count("accept") == 1


async def test_host_header_rewrite_and_path_prefix(upstream, make_tap):
    tap = await make_tap(upstream.url + "/echo", host_header="engine.internal", admin_port=None)
    async with aiohttp.ClientSession() as s, s.get(tap.url + "/sub?z=1") as r:
        assert r.status == 200
    assert upstream.log.hosts[-1] == "engine.internal"


@pytest.mark.parametrize("code", [200, 201, 204, 304, 404, 418, 500, 503])
@pytest.mark.parametrize("method", ["GET", "HEAD", "POST"])
async def test_status_codes_and_bodies(upstream, make_tap, code, method):
    tap = await make_tap(upstream.url, admin_port=None)
    async with aiohttp.ClientSession() as s:
        async with s.request(method, f"{upstream.url}/status/{code}") as d:
            direct = (d.status, await d.read(), d.headers.get("x-kind"), d.headers.get("Content-Length"))
        async with s.request(method, f"{tap.url}/status/{code}") as t:
            tapped = (t.status, await t.read(), t.headers.get("x-kind"), t.headers.get("Content-Length"))
    assert tapped == direct


async def test_expect_100_continue_answered(upstream, make_tap):
    tap = await make_tap(upstream.url, admin_port=None)
    reader, writer = await asyncio.open_connection("127.0.0.1", tap.port)
    writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n")
    await writer.drain()
    interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert interim.startswith(b"HTTP/1.1 100")
    writer.write(b"hello")
    await writer.drain()
    final = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert final.startswith(b"HTTP/1.1 200") and hashlib.sha256(b"hello").hexdigest().encode() in final
    writer.close()


async def test_keep_alive_and_upstream_pooling(upstream, make_tap):
    tap = await make_tap(upstream.url, admin_port=None)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as s:
        for _ in range(5):
            async with s.get(tap.url + "/status/200") as r:
                assert r.status == 200
    assert tap.tap.counters.upstream_connections == 1  # paired with the one client connection
    for _ in range(200):  # (the client's close reaches the tap: the upstream connection goes back to the pool)
        if tap.tap._pool:
            break
        await asyncio.sleep(0.01)
    async with aiohttp.ClientSession() as s:  # a new client connection takes the pooled upstream one
        for _ in range(3):
            async with s.get(tap.url + "/status/200") as r:
                assert r.status == 200
    assert tap.tap.counters.connections == 2 and tap.tap.counters.upstream_connections == 1


async def test_bare_upstream_head_gets_no_aiohttp_defaults(make_tap):
    """An upstream that sends no Date, Server or Content-Type: the client sees none through the tap either."""

    async def bare(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-Only: 1\r\n\r\nhello")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(bare, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        tap = await make_tap(f"http://127.0.0.1:{port}")
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", tap.port), 5)
        writer.write(b"GET /x HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        raw = await asyncio.wait_for(reader.read(), 5)
        writer.close()
    finally:
        server.close()
        await server.wait_closed()
    head, _, body = raw.partition(b"\r\n\r\n")
    names = {line.split(b":", 1)[0].strip().lower() for line in head.split(b"\r\n")[1:]}
    assert body == b"hello" and head.startswith(b"HTTP/1.1 200 OK")
    assert b"x-only" in names and b"content-length" in names
    assert not names & {b"date", b"server", b"content-type"}, head
