"""Failures on either side: what the client sees, what the upstream sees, what the span says."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
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
