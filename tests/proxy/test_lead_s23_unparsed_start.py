"""Bytes that cannot begin an HTTP request go to the upstream at once, unparsed, and its answer comes back, as on a
direct connection. Before, the tap's reader waited for the head's empty line: a TLS ClientHello sent to a plain tap,
binary junk or a bare ``GET /`` line were held until ``--header-timeout-s`` and then dropped, the upstream never saw
them and the client got nothing (probed: 0.4 s direct vs 2 s and a close through the tap)."""

from __future__ import annotations

import asyncio

import pytest

from deltatap.net import h1

ANSWER = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 3\r\nConnection: close\r\n\r\nbad"
CLIENT_HELLO = bytes.fromhex("160301020001000" "1fc0303") + bytes(range(32)) + b"\x00\x02\x13\x01"


@pytest.fixture
async def raw_upstream():
    """Records what it receives; answers 400 to the first bytes of a connection, then closes (as many servers do
    to a request they cannot parse)."""
    got: list[bytes] = []

    async def serve(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        data = await r.read(65536)
        got.append(data)
        w.write(ANSWER)
        await w.drain()
        w.close()

    srv = await asyncio.start_server(serve, "127.0.0.1", 0)
    yield got, f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}"
    srv.close()
    await srv.wait_closed()


@pytest.mark.parametrize("sent", [CLIENT_HELLO, bytes(range(256)) * 2, b"GET /\r\n", b"hello there\n", b"\x00"],
                         ids=["tls-client-hello", "binary", "http09-line", "text-line", "nul"])
async def test_bytes_that_cannot_begin_a_request_reach_the_upstream_at_once(make_tap, raw_upstream, sent):
    got, url = raw_upstream
    tap = await make_tap(url, header_timeout_s=30.0)
    r, w = await asyncio.open_connection("127.0.0.1", tap.port)
    w.write(sent)
    await w.drain()
    answer = await asyncio.wait_for(r.read(), 10)  # (the old reader held them for the 30 s header timeout)
    w.close()
    assert answer == ANSWER
    assert b"".join(got) == sent  # unaltered


@pytest.mark.parametrize("head", [b"GET", b"GET /v1/chat/completions HTT", b"POST / HTTP/1.1\r\nHost: a", b"\r\n\r\nGET / HTTP/1.1\r\n"])
def test_the_start_of_a_request_still_waits_for_its_head(head):
    reader = h1.Reader(True)
    events = reader.feed(head)
    assert not [e for e in events if e[0] == h1.ERROR] and not reader.opaque


@pytest.mark.parametrize("sent, reason", [
    (b"\x16\x03\x01", "request line does not begin with a method"),
    (b"GET /\r\n", "request line is not METHOD SP TARGET SP VERSION"),
    (b"GET / HTTP/1.1 x\n", "request line is not METHOD SP TARGET SP VERSION"),
    (b"G(T / HTTP/1.1\r\n", "invalid method"),
    (b"GET / HTTP/9\r\nHost", "invalid HTTP version"),
])
def test_the_reader_says_why_at_once_c_and_python_alike(sent, reason):
    """Split anywhere, the reader fails as soon as the bytes show they cannot begin a request: at the first byte, or
    at the end of the first line. The C accelerator and the Python definition (``_py_request_start``) say the same
    (``both`` compares every event and state)."""
    from tests.kernel.test_h1_native import both

    for at in range(1, len(sent) + 1):
        pieces = [sent[:at], sent[at:]] if at < len(sent) else [sent]
        first = both(pieces, True)[0]  # the first feed's events
        shows = sent[:1] == b"\x16" or b"\n" in sent[:at]
        assert [e for e in first if e[0] == h1.ERROR] == ([(h1.ERROR, 0, reason)] if shows else []), (at, first)
