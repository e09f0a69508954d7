"""A peer's last bytes and its reset waiting together at one readiness report (session 24).

uvloop's reader callbacks (libuv's uv_poll) stop watching a socket once a readiness report carries POLLERR: the
callback runs once, and if that one read takes bytes, the reset behind them is never reported. The stamped
transport reads once per callback, so before this fix the protocol got the bytes and never ``connection_lost``:
a tap's client saw nothing after the answer (no reset passed on) and the tap's shutdown waited its grace for the
exchange. asyncio's selector loop calls again and so never lost it. Each case here makes both wait before the
transport's loop runs (the peer writes and resets from inside the loop's own thread, without yielding), on both
loops, with and without the packet log, with the C read path and the Python reference."""

from __future__ import annotations

import asyncio
import socket
import struct

import pytest
import uvloop

from deltatap.net import kstamp

from test_kstamp import packet_stamps  # noqa: F401 (the fixture: with and without the packet log)

pytestmark = pytest.mark.skipif(not kstamp.enabled(), reason="kernel receive stamps need Linux (SO_TIMESTAMPING)")

LOOPS = pytest.mark.parametrize("run", [asyncio.run, uvloop.run], ids=["asyncio", "uvloop"])


@pytest.fixture(params=["native", "python"])
def native(request) -> str:
    return request.param


class Keep(asyncio.Protocol):
    def __init__(self) -> None:
        self.data = bytearray()
        self.lost: asyncio.Future = asyncio.get_running_loop().create_future()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.data += data
        if data == b"hello":
            self.transport.write(b"unread by the peer")  # its close with these unread is a reset

    def eof_received(self):
        return None

    def connection_lost(self, exc) -> None:
        if not self.lost.done():
            self.lost.set_result(exc)


def _reset(s: socket.socket) -> None:
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()


@LOOPS
def test_last_bytes_and_reset_at_one_report_reach_the_protocol(run, packet_stamps, native):
    async def scenario():
        protos: list[Keep] = []

        def factory() -> Keep:
            p = Keep()
            protos.append(p)
            return p

        server = await kstamp.start_server(factory, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        try:
            s.sendall(b"hello")
            for _ in range(300):  # bounded: until the transport has read it and answered
                if protos and bytes(protos[0].data) == b"hello":
                    break
                await asyncio.sleep(0.01)
            assert protos and bytes(protos[0].data) == b"hello"
            if native == "python":
                protos[0].transport._fast = None  # the Python reference read (a test may set either, see kstamp)
            await asyncio.sleep(0.05)  # the answer is in the peer's receive queue, unread
            s.sendall(b"last bytes")
            _reset(s)  # both wait together before the loop runs again
            exc = await asyncio.wait_for(protos[0].lost, 3)
        finally:
            s.close()
            server.close()
        return bytes(protos[0].data), exc

    data, exc = run(scenario())
    assert data == b"hellolast bytes"  # nothing lost ahead of the reset
    assert isinstance(exc, ConnectionResetError)
