"""The tap's own limits (issue 19): a header-read timeout, a connection cap, running out of file descriptors
reported as the tap's own failure, and streams cut by its shutdown grace named as such."""

from __future__ import annotations

import asyncio
import json
import os
import resource
import signal
import sys

import aiohttp
import pytest
from tap_helpers import wait_spans

from deltatap.core.vocab import Attr

pytestmark = pytest.mark.timeout(60)
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}


async def _closed_within(reader: asyncio.StreamReader, seconds: float, rest: bytes = b"") -> bool:
    """The tap closed the connection within ``seconds``, after sending exactly ``rest`` more (a reset counts too)."""
    try:
        return await asyncio.wait_for(reader.read(), seconds) == rest
    except ConnectionResetError:
        return not rest
    except asyncio.TimeoutError:
        return False


async def test_a_client_that_sends_no_whole_head_is_closed_and_others_are_served(upstream, make_tap):
    tap = await make_tap(upstream.url, header_timeout_s=0.3)
    slow_r, slow_w = await asyncio.open_connection("127.0.0.1", tap.port)
    slow_w.write(b"GET /status/200 HTTP/1.1\r\nHost: x\r\n")  # ... and never the end of the head
    await slow_w.drain()
    async with aiohttp.ClientSession() as s, s.get(tap.url + "/status/200") as r:
        assert r.status == 200  # served while the slow one waits
    assert await _closed_within(slow_r, 10)
    assert tap.tap.counters.upstream_connections == 1  # the partial head never opened a connection upstream
    # an idle keep-alive connection gets the same time for its next head
    r2, w2 = await asyncio.open_connection("127.0.0.1", tap.port)
    w2.write(b"GET /status/200 HTTP/1.1\r\nHost: x\r\n\r\n")
    head = await asyncio.wait_for(r2.readuntil(b"\r\n\r\n"), 5)
    assert head.startswith(b"HTTP/1.1 200")
    length = int(next(ln.split(b":")[1] for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length")))
    await r2.readexactly(length)
    assert await _closed_within(r2, 10)
    assert tap.tap.counters.header_timeouts == 2
    slow_w.close()
    w2.close()


async def test_connections_over_the_cap_are_closed_at_accept(upstream, make_tap):
    tap = await make_tap(upstream.url, max_connections=2)
    held = [await asyncio.open_connection("127.0.0.1", tap.port) for _ in range(2)]
    for _ in range(100):  # (the tap has taken both)
        if len(tap.tap.connections) == 2:
            break
        await asyncio.sleep(0.01)
    r3, w3 = await asyncio.open_connection("127.0.0.1", tap.port)
    w3.write(b"GET /status/200 HTTP/1.1\r\nHost: x\r\n\r\n")
    assert await _closed_within(r3, 10)
    assert tap.tap.counters.connections_refused == 1
    for _r, w in held:
        w.close()
    for _ in range(200):
        if not tap.tap.connections:
            break
        await asyncio.sleep(0.01)
    async with aiohttp.ClientSession() as s, s.get(tap.url + "/status/200") as r:
        assert r.status == 200  # served again once below the cap
    w3.close()


async def test_a_stream_cut_by_the_shutdown_grace_is_named_tap_shutdown(upstream, make_tap, span_exporter, telemetry):
    tap = await make_tap(upstream.url)
    reader, writer = await asyncio.open_connection("127.0.0.1", tap.port)
    body = json.dumps(CHAT).encode()
    writer.write(b"POST /v1/chat/completions?first_ms=1&n=1&hang=1 HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    await writer.drain()
    await asyncio.wait_for(reader.readuntil(b'"t0"'), 5)
    await tap.close(grace_s=0.2)
    (span,) = await wait_spans(span_exporter, telemetry, 1)
    assert span.attributes[Attr.OUTCOME] == "upstream_error" and span.attributes[Attr.ERROR_TYPE] == "tap_shutdown"
    writer.close()


async def test_out_of_file_descriptors_is_the_taps_own_failure(upstream, tmp_path):
    """A tap process limited to the descriptors it holds plus one: it accepts the client, cannot open the upstream
    connection (EMFILE), and says so as its own failure (503), not as an unreachable upstream."""
    from tests.conftest import free_port

    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "deltatap.app.cli", "tap", "--link", "edge", "--listen", f"127.0.0.1:{port}", "--no-admin",
        "--upstream", upstream.url, "--otlp", "none", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        env=dict(os.environ, PYTHONUNBUFFERED="1"))
    try:
        await asyncio.wait_for(proc.stdout.readline(), 30)
        await asyncio.sleep(0.3)  # (start-up's own connections closed)
        open_fds = len(os.listdir(f"/proc/{proc.pid}/fd"))
        _soft, hard = resource.prlimit(proc.pid, resource.RLIMIT_NOFILE)
        resource.prlimit(proc.pid, resource.RLIMIT_NOFILE, (open_fds + 1, hard))
        async with aiohttp.ClientSession() as s, s.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=CHAT) as r:
            status, doc = r.status, await r.json()
        assert status == 503 and doc["error"]["type"] == "tap_resource_exhausted"
        assert "EMFILE" in doc["error"]["cause"] and "ulimit" in doc["error"]["cause"]
    finally:
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 30)
    assert upstream.log.methods == []


async def test_an_unframeable_response_then_a_close_is_passed_on_as_it_is(make_tap, span_exporter, telemetry):
    """The upstream answers bytes the reader cannot frame and closes: the client gets exactly those bytes and the
    close, nothing of the tap's own, and the span says the response was bad (not that none came)."""
    answer = b"HTTP/1.1 200 OK\r\nBad Header Line\r\n\r\nbody"

    async def bad(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(answer)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(bad, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        tap = await make_tap(f"http://127.0.0.1:{port}")
        r, w = await asyncio.open_connection("127.0.0.1", tap.port)
        w.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        got = await asyncio.wait_for(r.read(), 10)
        assert got == answer
        (span,) = await wait_spans(span_exporter, telemetry, 1)
        assert span.attributes[Attr.ERROR_TYPE] == "upstream_bad_response"
        w.close()
    finally:
        server.close()
