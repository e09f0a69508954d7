"""A loopback OpenAI-style SSE server with known timing, for the load generator's functional tests.

Each streamed answer: role-only delta at once, the first content token after ``first_ms``, then one
token every ``interval_ms``; ``tokens`` tokens (default: the request's max_tokens), a usage chunk and
``[DONE]``. Stamps are taken at the socket (deltatap.wire): the request's first byte read and the
moment each token's write returned - the truth the client's measurements are compared with.
Special paths answer badly on purpose (non-SSE, malformed SSE, HTTP 500, refusal, truncated stream,
plain-text 404, a long HTML 502). ``GET /v1/models`` lists ``state.models`` (None: HTTP 500).
"""

from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

from deltatap.core.clock import mono_ns, to_unix_ns
from deltatap.core.clocksync import CLOCK_PATH, clock_answer
from deltatap.net.wire import last_write_mono_ns, make_stamping_runner, request_received_mono_ns


@dataclass
class Seen:
    request_id: str
    traceparent: str | None
    body: dict
    received_mono_ns: int | None
    token_mono_ns: list[int] = field(default_factory=list)
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class ServerState:
    first_ms: float = 20.0
    interval_ms: float = 5.0
    tokens: int | None = None
    seen: list[Seen] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0
    in_flight_log: list[tuple[int, int]] = field(default_factory=list)  # (mono_ns, in flight after the change)
    models: list[str] | None = field(default_factory=lambda: ["m"])  # GET /v1/models; None answers HTTP 500
    models_asked: int = 0
    errors_sent: int = 0  # answers of the /bad/ error routes


STATE = web.AppKey("state", ServerState)


def _chunk(delta: dict, finish: str | None = None, completions: bool = False) -> bytes:
    if completions:  # /v1/completions: {"object": "text_completion", "choices": [{"text": ...}]}
        obj = {"id": "x", "object": "text_completion", "model": "m",
               "choices": [{"index": 0, "text": delta.get("content", ""), "finish_reason": finish}]}
    else:
        obj = {"id": "x", "object": "chat.completion.chunk", "model": "m",
               "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


async def stream(request: web.Request) -> web.StreamResponse:
    st = request.app[STATE]
    comp = request.path.endswith("/v1/completions")
    received = request_received_mono_ns(request)
    body = await request.json()
    seen = Seen(request.headers.get("x-request-id", ""), request.headers.get("traceparent"), body, received,
                headers={k.lower(): v for k, v in request.headers.items()})
    st.seen.append(seen)
    st.in_flight += 1
    st.max_in_flight = max(st.max_in_flight, st.in_flight)
    st.in_flight_log.append((mono_ns(), st.in_flight))
    try:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(_chunk({"role": "assistant", "content": ""}, None, comp))
        n = st.tokens if st.tokens is not None else int(body.get("max_tokens", 8))
        t0 = received or mono_ns()
        for i in range(n):
            due = t0 + int((st.first_ms + i * st.interval_ms) * 1e6)
            delay = (due - mono_ns()) / 1e9
            if delay > 0:
                await asyncio.sleep(delay)
            await resp.write(_chunk({"content": f" tok{i}"}, None, comp))
            seen.token_mono_ns.append(last_write_mono_ns(request))
        await resp.write(_chunk({}, "length", comp))
        usage = {"id": "x", "object": "chat.completion.chunk", "model": "m", "choices": [],
                 "usage": {"prompt_tokens": 11, "completion_tokens": n, "total_tokens": n + 11}}
        await resp.write(b"data: " + json.dumps(usage).encode() + b"\n\ndata: [DONE]\n\n")
        await resp.write_eof()
        return resp
    finally:
        st.in_flight -= 1
        st.in_flight_log.append((mono_ns(), st.in_flight))


async def non_sse(request: web.Request) -> web.Response:
    await request.read()
    return web.json_response({"choices": [{"message": {"content": "hi"}}]})


async def malformed(request: web.Request) -> web.StreamResponse:
    await request.read()
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    await resp.write(b"data: {not json\n\ndata: <html>\n\n")
    await resp.write_eof()
    return resp


async def error500(request: web.Request) -> web.Response:
    await request.read()
    request.app[STATE].errors_sent += 1
    return web.json_response({"error": {"message": "boom"}}, status=500)


async def text404(request: web.Request) -> web.Response:
    await request.read()
    request.app[STATE].errors_sent += 1
    return web.Response(text="  no such\n route here  \n", status=404)


async def html502(request: web.Request) -> web.Response:
    await request.read()
    request.app[STATE].errors_sent += 1
    return web.Response(text="<html><body>" + "bad gateway " * 100 + "</body></html>", status=502, content_type="text/html")


async def refused(request: web.Request) -> web.Response:
    await request.read()
    return web.json_response({"error": {"message": "blocked by policy"}}, status=403)


async def truncated(request: web.Request) -> web.StreamResponse:
    await request.read()
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    await resp.write(_chunk({"content": "partial"}))
    await asyncio.sleep(0.01)
    request.transport.close()  # the server goes away mid-stream
    return resp


async def clock(request: web.Request) -> web.Response:
    """The collector's clock endpoint (deltatap.clocksync), for --clock-sync."""
    received = to_unix_ns(request_received_mono_ns(request) or mono_ns())
    return web.Response(body=clock_answer(received), content_type="application/json")


async def models(request: web.Request) -> web.Response:
    st = request.app[STATE]
    st.models_asked += 1
    if st.models is None:
        return web.json_response({"error": {"message": "model list unavailable"}}, status=500)
    return web.json_response({"object": "list", "data": [{"id": m, "object": "model"} for m in st.models]})


async def start_server(state: ServerState) -> tuple[web.AppRunner, int]:
    app = web.Application()
    app[STATE] = state
    app.router.add_post("/v1/chat/completions", stream)
    app.router.add_post("/v1/completions", stream)
    app.router.add_post("/bad/non-sse", non_sse)
    app.router.add_post("/bad/malformed", malformed)
    app.router.add_post("/bad/500", error500)
    app.router.add_post("/bad/404-text", text404)
    app.router.add_post("/bad/502-html", html502)
    app.router.add_post("/bad/refused", refused)
    app.router.add_post("/bad/truncated", truncated)
    app.router.add_get("/v1/models", models)
    app.router.add_get(CLOCK_PATH, clock)
    runner = make_stamping_runner(app, shutdown_timeout=1.0)  # (cleanup: an answer still sleeping is cancelled after 1 s, not awaited)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, port


async def load_cli(*args: str) -> tuple[int, str, str]:
    """``deltatap load ARGS`` in a subprocess from the repository root: (exit code, stdout, stderr)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "deltatap.app.cli", "load", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=str(Path(__file__).resolve().parents[2]),
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=90)
    return proc.returncode or 0, out.decode(), err.decode()
