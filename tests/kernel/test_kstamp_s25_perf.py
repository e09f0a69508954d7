"""A write the packet log already shows gone asks TCP nothing (session 25): after a ``send`` that took every byte,
``_sent`` reads ``tcpi_notsent_bytes`` (a ``getsockopt(TCP_INFO)``, ~0.5 µs) to tell a write TCP still holds; where
the log's newest frames hold the segment that carried the write's last byte, stamped by the send's return
(``KernelStampTransport._left_by``: on loopback a send's segments are logged inside the send), TCP holds none of it
and the answer is known without the call. Real loopback connections, the C write path and the Python reference;
the ring look's start (``ring_newest_near``) against the bisection it replaces, over generated rings."""

from __future__ import annotations

import asyncio
import importlib
import random
import socket
import struct

import pytest
import uvloop

from deltatap.net import kstamp, pktstamp
from deltatap.net.pktstamp import _FRAME, PacketLog

try:
    acc = importlib.import_module("deltatap.net._pktring")
except ImportError:
    acc = None

LOOPS = pytest.mark.parametrize("run", [asyncio.run, uvloop.run], ids=["asyncio", "uvloop"])
_STATUS = struct.Struct("=I")


@pytest.mark.skipif(acc is None, reason="deltatap.net._pktring is not built")
@pytest.mark.parametrize("seed", range(6))
def test_the_newest_frame_found_near_the_last_is_the_bisection_s(seed: int) -> None:
    """Frames filled in order (wrapping), ranges handed back (the head moves on, their status words zeroed), two rings
    looked at in turn (the start is kept per ring), a window's top under head + frames: the same newest frame as
    ``ring_newest`` and the Python reference (``PacketLog._newest_from``) at every step."""
    rng = random.Random(seed)
    rings = []
    for _ in range(2):
        frames = rng.choice([8, 64, 257])
        ring = bytearray(frames * _FRAME)
        rings.append({"ring": ring, "frames": frames, "head": 0, "filled": 0, "ref": PacketLog.over(ring)})
    for _ in range(400):
        r = rings[rng.randrange(2)]
        ring, frames = r["ring"], r["frames"]
        step = rng.random()
        if step < 0.5:  # the kernel fills the next frames (never past the head a lap on)
            for _ in range(min(rng.choice([0, 1, 2, 5, frames]), r["head"] + frames - r["filled"])):
                _STATUS.pack_into(ring, (r["filled"] % frames) * _FRAME, 1)
                r["filled"] += 1
        elif step < 0.7:  # a hand-back: [head, end) zeroed, the head moved there
            end = rng.randint(r["head"], r["filled"])
            for f in range(r["head"], end):
                _STATUS.pack_into(ring, (f % frames) * _FRAME, 0)
            r["head"] = end
        head = r["head"]
        top = rng.choice([head + frames, head + frames, head + rng.randint(0, frames)])
        want = acc.ring_newest(ring, head, top)
        assert want == r["ref"]._newest_from(head, top) == min(r["filled"], top)
        assert acc.ring_newest_near(ring, head, top) == want
        assert acc.ring_newest_near(ring, head, top) == want  # (again, from where it just ended)


class Take(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport = None
        self.made = asyncio.get_running_loop().create_future()

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.made.set_result(None)


@LOOPS
@pytest.mark.parametrize("native", ["native", "python"])
def test_a_write_the_log_shows_gone_is_told_without_tcp_and_as_tcp_tells_it(run, native, monkeypatch) -> None:
    """A peer that reads: every write leaves inside its send. The anchor is found at the first write; from then on the
    log answers (the reference asks TCP for under half of the writes), every answer it gives is TCP's own (asked
    right after, nothing is unsent), and each write is stamped as sent (bound >= 0, nothing unplaced)."""
    if acc is None and native == "native":
        pytest.skip("deltatap.net._pktring is not built")
    if not kstamp.enabled() or pktstamp.packet_log() is None:
        pytest.skip("the packet log needs CAP_NET_RAW (a packet socket)")
    asked = []
    real = kstamp.tcp_notsent
    monkeypatch.setattr(kstamp, "tcp_notsent", lambda sock: asked.append(1) or real(sock))
    said = []
    left_by = kstamp.KernelStampTransport._left_by

    def watched(self, t1: int) -> bool:
        got = left_by(self, t1)
        said.append((got, real(self._sock)))
        return got

    monkeypatch.setattr(kstamp.KernelStampTransport, "_left_by", watched)

    async def scenario():
        protos: list[Take] = []

        def factory() -> Take:
            p = Take()
            protos.append(p)
            return p

        server = await kstamp.start_server(factory, "127.0.0.1", 0)
        peer = socket.create_connection(server.sockets[0].getsockname(), timeout=5)
        peer.setblocking(False)
        try:
            for _ in range(300):
                if protos:
                    break
                await asyncio.sleep(0.01)
            await asyncio.wait_for(protos[0].made, 3)
            tr = protos[0].transport
            if native == "python":
                tr._wfast = None
            assert tr._plog is not None and tr._iss1 is None
            out = []
            got = 0
            for i in range(30):
                tr.write(b"data: %04d\n\n" % i + b"x" * 100)
                out.append((tr.last_write_bound_ns, tr.unplaced_write, tr.get_write_buffer_size()))
                for _ in range(200):  # the peer reads it (bounded)
                    try:
                        got += len(peer.recv(1 << 16))
                    except BlockingIOError:
                        pass
                    if got >= (i + 1) * 112:
                        break
                    await asyncio.sleep(0.001)
            anchored = tr._iss1 is not None and left_by(tr, kstamp._mono())
            return out, got, anchored
        finally:
            protos and protos[0].transport and protos[0].transport.abort()
            await asyncio.sleep(0)
            peer.close()
            server.close()

    out, got, anchored = run(scenario())
    assert got == 30 * 112
    assert all(b >= 0 and u is None and w == 0 for b, u, w in out), out
    assert anchored  # the anchor found at the first write places the last write's last byte in the log
    if native == "python":
        assert len(said) == 30
        assert all(notsent == 0 for left, notsent in said if left)
        assert sum(1 for left, _ in said if left) >= 20, said  # (the log answers: the segment is its newest)
        assert len(asked) <= 15, len(asked)
