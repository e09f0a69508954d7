"""Failures on either side: what the client sees, what the upstream sees, what the span says."""

from __future__ import annotations

import asyncio
import itertools
import socket
import struct
import time

import aiohttp
import pytest
from raw_peer import raw_exchange
from tap_helpers import event_times, free_port, wait_spans

from deltatap.telemetry.tracer import setup_telemetry
from deltatap.core.vocab import Attr, TapEvent
from deltatap.proxy import TapOptions, start_tap


CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}


async def test_upstream_refused_gives_502_naming_deltatap_link_and_cause(make_tap, span_exporter, telemetry):
    tap = await make_tap(f"http://127.0.0.1:{free_port()}", link="gw-fw")
    async with aiohttp.ClientSession() as s, s.post(tap.url + "/v1/chat/completions", json=CHAT, headers={"x-request-id": "r1"}) as r:
        assert r.status == 502
        err = (await r.json())["error"]
        assert r.headers["x-request-id"] == "r1"
    assert err["source"] == "deltatap" and err["link"] == "gw-fw" and err["type"] == "upstream_unreachable"
    assert "connect" in err["cause"] and "gw-fw" in err["message"]
    (span,) = await wait_spans(span_exporter, telemetry, 1)
    assert span.attributes[Attr.OUTCOME] == "upstream_error" and span.attributes[Attr.HTTP_STATUS] == 502
    assert span.attributes[Attr.ERROR_TYPE] == "upstream_unreachable"
    assert TapEvent.UPSTREAM_ERROR in event_times(span)
    async with aiohttp.ClientSession() as s, s.get(tap.admin_url + "/metrics") as m:
        assert 'deltatap_tap_upstream_errors_total{cause="upstream_unreachable",link="gw-fw"} 1.0' in await m.text()


async def test_upstream_reset_mid_stream_breaks_the_client_stream(upstream, make_tap, span_exporter, telemetry):
    tap = await make_tap(upstream.url)
    got = b""
    async with aiohttp.ClientSession() as s, s.post(tap.url + "/reset", json=CHAT) as r:
        assert r.status == 200
        with pytest.raises(aiohttp.ClientPayloadError):
            async for chunk in r.content.iter_any():
                got += chunk
    assert got.startswith(b"data: ")  # what came before the reset was forwarded
    (span,) = await wait_spans(span_exporter, telemetry, 1)
    assert span.attributes[Attr.OUTCOME] == "upstream_error"
    names = event_times(span)
    assert TapEvent.UPSTREAM_CLOSED in names or TapEvent.UPSTREAM_ERROR in names
    assert TapEvent.FIRST_TOKEN_RECEIVED in names and TapEvent.RESPONSE_END not in names


async def test_slow_upstream_never_timed_out_by_default(upstream, make_tap):
    tap = await make_tap(upstream.url)
    t = time.monotonic()
    async with aiohttp.ClientSession() as s, s.get(tap.url + "/slow?s=0.4") as r:
        assert r.status == 200 and (await r.json())["model"] == "m"
    assert time.monotonic() - t >= 0.4


async def test_configured_tap_timeout_gives_504(upstream, make_tap, span_exporter, telemetry):
    tap = await make_tap(upstream.url, timeout_s=0.1)
    async with aiohttp.ClientSession() as s, s.get(tap.url + "/slow?s=2") as r:
        assert r.status == 504
        assert (await r.json())["error"]["type"] == "upstream_timeout"
    (span,) = await wait_spans(span_exporter, telemetry, 1)
    assert span.attributes[Attr.OUTCOME] == "timeout" and TapEvent.TIMEOUT in event_times(span)


@pytest.mark.parametrize("phase", ["before_head", "mid_stream"])
async def test_client_disconnect_closes_upstream_at_once(upstream, make_tap, span_exporter, telemetry, phase):
    tap = await make_tap(upstream.url)
    query = "?head_ms=5000" if phase == "before_head" else "?first_ms=1&n=1&hang=1"
    reader, writer = await asyncio.open_connection("127.0.0.1", tap.port)
    body = b'{"model":"m","stream":true}'
    writer.write(b"POST /v1/chat/completions%s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (query.encode(), len(body), body))
    await writer.drain()
    if phase == "mid_stream":
        await asyncio.wait_for(reader.readuntil(b'"t0"'), 5)  # the first token came through
    else:
        await asyncio.sleep(0.1)
    writer.transport.abort()
    t_close = time.monotonic()
    for _ in range(200):
        if upstream.log.cancelled:
            break
        await asyncio.sleep(0.005)
    assert upstream.log.cancelled, "the upstream never saw the close"
    assert time.monotonic() - t_close < 0.5
    (span,) = await wait_spans(span_exporter, telemetry, 1)
    assert span.attributes[Attr.OUTCOME] == "client_cancel"
    assert TapEvent.DOWNSTREAM_CLOSED in event_times(span)


async def test_collector_unreachable_traffic_unaffected(upstream):
    tel = setup_telemetry("deltatap-test-deadcollector", otlp=f"http://127.0.0.1:{free_port()}")
    tap = await start_tap(TapOptions(link="edge", upstream=upstream.url, admin_port=None), tel)
    try:
        async with aiohttp.ClientSession() as s:
            t = time.monotonic()
            for _ in range(20):
                async with s.post(tap.url + "/v1/chat/completions?first_ms=1&n=2", json=CHAT) as r:
                    assert r.status == 200 and (await r.read()).endswith(b"data: [DONE]\n\n")
            assert time.monotonic() - t < 5
    finally:
        await tap.close(grace_s=1)
        await asyncio.get_running_loop().run_in_executor(None, tel.shutdown)
    assert tel.stats.spans_ended == 20
    assert tel.stats.spans_exported == 0 and tel.stats.spans_dropped == 20


@pytest.mark.parametrize(
    "raw",
    [
        b"GARBAGE\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: x\r\nBad Header Line\r\n\r\n",
        b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: nope\r\n\r\n",
        b"GET /" + b"a" * 10000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
    ],
)
async def test_malformed_requests_rejected_and_tap_keeps_serving(upstream, make_tap, raw):
    tap = await make_tap(upstream.url)
    reader, writer = await asyncio.open_connection("127.0.0.1", tap.port)
    writer.write(raw)
    await writer.drain()
    status = await asyncio.wait_for(reader.readline(), 5)
    assert status.split()[1] in (b"400", b"414", b"431")
    writer.close()
    assert upstream.log.methods == []  # nothing malformed reached the upstream
    async with aiohttp.ClientSession() as s, s.get(tap.url + "/echo") as r:
        assert r.status == 200


async def test_close_lets_streams_finish_within_grace(upstream, make_tap):
    tap = await make_tap(upstream.url)
    async with aiohttp.ClientSession() as s:
        async with s.post(tap.url + "/v1/chat/completions?first_ms=1&gap_ms=40&n=8", json=CHAT) as r:
            await r.content.readuntil(b'"t0"')
            closing = asyncio.create_task(tap.close(grace_s=5))
            await asyncio.sleep(0.05)
            with pytest.raises(aiohttp.ClientConnectorError):  # no new connections while draining
                async with aiohttp.ClientSession() as s2, s2.get(tap.url + "/echo"):
                    pass
            rest = await r.read()
        assert rest.endswith(b"data: [DONE]\n\n") and b'"t7"' in rest
    await asyncio.wait_for(closing, 5)


async def test_close_cuts_streams_after_grace(upstream, make_tap):
    tap = await make_tap(upstream.url)
    async with aiohttp.ClientSession() as s:
        async with s.post(tap.url + "/v1/chat/completions?first_ms=1&n=1&hang=1", json=CHAT) as r:
            await r.content.readuntil(b'"t0"')
            t = time.monotonic()
            await tap.close(grace_s=0.2)
            assert time.monotonic() - t < 2
    for _ in range(100):
        if upstream.log.cancelled:
            break
        await asyncio.sleep(0.01)
    assert upstream.log.cancelled


class _ClosesOnReuse:
    """A raw upstream whose keep-alive ends just as a connection is reused: it answers the first request of each
    connection and closes (FIN, or an RST with ``rst``) the connection when a second request comes on it. A direct
    client opening a connection per request never meets that; a tap that pools idle upstream connections does."""

    RESP = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok"

    def __init__(self, rst: bool) -> None:
        self.rst = rst
        self.requests: list[tuple[int, int, bytes]] = []  # (connection, request number on it, head)
        self.writers: list[asyncio.StreamWriter] = []

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = len(self.writers)
        self.writers.append(writer)
        try:
            for n in itertools.count(1):
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
                self.requests.append((conn, n, head))
                if n > 1:
                    if self.rst:
                        writer.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                        writer.transport.abort()
                    else:
                        writer.close()
                    return
                writer.write(self.RESP)
                await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.TimeoutError, ConnectionError):
            writer.close()

    async def close(self) -> None:
        self.server.close()
        for w in self.writers:
            w.transport.abort()
        await self.server.wait_closed()


async def _metric(url: str, name: str) -> float:
    async with aiohttp.ClientSession() as s, s.get(url + "/metrics") as m:
        for line in (await m.text()).splitlines():
            if line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name} in /metrics")


@pytest.mark.parametrize("rst", [False, True], ids=["fin", "rst"])
async def test_a_pooled_connection_closed_by_the_upstream_is_retried_on_a_fresh_one(make_tap, span_exporter, telemetry, rst):
    up = _ClosesOnReuse(rst)
    tap = await make_tap(await up.start())
    port = int(tap.url.rsplit(":", 1)[1])
    req = b"GET /v1/models HTTP/1.1\r\nHost: m\r\n\r\n"
    try:
        first = await raw_exchange(port, [req], expect=len(up.RESP))  # its connection ends: the upstream one is pooled
        assert first.received == up.RESP
        for _ in range(100):  # (the tap sees the client's close and pools the upstream connection)
            if tap.tap._pool:
                break
            await asyncio.sleep(0.01)
        second = await raw_exchange(port, [req], expect=len(up.RESP))
        assert second.received == up.RESP, second  # what a client with a connection of its own gets: the answer
        c = up.requests[0][0]  # (the tap's start-up probe of its upstream may have been a connection before)
        assert [(c0 - c, n) for c0, n, _ in up.requests] == [(0, 1), (0, 2), (1, 1)]  # on the stale one, then again
        assert up.requests[1][2] == up.requests[2][2]  # the same bytes
        assert await _metric(tap.admin_url, "deltatap_tap_stale_retries_total") == 1
        spans = await wait_spans(span_exporter, telemetry, 2)
        assert [s.attributes[Attr.OUTCOME] for s in spans] == ["ok", "ok"]
    finally:
        await up.close()


@pytest.mark.parametrize("rst", [False, True], ids=["fin", "rst"])
async def test_an_upstream_closing_before_the_response_reaches_the_client_as_that_close(make_tap, span_exporter, telemetry, rst):
    """On a connection that was not pooled (the client's own pairing), the close is the client's to see, as directly."""
    up = _ClosesOnReuse(rst)
    tap = await make_tap(await up.start())
    port = int(tap.url.rsplit(":", 1)[1])
    req = b"GET /v1/models HTTP/1.1\r\nHost: m\r\n\r\n"
    try:
        got = await raw_exchange(port, [req, req], pause_s=0.05, expect=2 * len(up.RESP), timeout_s=3)
        assert got.received == up.RESP and got.end == ("rst" if rst else "fin"), got  # no 502 of the tap's
        spans = await wait_spans(span_exporter, telemetry, 2)
        failed = [s for s in spans if s.attributes[Attr.OUTCOME] != "ok"]
        assert len(failed) == 1 and failed[0].attributes[Attr.ERROR_TYPE] == ("upstream_reset" if rst else "upstream_closed")
        assert Attr.HTTP_STATUS not in failed[0].attributes
        assert await _metric(tap.admin_url, "deltatap_tap_stale_retries_total") == 0
    finally:
        await up.close()
