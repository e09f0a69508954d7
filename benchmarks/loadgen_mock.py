"""A fast OpenAI-style SSE mock for benchmarks/loadgen_vs_aiperf.py (run in its own process).

Every chat/completions request gets: a role-only chunk, the first content token after ``--first-ms``,
``--tokens`` - 1 more tokens ``--interval-ms`` apart, a usage chunk and ``[DONE]``. The *true* time of
each request's arrival (first byte read) and of its first content token (the moment that write
returned) are stamped at the socket (deltatap.wire) and kept per ``X-Request-ID``;
``GET /_truth`` returns and clears them as JSON ``{request_id: [received_unix_ns, first_token_unix_ns]}``.

    python benchmarks/loadgen_mock.py --port 8399 [--first-ms 5 --interval-ms 1 --tokens 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json

from aiohttp import web

from deltatap.net import aio
from deltatap.core.clock import mono_ns, to_unix_ns
from deltatap.net.wire import last_write_mono_ns, make_stamping_runner, make_stamping_site, request_received_mono_ns

TRUTH = web.AppKey("truth", dict)
CFG = web.AppKey("cfg", argparse.Namespace)


def chunk(text: str | None, finish: str | None = None) -> bytes:
    delta = {"role": "assistant", "content": ""} if text is None else {"content": text}
    obj = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "mock",
           "choices": [{"index": 0, "delta": delta if finish is None else {}, "finish_reason": finish}]}
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


ROLE = chunk(None)
TOKENS = [chunk(f" w{i}") for i in range(4096)]
FINISH = chunk(None, "length")


async def stream(request: web.Request) -> web.StreamResponse:
    cfg = request.app[CFG]
    received = request_received_mono_ns(request) or mono_ns()
    body = await request.read()
    n = cfg.tokens
    usage = (b'data: {"id":"c","object":"chat.completion.chunk","created":0,"model":"mock","choices":[],'
             b'"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}}\n\ndata: [DONE]\n\n'
             % (len(body) // 4, n, len(body) // 4 + n))
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.prepare(request)
    await resp.write(ROLE)
    if cfg.first_ms > 0:
        await asyncio.sleep(max(0.0, (received + int(cfg.first_ms * 1e6) - mono_ns()) / 1e9))
    await resp.write(TOKENS[0])
    first = last_write_mono_ns(request)
    rid = request.headers.get("X-Request-ID")
    if rid:
        request.app[TRUTH][rid] = (to_unix_ns(received), to_unix_ns(first) if first else None)
    for i in range(1, n):
        if cfg.interval_ms > 0:
            await asyncio.sleep(cfg.interval_ms / 1000)
        await resp.write(TOKENS[i % len(TOKENS)])
    await resp.write(FINISH + usage)
    await resp.write_eof()
    return resp


async def truth(request: web.Request) -> web.Response:
    data = request.app[TRUTH]
    request.app[TRUTH] = {}
    return web.json_response(data)


async def models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [{"id": "mock", "object": "model"}]})


async def main(cfg: argparse.Namespace) -> None:
    app = web.Application()
    app[TRUTH] = {}
    app[CFG] = cfg
    app.router.add_post("/v1/chat/completions", stream)
    app.router.add_post("/v1/completions", stream)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/_truth", truth)
    runner = make_stamping_runner(app, access_log=None)
    await runner.setup()
    await make_stamping_site(runner, "127.0.0.1", cfg.port, backlog=4096).start()
    print(f"mock listening on 127.0.0.1:{cfg.port}", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--first-ms", type=float, default=5.0)
    p.add_argument("--interval-ms", type=float, default=1.0)
    p.add_argument("--tokens", type=int, default=4)
    aio.run(main(p.parse_args()))
