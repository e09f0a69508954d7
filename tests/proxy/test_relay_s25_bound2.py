"""Session 25 ("bound2"): an exchange that ends while a forwarding write of its is still held by TCP (a slow reader)
keeps its finish (record, counters, span; counted in flight) until the write has left (``relay.HOLD_FINISH_S``).
Live on 127.0.0.1, with the packet log and without it: the raw upstream of test_relay_s25_bound streams a whole
response (head larger than the client's 4 KiB window, first token, the rest) in ~0.1 s; the client

* reads 0.3 s after its request, after the stream ended: no span while it has not read (the exchange in flight), then
  the last token's write bounded by its last byte's departure (packet log) or by the later drained check, its
  interval reaching the client's first read (it was unknown in every such span before: docs/benchmarks.md, session 25 bound);
* closes without reading: the span comes at once (not after the limit), the held writes stated unknown;
* is still not reading when the tap closes: the close does not wait for the limit, the span is out, unknown."""

from __future__ import annotations

import asyncio
import socket
import threading

from deltatap.core.vocab import Attr, TapEvent, parse_stamp_bounds
from deltatap.proxy import relay
from tests.proxy.test_relay_s25_bound import TIMEOUT_S, _exchange, _upstream, plog_mode  # noqa: F401 (the fixture)


async def test_a_slow_readers_last_token_is_settled_once_read(make_tap, span_exporter, plog_mode):
    a, rec, began = await _exchange(make_tap, span_exporter, 0.3, 0.0)
    stated = parse_stamp_bounds(a.get(Attr.STAMP_BOUNDS))
    obs = rec.stream
    assert obs.last_token_mono_ns < began  # (the tap had read the stream's end before the client read: the case was met)
    for ev, t in ((TapEvent.RESPONSE_HEADERS_FORWARDED, rec.response_headers_forwarded),
                  (TapEvent.FIRST_TOKEN_FORWARDED, obs.first_token_forwarded_mono_ns),
                  (TapEvent.LAST_TOKEN_FORWARDED, obs.last_token_forwarded_mono_ns)):
        b = stated.get(str(ev), (0, 0))[1]
        assert b >= 0, (ev, a.get(Attr.STAMP_BOUNDS))  # known now: placed, or bounded by the later check
        assert t + b >= began, (ev, (began - t - b) / 1e6)  # the interval reaches the bytes' departure
        if plog_mode == "packet_log":  # (placed from the log: exact after the client began to read, or an interval
            assert b > 0 or t >= began, ev  # over its write's segments, which reaches that, asserted above)
        else:
            assert b > 0, ev  # never stated exact


async def _held(make_tap, span_exporter):
    """A tap and a client (4 KiB window) that sent its request and reads nothing: returns once the stream is over
    (the upstream closed) and the exchange waits for its writes. (tap, client socket, the upstream's thread, listener)."""
    listener = socket.create_server(("127.0.0.1", 0))
    th = threading.Thread(target=_upstream, args=(listener, 0.0), daemon=True)
    th.start()
    tap = await make_tap(f"http://127.0.0.1:{listener.getsockname()[1]}")
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    client.connect(("127.0.0.1", tap.port))
    client.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: e\r\nContent-Length: 2\r\n\r\n{}")
    async with asyncio.timeout(TIMEOUT_S):
        while th.is_alive() or not any(d.holding for d in list(tap.tap.connections)):
            await asyncio.sleep(0.01)
    assert tap.tap.in_flight == 1 and not span_exporter.get_finished_spans()  # (held: no span, still in flight)
    return tap, client, th, listener


def _unknown(span_exporter) -> dict:
    spans = span_exporter.get_finished_spans()
    assert len(spans) == 1
    stated = parse_stamp_bounds(spans[0].attributes.get(Attr.STAMP_BOUNDS))
    assert stated.get(str(TapEvent.LAST_TOKEN_FORWARDED)) == (0, -1), stated
    return stated


async def test_a_held_finish_ends_when_the_client_closes(make_tap, span_exporter, plog_mode, monkeypatch):
    monkeypatch.setattr(relay, "HOLD_FINISH_S", 60.0)  # (never reached within the test's timeout)
    tap, client, th, listener = await _held(make_tap, span_exporter)
    try:
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        client.close()  # (unread bytes: an RST)
        async with asyncio.timeout(TIMEOUT_S):
            while not span_exporter.get_finished_spans():
                tap.tap.telemetry.processor.force_flush()
                await asyncio.sleep(0.01)
        assert tap.tap.in_flight == 0
        _unknown(span_exporter)
    finally:
        listener.close()
        th.join(TIMEOUT_S)


async def test_a_held_finish_ends_when_the_tap_closes(make_tap, span_exporter, plog_mode, monkeypatch):
    monkeypatch.setattr(relay, "HOLD_FINISH_S", 60.0)
    tap, client, th, listener = await _held(make_tap, span_exporter)
    try:
        async with asyncio.timeout(TIMEOUT_S):
            await tap.close(grace_s=30)  # (neither the grace nor the limit is waited for)
        assert tap.tap.in_flight == 0
        _unknown(span_exporter)
    finally:
        client.close()
        listener.close()
        th.join(TIMEOUT_S)
