"""Helpers for the reference-stack tests (imported as ``stack_helpers``): start components on free loopback ports, read streams
with client-side stamps, and look up span events."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from deltatap.core.clock import mono_ns, to_unix_ns
from deltatap.core.sse import StreamObserver

from deltatap.stack.config import EngineConfig, FirewallConfig, GatewayConfig

MS = 1_000_000
FAST_ENGINE = {"scheduler": {"prefill_base_ms": 1.0, "prefill_per_token_ms": 0.02, "decode_base_ms": 5.0, "decode_per_seq_ms": 0.1}}


def engine_cfg(**over: Any) -> EngineConfig:
    data = json.loads(json.dumps(FAST_ENGINE))
    sched = over.pop("scheduler", {})
    data["scheduler"].update(sched)
    data.update(over)
    return EngineConfig.model_validate(data)


def firewall_cfg(upstream: str, **over: Any) -> FirewallConfig:
    return FirewallConfig.model_validate({"upstream": upstream, **over})


def gateway_cfg(upstreams: list[str], **over: Any) -> GatewayConfig:
    return GatewayConfig.model_validate({"routes": [{"upstreams": upstreams}], **over})


def chat(content: str = "hello there", max_tokens: int = 8, stream: bool = True, **extra: Any) -> dict[str, Any]:
    body = {"model": "deltatap-ref", "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens, "stream": stream}
    body.update(extra)
    return body


@dataclass
class Seen:
    """What an independent client saw, stamped with ``mono_ns`` as each read returned."""

    status: int
    headers: dict[str, str]
    sent_mono: int
    headers_mono: int
    obs: StreamObserver | None = None
    body: bytes = b""
    chunks: list[tuple[int, bytes]] = field(default_factory=list)

    @property
    def first_content_mono(self) -> int | None:
        return self.obs.first_token_mono_ns if self.obs else None

    @property
    def text(self) -> str:
        return self.body.decode()

    def events(self) -> list[dict[str, Any]]:
        out = []
        for line in self.body.decode().splitlines():
            if line.startswith("data: ") and line != "data: [DONE]":
                out.append(json.loads(line[6:]))
        return out

    def content(self) -> str:
        parts = []
        for ev in self.events():
            for ch in ev.get("choices", []):
                parts.append((ch.get("delta") or {}).get("content") or ch.get("text") or "")
        return "".join(parts)


async def post(session: aiohttp.ClientSession, url: str, body: dict[str, Any] | bytes, headers: dict[str, str] | None = None) -> Seen:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    h = {"Content-Type": "application/json", **(headers or {})}
    t_send = mono_ns()
    async with session.post(url, data=data, headers=h) as resp:
        seen = Seen(resp.status, dict(resp.headers), t_send, mono_ns())
        if resp.headers.get("Content-Type", "").startswith("text/event-stream"):
            seen.obs = StreamObserver(path=url)
        buf = bytearray()
        async for chunk in resp.content.iter_any():
            t = mono_ns()
            seen.chunks.append((t, chunk))
            buf += chunk
            if seen.obs is not None:
                seen.obs.feed(chunk, t)
        seen.body = bytes(buf)
    return seen


def spans_named(exporter, name: str) -> list:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def events(span) -> dict[str, int]:
    """Event name -> Unix ns (first occurrence)."""
    out: dict[str, int] = {}
    for e in span.events:
        out.setdefault(e.name, e.timestamp)
    return out


def unix(t_mono: int) -> int:
    return to_unix_ns(t_mono)


async def wait_for(cond, timeout_s: float = 5.0, what: str = "condition") -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not cond():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


async def flushed(telemetry) -> None:
    await asyncio.to_thread(telemetry.processor.force_flush, 5000)


class ScriptedUpstream:
    """A controlled upstream for the intermediaries' tests: records every request it gets and
    answers with ``respond(request, n)`` (n = 1 for the first request); counts handlers that were
    cancelled because the caller went away."""

    def __init__(self, respond) -> None:
        self.respond = respond
        self.requests: list[tuple[dict[str, str], bytes]] = []
        self.arrivals: list[int] = []  # mono_ns at handler entry
        self.disconnects = 0
        self.runner = None
        self.url = ""

    async def _handle(self, request):
        self.arrivals.append(mono_ns())
        body = await request.read()
        self.requests.append((dict(request.headers), body))
        try:
            return await self.respond(request, len(self.requests))
        except asyncio.CancelledError:
            self.disconnects += 1
            raise

    async def start(self) -> "ScriptedUpstream":
        from aiohttp import web

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self.runner = web.AppRunner(app, handler_cancellation=True)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"
        return self

    async def close(self) -> None:
        await self.runner.cleanup()


async def sse_answer(request, tokens: list[str], gap_s: float = 0.0, before_s: float = 0.0):
    """An OpenAI chat stream of ``tokens``, ``gap_s`` apart, after ``before_s``."""
    from aiohttp import web

    from deltatap.stack.openai import DONE, ChatRenderer

    r = ChatRenderer("cmpl-up", "deltatap-ref")
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await asyncio.sleep(before_s)
    await resp.prepare(request)
    await resp.write(r.start())
    for t in tokens:
        if gap_s:
            await asyncio.sleep(gap_s)
        await resp.write(r.token(t))
    await resp.write(r.finish("stop") + DONE)
    return resp


def dead_url() -> str:
    """A loopback URL nobody listens on (connection refused)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"
