"""A light SSE engine (aiohttp) and a raw HTTP/1.1 client for the reliability suite.

The engine answers ``POST /v1/chat/completions?n=N&gap_ms=G`` with N OpenAI chat chunks G ms apart, a usage chunk
and ``[DONE]`` (``?status=CODE``, or a body with ``"fail": TEXT``: that status, or 400, with a small JSON error
body carrying TEXT). Every request leaves an
:class:`Seen` entry: its body, whether the handler finished and whether it saw the client go away.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field

from aiohttp import web


@dataclass
class Seen:
    path: str
    body: bytes = b""
    events_written: int = 0
    completed: bool = False
    saw_close: bool = False


def content_chunk(i: int, word: str = "tok") -> bytes:
    chunk = {"object": "chat.completion.chunk", "model": "m", "choices": [{"index": 0, "delta": {"content": f"{word}{i} "}}]}
    return f"data: {json.dumps(chunk)}\n\n".encode()


@dataclass
class Engine:
    runner: web.AppRunner
    port: int
    seen: list[Seen] = field(default_factory=list)
    word: str = "tok"  # the completion's text: word0, word1, ... (a request body's "say" overrides it)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def close(self) -> None:
        await self.runner.cleanup()


def build_app(eng: Engine, record: bool = True) -> web.Application:
    async def chat(request: web.Request) -> web.StreamResponse:
        s = Seen(request.path_qs)
        if record:
            eng.seen.append(s)
        try:
            s.body = await request.read()
            n, gap = int(request.query.get("n", 10)), float(request.query.get("gap_ms", 10)) / 1000
            status = int(request.query.get("status", 200))
            try:
                asked = json.loads(s.body or b"{}")
            except ValueError:
                asked = {}
            word = asked.get("say") or eng.word
            if "fail" in asked:  # an error answer whose body carries the request's "fail" text
                status, msg = 400, asked["fail"]
            else:
                msg = "no"
            if status != 200:
                s.completed = True
                return web.json_response({"error": {"message": msg}}, status=status)
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
            await resp.prepare(request)
            await resp.write(b'data: {"object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"role":"assistant"}}]}\n\n')
            for i in range(n):
                await asyncio.sleep(gap)
                await resp.write(content_chunk(i, word))
                s.events_written += 1
            await resp.write(b'data: {"object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":%d}}\n\n' % n)
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            s.completed = True
            return resp
        except (asyncio.CancelledError, ConnectionError):
            s.saw_close = True
            raise

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    return app


async def start_engine(record: bool = True, backlog: int = 128) -> Engine:
    eng = Engine(runner=None, port=0)  # type: ignore[arg-type]
    eng.runner = web.AppRunner(build_app(eng, record), handler_cancellation=True, access_log=None)
    await eng.runner.setup()
    site = web.TCPSite(eng.runner, "127.0.0.1", 0, backlog=backlog)
    await site.start()
    eng.port = site._server.sockets[0].getsockname()[1]
    return eng


# ---- the raw client ------------------------------------------------------------------------------------
@dataclass
class Got:
    """What a client saw: the status (0: no response head), the de-chunked body, and how it ended:
    ``eof`` (FIN after a complete response), ``truncated`` (FIN before the end of the body), ``reset``
    (ECONNRESET), ``stalled`` (nothing more within the client's patience; the client then closes)."""

    status: int
    body: bytes
    end: str
    raw: bytes
    tail_s: float = 0.0  # from the last byte to the end (EOF, reset or giving up)


def dechunk(data: bytes) -> tuple[bytes, bool]:
    """De-chunk as far as the bytes go: (body, complete)."""
    out, pos = bytearray(), 0
    while True:
        nl = data.find(b"\r\n", pos)
        if nl < 0:
            return bytes(out), False
        size = int(data[pos:nl].split(b";")[0] or b"0", 16)
        if size == 0:
            return bytes(out), data.find(b"\r\n\r\n", nl - 2 if nl >= 2 else 0) >= 0
        start = nl + 2
        out += data[start : start + size]
        if len(data) < start + size + 2:
            return bytes(out), False
        pos = start + size + 2


def parse(raw: bytes, end: str, tail_s: float = 0.0) -> Got:
    head_end = raw.find(b"\r\n\r\n")
    if head_end < 0:
        return Got(0, b"", end, raw, tail_s)
    head, rest = raw[:head_end].decode("latin-1"), raw[head_end + 4 :]
    status = int(head.split(" ", 2)[1])
    fields = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in head.split("\r\n")[1:])}
    if fields.get("transfer-encoding", "").lower() == "chunked":
        body, complete = dechunk(rest)
    elif "content-length" in fields:
        n = int(fields["content-length"])
        body, complete = rest[:n], len(rest) >= n
    else:
        body, complete = rest, end == "eof"
    if end == "eof" and not complete:
        end = "truncated"
    return Got(status, body, end, raw, tail_s)


async def raw_request(port: int, path: str, body: bytes, headers: dict[str, str] | None = None, patience_s: float = 3.0) -> Got:
    """POST ``body`` with ``Connection: close`` and read until EOF, reset, or ``patience_s`` without a byte."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    writer.write(
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        f"Connection: close\r\n{extra}\r\n".encode() + body
    )
    loop = asyncio.get_running_loop()
    raw, end, last = bytearray(), "eof", loop.time()
    try:
        await writer.drain()
        while True:
            data = await asyncio.wait_for(reader.read(65536), patience_s)
            if not data:
                break
            raw += data
            last = loop.time()
    except asyncio.TimeoutError:
        end = "stalled"
    except ConnectionResetError:
        end = "reset"
    finally:
        writer.transport.abort()
    return parse(bytes(raw), end, loop.time() - last)
