"""A write whose bytes TCP still holds when ``send`` returns (session 24): the peer's window shut, or the congestion
window full, so ``send`` took every byte but they leave later. Before, such a write was stamped at ``send`` with the
send's own duration as its bound: confidently early (by the time until an acknowledgement or the peer's read let
them go: ~40 ms here, a delayed acknowledgement). Now its bound is
-1 (it left later, by an unknown time) and, with the packet log, its placement takes the departure of the segment that
carried its last byte once it has left, after ``send``'s return. Real loopback, a peer that does not read; the C
write path and the Python reference."""

from __future__ import annotations

import asyncio
import socket

import pytest
import uvloop

from deltatap.net import kstamp
from deltatap.net.pktstamp import tcp_notsent

pytestmark = pytest.mark.skipif(not kstamp.enabled(), reason="kernel stamps need Linux")
LOOPS = pytest.mark.parametrize("run", [asyncio.run, uvloop.run], ids=["asyncio", "uvloop"])


@pytest.fixture(params=["native", "python"])
def native(request) -> str:
    return request.param


class Hold(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport = None
        self.made = asyncio.get_running_loop().create_future()

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.made.set_result(None)


async def _queued_write(native: str, lazy: bool):
    """A server transport writing 1 KiB at a time to a peer that does not read (its receive buffer small), until a
    write that ``send`` took whole leaves bytes unsent; its stamp, bound and unplaced record, and the peer's socket."""
    protos: list[Hold] = []

    def factory() -> Hold:
        p = Hold()
        protos.append(p)
        return p

    server = await kstamp.start_server(factory, "127.0.0.1", 0)
    peer = socket.socket()
    peer.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    peer.connect(server.sockets[0].getsockname())
    for _ in range(300):
        if protos:
            break
        await asyncio.sleep(0.01)
    await asyncio.wait_for(protos[0].made, 3)
    tr = protos[0].transport
    if native == "python":
        tr._wfast = None  # the Python reference write (a test may set either, see kstamp)
    tr.lazy_placement = lazy
    for _ in range(400):  # bounded: the window shuts after a few KiB
        before = tr.get_write_buffer_size()
        tr.write(b"x" * 1024)
        if before == 0 and tr.get_write_buffer_size() == 0 and tcp_notsent(tr._sock):
            return server, peer, tr, tr.last_write_mono_ns, tr.last_write_bound_ns, tr.unplaced_write
        if tr.get_write_buffer_size():
            break
        await asyncio.sleep(0)
    tr.abort()
    await asyncio.sleep(0)
    server.close()
    peer.close()
    pytest.skip("no write was taken whole with bytes left unsent (the kernel's buffers)")


@LOOPS
def test_a_write_tcp_still_holds_is_not_stamped_as_sent(run, native):
    async def scenario():
        server, peer, tr, t, bound, unplaced = await _queued_write(native, lazy=False)
        tr.abort()  # (its packet-log watch ends with it)
        await asyncio.sleep(0)
        peer.close()
        server.close()
        return bound

    assert run(scenario()) == -1  # it left later, by an unknown time: not the send's duration


@LOOPS
def test_a_queued_write_is_placed_at_its_departure_once_it_left(run, native):
    from deltatap.net import pktstamp

    if pktstamp.packet_log() is None:
        pytest.skip("the placement needs the packet log (CAP_NET_RAW)")

    async def scenario():
        server, peer, tr, t, bound, unplaced = await _queued_write(native, lazy=True)
        try:
            assert unplaced is not None and unplaced[3] is True and unplaced[0] == t and unplaced[2] - unplaced[4] == 1024
            t0, t1 = unplaced[0], unplaced[1]
            early = tr.place_write(unplaced)  # not on the wire yet: no departure to take
            await asyncio.sleep(0.2)
            peer.setblocking(False)
            got = 0
            for _ in range(400):  # read everything: the window opens, the held bytes leave
                try:
                    chunk = peer.recv(1 << 16)
                    got += len(chunk)
                except BlockingIOError:
                    if not tcp_notsent(tr._sock):
                        break
                    await asyncio.sleep(0.005)
            late = tr.place_write(unplaced)
            return t0, t1, early, late
        finally:
            tr.abort()  # (its packet-log watch ends with it)
            await asyncio.sleep(0)
            peer.close()
            server.close()

    t0, t1, early, late = run(scenario())
    assert early == (t0, -1)
    assert late is not None and late[1] >= 0  # (its first byte's departure; the bound reaches its last byte's)
    # it left after send returned (when an acknowledgement or the peer's read let it: tens of ms here), where the
    # stamp used to say it left within the send
    assert late[0] >= t1, (late[0] - t1)


def test_unsent_of_a_closed_socket_is_unknown_not_an_error():
    s = socket.socket()
    s.close()
    assert tcp_notsent(s) is None  # (the write then counts as not held: its bound the send's, as before)
