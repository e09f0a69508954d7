"""The packet log's range filter keyed by the connections' other side (deltatap/net/pktstamp.py ``watch(local_port,
server_port, accepted)``): past ``_MAX_LISTED_PORTS`` watched ports, with every connection keyed and few listening and
server ports, the range keeps a segment only toward or from a listening port, or toward or from a port in the range
whose other end is a server's port. Real packets on loopback: every segment of every watched connection is still logged
(arrivals and departures), and the other copy loopback shows of each (a departure's arrival at its peer, an arrival's
departure from its peer) no longer is; the filter stays keyed only while every watched connection is."""

from __future__ import annotations

import socket
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deltatap.net import pktstamp
from deltatap.net.pktstamp import _MAX_KEYED_PORTS, _MAX_LISTED_PORTS, PacketLog, packet_log


def _log() -> PacketLog:
    return PacketLog.over(bytearray(pktstamp._FRAME * 16))


def test_without_a_range_or_keys_the_filter_is_the_one_before():
    ports = list(range(50000, 50000 + _MAX_LISTED_PORTS + 1))
    assert pktstamp._filter(ports, None, [8080]) == pktstamp._filter(ports)  # (a range, but no peers given)
    assert pktstamp._filter(ports, None, [8080], [9000]) != pktstamp._filter(ports)
    assert pktstamp._filter([40000, 40001], None, [8080], [9000]) == pktstamp._filter([40000, 40001])  # listed: never keyed


def test_the_range_is_keyed_once_every_connection_says_its_side():
    log = _log()
    for p in range(30000, 30000 + _MAX_LISTED_PORTS + 5):
        log.watch(p, 8000)  # connections to a server on port 8000
    log.watch(9000, accepted=True)  # accepted on a listening port
    assert log.span is not None and log._keyed == ((9000,), (8000,))
    log.watch(30001, 8001)  # a second server: keyed again, with both
    assert log._keyed == ((9000,), (8000, 8001))
    log.watch(31000)  # a connection watched without its side: the range alone
    assert log._keyed is None and log.span[1] == 31000
    log.unwatch(31000)
    log.unwatch(30001, 8001)
    assert log._keyed is None  # (left as it was until the range is computed again)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1024, 1024 + 2 * _MAX_LISTED_PORTS), st.sampled_from(["acc", "srv", "none"]),
                          st.integers(0, _MAX_KEYED_PORTS + 2)), min_size=1, max_size=800))
def test_a_keyed_filter_names_every_listening_and_server_port_watched(ops):
    log = _log()
    live: list[tuple[int, int | None, bool]] = []
    for add, port, side, other in ops:
        conn = (port, 7000 + other if side == "srv" else None, side == "acc")
        if add:
            log.watch(*conn)
            live.append(conn)
        elif conn in live:
            log.unwatch(*conn)
            live.remove(conn)
        keyed = log._keyed
        if keyed is None:
            continue
        assert log.span is not None  # (listed ports are never keyed)
        assert all(srv is not None or acc for _, srv, acc in live)  # no connection without its side
        assert {p for p, _, acc in live if acc} <= set(keyed[0])
        assert {srv for _, srv, _ in live if srv is not None} <= set(keyed[1])


def _pair(lsock: socket.socket) -> tuple[socket.socket, socket.socket]:
    c = socket.create_connection(lsock.getsockname(), timeout=5)
    s, _ = lsock.accept()
    for x in (c, s):
        x.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return c, s


def _key(src: socket.socket, dst: socket.socket) -> tuple[bytes, int, bytes, int]:
    """Segments from ``src`` toward ``dst``: (source ip, source port, destination ip, destination port)."""
    a, ap = src.getsockname()
    b, bp = dst.getsockname()
    return socket.inet_aton(a), ap, socket.inet_aton(b), bp


@pytest.mark.skipif(packet_log() is None, reason="per-packet stamps need CAP_NET_RAW (a packet socket)")
def test_real_segments_of_keyed_connections_are_logged_once():
    """A tap's shape: a client connects to our listening port (we watch the accepted socket), we connect to a server
    (we watch our socket, keyed by the server's port); the range spans every port involved. Each direction of each
    connection: its segments logged, each once (the copy loopback shows at the unwatched end left out)."""
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM, socket.htons(pktstamp.ETH_P_ALL))
    sock.setblocking(False)
    log = PacketLog(sock)  # (its own: the process's may watch other tests' connections, unkeyed)
    with socket.create_server(("127.0.0.1", 0)) as ours, socket.create_server(("127.0.0.1", 0)) as server:
        client, acc = _pair(ours)  # client -> our listening port
        up, srv = _pair(server)  # our connection -> the server
    real = [acc.getsockname()[1], up.getsockname()[1]]
    everyone = [*real, client.getsockname()[1], srv.getsockname()[1]]
    fake = [p for p in range(min(everyone) - _MAX_LISTED_PORTS - 2, max(everyone) + 2) if p not in everyone and p > 0]
    watched = [(p, 1, False) for p in fake] + [(real[0], None, True), (real[1], srv.getsockname()[1], False)]
    try:
        for w in watched:
            log.watch(*w)
        assert log.span is not None and log.span[0] <= min(everyone) and max(everyone) <= log.span[1]
        assert log._keyed is not None and real[0] in log._keyed[0] and srv.getsockname()[1] in log._keyed[1]
        lens = (11, 12, 13)
        for n in lens:  # each write its own segment (TCP_NODELAY, 2 ms apart)
            client.send(b"a" * n)  # arrives at acc: kept (toward a listening port)
            acc.send(b"b" * n)  # departs from acc: kept; its arrival at the client: not
            srv.send(b"c" * n)  # arrives at up: kept (from the server); its departure from srv: not
            up.send(b"d" * n)  # departs from up: kept (toward the server); its arrival at srv: not
            time.sleep(0.002)
        time.sleep(0.01)
        for src, dst in ((client, acc), (acc, client), (srv, up), (up, srv)):
            key = _key(src, dst)
            newest = log.newest_segment(key)
            assert newest is not None, (src.getsockname(), dst.getsockname())
            segs = log.segments_since(key, (newest[1] - sum(lens)) & 0xFFFFFFFF)
            assert [end - seq for seq, end, _ in segs] == list(lens), (src.getsockname(), dst.getsockname())  # each once
    finally:
        for w in watched:
            log.unwatch(*w)
        for s in (client, acc, up, srv, sock):
            s.close()
