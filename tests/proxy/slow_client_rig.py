"""The rig of the held-write tests (test_relay_s24_held, test_relay_s25_bound): a raw upstream on a blocking socket
(in a thread) that answers one request with an SSE response whose head is larger than a small client window, the
client socket with that window, and the tap's finished records."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

from deltatap.core.clock import mono_ns
from deltatap.proxy.record import TapRecord

TIMEOUT_S = 10.0
FIRST = b'data: {"choices":[{"delta":{"content":"first"}}]}\n\n'
LATER = b'data: {"choices":[{"delta":{"content":"later"}}]}\n\n'
DONE = b"data: [DONE]\n\n"


def chunk(b: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(b), b)


def serve_one(listener: socket.socket, answer: Callable[[socket.socket, bytes], None], recv_size: int = 65536) -> None:
    """Accept until a connection brings a request head (one that ends first is the tap's start-up probe), then
    ``answer(conn, what was read)``, and return (the connection closed after it)."""
    listener.settimeout(TIMEOUT_S)
    while True:
        conn, _ = listener.accept()
        with conn:
            conn.settimeout(TIMEOUT_S)
            buf = b""
            while b"\r\n\r\n" not in buf:
                data = conn.recv(recv_size)
                if not data:
                    break
                buf += data
            if b"\r\n\r\n" not in buf:
                continue  # (the tap's start-up probe)
            answer(conn, buf)
            return


def sse_upstream(listener: socket.socket, pad: int, pause_s: float) -> None:
    """Answers one request: a response head with a ``pad``-byte header (larger than the client's window), 50 ms later
    the first token, ``pause_s`` later the rest."""

    def answer(conn: socket.socket, _buf: bytes) -> None:
        head_pad = b"X-Pad: " + b"p" * pad + b"\r\n"
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n" + head_pad + b"Transfer-Encoding: chunked\r\n\r\n")
        time.sleep(0.05)
        conn.sendall(chunk(FIRST))
        time.sleep(pause_s)
        conn.sendall(chunk(LATER) + chunk(DONE) + b"0\r\n\r\n")
        time.sleep(0.05)

    serve_one(listener, answer)


def record_finishes(tap) -> list[TapRecord]:
    """The records the tap (``tap.tap``: a started tap's) finishes from now on, in order (each still finished)."""
    seen: list[TapRecord] = []
    real_finish = tap.tap.finish

    def finish(span, rec):
        seen.append(rec)
        real_finish(span, rec)

    tap.tap.finish = finish
    return seen


def small_window_client(port: int) -> socket.socket:
    """A client connected to 127.0.0.1:``port`` with a 4 KiB receive buffer (its window fills at once)."""
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    client.settimeout(TIMEOUT_S)
    client.connect(("127.0.0.1", port))
    return client


def ask_then_read(client: socket.socket, wait: Callable[[], None], began: list[int]) -> bytes:
    """Send one streaming request, ``wait()`` (the client's window stays shut meanwhile), note in ``began`` when the
    client begins to read, then read to the end of the chunked response (blocking: run it in a thread)."""
    client.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: e\r\nContent-Length: 2\r\n\r\n{}")
    wait()
    began.append(mono_ns())
    got = b""
    while not got.endswith(b"0\r\n\r\n"):
        data = client.recv(65536)
        assert data, got[-200:]
        got += data
    return got
