"""A controllable upstream for the tap tests, on real loopback sockets (imported by conftest and tests)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
from dataclasses import dataclass, field

from aiohttp import web

from deltatap.core.clock import mono_ns
from deltatap.net.wire import last_write_mono_ns, make_stamping_runner


def payload(seed: int, size: int) -> bytes:
    return random.Random(seed).randbytes(size)


@dataclass
class UpstreamLog:
    """What the upstream saw and when (its own socket-level stamps, same process clock)."""

    headers: list[list[tuple[str, str]]] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)
    head_written: list[int] = field(default_factory=list)
    token_written: list[list[int]] = field(default_factory=list)
    cancelled: list[int] = field(default_factory=list)
    methods: list[str] = field(default_factory=list)


def build_upstream(log: UpstreamLog) -> web.Application:
    async def echo(request: web.Request) -> web.StreamResponse:
        log.methods.append(request.method)
        log.headers.append([(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.raw_headers])
        log.hosts.append(request.headers.get("Host", ""))
        digest, n = hashlib.sha256(), 0
        async for chunk in request.content.iter_any():
            digest.update(chunk)
            n += len(chunk)
        status = int(request.headers.get("x-status", "200"))
        sizes = [int(s) for s in request.headers.get("x-resp-chunks", "").split(",") if s]
        seed = int(request.headers.get("x-resp-seed", "0"))
        body = payload(seed, sum(sizes))
        resp = web.StreamResponse(status=status, headers={"x-body-sha256": digest.hexdigest(), "x-body-len": str(n)})
        resp.headers.add("Set-Cookie", "a=1")
        resp.headers.add("Set-Cookie", "b=2")
        resp.headers["Connection"] = "x-upstream-hop"
        resp.headers["x-upstream-hop"] = "must-not-pass"
        if request.headers.get("x-length") == "1":
            resp.content_length = len(body)
        await resp.prepare(request)
        pos = 0
        for size in sizes:
            await resp.write(body[pos : pos + size])
            pos += size
        await resp.write_eof()
        return resp

    async def status(request: web.Request) -> web.Response:
        code = int(request.match_info["code"])
        body = None if code in (204, 304) or request.method == "HEAD" else f"status {code}".encode()
        return web.Response(status=code, body=body, headers={"x-kind": "status"})

    async def sse(request: web.Request) -> web.StreamResponse:
        """Role-only event, then ``first_ms`` later the first content token, then ``n - 1`` more every ``gap_ms``."""
        q = request.query
        first_ms, gap_ms, n = float(q.get("first_ms", 50)), float(q.get("gap_ms", 5)), int(q.get("n", 5))
        hang = q.get("hang") == "1"
        log.headers.append([(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.raw_headers])
        await request.read()
        try:
            await asyncio.sleep(float(q.get("head_ms", 0)) / 1000)
        except asyncio.CancelledError:
            log.cancelled.append(mono_ns())
            raise
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)  # aiohttp sends the head in a write of its own here
        log.head_written.append(last_write_mono_ns(request))
        await resp.write(b'data: {"object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":null}}]}\n\n')
        written: list[int] = []
        log.token_written.append(written)
        try:
            await asyncio.sleep(first_ms / 1000)
            for i in range(n):
                if i:
                    await asyncio.sleep(gap_ms / 1000)
                chunk = {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": f"t{i}"}}]}
                await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
                written.append(last_write_mono_ns(request))
            if hang:
                await asyncio.sleep(3600)
            await resp.write(b'data: {"object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":7,"completion_tokens":%d}}\n\n' % n)
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except (asyncio.CancelledError, ConnectionError):
            log.cancelled.append(mono_ns())
            raise
        return resp

    async def reset(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b'data: {"choices":[{"delta":{"content":"x"}}]}\n\n')
        await asyncio.sleep(0.02)
        request.transport.abort()  # RST mid-stream
        return resp

    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(float(request.query.get("s", "0.3")))
        return web.json_response({"model": "m", "usage": {"prompt_tokens": 3, "completion_tokens": 4}})

    app = web.Application(handler_args={"max_field_size": 65536})
    app.router.add_route("*", "/echo{tail:.*}", echo)
    app.router.add_route("*", "/status/{code}", status)
    app.router.add_post("/v1/chat/completions", sse)
    app.router.add_post("/reset", reset)
    app.router.add_route("*", "/slow", slow)
    return app


@dataclass
class Upstream:
    url: str
    port: int
    log: UpstreamLog
    runner: web.AppRunner


async def start_upstream(ssl_context=None, host: str = "127.0.0.1") -> Upstream:
    """The upstream on a free port; with ``ssl_context``, over TLS (URL ``https://HOST:PORT``)."""
    log = UpstreamLog()
    runner = make_stamping_runner(build_upstream(log), handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ssl_context)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    return Upstream(f"{'https' if ssl_context else 'http'}://{host}:{port}", port, log, runner)


def tap_spans(span_exporter, telemetry):
    telemetry.processor.force_flush(5_000)
    return [s for s in span_exporter.get_finished_spans() if s.name.startswith("deltatap.tap")]


async def wait_spans(span_exporter, telemetry, n: int, timeout_s: float = 5.0):
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        spans = tap_spans(span_exporter, telemetry)
        if len(spans) >= n or asyncio.get_running_loop().time() > deadline:
            return spans
        await asyncio.sleep(0.02)


def event_times(span) -> dict[str, int]:
    return {e.name: e.timestamp for e in span.events}


def free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
