"""deltatap.net.pktstamp: the packet log's filter, its ring (wrapping past its size) and what it returns, over real
loopback connections. Needs CAP_NET_RAW (a packet socket); skipped without it."""

from __future__ import annotations

import socket
import time

import pytest

from deltatap.net import pktstamp
from deltatap.net.pktstamp import _FRAMES, packet_log, tcp_counters

pytestmark = pytest.mark.skipif(packet_log() is None, reason="per-packet stamps need CAP_NET_RAW (a packet socket)")


def _pair() -> tuple[socket.socket, socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as lsock:
        c = socket.create_connection(lsock.getsockname(), timeout=5)
        s, _ = lsock.accept()
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return c, s


def _key(c: socket.socket, s: socket.socket) -> tuple[bytes, int, bytes, int]:
    """Segments toward ``s``: (source ip, source port, local ip, local port)."""
    src, sport = c.getsockname()
    dst, dport = s.getsockname()
    return socket.inet_aton(src), sport, socket.inet_aton(dst), dport


def _anchor(log, key, s) -> int:
    newest = log.newest_segment(key)
    assert newest is not None
    return (newest[1] - tcp_counters(s)[1]) & 0xFFFFFFFF


def test_only_data_segments_to_and_from_watched_ports_are_kept():
    log = packet_log()
    c1, s1 = _pair()
    c2, s2 = _pair()
    try:
        log.watch(s1.getsockname()[1])
        for i in range(5):
            c1.send(b"w" * (10 + i))
            c2.send(b"u" * 7)
            s1.send(b"answer")  # from the watched port: kept as departures (toward c1's port, which nobody watches)
            time.sleep(0.002)
        time.sleep(0.01)
        k1, k2, back = _key(c1, s1), _key(c2, s2), _key(s1, c1)
        irs1 = _anchor(log, k1, s1)
        segs = log.segments_since(k1, irs1)
        assert [end - seq for seq, end, _ in segs] == [10, 11, 12, 13, 14]  # every write, in order, with its length
        assert [seq for seq, _, _ in segs] == [(irs1 + sum(range(10, 10 + i))) & 0xFFFFFFFF for i in range(5)]
        assert all(a[2] <= b[2] for a, b in zip(segs, segs[1:], strict=False))  # stamps in arrival order
        assert log.newest_segment(k2) is None
        # (pure acknowledgements toward s1 exist - c1 acknowledges s1's answers - but carry no data: dropped)
        # s1's own segments: each once (loopback shows a packet twice, departing and arriving: the departure is kept)
        newest = log.newest_segment(back)
        assert newest is not None
        out = log.segments_since(back, (newest[1] - 5 * 6) & 0xFFFFFFFF)
        assert [end - seq for seq, end, _ in out] == [6] * 5
        assert all(a[2] < b[2] for a, b in zip(out, out[1:], strict=False))
    finally:
        log.unwatch(s1.getsockname()[1])
        for x in (c1, s1, c2, s2):
            x.close()


def test_the_ring_wraps_and_keeps_the_newest_segments():
    log = packet_log()
    c, s = _pair()
    try:
        log.watch(s.getsockname()[1])
        s.setblocking(False)
        sent = 0
        n = _FRAMES + _FRAMES // 2  # one and a half times round the ring
        for i in range(n):
            c.send(b"%08d" % i)
            sent += 8
            if i % 64 == 63:
                log.maintain(force=True)  # what reads do every 20 ms: hand the older half back
                try:
                    while s.recv(1 << 16):
                        pass
                except BlockingIOError:
                    pass
        time.sleep(0.01)
        key = _key(c, s)
        newest = log.newest_segment(key)
        assert newest is not None
        irs1 = (newest[1] - sent) & 0xFFFFFFFF
        assert _anchor(log, key, s) == irs1
        # the last 800 bytes are still in the ring, segment after segment (TCP may have sent several writes as one)
        base = (irs1 + sent - 800) & 0xFFFFFFFF
        segs = log.segments_since(key, base)
        rel = [((seq - irs1) & 0xFFFFFFFF, (end - irs1) & 0xFFFFFFFF) for seq, end, _ in segs]
        assert rel[0][0] <= sent - 800 < rel[0][1] and rel[-1][1] == sent
        covered = rel[0][1]  # no hole (on a loaded machine loopback may drop and TCP resend: a copy may overlap)
        for seq, end in rel[1:]:
            assert seq <= covered, (seq, covered)
            covered = max(covered, end)
        assert all(0 < end - seq and (end - seq) % 8 == 0 for seq, end in rel)
        # and an offset long handed back to the kernel is not invented
        assert log.segments_since(key, irs1)[0][0] != irs1
    finally:
        log.unwatch(s.getsockname()[1])
        c.close()
        s.close()


def test_a_filter_for_many_ports_takes_their_range():
    prog_few = pktstamp._filter([40000, 40001])
    prog_many = pktstamp._filter(list(range(30000, 30000 + pktstamp._MAX_LISTED_PORTS + 1)))
    assert len(prog_many) < len(prog_few) + 8 * pktstamp._INSN.size  # two comparisons, not one per port
    assert pktstamp._filter([]) == pktstamp._INSN.pack(pktstamp._RET, 0, 0, 0)  # nothing watched: drop all


def test_reaches_says_whether_a_search_window_goes_back_to_an_arrival():
    log = packet_log()
    c, s = _pair()
    try:
        log.watch(s.getsockname()[1])
        for i in range(3):
            c.send(b"r" * 9)
            time.sleep(0.002)
        time.sleep(0.01)
        newest = log.newest_segment(_key(c, s))
        assert newest is not None
        wall = newest[2]
        # a window of one frame holds only the newest packet: it reaches back to that packet's arrival, not before
        assert log.reaches(wall, limit=1) and not log.reaches(wall - 1, limit=1)
        assert log.reaches(wall - 1, limit=3)  # three frames: the earlier writes, 2 ms before, are in reach
        assert not log.reaches(wall - 10**9, limit=3)  # a read whose bytes came a second earlier is out of reach
    finally:
        log.unwatch(s.getsockname()[1])
        c.close()
        s.close()
