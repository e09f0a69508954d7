"""Session 25 ("bound"): a forwarding write whose bytes TCP still held when it was stamped (the client's window shut)
is never reported exact. Live on 127.0.0.1, with the packet log and without it (``kstamp.packet_log`` -> None, what
``DELTATAP_PACKET_STAMPS=0`` or a tap without CAP_NET_RAW gets): a raw upstream answers a response head larger than
the client's window, a first token, and the rest; the client (SO_RCVBUF 4 KiB)

* reads nothing until the exchange's span is out (a reader that never reads in time: the finish waits
  ``relay.HOLD_FINISH_S``, here 0.2 s, for them): the response head's, the first and the last token's writes are stated
  unknown (``=0/?``) - nothing saw them leave;
* reads after 0.2 s, while the stream goes on: each of those writes gets its departure (packet log) or a finite bound
  from the later check that TCP held nothing (``tcpi_notsent_bytes`` 0), and the interval holds the truth: the bytes
  left once the client read, so ``stamp + bound`` is at or after the client's first read."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest
from slow_client_rig import TIMEOUT_S, ask_then_read, record_finishes, serve_one, small_window_client, sse_upstream

from deltatap.core.clock import mono_ns
from deltatap.core.vocab import Attr, TapEvent, parse_stamp_bounds
from deltatap.net import kstamp, pktstamp
from deltatap.proxy import relay

def _upstream(listener: socket.socket, pause_s: float) -> None:
    sse_upstream(listener, 12_000, pause_s)  # (a head larger than the client's window, within the tap's send buffer)


async def _exchange(make_tap, span_exporter, read_after_s: float | None, pause_s: float):
    """One exchange through a tap; the client starts reading ``read_after_s`` after its request (None: once the
    span is out). Returns (the span's attributes, the record, the mono time the client began to read)."""
    listener = socket.create_server(("127.0.0.1", 0))
    th = threading.Thread(target=_upstream, args=(listener, pause_s), daemon=True)
    th.start()
    spanned = threading.Event()
    try:
        tap = await make_tap(f"http://127.0.0.1:{listener.getsockname()[1]}")
        seen = record_finishes(tap)
        client = small_window_client(tap.port)
        began: list[int] = []

        def wait() -> None:
            if read_after_s is None:
                assert spanned.wait(TIMEOUT_S)
            else:
                time.sleep(read_after_s)

        def talk() -> bytes:
            return ask_then_read(client, wait, began)

        loop = asyncio.get_running_loop()
        async with asyncio.timeout(TIMEOUT_S):
            fut = loop.run_in_executor(None, talk)
            while not span_exporter.get_finished_spans():
                await asyncio.sleep(0.01)
            spanned.set()
            got = await fut
        client.close()
    finally:
        spanned.set()
        listener.close()
        th.join(TIMEOUT_S)
    assert b"first" in got and b"later" in got
    span = span_exporter.get_finished_spans()[0]
    return dict(span.attributes), seen[0], began[0]


@pytest.fixture(params=["packet_log", "no_packet_log"])
def plog_mode(request, monkeypatch):
    if not kstamp.enabled():
        pytest.skip("needs kernel stamps")
    if request.param == "packet_log":
        if pktstamp.packet_log() is None:
            pytest.skip("needs the packet log (CAP_NET_RAW)")
    else:
        monkeypatch.setattr(kstamp, "packet_log", lambda: None)
    return request.param


async def test_writes_still_held_at_the_end_are_stated_unknown(make_tap, span_exporter, plog_mode, monkeypatch):
    monkeypatch.setattr(relay, "HOLD_FINISH_S", 0.2)  # (the finish waits for them this long: relay.HOLD_FINISH_S)
    a, rec, _began = await _exchange(make_tap, span_exporter, None, 0.05)
    stated = parse_stamp_bounds(a.get(Attr.STAMP_BOUNDS))
    for ev in (TapEvent.RESPONSE_HEADERS_FORWARDED, TapEvent.FIRST_TOKEN_FORWARDED, TapEvent.LAST_TOKEN_FORWARDED):
        assert stated.get(str(ev)) == (0, -1), (ev, a.get(Attr.STAMP_BOUNDS))
    assert "=0/?" in a[Attr.STAMP_BOUNDS]
    assert a.get(Attr.OVERHEAD_HOP_NS) is None  # (no bound on the hop either)


async def test_writes_held_then_read_get_a_bound_that_holds_the_truth(make_tap, span_exporter, plog_mode):
    a, rec, began = await _exchange(make_tap, span_exporter, 0.2, 0.4)
    stated = parse_stamp_bounds(a.get(Attr.STAMP_BOUNDS))
    obs = rec.stream
    # the response head's and the first token's writes waited for the client (it read 0.2 s after its request)
    for ev, t in ((TapEvent.RESPONSE_HEADERS_FORWARDED, rec.response_headers_forwarded),
                  (TapEvent.FIRST_TOKEN_FORWARDED, obs.first_token_forwarded_mono_ns)):
        b = stated.get(str(ev), (0, 0))[1]
        assert b >= 0, (ev, a.get(Attr.STAMP_BOUNDS))  # known: placed, or bounded by the later check
        assert t + b >= began, (ev, (began - t - b) / 1e6)  # the interval reaches the bytes' departure
        if plog_mode == "packet_log":  # (placed from the log: exact after the client began to read, or an interval
            assert b > 0 or t >= began, ev  # over its write's segments, which reaches that, asserted above)
        else:
            assert b > 0, ev  # never stated exact
    assert obs.first_token_mono_ns < began  # (the tap had read it well before: the case was met)


def _late_reader(listener: socket.socket, began: list[int]) -> None:
    """An upstream that reads a request's head, then nothing for 0.15 s (the tap's write of the body waits), then
    the body, and answers."""

    def answer(conn: socket.socket, buf: bytes) -> None:
        head, _, body = buf.partition(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length:", 1)[1].split(b"\r\n", 1)[0])
        time.sleep(0.15)
        began.append(mono_ns())
        while len(body) < length:
            data = conn.recv(1 << 20)
            assert data
            body += data
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")

    serve_one(listener, answer, recv_size=4096)


async def test_a_request_write_held_by_a_late_upstream_is_placed_or_bounded(make_tap, plog_mode):
    listener = socket.create_server(("127.0.0.1", 0))
    began: list[int] = []
    th = threading.Thread(target=_late_reader, args=(listener, began), daemon=True)
    th.start()
    try:
        tap = await make_tap(f"http://127.0.0.1:{listener.getsockname()[1]}")
        seen = record_finishes(tap)
        body = b'{"prompt": "' + b"p" * 2_000_000 + b'"}'

        def talk() -> bytes:
            with socket.create_connection(("127.0.0.1", tap.port), timeout=TIMEOUT_S) as c:
                c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: e\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
                got = b""
                while not got.endswith(b"{}"):
                    data = c.recv(65536)
                    assert data
                    got += data
                return got

        async with asyncio.timeout(TIMEOUT_S):
            await asyncio.get_running_loop().run_in_executor(None, talk)
            while not seen:
                await asyncio.sleep(0.01)
    finally:
        listener.close()
        th.join(TIMEOUT_S)
    rec = seen[0]
    b = rec.bounds[TapEvent.REQUEST_FORWARDED][1]
    assert b >= 0  # placed, or bounded by the later check: never unknown once the upstream read it all
    assert rec.forwarded + b >= began[0], (began[0] - rec.forwarded - b) / 1e6  # the interval reaches the departure
