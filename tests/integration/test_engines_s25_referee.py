"""The referee's engines (deltatap/app/referee/engines.py) as they write on real loopback sockets: the raw engine's
styles (line ends, framing, split writes, tokens per write, token size, usage on the last chunk, a non-streamed JSON
answer, keep-alive) and the plain proxy as a slow reader; each answer parsed back with the referee's own HTTP/SSE
reassembly (deltatap/app/referee/reassembly.py), so the engine and the parser the referee trusts agree."""

from __future__ import annotations

import asyncio
import itertools
import json
import socket

import pytest
from aiohttp import web

from deltatap.app.referee.engines import RawStyle, proxy_app, raw_events, serve_raw_engine
from deltatap.app.referee.reassembly import Stream, first_last_content, parse_requests, parse_responses, sse_events

TIMEOUT_S = 5.0


def _request(n: int, close: bool = False, stream: bool = True) -> bytes:
    body = json.dumps({"model": "m", "stream": stream, "max_tokens": n, "messages": [{"role": "user", "content": "hi"}]}).encode()
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: e\r\nContent-Type: application/json\r\nX-Request-ID: r%d\r\n"
            b"Content-Length: %d\r\n%s\r\n" % (n, len(body), b"Connection: close\r\n" if close else b"")) + body


async def _exchange(port: int, reqs: list[bytes], until_close: bool = False) -> tuple[bytes, list[bytes], bool]:
    """Send the requests one after another on one connection, each after the previous answer ended (keep-alive);
    returns the bytes, each recv's bytes (the reads), and whether the server closed."""
    r, w = await asyncio.open_connection("127.0.0.1", port)
    got, reads, closed = bytearray(), [], False
    try:
        for i, req in enumerate(reqs):
            w.write(req)
            await w.drain()
            while True:
                data = await r.read(65536)
                if not data:
                    closed = True
                    break
                reads.append(data)
                got += data
                resps = _parse(bytes(got), len(reqs[: i + 1]), until_close=False)
                if not until_close and len(resps) > i and resps[i].complete and resps[i].end == len(got):
                    break
            if closed:
                break
    finally:
        w.close()
    return bytes(got), reads, closed


def _parse(data: bytes, n_req: int, until_close: bool) -> list:
    st = Stream(("a", 1, "b", 2))
    st.data = data
    req = Stream(("b", 2, "a", 1))
    req.data = b"".join(_request(1) for _ in range(n_req))
    return parse_responses(st, parse_requests(req))


async def _with_engine(style: RawStyle, fn):
    server = await serve_raw_engine(style, "127.0.0.1", 0)
    try:
        port = server.sockets[0].getsockname()[1]
        return await asyncio.wait_for(fn(port), TIMEOUT_S)
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize("line_end", ["lf", "crlf"])
@pytest.mark.parametrize("framing", ["chunked", "length", "close"])
async def test_raw_engine_framings_and_line_ends_parse_to_the_same_tokens(line_end, framing):
    style = RawStyle(gap_ms=0, prefill_ms=0, line_end=line_end, framing=framing)
    got, _reads, closed = await _with_engine(style, lambda p: _exchange(p, [_request(5)], until_close=framing == "close"))
    head = got.split(b"\r\n\r\n", 1)[0].lower()
    assert (b"transfer-encoding: chunked" in head) == (framing == "chunked")
    assert (b"content-length:" in head) == (framing == "length")
    assert closed == (framing == "close")  # close-delimited: the server's FIN ends the body
    resp = _parse(got, 1, until_close=True)[0]
    assert resp.complete and resp.status == 200
    evs = sse_events(resp.body)
    assert [e.text for e in evs if e.text] == ["alpha ", "beta ", "gamma ", "delta ", "epsilon "]
    assert evs[-1].data == "[DONE]" and json.loads(evs[-2].data)["usage"]["completion_tokens"] == 5
    eol = b"\r\n\r\n" if line_end == "crlf" else b"\n\n"
    assert resp.body.count(eol) == len(evs) and (line_end == "lf") == (b"\r" not in resp.body)
    first, last = first_last_content(evs)
    assert first.text == "alpha " and last.text == "epsilon "
    # the completing byte of each event is the first byte of its blank line's line end (a parser dispatches there)
    assert all(resp.body[e.end - len(eol) // 2 : e.end + len(eol) // 2] == eol for e in evs)


async def test_raw_engine_split_writes_reach_the_client_as_separate_reads():
    style = RawStyle(gap_ms=0, prefill_ms=0, split_ms=20.0)  # 20 ms apart: the two halves cannot be merged by the reader
    got, reads, _ = await _with_engine(style, lambda p: _exchange(p, [_request(2)]))
    resp = _parse(got, 1, until_close=False)[0]
    writes = [b"".join(w) for w in raw_events(style, 2, "x", 0, 1)]
    assert len(writes) == 4  # role, two tokens, usage + [DONE]
    # each write is two chunks of the chunked coding; every split event's first half came in a read before its end
    assert resp.body.count(b"data: ") == 5 and len(resp.body_map) == 8
    ends = list(itertools.accumulate(len(x) for x in reads))

    def read_of(off: int) -> int:
        return next(i for i, n in enumerate(ends) if off < n)

    for ev in sse_events(resp.body)[:3]:  # role, two tokens: each one write, split in the middle
        start = resp.body.rfind(b"data: ", 0, ev.end)
        assert read_of(resp.stream_offset(start)) < read_of(resp.stream_offset(ev.end))  # its end came in a later read


async def test_raw_engine_tokens_per_write_token_bytes_and_usage_in_last():
    style = RawStyle(gap_ms=0, prefill_ms=0, tokens_per_write=3, token_bytes=4000, usage_in_last=True)
    got, _reads, _ = await _with_engine(style, lambda p: _exchange(p, [_request(7)]))
    resp = _parse(got, 1, until_close=False)[0]
    assert len(resp.body_map) == 1 + 3 + 1  # role; tokens 3 + 3 + 1; [DONE] alone (the usage rides on the last token)
    evs = sse_events(resp.body)
    toks = [e for e in evs if e.text]
    assert len(toks) == 7 and all(len(e.text) == 4000 for e in toks)
    assert json.loads(toks[-1].data)["usage"]["completion_tokens"] == 7 and json.loads(toks[-1].data)["choices"][0]["finish_reason"] == "length"
    assert [e.data for e in evs[len(toks) + 1 :]] == ["[DONE]"]


async def test_raw_engine_keep_alive_and_a_large_json_answer():
    style = RawStyle(gap_ms=0, prefill_ms=0, json_kib=1024)
    got, _reads, closed = await _with_engine(style, lambda p: _exchange(p, [_request(3), _request(4)]))
    assert not closed
    resps = _parse(got, 2, until_close=False)
    assert len(resps) == 2 and all(r.complete for r in resps)
    docs = [json.loads(r.body) for r in resps]
    assert [d["id"] for d in docs] == ["cmpl-1", "cmpl-2"]  # one connection, two answers
    assert all(len(d["choices"][0]["message"]["content"]) == 1024 * 1024 for d in docs)
    assert resps[0].headers["content-length"] == str(len(resps[0].body))


async def test_proxy_as_a_slow_reader_passes_the_answer_unchanged():
    style = RawStyle(gap_ms=0, prefill_ms=0, token_bytes=2000)

    async def run(eport: int):
        app = proxy_app(f"http://127.0.0.1:{eport}", 0.0, rcvbuf=1024, read_bytes=512, read_pause_ms=1.0)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        try:
            pport = site._server.sockets[0].getsockname()[1]
            direct, _, _ = await _exchange(eport, [_request(6)])
            through, reads, _ = await _exchange(pport, [_request(6)])
        finally:
            await runner.cleanup()
        return direct, through, reads

    direct, through, reads = await _with_engine(style, run)
    a, b = _parse(direct, 1, False)[0], _parse(through, 1, False)[0]
    assert a.complete and b.complete
    strip = lambda body: [json.loads(e.data).get("choices") for e in sse_events(body) if e.data != "[DONE]"]  # noqa: E731
    assert strip(a.body) == strip(b.body)  # the same events (ids differ: cmpl-1 vs cmpl-2)
    assert len(b.body_map) > len(a.body_map)  # re-chunked as read, 512 bytes at a time


def test_small_window_socket_factory_sets_the_receive_buffer():
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
    assert s.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) < 16384  # (what the slow reader relies on: a small window)
    s.close()


def test_an_event_completes_at_the_first_byte_of_its_blank_lines_line_end():
    # "\r\n\r" + "\n": a parser dispatches at the blank line's "\r" (WHATWG: a lone "\r" ends a line), before the "\n"
    body = b'data: {"choices":[{"delta":{"content":"a"}}]}\r\n\r\n' + b"data: x\n\n" + b"data: y\r\r"
    evs = sse_events(body)
    assert [body[e.end : e.end + 1] for e in evs] == [b"\r", b"\n", b"\r"]
    assert evs[0].end == body.index(b"\r\n\r\n") + 2 and evs[0].text == "a"


async def test_raw_engine_split_tail_sends_the_final_lf_of_a_crlf_event_alone():
    style = RawStyle(gap_ms=0, prefill_ms=0, line_end="crlf", split_ms=20.0, split_tail=1)
    got, reads, _ = await _with_engine(style, lambda p: _exchange(p, [_request(2)]))
    resp = _parse(got, 1, until_close=False)[0]
    ends = list(itertools.accumulate(len(x) for x in reads))

    def read_of(off: int) -> int:
        return next(i for i, n in enumerate(ends) if off < n)

    for ev in sse_events(resp.body)[:3]:  # role, two tokens: the blank line's "\r" in one read, its "\n" in a later one
        cr = resp.stream_offset(ev.end)
        assert resp.body[ev.end : ev.end + 2] == b"\r\n"
        assert read_of(cr) < read_of(resp.stream_offset(ev.end + 1))
    with pytest.raises(ValueError):
        RawStyle(split_tail=1)  # (needs --split-ms)


async def test_raw_engine_comments_and_data_less_blocks_are_no_events():
    style = RawStyle(gap_ms=0, prefill_ms=0, comments=True)
    got, _reads, _ = await _with_engine(style, lambda p: _exchange(p, [_request(3)]))
    resp = _parse(got, 1, until_close=False)[0]
    assert resp.body.count(b": keep-alive\n\n") == 3 and resp.body.count(b"\nid: cmpl-1\n\n") == 3
    evs = sse_events(resp.body)
    assert [e.text for e in evs if e.text] == ["alpha ", "beta ", "gamma "] and len(evs) == 1 + 3 + 2  # role, tokens, usage, [DONE]
    first, _ = first_last_content(evs)
    assert resp.body[: first.end].endswith(b'"alpha "},"finish_reason":null}]}\n')
