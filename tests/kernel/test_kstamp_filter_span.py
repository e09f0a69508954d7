"""The packet log's filter over many watched ports (deltatap/net/pktstamp.py ``watch``/``unwatch``): past
``_MAX_LISTED_PORTS`` it keeps the range of the watched ports, kept up to date without a pass over every port per
connection; whatever the order of connects and closes, every watched port stays inside the range, and the range is
never wider than the ports watched since it was last computed. Real packets: a port inside the range is logged, one
outside it is not."""

from __future__ import annotations

import socket
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deltatap.net import pktstamp
from deltatap.net.pktstamp import _MAX_LISTED_PORTS, PacketLog, packet_log

_RING = bytearray(pktstamp._FRAME * 16)


def _log() -> PacketLog:
    return PacketLog.over(bytearray(_RING))


def test_the_range_follows_connects_without_recomputing_it():
    log = _log()
    ports = list(range(40000, 40000 + 2 * (_MAX_LISTED_PORTS + 10), 2))  # how Linux hands out ephemeral ports
    for i, p in enumerate(ports):
        log.watch(p)
        assert log.span == (None if i + 1 <= _MAX_LISTED_PORTS else (ports[0], p))
    log.watch(ports[5])  # a second connection on a watched port, and a port inside the range: no change
    log.watch(ports[7] + 1)
    assert log.span == (ports[0], ports[-1])


def test_closes_shrink_the_range_once_half_the_ports_are_gone():
    log = _log()
    ports = list(range(30000, 30400))
    for p in ports:
        log.watch(p)
    assert log.span == (30000, 30399)
    for p in ports[:199]:  # the oldest connections close first: the range keeps its low end for a while
        log.unwatch(p)
    assert log.span == (30000, 30399)
    log.unwatch(ports[199])  # 200 left, half of 400: computed again from the ports watched
    assert log.span == (30200, 30399)
    for p in ports[200 : 400 - _MAX_LISTED_PORTS]:
        log.unwatch(p)
    assert log.span is None  # few enough to list one by one


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1024, 1024 + 3 * _MAX_LISTED_PORTS)), min_size=1, max_size=1500))
def test_every_watched_port_stays_inside_the_range(ops):
    log = _log()
    watched: dict[int, int] = {}
    since: set[int] = set()  # ports watched since the range was last computed from all of them
    for add, port in ops:
        if add:
            log.watch(port)
            watched[port] = watched.get(port, 0) + 1
            since.add(port)
        elif watched.get(port):
            log.unwatch(port)
            watched[port] -= 1
            if not watched[port]:
                del watched[port]
        span = log.span
        if len(watched) <= _MAX_LISTED_PORTS:
            assert span is None
            since = set(watched)
            continue
        assert span is not None
        assert all(span[0] <= p <= span[1] for p in watched)
        assert min(since) <= span[0] and span[1] <= max(since)  # no wider than what was watched meanwhile
        if span == (min(watched), max(watched)):
            since = set(watched)


def test_the_filter_for_a_range_is_the_one_computed_from_all_ports():
    ports = list(range(50000, 50000 + _MAX_LISTED_PORTS + 1))
    assert pktstamp._filter([], (ports[0], ports[-1])) == pktstamp._filter(ports)


@pytest.mark.skipif(packet_log() is None, reason="per-packet stamps need CAP_NET_RAW (a packet socket)")
def test_real_segments_inside_the_range_are_logged_and_outside_not():
    log = packet_log()
    with socket.create_server(("127.0.0.1", 0)) as lsock:
        c1 = socket.create_connection(lsock.getsockname(), timeout=5)
        s1, _ = lsock.accept()
        c2 = socket.create_connection(lsock.getsockname(), timeout=5)
        s2, _ = lsock.accept()
    # (c1 and c2 talk to s1/s2 on the listening port; their own ephemeral ports receive s1's and s2's answers)
    p_in, p_out = sorted((c1.getsockname()[1], c2.getsockname()[1]))
    fake = [p for p in range(p_in - _MAX_LISTED_PORTS - 5, p_in) if p != p_out]  # a range ending at p_in
    watched = [*fake, p_in]
    try:
        for p in watched:
            log.watch(p)
        assert log.span is not None and log.span[1] == p_in < p_out
        inside = (c1, s1) if c1.getsockname()[1] == p_in else (c2, s2)
        other_c, other_s = (c2, s2) if inside[0] is c1 else (c1, s1)
        for _ in range(3):
            inside[1].send(b"in" * 5)
            other_s.send(b"out" * 5)
            time.sleep(0.002)
        time.sleep(0.01)

        def key(dst: socket.socket, src: socket.socket) -> tuple[bytes, int, bytes, int]:
            a, ap = src.getsockname()
            b, bp = dst.getsockname()
            return socket.inet_aton(a), ap, socket.inet_aton(b), bp

        assert log.newest_segment(key(inside[0], inside[1])) is not None  # toward a port inside the range: logged
        assert log.newest_segment(key(other_c, other_s)) is None  # toward a port past its end: not
    finally:
        for p in watched:
            log.unwatch(p)
        for s in (c1, s1, c2, s2):
            s.close()
