"""A write the packet log already shows gone asks TCP nothing (session 25): after a ``send`` that took every byte,
``_sent`` reads ``tcpi_notsent_bytes`` (a ``getsockopt(TCP_INFO)``, ~0.5 µs) to tell a write TCP still holds; where
the log's newest frames hold the segment that carried the write's last byte, stamped by the send's return
(``KernelStampTransport._left_by``: on loopback a send's segments are logged inside the send), TCP holds none of it
and the answer is known without the call. Real loopback connections, the C write path and the Python reference;
the ring look's start (``ring_newest_near``) against the bisection it replaces, over generated rings."""

from __future__ import annotations

import asyncio
import time
import importlib
import random
import socket
import struct

import pytest
import uvloop

from deltatap.net import kstamp, pktstamp
from deltatap.net.pktstamp import _FRAME, PacketLog
from tests.kernel.kstamp_rig import SLACK_NS, close_pairs, read_to_eof, stamped_pair, stamping_kept
from tests.kernel.test_kstamp_s24_queued import Hold

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
        protos: list[Hold] = []

        def factory() -> Hold:
            p = Hold()
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
            iss1, off = tr._iss1, []
            for d in (1, -1, 100, -100, 112):  # an anchor off by any amount: the log does not answer
                tr._iss1 = (iss1 + d) & 0xFFFFFFFF
                off.append(left_by(tr, kstamp._mono()))
            tr._iss1 = iss1
            return out, got, anchored and not any(off)
        finally:
            protos and protos[0].transport and protos[0].transport.abort()
            await asyncio.sleep(0)
            peer.close()
            server.close()

    out, got, anchored = run(scenario())
    assert got == 30 * 112
    assert all(b >= 0 and u is None and w == 0 for b, u, w in out), out
    assert anchored  # the anchor found at the first write places the last write's last byte in the log (only it)
    if native == "python":
        assert len(said) == 30
        assert all(notsent == 0 for left, notsent in said if left)
        assert sum(1 for left, _ in said if left) >= 20, said  # (the log answers: the segment is its newest)
        assert len(asked) <= 15, len(asked)


# ---- the read without the packet log (no CAP_NET_RAW, IPv6): its C twin, read_plain --------------------------------


@pytest.fixture
def stamping():
    with stamping_kept():
        yield


def _plain_pair(fast: bool):
    return stamped_pair(fast, packet_log=False)


@pytest.mark.skipif(kstamp._read_plain is None, reason="deltatap.net._pktring is not built (or DELTATAP_NATIVE turns it off)")
@pytest.mark.parametrize("seed", range(4))
def test_the_c_read_without_the_log_hands_over_what_the_reference_does(seed: int, monkeypatch, stamping) -> None:
    """Two connections without the packet log get the same writes (one or several before a read, back to back or apart,
    the reader sometimes late by more than _PROMPT_NS, so that _read_late splits in the reference), one read by the C
    twin and one by the reference: the same bytes in the same deliveries, the same exact reads (bound 0), every stamp
    within the sends that carried its bytes; READ_LAG counted by both; _rx_off and _segs_in the kernel's; end of stream
    told once."""
    monkeypatch.setenv("DELTATAP_PACKET_STAMPS", "0")
    rng = random.Random(seed)
    pairs = [_plain_pair(True), _plain_pair(False)]
    late_reads = []
    read_late = kstamp.KernelStampTransport._read_late
    monkeypatch.setattr(kstamp.KernelStampTransport, "_read_late", lambda self, *a: late_reads.append(self) or read_late(self, *a))
    try:
        sent = [0, 0]
        windows: list[list[tuple[int, int, int]]] = [[], []]
        lag_before = kstamp.READ_LAG.count
        for step in range(40):
            sizes = [rng.choice([1, 7, 100, 1448, 9000]) for _ in range(rng.choice([1, 1, 2, 3]))]
            gap = rng.choice([0, 0, 0.0001])
            for size in sizes:
                for j, (c, _s, _tr, _p) in enumerate(pairs):
                    t0 = time.perf_counter_ns()
                    c.sendall(b"%c" % (65 + len(windows[j]) % 26) * size)
                    windows[j].append((sent[j] + size, t0, time.perf_counter_ns()))
                    sent[j] += size
                if gap:
                    time.sleep(gap)
            if rng.random() < 0.3:
                time.sleep(0.0002)  # (late: the first byte waited longer than _PROMPT_NS)
            deadline = time.monotonic() + 5
            for j, (_c, s, tr, p) in enumerate(pairs):
                while tr._rx_off < sent[j]:
                    assert time.monotonic() < deadline, "the bytes did not arrive"
                    # (the C connection by the loop's reader callback, readable, where built: read_plain from there)
                    kstamp._readable(tr) if j == 0 and kstamp._readable is not None else tr._on_readable()
        for j, (_c, s, tr, p) in enumerate(pairs):
            data = b"".join(d for d, _t, _b in p.got)
            assert data == b"".join(b"%c" % (65 + i % 26) * (w[0] - (windows[j][i - 1][0] if i else 0)) for i, w in enumerate(windows[j]))
            counts = pktstamp.tcp_counters(s)
            assert counts is not None and tr._rx_off == counts[1] == sent[j] and tr._segs_in == counts[0]
            pos = 0
            for d, t, bound in p.got:
                first = next(w for w in windows[j] if w[0] > pos)
                last = next(w for w in windows[j] if w[0] >= pos + len(d))
                assert bound >= 0 and t >= last[1] - SLACK_NS and t - bound <= first[2] + SLACK_NS, (j, pos)
                if bound == 0:
                    assert t <= last[2] + SLACK_NS, (j, pos)
                pos += len(d)
        assert kstamp.READ_LAG.count > lag_before
        assert any(tr is pairs[0][2] for tr in late_reads) and any(tr is pairs[1][2] for tr in late_reads)  # both paths met late reads
        for c, _s, _tr, _p in pairs:
            c.shutdown(socket.SHUT_WR)
        read_to_eof(pairs, lambda tr: kstamp._readable(tr) if tr is pairs[0][2] and kstamp._readable is not None else tr._on_readable())
    finally:
        close_pairs(pairs)


@pytest.mark.skipif(kstamp._read_plain is None, reason="deltatap.net._pktring is not built (or DELTATAP_NATIVE turns it off)")
def test_the_c_read_without_the_log_takes_the_prompt_reads(monkeypatch) -> None:
    """Prompt reads of single writes (the usual SSE event) are the C twin's whole, and exact: each delivery one write,
    bound 0, within its send; the reference's _read_merged is not called for them."""
    monkeypatch.setenv("DELTATAP_PACKET_STAMPS", "0")
    calls = []
    merged = kstamp.KernelStampTransport._read_merged
    monkeypatch.setattr(kstamp.KernelStampTransport, "_read_merged", lambda self, v: calls.append(1) or merged(self, v))
    c, s, tr, p = _plain_pair(True)
    try:
        windows = []
        for i in range(50):
            t0 = time.perf_counter_ns()
            c.sendall(b"data: %d\n\n" % i)
            windows.append((t0, time.perf_counter_ns()))
            deadline = time.monotonic() + 5
            while len(p.got) <= i:
                assert time.monotonic() < deadline
                kstamp._readable(tr) if i % 2 and kstamp._readable is not None else tr._on_readable()
        assert [d for d, _t, _b in p.got] == [b"data: %d\n\n" % i for i in range(50)]
        assert calls == []
        exact = [(t, w) for (_d, t, b), w in zip(p.got, windows) if b == 0]
        assert len(exact) >= 25  # (a read late past _PROMPT_NS goes to the reference's _read_late, unsplit here)
        assert all(w[0] - SLACK_NS <= t <= w[1] + SLACK_NS for t, w in exact)
    finally:
        c.close()
        tr.abort()
