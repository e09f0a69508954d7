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
from slow_client_rig import TIMEOUT_S, ask_then_read, record_finishes, small_window_client, sse_upstream

from deltatap.net import kstamp, pktstamp


async def test_a_first_token_tcp_held_is_placed_at_its_departure(make_tap):
    if not kstamp.enabled() or pktstamp.packet_log() is None:
        pytest.skip("needs kernel stamps and the packet log (CAP_NET_RAW)")
    listener = socket.create_server(("127.0.0.1", 0))
    th = threading.Thread(target=sse_upstream, args=(listener, 60_000, 0.4), daemon=True)  # (a head larger than the client's window)
    th.start()
    try:
        tap = await make_tap(f"http://127.0.0.1:{listener.getsockname()[1]}")
        seen = record_finishes(tap)
        client = small_window_client(tap.port)
        began: list[int] = []

        def talk() -> bytes:  # (for 0.2 s the window stays shut: the tap's first-token write waits in its kernel)
            return ask_then_read(client, lambda: time.sleep(0.2), began)

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
