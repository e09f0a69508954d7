"""A held write placed from the packet log states where the token it carries left: between its first byte's
departure and its last byte's (session 25's wire referee: behind a slow reader the window opens a few hundred bytes at a
time, and a write of four tokens, placed at its last byte's departure and stated exact, put its first token up to
233 ms late). One 48 KiB write to a peer whose small receive buffer it overfills, the peer then reading a little at a
time: the write leaves in pieces, ms apart; its placement is (the first piece's departure, up to the last's). Real
loopback, the C write path and the Python reference."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest

from deltatap.net import kstamp, pktstamp
from deltatap.net.pktstamp import tcp_notsent
from tests.kernel.test_kstamp_s24_queued import Hold

pytestmark = pytest.mark.skipif(not kstamp.enabled() or pktstamp.packet_log() is None,
                                reason="the placement needs kernel stamps and the packet log (Linux, CAP_NET_RAW)")


@pytest.mark.parametrize("native", ["native", "python"])
def test_a_write_that_left_in_pieces_is_placed_from_its_first_piece_to_its_last(native: str) -> None:
    async def scenario():
        protos: list[Hold] = []
        server = await kstamp.start_server(lambda: protos.append(Hold()) or protos[-1], "127.0.0.1", 0)
        peer = socket.socket()
        peer.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        peer.connect(server.sockets[0].getsockname())
        try:
            for _ in range(300):
                if protos:
                    break
                await asyncio.sleep(0.01)
            await asyncio.wait_for(protos[0].made, 3)
            tr = protos[0].transport
            if native == "python":
                tr._wfast = None
            tr.lazy_placement = True
            tr.write(b"y" * (48 * 1024))
            if tr.get_write_buffer_size() or not tcp_notsent(tr._sock):
                pytest.skip("send did not take the write whole with bytes held (the kernel's buffers)")
            unplaced, t1 = tr.unplaced_write, time.monotonic_ns()
            peer.setblocking(False)
            got, pieces = 0, 0
            for _ in range(2000):  # bounded: read 2 KiB, let the window reopen, until every byte came
                try:
                    got += len(peer.recv(2048))
                    pieces += 1
                except BlockingIOError:
                    pass
                if got >= 48 * 1024:
                    break
                await asyncio.sleep(0.003)
            return unplaced, t1, got, pieces, tr.place_write(unplaced), tr
        finally:
            for p in protos:
                if p.transport is not None:
                    p.transport.abort()
            await asyncio.sleep(0)
            peer.close()
            server.close()

    unplaced, t1, got, pieces, placed, _tr = asyncio.run(scenario())
    assert got == 48 * 1024 and pieces > 3
    t0, _t1, end, queued, start = unplaced
    assert queued and end - start == 48 * 1024
    t, bound = placed
    assert bound > 0  # several departures ms apart: an interval, not one exact time
    assert t >= t0 and t + bound >= t1  # the last piece left once the peer read, after the write was handed over
