"""The tap's upstream probe (start line and /healthz) names what is wrong: an unresolvable host, and an ``https://``
upstream that answers in plain HTTP (before: "unknown error -2", and "ok" while every request got 502)."""

from __future__ import annotations

import asyncio
import logging

import aiohttp


async def _plain_http_server():
    async def answer(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await r.read(65536)
        w.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        await w.drain()
        w.close()

    return await asyncio.start_server(answer, "127.0.0.1", 0)


async def test_https_upstream_speaking_plain_http_is_named_at_start_and_in_healthz(make_tap, caplog):
    srv = await _plain_http_server()
    port = srv.sockets[0].getsockname()[1]
    try:
        with caplog.at_level(logging.WARNING, logger="deltatap.tap"):
            tap = await make_tap(f"https://127.0.0.1:{port}", admin_port=0)
        warned = [r.getMessage() for r in caplog.records if "not reachable" in r.getMessage()]
        assert len(warned) == 1 and "TLS handshake failed" in warned[0] and "--upstream http://" in warned[0], warned
        async with aiohttp.ClientSession() as session:
            async with session.get(tap.admin_url + "/healthz") as r:
                doc = await r.json()
        assert r.status == 503 and doc["status"] == "upstream_unreachable", doc
        assert doc["upstream_problem"].startswith("TLS handshake failed"), doc
    finally:
        srv.close()
        await srv.wait_closed()


async def test_unresolvable_upstream_is_named_as_such(make_tap, caplog):
    with caplog.at_level(logging.WARNING, logger="deltatap.tap"):
        await make_tap("http://no-such-host.invalid:8300", admin_port=0)
    warned = [r.getMessage() for r in caplog.records if "not reachable" in r.getMessage()]
    assert len(warned) == 1 and "cannot resolve no-such-host.invalid" in warned[0], warned
    assert "unknown error" not in warned[0]
