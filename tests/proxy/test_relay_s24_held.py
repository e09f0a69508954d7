"""Session 24: the first token's write when TCP still holds its bytes at ``send``'s return (the client's window shut:
it does not read yet). The tap used to stamp it as gone within its send; now its departure is taken from the packet
log at a later read of the exchange, once the bytes left (``proxy/relay.py``: ``Upstream._place_first``;
``deltatap/net/kstamp.py``: ``_sent``). Live on 127.0.0.1: a raw upstream answers a large response head (it fills a
small client window), the first token, and, 0.4 s later, the rest; the client reads nothing for 0.2 s, then
everything. The span's first-token-forwarded time is the token's departure, after the client began to read, not its
write ~0.2 s before."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest

from deltatap.core.clock import mono_ns
from deltatap.net import kstamp, pktstamp
from deltatap.proxy.record import TapRecord

TIMEOUT_S = 10.0
_FIRST = b'data: {"choices":[{"delta":{"content":"first"}}]}\n\n'
_LATER = b'data: {"choices":[{"delta":{"content":"later"}}]}\n\n'
_DONE = b"data: [DONE]\n\n"


def _chunk(b: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(b), b)


def _upstream(listener: socket.socket) -> None:
    listener.settimeout(TIMEOUT_S)
    while True:
        conn, _ = listener.accept()
        with conn:
            conn.settimeout(TIMEOUT_S)
            buf = b""
            while b"\r\n\r\n" not in buf:
                data = conn.recv(65536)
                if not data:
                    break
                buf += data
            if b"\r\n\r\n" not in buf:
                continue  # (the tap's start-up probe)
            pad = b"X-Pad: " + b"p" * 60_000 + b"\r\n"  # a head larger than the client's window
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n" + pad + b"Transfer-Encoding: chunked\r\n\r\n")
            time.sleep(0.05)
            conn.sendall(_chunk(_FIRST))
            time.sleep(0.4)
            conn.sendall(_chunk(_LATER) + _chunk(_DONE) + b"0\r\n\r\n")
            time.sleep(0.05)
            return


async def test_a_first_token_tcp_held_is_placed_at_its_departure(make_tap):
    if not kstamp.enabled() or pktstamp.packet_log() is None:
        pytest.skip("needs kernel stamps and the packet log (CAP_NET_RAW)")
    listener = socket.create_server(("127.0.0.1", 0))
    th = threading.Thread(target=_upstream, args=(listener,), daemon=True)
    th.start()
    try:
        tap = await make_tap(f"http://127.0.0.1:{listener.getsockname()[1]}")
        seen: list[TapRecord] = []
        real_finish = tap.tap.finish

        def finish(span, rec):
            seen.append(rec)
            real_finish(span, rec)

        tap.tap.finish = finish
        client = socket.socket()
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        client.settimeout(TIMEOUT_S)
        client.connect(("127.0.0.1", tap.port))
        began: list[int] = []

        def talk() -> bytes:
            client.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: e\r\nContent-Length: 2\r\n\r\n{}")
            time.sleep(0.2)  # the window stays shut: the tap's first-token write waits in its kernel
            began.append(mono_ns())
            got = b""
            while not got.endswith(b"0\r\n\r\n"):
                data = client.recv(65536)
                assert data, got[-200:]
                got += data
            return got

        loop = asyncio.get_running_loop()
        async with asyncio.timeout(TIMEOUT_S):
            got = await loop.run_in_executor(None, talk)
            while not seen:
                await asyncio.sleep(0.01)
    finally:
        listener.close()
        th.join(TIMEOUT_S)
    assert b"first" in got and b"later" in got
    obs = seen[0].stream
    t, bound = obs.first_token_forwarded_mono_ns, obs.first_token_forwarded_bound_ns
    assert bound == 0, bound  # placed: its departure from the packet log
    assert t >= began[0], (began[0] - t) / 1e6  # it left once the client read, not when the tap wrote it
    assert obs.first_token_mono_ns < began[0]  # (it had been read by the tap well before: the case was met)
