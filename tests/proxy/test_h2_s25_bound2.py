"""Session 25 ("bound2"): the HTTP/2 relay's forwarding writes whose bytes TCP still held when stamped (a client that
does not read: its 4 KiB receive buffer full) are stated unknown (``=0/?``) once the stream's finish has waited its
limit for them (``relay.HOLD_FINISH_S``, here 0.2 s), never exact; a client that reads as it comes gets exact (or
finitely bounded) writes: one still held at the stream's end (TCP autocorking the last frames) is bounded by the
finish's next check. Live on 127.0.0.1: the h2 peer of test_h2 upstream, a raw h2 client
(``h2`` on a blocking socket, SO_RCVBUF 4 KiB) in a thread.

Stream 1 streams 80 chunks at once (~8 KB, past the client's TCP window: the last token's write is held); stream 3,
opened once stream 1's span is out, gets its response head behind those bytes (its head's write held too)."""

from __future__ import annotations

import asyncio
import socket
import threading

import h2.config
import h2.connection
import h2.events
from h2_peer import start_h2_peer
from tap_helpers import wait_spans

from deltatap.core.vocab import Attr, TapEvent, parse_stamp_bounds
from deltatap.proxy import relay

TIMEOUT_S = 10.0


def _req(port: int, path: str) -> list[tuple[bytes, bytes]]:
    return [(b":method", b"POST"), (b":path", path.encode()), (b":scheme", b"http"), (b":authority", f"127.0.0.1:{port}".encode())]


def _client(port: int, rcvbuf: int | None, second: threading.Event, go: threading.Event, got: dict) -> None:
    s = socket.socket()
    if rcvbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.settimeout(TIMEOUT_S)
    s.connect(("127.0.0.1", port))
    with s:
        c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
        c.initiate_connection()
        c.send_headers(1, _req(port, "/v1/chat/completions?first_ms=0&gap_ms=0&n=80"), end_stream=True)
        s.sendall(c.data_to_send())
        if rcvbuf:  # (a client that does not read: stream 3 once stream 1's span is out, then reads)
            assert second.wait(TIMEOUT_S)
        c.send_headers(3, _req(port, "/v1/chat/completions?first_ms=0&gap_ms=0&n=1"), end_stream=True)
        s.sendall(c.data_to_send())
        if rcvbuf:
            assert go.wait(TIMEOUT_S)
        ended: set[int] = set()
        while ended != {1, 3}:
            data = s.recv(65536)
            assert data, ended
            for ev in c.receive_data(data):
                if isinstance(ev, h2.events.DataReceived):
                    got[ev.stream_id] = got.get(ev.stream_id, b"") + ev.data
                    c.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                elif isinstance(ev, h2.events.StreamEnded):
                    ended.add(ev.stream_id)
            out = c.data_to_send()
            if out:
                s.sendall(out)


async def _run(make_tap, span_exporter, telemetry, rcvbuf: int | None) -> dict[str, dict]:
    peer = await start_h2_peer()
    try:
        tap = await make_tap(peer.url)
        second, go = threading.Event(), threading.Event()
        got: dict = {}
        th = threading.Thread(target=_client, args=(tap.port, rcvbuf, second, go, got), daemon=True)
        th.start()
        try:
            spans = await wait_spans(span_exporter, telemetry, 1, TIMEOUT_S)
            assert spans
            second.set()
            spans = await wait_spans(span_exporter, telemetry, 2, TIMEOUT_S)
            assert len(spans) == 2
        finally:
            second.set()
            go.set()
            await asyncio.get_running_loop().run_in_executor(None, th.join, TIMEOUT_S)
        assert b"[DONE]" in got.get(1, b"") and b"[DONE]" in got.get(3, b"")
    finally:
        await peer.close()
    out = {}
    for sp in spans:
        a = dict(sp.attributes)
        out["many" if b"t79" in got[1] and a.get(Attr.GENAI_OUTPUT_TOKENS) == 80 else "one"] = parse_stamp_bounds(a.get(Attr.STAMP_BOUNDS))
    assert set(out) == {"many", "one"}, out
    return out


async def test_h2_writes_held_by_a_client_that_does_not_read_are_stated_unknown(make_tap, span_exporter, telemetry, monkeypatch):
    monkeypatch.setattr(relay, "HOLD_FINISH_S", 0.2)  # (each stream's finish waits this long for its held writes)
    b = await _run(make_tap, span_exporter, telemetry, 4096)
    assert b["many"].get(str(TapEvent.LAST_TOKEN_FORWARDED)) == (0, -1), sorted(b["many"].items())
    assert b["one"].get(str(TapEvent.RESPONSE_HEADERS_FORWARDED)) == (0, -1), b["one"]  # (was stated exact: clamped to 0)


async def test_h2_writes_to_a_reading_client_are_known(make_tap, span_exporter, telemetry):
    b = await _run(make_tap, span_exporter, telemetry, None)
    for which in ("many", "one"):
        for ev in (TapEvent.RESPONSE_HEADERS_FORWARDED, TapEvent.FIRST_TOKEN_FORWARDED, TapEvent.LAST_TOKEN_FORWARDED):
            assert b[which].get(str(ev), (0, 0))[1] >= 0, (which, ev, b[which])


def test_grpc_request_messages_forwarded_while_held_are_stated_unknown():
    from deltatap.proxy.grpc import GrpcRequestObserver

    gq = GrpcRequestObserver()
    msg = b"\x00" + (3).to_bytes(4, "big") + b"abc"
    assert gq.feed(msg + msg, 1_000, 5) == 2
    gq.forwarded(1, (1_000, 5), 2_000, -1)  # (the first message's write: TCP still held its bytes)
    gq.forwarded(2, (1_000, 5), 3_000, 40)
    b = gq.span_bounds()
    assert b[TapEvent.FIRST_REQUEST_MESSAGE_FORWARDED] == (0, -1)  # (was clamped to 0: exact)
    assert b[TapEvent.LAST_REQUEST_MESSAGE_FORWARDED] == (0, 40)


async def test_h2_a_held_finish_ends_when_the_client_goes(make_tap, span_exporter, telemetry, monkeypatch):
    monkeypatch.setattr(relay, "HOLD_FINISH_S", 60.0)  # (never reached within the test's timeout)
    peer = await start_h2_peer()
    try:
        tap = await make_tap(peer.url)
        gone = threading.Event()

        def client() -> None:
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.settimeout(TIMEOUT_S)
            s.connect(("127.0.0.1", tap.port))
            c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
            c.initiate_connection()
            c.send_headers(1, _req(tap.port, "/v1/chat/completions?first_ms=0&gap_ms=0&n=80"), end_stream=True)
            s.sendall(c.data_to_send())
            gone.wait(TIMEOUT_S)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            s.close()  # (unread bytes: an RST)

        th = threading.Thread(target=client, daemon=True)
        th.start()
        try:
            async with asyncio.timeout(TIMEOUT_S):
                while not any(getattr(d, "held_streams", None) for d in list(tap.tap.connections)):
                    await asyncio.sleep(0.01)
            assert not await wait_spans(span_exporter, telemetry, 1, 0.05) and tap.tap.in_flight == 1  # (held)
            gone.set()
            spans = await wait_spans(span_exporter, telemetry, 1, TIMEOUT_S)
        finally:
            gone.set()
            await asyncio.get_running_loop().run_in_executor(None, th.join, TIMEOUT_S)
        assert len(spans) == 1 and tap.tap.in_flight == 0
        b = parse_stamp_bounds(spans[0].attributes.get(Attr.STAMP_BOUNDS))
        assert b.get(str(TapEvent.LAST_TOKEN_FORWARDED)) == (0, -1), b
    finally:
        await peer.close()
