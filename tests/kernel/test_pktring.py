"""deltatap.net._pktring (C) against its Python reference in deltatap.net.pktstamp: the packet log's ring search over
generated TPACKET_V2 rings (random connections, sequence numbers wrapping past 2**32, retransmissions, missing
segments, frames overwritten with random bytes, odd header offsets, random frame status words), and the socket
calls (``TCP_INFO`` counters, the stamped ``recvmsg``) on real loopback connections. The reference is the definition:
every result, and every exception, must be the same."""

from __future__ import annotations

import importlib
import random
import socket
import struct
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deltatap.net import pktstamp
from deltatap.net.pktstamp import _FRAME, PacketLog
from tests.kernel.test_kstamp import _wait_kernel_stamping

try:
    acc = importlib.import_module("deltatap.net._pktring")
except ImportError:  # no C compiler here: nothing to compare (tests/kernel/test_native.py says so where one is)
    acc = None

pytestmark = pytest.mark.skipif(acc is None, reason="deltatap.net._pktring is not built")

_TP2 = struct.Struct("=IIIHHII")
_ADDRS = [bytes([127, 0, 0, 1]), bytes([127, 0, 0, 2]), bytes([10, 1, 2, 3])]


def _keys(rng: random.Random) -> list[tuple[bytes, int, bytes, int]]:
    """A few connections, some sharing addresses or a port (their patterns differ in a few bytes only)."""
    ports = [rng.choice([8080, 40000, rng.randrange(65536)]) for _ in range(4)]
    keys = []
    for _ in range(rng.randint(1, 4)):
        src, dst = rng.choice(_ADDRS), rng.choice(_ADDRS)
        keys.append((src, rng.choice(ports), dst, rng.choice(ports)))
    return keys


def _frame(ring: bytearray, at: int, rng: random.Random, key, seq: int, payload: int, wall: int, adversarial: bool) -> None:
    """One packet's frame at byte ``at``: tpacket2_hdr, then IPv4 and TCP headers at its ``net`` offset."""
    net = rng.choice([66, 80, 82]) if not adversarial or rng.random() < 0.7 else rng.choice([0, 200, 231, 232, 243, 244, 250, rng.randrange(65536)])
    options = 0 if rng.random() < 0.9 else rng.randrange(1, 11) * 4
    ihl = 20 + options
    doff = rng.choice([5, 5, 8, rng.randrange(16)])
    total = ihl + doff * 4 + payload
    if adversarial and rng.random() < 0.2:
        total = rng.randrange(65536)
    snap = rng.choice([128, 128, 128, 40, 39, 0]) if adversarial else 128
    _TP2.pack_into(ring, at, 1, total, snap, net, net, wall // 10**9, wall % 10**9)
    ip = at + net
    head = struct.pack("!BBHHHBB", 0x40 | (ihl // 4), 0, total & 0xFFFF, 0, 0, 64, 6) + b"\0\0" + key[0] + key[2]
    tcp = struct.pack("!HHIIB", key[1], key[3], seq & 0xFFFFFFFF, 0, doff << 4)
    body = head + bytes(options) + tcp
    room = len(ring) - ip
    if room > 0:
        ring[ip:ip + min(len(body), room)] = body[:room]


def _ring(seed: int, frames: int, adversarial: bool) -> tuple[bytearray, int, list, list]:
    """A ring of ``frames`` frames whose frames ``[head, head + count)`` hold packets of a few connections, in arrival
    order (wrapping round the ring), the rest stale packets the kernel owns; returns (ring, head, keys, segments)."""
    rng = random.Random(seed)
    ring = bytearray(frames * _FRAME)
    keys = _keys(rng)
    seqs = [rng.choice([rng.randrange(1 << 32), (1 << 32) - rng.randrange(1, 3000)]) for _ in keys]
    head = rng.randrange(3 * frames)
    count = rng.randint(0, frames)
    wall = rng.randrange(1, 2 * 10**18)
    segs: list = []
    start = head - rng.randint(0, frames - count)  # (older frames: stale packets, status cleared)
    for frame in range(start, head + count):
        i = rng.randrange(len(keys))
        payload = rng.choice([1, 8, 100, 1448, rng.randrange(0, 3000)])
        seq = seqs[i]
        r = rng.random()
        if r < 0.03 and segs:  # a retransmission of an earlier segment of some connection
            seq = rng.choice(segs)[1]
        elif r < 0.04:  # a missing segment (a gap)
            seq = (seq + rng.randrange(1, 2000)) & 0xFFFFFFFF
        wall += rng.choice([0, 1, 1000, 50_000, rng.randrange(10**7)])
        at = (frame % frames) * _FRAME
        _frame(ring, at, rng, keys[i], seq, payload, wall, adversarial)
        if frame < head:
            struct.pack_into("=I", ring, at, 0)
        segs.append((i, seq & 0xFFFFFFFF, payload, wall))
        seqs[i] = (seq + payload) & 0xFFFFFFFF if seq == seqs[i] or r < 0.04 else seqs[i]
    if adversarial:
        for _ in range(rng.randrange(6)):
            at = rng.randrange(len(ring))
            junk = rng.randbytes(rng.randrange(1, 64))
            ring[at:at + len(junk)] = junk[: len(ring) - at]
        for _ in range(rng.randrange(4)):  # a pattern at the wrong place in a frame: rfind meets it, the frame is no hit
            key = rng.choice(keys)
            pat = pktstamp._pattern(key)
            at = rng.randrange(len(ring) - 12)
            ring[at:at + 12] = pat
        for _ in range(rng.randrange(4)):  # status words the kernel would not leave
            struct.pack_into("=I", ring, rng.randrange(frames) * _FRAME, rng.choice([0, 1, 3, 0xFFFFFFFF, 2]))
    return ring, head, keys, segs


def _pair_logs(ring: bytearray, head: int) -> tuple[PacketLog, PacketLog]:
    py, c = PacketLog.over(ring), PacketLog.over(ring, acc)
    py._head = c._head = head
    return py, c


def _queries(rng: random.Random, keys, segs, frames: int):
    """(key, base, limit) to ask the ring: every connection and one nobody has, sequence numbers at, inside, before
    and after segments, and windows from none to more than the ring."""
    asked = [*keys, (bytes([9, 9, 9, 9]), 1, bytes([9, 9, 9, 9]), 2)]
    for _ in range(12):
        i = rng.randrange(len(asked))
        key = asked[i]
        mine = [x for x in segs if x[0] == i] or segs
        if mine and rng.random() < 0.8:
            _i, seq, payload, _w = rng.choice(mine)
            base = rng.choice([seq, seq, seq + payload, seq + rng.randrange(payload + 1), seq - rng.randrange(1, 5000), seq + rng.randrange(1 << 31)])
        else:
            base = rng.randrange(1 << 32)
        base &= 0xFFFFFFFF
        limit = rng.choice([frames, frames, frames * 2, 1, 2, 0, -1, rng.randrange(frames + 1), 2048])
        # waiting byte counts: where a segment of the connection ends (a read the log can place), or anything
        ends = [(x[1] + x[2] - base) & 0xFFFFFFFF for x in mine]
        ends = [e for e in ends if 0 < e < 1 << 20] or [1]
        n = rng.choice([rng.choice(ends), rng.choice(ends), rng.choice(ends) + rng.choice([1, 5, 1000]), 0, 1, 1448, rng.randrange(1 << 18)])
        yield key, base, limit, n


def _same(fn_py, fn_c):
    """Both calls return the same, or raise the same exception type."""
    try:
        want = ("ok", fn_py())
    except Exception as exc:  # noqa: BLE001 - the exception itself is what is compared
        want = ("raised", type(exc))
    try:
        got = ("ok", fn_c())
    except Exception as exc:  # noqa: BLE001
        got = ("raised", type(exc))
    assert got == want
    return want


_SETTINGS = settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_SETTINGS
@given(seed=st.integers(0, 2**64), frames=st.sampled_from([1, 2, 3, 16, 64, 200]), adversarial=st.booleans())
def test_the_ring_search_matches_the_reference(seed: int, frames: int, adversarial: bool) -> None:
    ring, head, keys, segs = _ring(seed, frames, adversarial)
    py, c = _pair_logs(ring, head)
    rng = random.Random(seed ^ 0x5EED)
    assert c._newest() == py._newest()
    for key, base, limit, n in _queries(rng, keys, segs, frames):
        _same(lambda: py.segments_since(key, base, limit), lambda: c.segments_since(key, base, limit))
        _same(lambda: py.newest_segment(key, limit), lambda: c.newest_segment(key, limit))
        last_ns = rng.randrange(1 << 62)
        read_size = rng.choice([n, n + 1, 256 * 1024])
        _same(lambda: py.cuts(key, base, n, last_ns, limit, read_size), lambda: c.cuts(key, base, n, last_ns, limit, read_size))
        if segs:
            wall = rng.choice(segs)[3] + rng.choice([-1, 0, 1, -(10**9)])
            _same(lambda: py.reaches(wall, limit), lambda: c.reaches(wall, limit))


@_SETTINGS
@given(seed=st.integers(0, 2**64), frames=st.sampled_from([1, 2, 16, 64]), adversarial=st.booleans())
def test_handing_frames_back_matches_the_reference(seed: int, frames: int, adversarial: bool) -> None:
    ring, head, _keys, _segs = _ring(seed, frames, adversarial)
    ring_c = bytearray(ring)
    py, c = PacketLog.over(ring), PacketLog.over(ring_c, acc)
    py._head = c._head = head
    py.maintain(force=True)
    c.maintain(force=True)
    assert c._head == py._head
    assert ring_c == ring


def test_cuts_of_a_merged_read_place_each_segment_and_the_unlogged_tail() -> None:
    """A hand-built case the generated ones must not miss: segments wrapping past 2**32, a retransmitted copy, then
    bytes past the newest logged segment."""
    frames = 16
    key = (bytes([127, 0, 0, 1]), 40000, bytes([127, 0, 0, 1]), 8080)
    ring = bytearray(frames * _FRAME)
    rng = random.Random(1)
    base = (1 << 32) - 100
    plan = [(base, 60, 1_000), (base + 60, 80, 2_000), (base + 60, 80, 2_500), (base + 140, 30, 3_000)]
    for i, (seq, payload, wall) in enumerate(plan):
        _frame(ring, (14 + i) % frames * _FRAME, rng, key, seq, payload, wall * 1000, False)
    for log in _pair_logs(ring, 14):
        assert log.segments_since(key, base) == [
            (base, (base + 60) & 0xFFFFFFFF, 1_000_000),
            ((base + 60) & 0xFFFFFFFF, (base + 140) & 0xFFFFFFFF, 2_000_000),
            ((base + 60) & 0xFFFFFFFF, (base + 140) & 0xFFFFFFFF, 2_500_000),
            ((base + 140) & 0xFFFFFFFF, (base + 170) & 0xFFFFFFFF, 3_000_000),
        ]
        assert log.cuts(key, base, 170, 9, 16, 256 * 1024) == ([(60, 1_000_000), (140, 2_000_000), (170, 3_000_000)], False, None)
        assert log.cuts(key, base, 200, 9, 16, 256 * 1024) == ([(60, 1_000_000), (140, 2_000_000), (170, 3_000_000), (200, 9)], True, None)
        cuts, tail, why = log.cuts(key, base, 150, 9, 16, 256 * 1024)  # ends inside a segment: the anchor is off
        assert (cuts, tail) == (None, False) and "20 bytes past" in why
        cuts, tail, why = log.cuts(key, (base - 10) & 0xFFFFFFFF, 150, 9, 16, 256 * 1024)  # 10 bytes the log never saw
        assert (cuts, tail) == (None, False) and "start 10 bytes in" in why


# ---- the socket calls, on real loopback connections ------------------------------------------------------------
def _pair() -> tuple[socket.socket, socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as lsock:
        c = socket.create_connection(lsock.getsockname(), timeout=5)
        s, _ = lsock.accept()
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.setsockopt(socket.SOL_SOCKET, pktstamp.SO_TIMESTAMPING, (1 << 3) | (1 << 4))
    s.setblocking(False)
    return c, s


def _wait_waiting(s: socket.socket, n: int) -> None:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            if len(s.recv(1 << 16, socket.MSG_PEEK)) >= n:
                return
        except BlockingIOError:
            pass
        time.sleep(0.001)
    raise AssertionError(f"{n} bytes did not arrive")


def test_tcp_counters_and_notsent_match_the_reference() -> None:
    c, s = _pair()
    try:
        for i in range(20):
            c.send(b"x" * (1 + i * 37))
            _wait_waiting(s, 1)
            assert acc.tcp_counters(s) == pktstamp._tcp_counters(s)
            assert acc.tcp_counters(c) == pktstamp._tcp_counters(c)
            assert acc.tcp_notsent(c) == pktstamp._tcp_notsent(c)
            if i % 3 == 0:
                s.recv(1 << 16)
        segs, got = acc.tcp_counters(s)
        assert got == sum(1 + i * 37 for i in range(20)) and segs >= 1
    finally:
        c.close()
        s.close()
    # a closed socket: both say they do not know
    assert acc.tcp_counters(s) is None and pktstamp._tcp_counters(s) is None
    assert acc.tcp_notsent(s) is None and pktstamp._tcp_notsent(s) is None


def test_the_stamped_recv_matches_the_reference() -> None:
    """The same peeks return the same (bytes, stamp) through both; reads take the same bytes; nothing waiting and a
    closed socket raise the same; end of stream reads 0 bytes in both."""
    c, s = _pair()
    _wait_kernel_stamping()  # (turned on for the system from a work queue: this pair's first packets may come unstamped)
    view = memoryview(bytearray(4096))
    try:
        with pytest.raises(BlockingIOError):
            acc.recv(s, view, 0)
        with pytest.raises(BlockingIOError):
            pktstamp._recv_stamped(s, view, 0)
        sent = b""
        for i in range(30):
            piece = bytes([65 + i % 26]) * (1 + (i * 53) % 300)
            c.send(piece)
            sent += piece
            _wait_waiting(s, len(sent))
            for length in (1, len(piece), len(sent), 4096):
                for flags in (socket.MSG_PEEK, socket.MSG_PEEK | socket.MSG_TRUNC):
                    a = acc.recv(s, view[:length], flags)
                    b = pktstamp._recv_stamped(s, view[:length], flags)
                    assert a == b and a[1] > 0
            if i % 4 == 3:  # take some: the C twin's read fills the buffer with the same bytes the peek saw
                n, k = acc.recv(s, view, 0)
                assert bytes(view[:n]) == sent and k > 0
                sent = b""
        c.shutdown(socket.SHUT_WR)
        n = len(sent)
        assert acc.recv(s, view[:n], socket.MSG_TRUNC)[0] == n  # (discarded without copying, as kstamp takes peeks in)
        deadline = time.monotonic() + 5
        while True:
            try:
                a = acc.recv(s, view, 0)
                break
            except BlockingIOError:
                assert time.monotonic() < deadline
                time.sleep(0.001)
        assert a[0] == pktstamp._recv_stamped(s, view, 0)[0] == 0  # end of stream
        with pytest.raises(TypeError):
            acc.recv(s, b"read-only", 0)
        with pytest.raises(TypeError):
            pktstamp._recv_stamped(s, b"read-only", 0)
    finally:
        c.close()
        s.close()
    with pytest.raises(OSError):
        acc.recv(s, view, 0)
    with pytest.raises(OSError):
        pktstamp._recv_stamped(s, view, 0)


def test_the_accelerator_is_what_the_read_path_uses() -> None:
    """With the accelerator built and not turned off, the module's names are the C twins (else the references)."""
    if pktstamp._acc is None:
        assert pktstamp.tcp_counters is pktstamp._tcp_counters and pktstamp.recv_stamped is pktstamp._recv_stamped
    else:
        assert pktstamp.tcp_counters is acc.tcp_counters and pktstamp.recv_stamped is acc.recv
