"""Plain aiohttp servers for the referee's chain: none of deltatap's code, no stamps, no spans.

    python deltatap/app/referee/engines.py engine --listen 127.0.0.1:PORT [--gap-ms 2] [--prefill-ms 3]
    python deltatap/app/referee/engines.py proxy  --listen 127.0.0.1:PORT --upstream http://127.0.0.1:P [--delay-ms 0]

``engine``: POST /v1/chat/completions (and /v1/completions) honouring ``max_tokens``; with
``stream`` (the load generator always streams) it answers an event stream written the way ordinary
OpenAI-compatible servers write it: after ``--prefill-ms`` a role-only chunk
(``{"choices":[{"delta":{"role":"assistant"}}]}``), the first content token as a separate write
right after it, the remaining tokens ``--gap-ms`` apart, a usage chunk and ``data: [DONE]``.
GET /v1/models lists the model. Each write is one ``StreamResponse.write`` (one chunk of the
chunked transfer coding).

``proxy`` (the gateway and the firewall): forwards each request with an aiohttp client (headers
except hop-by-hop ones, body read whole), optionally after ``--delay-ms`` (an inbound decision), and
streams the response back chunk by chunk as it is read.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import aiohttp
from aiohttp import web

HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer", "trailers",
       "transfer-encoding", "upgrade", "content-length", "host"}
MODEL = "plain-engine"


def _chunk(rid: str, created: int, delta: dict | None = None, text: str | None = None, chat: bool = True, finish: str | None = None, usage: dict | None = None) -> bytes:
    if chat:
        choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
        obj = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": MODEL, "choices": choices}
    else:
        choices = [] if text is None else [{"index": 0, "text": text, "finish_reason": finish}]
        obj = {"id": rid, "object": "text_completion", "created": created, "model": MODEL, "choices": choices}
    if usage is not None:
        obj["usage"] = usage
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def engine_app(gap_ms: float, prefill_ms: float) -> web.Application:
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]
    counter = 0

    async def models(_req: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    async def complete(req: web.Request) -> web.StreamResponse:
        nonlocal counter
        doc = await req.json()
        chat = req.path.endswith("/chat/completions")
        n = max(1, int(doc.get("max_tokens") or doc.get("max_completion_tokens") or 16))
        counter += 1
        rid = f"cmpl-{counter}"
        created = int(time.time())
        prompt_tokens = len(json.dumps(doc.get("messages") or doc.get("prompt") or "").split())
        toks = [words[i % len(words)] + " " for i in range(n)]
        if not doc.get("stream"):
            await asyncio.sleep(prefill_ms / 1e3 + gap_ms * (n - 1) / 1e3)
            text = "".join(toks)
            body = {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": created, "model": MODEL,
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"} if chat else {"index": 0, "text": text, "finish_reason": "length"}],
                    "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": n, "total_tokens": prompt_tokens + n}}
            return web.json_response(body)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(req)
        if prefill_ms > 0:
            await asyncio.sleep(prefill_ms / 1e3)
        if chat:
            await resp.write(_chunk(rid, created, {"role": "assistant"}))  # role only: not a token
        for i, tok in enumerate(toks):
            if i > 0 and gap_ms > 0:  # the first token goes right after the role chunk
                await asyncio.sleep(gap_ms / 1e3)
            last = i == n - 1
            await resp.write(_chunk(rid, created, {"content": tok}, chat=chat, finish="length" if last else None) if chat
                             else _chunk(rid, created, text=tok, chat=False, finish="length" if last else None))
        await resp.write(_chunk(rid, created, None, chat=chat, usage={"prompt_tokens": prompt_tokens, "completion_tokens": n, "total_tokens": prompt_tokens + n}))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", complete)
    app.router.add_post("/v1/completions", complete)
    return app


def proxy_app(upstream: str, delay_ms: float) -> web.Application:
    session: aiohttp.ClientSession | None = None
    base = upstream.rstrip("/")

    async def startup(_app: web.Application) -> None:
        nonlocal session
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=None), auto_decompress=False)

    async def cleanup(_app: web.Application) -> None:
        if session is not None:
            await session.close()

    async def forward(req: web.Request) -> web.StreamResponse:
        body = await req.read()
        if delay_ms > 0:
            await asyncio.sleep(delay_ms / 1e3)
        headers = {k: v for k, v in req.headers.items() if k.lower() not in HOP}
        assert session is not None
        async with session.request(req.method, base + req.path_qs, headers=headers, data=body, allow_redirects=False) as up:
            out = web.StreamResponse(status=up.status, reason=up.reason)
            for k, v in up.headers.items():
                if k.lower() not in HOP:
                    out.headers.add(k, v)
            await out.prepare(req)
            async for chunk in up.content.iter_any():
                await out.write(chunk)
            await out.write_eof()
            return out

    app = web.Application()
    app.on_startup.append(startup)
    app.on_cleanup.append(cleanup)
    app.router.add_route("*", "/{tail:.*}", forward)
    return app


def main() -> None:
    ap = argparse.ArgumentParser(description="plain aiohttp engine / forwarding proxy")
    ap.add_argument("role", choices=["engine", "proxy"])
    ap.add_argument("--listen", required=True, help="HOST:PORT")
    ap.add_argument("--upstream", help="proxy: base URL to forward to")
    ap.add_argument("--delay-ms", type=float, default=0.0, help="proxy: inbound delay before forwarding")
    ap.add_argument("--gap-ms", type=float, default=2.0, help="engine: inter-token gap")
    ap.add_argument("--prefill-ms", type=float, default=3.0, help="engine: time before the role chunk")
    a = ap.parse_args()
    host, _, port = a.listen.rpartition(":")
    app = engine_app(a.gap_ms, a.prefill_ms) if a.role == "engine" else proxy_app(a.upstream, a.delay_ms)
    web.run_app(app, host=host, port=int(port), access_log=None, print=None, handle_signals=True)


if __name__ == "__main__":
    main()
