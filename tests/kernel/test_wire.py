"""deltatap.net.wire: stamps taken at the socket, over real loopback connections."""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import web

from deltatap.core.clock import mono_ns
from deltatap.net.wire import (
    last_read_mono_ns,
    last_write_mono_ns,
    make_stamping_connector,
    make_stamping_runner,
    request_head_mono_ns,
    request_received_mono_ns,
    upstream_stamps,
)

MS = 1_000_000


async def start(app: web.Application):
    runner = make_stamping_runner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    return runner, port


async def test_server_stamps_first_byte_head_body_and_write():
    seen: list[dict] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        rec = {"received": request_received_mono_ns(request), "head": request_head_mono_ns(request)}
        await request.read()
        rec["body"] = last_read_mono_ns(request)
        resp = web.StreamResponse()
        await resp.prepare(request)
        await resp.write(b"hello")
        rec["written"] = last_write_mono_ns(request)
        await resp.write_eof()
        seen.append(rec)
        return resp

    app = web.Application()
    app.router.add_post("/x", handler)
    runner, port = await start(app)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for i in range(2):  # two requests on one keep-alive connection
            t_sent_first = mono_ns()
            writer.write(b"POST /x HTTP/1.1\r\nHost: a\r\n")
            await writer.drain()
            await asyncio.sleep(0.05)
            t_sent_head = mono_ns()
            writer.write(b"Content-Length: 4\r\n\r\n")
            await writer.drain()
            await asyncio.sleep(0.05)
            t_sent_body = mono_ns()
            writer.write(b"body")
            await writer.drain()
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200")
            size = int(await reader.readuntil(b"\r\n"), 16)
            await reader.readexactly(size + 2)
            t_got = mono_ns()
            await reader.readuntil(b"0\r\n\r\n")
            for _ in range(200):
                if len(seen) > i:
                    break
                await asyncio.sleep(0.01)
            rec = seen[i]
            # each stamp sits between our send and the next phase (loopback delivery takes < 40 ms
            # even on a loaded machine; the phases are 50 ms apart)
            assert t_sent_first <= rec["received"] < t_sent_head
            assert t_sent_head <= rec["head"] < t_sent_body
            assert t_sent_body <= rec["body"] <= t_got
            assert rec["body"] <= rec["written"] <= t_got
            await asyncio.sleep(0.05)  # idle gap: the next request's first byte comes later
        assert len(seen) == 2 and seen[1]["received"] - seen[0]["written"] >= 40 * MS
        writer.close()
    finally:
        await runner.cleanup()


async def test_malformed_request_still_answered_by_stamping_server():
    app = web.Application()
    runner, port = await start(app)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"NOT HTTP AT ALL\r\n\r\n")
        line = await asyncio.wait_for(reader.readline(), 5)
        assert line.split()[1] == b"400"
        writer.close()
    finally:
        await runner.cleanup()


async def test_client_stamps_head_and_splits_body_by_read():
    writes: list[int] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse()
        await resp.prepare(request)
        writes.append(last_write_mono_ns(request))
        for part in (b"A" * 10, b"B" * 20):
            await asyncio.sleep(0.05)
            await resp.write(part)
            writes.append(last_write_mono_ns(request))
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/s", handler)
    runner, port = await start(app)
    try:
        async with aiohttp.ClientSession(connector=make_stamping_connector(), auto_decompress=False) as s:
            t_before = mono_ns()
            async with s.post(f"http://127.0.0.1:{port}/s", data=b"xyz") as resp:
                up = upstream_stamps(resp)
                assert up is not None
                assert t_before <= up.request_written_mono_ns <= up.head_mono_ns
                assert writes[0] <= up.head_mono_ns
                await asyncio.sleep(0.2)  # read late: both parts are buffered by now
                body = await resp.read()
                assert body == b"A" * 10 + b"B" * 20
                parts = up.slices(0, 30)
                assert [(a, b) for a, b, _ in parts] == [(0, 10), (10, 30)]
                # each part is stamped at its own read, not when we got round to reading it
                for (_, _, t), w in zip(parts, writes[1:]):
                    assert w <= t < w + 40 * MS
                assert up.arrival_mono_ns(5) == parts[0][2] and up.arrival_mono_ns(30) == parts[1][2]
    finally:
        await runner.cleanup()


async def test_plain_runner_and_connector_give_none():
    async def handler(request):
        return web.json_response({"r": request_received_mono_ns(request), "w": last_write_mono_ns(request)})

    app = web.Application()
    app.router.add_get("/", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    try:
        async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/") as resp:
            assert await resp.json() == {"r": None, "w": None}
            assert upstream_stamps(resp) is None
    finally:
        await runner.cleanup()
