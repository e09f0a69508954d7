"""The header timeout's one timer per connection: requests move its deadline, none makes or cancels a timer; the
timeout still closes an idle connection once the deadline after its last exchange has passed, never before."""

from __future__ import annotations

import asyncio
import time

HEAD = b"GET /status/200 HTTP/1.1\r\nHost: x\r\n\r\n"


async def _exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(HEAD)
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert head.startswith(b"HTTP/1.1 200")
    length = int(next(ln.split(b":")[1] for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length")))
    await asyncio.wait_for(reader.readexactly(length), 5)


async def test_a_busy_keep_alive_connection_outlives_the_header_timeout_and_closes_once_idle(upstream, make_tap):
    timeout = 0.8  # (the gaps between requests here are ~0.05 s: far inside it on a loaded machine too)
    tap = await make_tap(upstream.url, header_timeout_s=timeout)
    reader, writer = await asyncio.open_connection("127.0.0.1", tap.port)
    (down,) = tap.tap.connections
    timer = down.head_timer
    assert timer is not None
    began = time.monotonic()
    n = 0
    while time.monotonic() - began < 2.5 * timeout:  # requests for 2.5 header timeouts, each within one of the one before
        await _exchange(reader, writer)
        n += 1
        if time.monotonic() - began < 0.8 * timeout:  # (before the first timer's time: still that timer, moved by no request)
            assert down.head_timer is timer and not timer.cancelled()
        await asyncio.sleep(0.05)
    assert n >= 3 and tap.tap.counters.header_timeouts == 0 and down in tap.tap.connections
    assert down.head_deadline is not None and down.head_timer is not None
    idle_from = time.monotonic()
    assert await asyncio.wait_for(reader.read(), 10) == b""  # idle now: closed at the deadline after the last exchange
    waited = time.monotonic() - idle_from
    assert waited >= timeout / 2  # (the deadline was set as the last response went out, just before idle_from)
    assert tap.tap.counters.header_timeouts == 1
    writer.close()


async def test_a_head_that_comes_in_pieces_past_a_moved_deadline_is_still_timed_out(upstream, make_tap):
    tap = await make_tap(upstream.url, header_timeout_s=0.3)
    reader, writer = await asyncio.open_connection("127.0.0.1", tap.port)
    await _exchange(reader, writer)  # the deadline moves past the first timer's
    writer.write(b"GET /status/200 HTTP/1.1\r\n")  # ... and never the rest of the head
    assert await asyncio.wait_for(reader.read(), 10) == b""
    assert tap.tap.counters.header_timeouts == 1 and tap.tap.counters.requests.get("ok") == 1
    writer.close()
