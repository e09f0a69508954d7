"""Plain aiohttp servers for the referee's chain: none of deltatap's code, no stamps, no spans.

    python deltatap/app/referee/engines.py engine --listen 127.0.0.1:PORT [--gap-ms 2] [--prefill-ms 3]
    python deltatap/app/referee/engines.py proxy  --listen 127.0.0.1:PORT --upstream http://127.0.0.1:P [--delay-ms 0]
                                           [--rcvbuf B --read-bytes N --read-pause-ms M]
    python deltatap/app/referee/engines.py raw-engine --listen 127.0.0.1:PORT [--gap-ms 2] [--prefill-ms 3]
        [--line-end lf|crlf] [--framing chunked|length|close] [--split-ms S] [--tokens-per-write K]
        [--token-bytes B] [--usage-in-last] [--json-kib N]

``engine``: POST /v1/chat/completions (and /v1/completions) honouring ``max_tokens``; with
``stream`` (the load generator always streams) it answers an event stream written the way ordinary
OpenAI-compatible servers write it: after ``--prefill-ms`` a role-only chunk
(``{"choices":[{"delta":{"role":"assistant"}}]}``), the first content token as a separate write
right after it, the remaining tokens ``--gap-ms`` apart, a usage chunk and ``data: [DONE]``.
GET /v1/models lists the model. Each write is one ``StreamResponse.write`` (one chunk of the
chunked transfer coding).

``proxy`` (the gateway and the firewall): forwards each request with an aiohttp client (headers
except hop-by-hop ones, body read whole), optionally after ``--delay-ms`` (an inbound decision), and
streams the response back chunk by chunk as it is read. With ``--rcvbuf`` / ``--read-bytes`` /
``--read-pause-ms`` it is a slow reader: its upstream sockets get a small receive buffer (set before
connecting: a small window) and it reads the answer N bytes at a time with a pause between reads, so
what the tap before it writes is held by TCP (the window shut) until it reads.

``raw-engine``: the same answer written on asyncio streams byte for byte as styled (``RawStyle``):
LF or CRLF line ends; chunked, Content-Length (the whole stream built first) or close-delimited
framing; each write split in two ``--split-ms`` apart (events split across writes; ``--split-tail 1``
with CRLF puts the final ``\n`` alone in the second write, after the blank line's ``\r``); K token events per write; tokens of B bytes;
the usage on the last content chunk; an SSE comment and a data-less ``id:`` block before each token write
(``--comments``: neither is an event); or a non-streamed JSON answer of N KiB whatever ``stream`` asks.
Connections are kept alive for further requests unless the framing is close-delimited or the
request says ``Connection: close``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import time
from dataclasses import dataclass

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


def proxy_app(upstream: str, delay_ms: float, rcvbuf: int = 0, read_bytes: int = 0, read_pause_ms: float = 0.0) -> web.Application:
    """``rcvbuf`` > 0: the upstream sockets' SO_RCVBUF, set before connecting (a small window: what the upstream writes
    is held by TCP while this proxy is slow to read); ``read_bytes`` > 0: the response read this many bytes at a
    time, ``read_pause_ms`` between reads (a slow reader)."""
    session: aiohttp.ClientSession | None = None
    base = upstream.rstrip("/")

    def small_window(addr_info) -> socket.socket:
        family, type_, proto, _, _ = addr_info
        s = socket.socket(family, type_, proto)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        return s

    async def startup(_app: web.Application) -> None:
        nonlocal session
        conn = aiohttp.TCPConnector(limit=0, **({"socket_factory": small_window} if rcvbuf > 0 else {}))
        session = aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=None), auto_decompress=False,
                                        **({"read_bufsize": max(256, read_bytes)} if read_bytes > 0 else {}))

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
            if read_bytes > 0:
                async for chunk in up.content.iter_chunked(read_bytes):
                    await out.write(chunk)
                    if read_pause_ms > 0:
                        await asyncio.sleep(read_pause_ms / 1e3)
            else:
                async for chunk in up.content.iter_any():
                    await out.write(chunk)
            await out.write_eof()
            return out

    app = web.Application()
    app.on_startup.append(startup)
    app.on_cleanup.append(cleanup)
    app.router.add_route("*", "/{tail:.*}", forward)
    return app



# ------------------------------------------------------------------ raw engine: the bytes written exactly as told


@dataclass
class RawStyle:
    """How ``raw-engine`` writes its answer (every choice an ordinary OpenAI-compatible server makes somewhere)."""

    gap_ms: float = 2.0  # between token writes (0: back to back)
    prefill_ms: float = 3.0  # before the role chunk
    line_end: str = "lf"  # lf: ``\\n\\n`` after each event; crlf: ``\\r\\n\\r\\n``
    framing: str = "chunked"  # chunked | length (Content-Length: the whole stream built first) | close (close-delimited)
    split_ms: float = -1.0  # >= 0: every write is two writes, the second half this long after the first (events split)
    split_tail: int = 0  # > 0: the second write is the last this many bytes (1 with CRLF: between the final "\r" and "\n")
    tokens_per_write: int = 1  # token events per write
    token_bytes: int = 0  # > 0: each token's text this many bytes long (large chunks)
    usage_in_last: bool = False  # the usage object rides on the last content chunk (no separate usage chunk)
    json_kib: int = 0  # > 0: a non-streamed JSON answer of about this size, whatever ``stream`` asks
    comments: bool = False  # a comment (": keep-alive") and an "event:"/"id:"-only block before each token write: no events

    def __post_init__(self) -> None:
        if self.split_tail < 0 or (self.split_tail and self.split_ms < 0):
            raise ValueError("split_tail needs split_ms >= 0 and is a byte count >= 0")


def raw_events(style: RawStyle, n: int, rid: str, created: int, prompt_tokens: int, chat: bool = True) -> list[list[bytes]]:
    """The answer's writes, each a list of SSE events (bytes, line ends as styled): the role chunk, then the tokens
    ``tokens_per_write`` to a write, then the usage chunk (unless ``usage_in_last``) and ``[DONE]``."""
    eol = b"\r\n" if style.line_end == "crlf" else b"\n"
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": n, "total_tokens": prompt_tokens + n}

    def ev(delta=None, text=None, finish=None, usage_=None) -> bytes:
        return _chunk(rid, created, delta, text=text, chat=chat, finish=finish, usage=usage_)[:-2] + eol + eol

    def tok(i: int) -> str:
        w = words[i % len(words)] + " "
        return (w * (style.token_bytes // len(w) + 1))[: style.token_bytes] if style.token_bytes > 0 else w

    writes: list[list[bytes]] = [[ev({"role": "assistant"})]] if chat else []
    toks = []
    for i in range(n):
        last = i == n - 1
        u = usage if last and style.usage_in_last else None
        toks.append(ev({"content": tok(i)}, finish="length" if last else None, usage_=u) if chat
                    else ev(text=tok(i), finish="length" if last else None, usage_=u))
    k = max(1, style.tokens_per_write)
    ping = [b": keep-alive" + eol + eol, b"id: " + rid.encode() + eol + eol] if style.comments else []  # no data: no event
    writes += [ping + toks[i : i + k] for i in range(0, n, k)]
    tail = [] if style.usage_in_last else [ev(None, usage_=usage)]
    writes.append(tail + [b"data: [DONE]" + eol + eol])
    return writes


def _frame(style: RawStyle, data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n" if style.framing == "chunked" else data


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, str, dict[str, str], bytes] | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
        return None
    lines = head[:-4].decode("latin-1").split("\r\n")
    method, target, _ = (lines[0].split(" ", 2) + ["", ""])[:3]
    headers: dict[str, str] = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    try:
        if "chunked" in headers.get("transfer-encoding", "").lower():
            body = bytearray()
            while True:
                size = int((await reader.readuntil(b"\r\n")).split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while (await reader.readuntil(b"\r\n")) != b"\r\n":
                        pass
                    break
                body += (await reader.readexactly(size + 2))[:-2]
            return method, target, headers, bytes(body)
        return method, target, headers, await reader.readexactly(int(headers.get("content-length") or 0))
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, ValueError):
        return None


async def raw_engine_conn(style: RawStyle, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, counter: list[int]) -> None:
    """One connection: requests answered in turn while the client keeps it open (keep-alive); a
    close-delimited answer ends it."""
    try:
        while True:
            got = await _read_request(reader)
            if got is None:
                return
            method, target, headers, body = got
            keep = headers.get("connection", "").lower() != "close"
            if method == "GET" and target.startswith("/v1/models"):
                out = json.dumps({"object": "list", "data": [{"id": MODEL, "object": "model"}]}).encode()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(out) + out)
                await writer.drain()
                if not keep:
                    return
                continue
            doc = json.loads(body or b"{}")
            chat = target.startswith("/v1/chat/completions")
            n = max(1, int(doc.get("max_tokens") or doc.get("max_completion_tokens") or 16))
            counter[0] += 1
            rid, created = f"cmpl-{counter[0]}", int(time.time())
            prompt_tokens = len(json.dumps(doc.get("messages") or doc.get("prompt") or "").split())
            if style.json_kib > 0 or not doc.get("stream"):
                await asyncio.sleep((style.prefill_ms + style.gap_ms * (n - 1)) / 1e3)
                text = ("alpha beta " * (style.json_kib * 1024 // 11 + 1))[: style.json_kib * 1024] if style.json_kib > 0 else "alpha " * n
                obj = {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": created, "model": MODEL,
                       "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"} if chat
                                   else {"index": 0, "text": text, "finish_reason": "length"}],
                       "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": n, "total_tokens": prompt_tokens + n}}
                out = json.dumps(obj).encode()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(out) + out)
                await writer.drain()
                if not keep:
                    return
                continue
            writes = [b"".join(w) for w in raw_events(style, n, rid, created, prompt_tokens, chat)]
            head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
            if style.framing == "chunked":
                head += b"Transfer-Encoding: chunked\r\n"
            elif style.framing == "length":
                head += b"Content-Length: %d\r\n" % sum(map(len, writes))
            else:
                head += b"Connection: close\r\n"
            writer.write(head + b"\r\n")
            await writer.drain()
            if style.prefill_ms > 0:
                await asyncio.sleep(style.prefill_ms / 1e3)
            first_tok = 1 if chat else 0
            for i, w in enumerate(writes):
                if first_tok < i < len(writes) - 1 and style.gap_ms > 0:  # the first token right after the role chunk, the tail after the last

                    await asyncio.sleep(style.gap_ms / 1e3)
                if style.split_ms >= 0 and len(w) > max(1, style.split_tail):
                    h = len(w) - style.split_tail if style.split_tail else len(w) // 2
                    writer.write(_frame(style, w[:h]))
                    await writer.drain()
                    await asyncio.sleep(style.split_ms / 1e3)
                    w = w[h:]
                writer.write(_frame(style, w))
                await writer.drain()
            if style.framing == "chunked":
                writer.write(b"0\r\n\r\n")
                await writer.drain()
            if style.framing == "close" or not keep:
                return
    except ConnectionError:
        return
    finally:
        writer.close()


async def serve_raw_engine(style: RawStyle, host: str, port: int) -> asyncio.base_events.Server:
    counter = [0]
    return await asyncio.start_server(lambda r, w: raw_engine_conn(style, r, w, counter), host, port)


def main() -> None:
    ap = argparse.ArgumentParser(description="plain aiohttp engine / forwarding proxy / raw-socket engine")
    ap.add_argument("role", choices=["engine", "proxy", "raw-engine"])
    ap.add_argument("--listen", required=True, help="HOST:PORT")
    ap.add_argument("--upstream", help="proxy: base URL to forward to")
    ap.add_argument("--delay-ms", type=float, default=0.0, help="proxy: inbound delay before forwarding")
    ap.add_argument("--rcvbuf", type=int, default=0, help="proxy: SO_RCVBUF of its upstream sockets (0: the system's)")
    ap.add_argument("--read-bytes", type=int, default=0, help="proxy: read the response this many bytes at a time (0: as it comes)")
    ap.add_argument("--read-pause-ms", type=float, default=0.0, help="proxy: pause between reads of --read-bytes")
    ap.add_argument("--gap-ms", type=float, default=2.0, help="engine: inter-token gap")
    ap.add_argument("--prefill-ms", type=float, default=3.0, help="engine: time before the role chunk")
    ap.add_argument("--line-end", choices=["lf", "crlf"], default="lf", help="raw-engine: SSE line ends")
    ap.add_argument("--framing", choices=["chunked", "length", "close"], default="chunked", help="raw-engine: response framing")
    ap.add_argument("--split-ms", type=float, default=-1.0, help="raw-engine: >= 0 splits every write in two, this far apart")
    ap.add_argument("--split-tail", type=int, default=0, help="raw-engine: with --split-ms, the second write is the last N bytes "
                    "(1 with --line-end crlf: the final \"\\n\" alone)")
    ap.add_argument("--tokens-per-write", type=int, default=1, help="raw-engine: token events per write")
    ap.add_argument("--token-bytes", type=int, default=0, help="raw-engine: bytes of text per token (0: one short word)")
    ap.add_argument("--comments", action="store_true", help="raw-engine: a comment and a data-less block before each token write")
    ap.add_argument("--usage-in-last", action="store_true", help="raw-engine: usage on the last content chunk")
    ap.add_argument("--json-kib", type=int, default=0, help="raw-engine: answer a non-streamed JSON body of this many KiB")
    a = ap.parse_args()
    host, _, port = a.listen.rpartition(":")
    if a.role == "raw-engine":
        style = RawStyle(a.gap_ms, a.prefill_ms, a.line_end, a.framing, a.split_ms, a.split_tail, a.tokens_per_write, a.token_bytes,
                         a.usage_in_last, a.json_kib, a.comments)

        async def run() -> None:
            server = await serve_raw_engine(style, host, int(port))
            async with server:
                await server.serve_forever()

        try:
            asyncio.run(run())
        except KeyboardInterrupt:
            pass
        return
    app = (engine_app(a.gap_ms, a.prefill_ms) if a.role == "engine"
           else proxy_app(a.upstream, a.delay_ms, a.rcvbuf, a.read_bytes, a.read_pause_ms))
    web.run_app(app, host=host, port=int(port), access_log=None, print=None, handle_signals=True)

if __name__ == "__main__":
    main()
