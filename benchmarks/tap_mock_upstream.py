"""Streaming mock upstream for benchmarks/tap_overhead.py (run in its own process).

POST /v1/chat/completions answers an OpenAI-style SSE stream as ordinary servers write it: a role-only event at
once, the first content token ``--first-ms`` later, the rest every ``--gap-ms``, a usage event, [DONE]. It
honours the request's ``max_tokens`` (``--tokens`` when the body has none). Query parameters ``first_ms``,
``gap_ms`` and ``tokens`` override per request. The usage event also says how long the engine itself took from
having read the request to writing the first token (``"mock_ttft_ns"``, its monotonic clock), so that a client can
take the engine's own time (its timer's millisecond granularity included) out of each TTFT it measures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

from aiohttp import web

from deltatap.net import aio

ROLE = b'data: {"object":"chat.completion.chunk","model":"mock","choices":[{"index":0,"delta":{"role":"assistant","content":null}}]}\n\n'
DONE = b"data: [DONE]\n\n"


def token(i: int) -> bytes:
    return ("data: " + json.dumps({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": f" tok{i}"}}]}) + "\n\n").encode()


async def main(args: argparse.Namespace) -> None:
    async def chat(request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        t_in = time.monotonic_ns()
        q = request.query
        first_ms = float(q.get("first_ms", args.first_ms))
        gap_ms = float(q.get("gap_ms", args.gap_ms))
        try:
            asked = json.loads(raw).get("max_tokens")
        except (ValueError, AttributeError):
            asked = None
        n = int(q["tokens"]) if "tokens" in q else asked if isinstance(asked, int) and asked > 0 else args.tokens
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        await resp.write(ROLE)
        if first_ms:
            await asyncio.sleep(first_ms / 1000)
        t_first = None
        for i in range(n):
            if i and gap_ms:
                await asyncio.sleep(gap_ms / 1000)
            if t_first is None:
                t_first = time.monotonic_ns()
            await resp.write(token(i))
        ttft = -1 if t_first is None else t_first - t_in
        await resp.write(b'data: {"object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":8,"completion_tokens":%d},'
                         b'"mock_ttft_ns":%d}\n\n' % (n, ttft))
        await resp.write(DONE)
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    ctx = None
    if args.tls_cert:  # (benchmarks/tap_tls_ws.py: a direct TLS path to compare a TLS tap with)
        import ssl

        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(args.tls_cert, args.tls_key)
    await web.TCPSite(runner, "127.0.0.1", args.port, backlog=2048, ssl_context=ctx).start()
    print("ready", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--first-ms", type=float, default=20)
    p.add_argument("--gap-ms", type=float, default=2)
    p.add_argument("--tokens", type=int, default=4)
    p.add_argument("--tls-cert", help="serve HTTPS with this PEM certificate (with --tls-key)")
    p.add_argument("--tls-key")
    aio.run(main(p.parse_args()))
