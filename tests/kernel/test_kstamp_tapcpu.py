"""The read handler in C (deltatap/net/_pktring.c ``readable``) against ``KernelStampTransport._on_readable``, its
definition, on real loopback connections with the packet log.

``readable(transport)`` is what the loop calls (``add_reader(fd, readable, transport)``) instead of the bound method:
it must hand the protocol the same deliveries as ``_on_readable`` (one segment, several merged segments placed from the
packet log, end of stream), hand a transport whose ``_fast`` is not ``read_one`` to ``_on_readable`` whole, do nothing
on a lost transport, and turn an exception from the protocol's ``data_received`` into ``_fatal(exc, "protocol.
data_received() failed")`` (the connection closed, the exception not raised to the loop), as the Python does.
Needs CAP_NET_RAW (the packet log) and the built accelerator."""

from __future__ import annotations

import random
import socket
import time

import pytest

from deltatap.net import kstamp, pktstamp
from tests.kernel.test_kstamp_native import Recorder, _Loop, _pair, _settle, _stamping_on, _waiting  # noqa: F401

pytestmark = [
    pytest.mark.skipif(pktstamp.packet_log() is None, reason="per-packet stamps need CAP_NET_RAW (a packet socket)"),
    pytest.mark.skipif(kstamp._readable is None, reason="deltatap.net._pktring is not built (or DELTATAP_NATIVE turns it off)"),
]


def _drain(tr, s, handler) -> None:
    deadline = time.monotonic() + 5
    while _waiting(s):  # (a read takes at most the read buffer's 256 KiB)
        assert time.monotonic() < deadline
        handler(tr)


def test_the_c_handler_hands_over_what_on_readable_does() -> None:
    """Two connections get the same writes (single, back to back, large, a late read of several), one read by the C
    handler and one by ``_on_readable``: the same bytes in the same deliveries, the same exact pieces; then the end of
    stream told once each."""
    rng = random.Random(20)
    pairs = [_pair(True), _pair(True)]
    handlers = [kstamp._readable, kstamp.KernelStampTransport._on_readable]
    try:
        for _ in range(20):  # past TCP's quick-ack start, so that writes sent while the reader is late merge in its queue
            for (c, s, tr, _p), h in zip(pairs, handlers, strict=True):
                c.send(b"w")
                _settle([s], [1])
                h(tr)
        sent = [20, 20]
        for i in range(120):
            sizes = rng.choice([[10], [10, 10], [98, 98, 98, 98], [3000], [1, 70_000]])
            for size in sizes:
                for j, (c, _s, _tr, _p) in enumerate(pairs):
                    c.sendall(b"%c" % (65 + i % 26) * size)
                    sent[j] += size
                time.sleep(rng.choice([0, 0, 0.0002]))
            _settle([s for _c, s, _tr, _p in pairs], [n - tr._rx_off for n, (_c, _s, tr, _p) in zip(sent, pairs, strict=True)])
            for (_c, s, tr, _p), h in zip(pairs, handlers, strict=True):
                _drain(tr, s, h)
        (_, _, tr_c, p_c), (_, _, tr_py, p_py) = pairs
        assert b"".join(d for d, _ in p_c.got) == b"".join(d for d, _ in p_py.got)
        assert len(b"".join(d for d, _ in p_c.got)) == sent[0] == tr_c._rx_off
        for p in (p_c, p_py):  # every piece stamped, bounds never negative
            assert all(t > 0 and bound >= 0 for _d, pieces in p.got for _a, _b, t, bound in pieces)
        assert any(len(pieces) > 1 for _d, pieces in p_c.got), "no merged read was placed segment by segment"
        for c, _s, _tr, _p in pairs:
            c.shutdown(socket.SHUT_WR)
        deadline = time.monotonic() + 5
        for (_c, _s, tr, p), h in zip(pairs, handlers, strict=True):
            while not p.eof:
                assert time.monotonic() < deadline
                h(tr)
                time.sleep(0.0002)
            assert p.eof == 1
    finally:
        for c, _s, tr, _p in pairs:
            c.close()
            if not tr._lost:
                tr.abort()


class _Counted(kstamp.KernelStampTransport):
    __slots__ = ("calls",)

    def _on_readable(self) -> None:
        self.calls += 1
        super()._on_readable()


def _counted_pair():
    c, s, tr, p = _pair(True, _Counted)
    tr.calls = 0
    return c, s, tr, p


def test_a_transport_without_the_c_read_is_read_by_the_reference() -> None:
    c, s, tr, p = _counted_pair()
    try:
        assert tr._plog is not None
        c.send(b"data: 1\n\n")
        _settle([s], [9])
        kstamp._readable(tr)  # (_fast is read_one: the C read, _on_readable not called)
        assert tr.calls == 0 and b"".join(d for d, _ in p.got) == b"data: 1\n\n"
        tr._fast = None  # the Python _one_segment: the reference whole
        c.send(b"data: 2\n\n")
        _settle([s], [9])
        kstamp._readable(tr)
        assert tr.calls == 1 and b"".join(d for d, _ in p.got) == b"data: 1\n\ndata: 2\n\n"
    finally:
        c.close()
        tr.abort()


def test_a_lost_transport_reads_nothing() -> None:
    c, s, tr, p = _pair(True)
    try:
        c.send(b"x")
        _settle([s], [1])
        tr._lost = True
        assert kstamp._readable(tr) is None
        assert p.got == [] and _waiting(s) == 1
        tr._lost = False
    finally:
        c.close()
        tr.abort()


class _Raises(Recorder):
    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        raise ValueError("from the protocol")


def test_an_exception_from_data_received_closes_as_the_reference_does(caplog) -> None:
    outcomes = []
    for handler in (kstamp._readable, kstamp.KernelStampTransport._on_readable):
        c, s, tr, _p = _pair(True)
        p = _Raises()
        p.connection_made(tr)
        tr._protocol = p
        caplog.clear()
        try:
            c.send(b"data: 1\n\n")
            _settle([s], [9])
            with caplog.at_level("ERROR", logger="deltatap.net.kstamp"):
                handler(tr)  # (nothing raised to the loop)
            logged = [(r.getMessage(), r.exc_info[0], str(r.exc_info[1]), r.exc_info[2] is not None) for r in caplog.records]
            outcomes.append((logged, [d for d, _ in p.got], tr._lost, tr._closing))
        finally:
            c.close()
            if not tr._lost:
                tr.abort()
    assert outcomes[0] == outcomes[1] == ([("protocol.data_received() failed", ValueError, "from the protocol", True)],
                                          [b"data: 1\n\n"], True, True)


def test_the_loop_is_given_the_c_handler() -> None:
    class Loop(_Loop):
        def __init__(self) -> None:
            self.readers: list[tuple] = []

        def add_reader(self, *a) -> None:
            self.readers.append(a)

    c, s, tr, _p = _pair(True)
    try:
        tr._loop = loop = Loop()
        tr._start()
        tr.pause_reading()
        tr.resume_reading()
        assert loop.readers == [(tr._fd, kstamp._readable, tr)] * 2
    finally:
        c.close()
        tr.abort()


class _RaisesOnCuts(Recorder):
    def cuts_received(self, data: bytes, pieces) -> None:
        super().cuts_received(data, pieces)
        raise ValueError("from cuts_received")

    def data_received(self, data: bytes) -> None:  # (a burst read whole, not placed: the test sends another)
        self.plain = getattr(self, "plain", 0) + 1


def test_an_exception_from_cuts_received_closes_as_the_reference_does(caplog) -> None:
    """A merged read placed from the packet log (several segments waiting), its protocol's cuts_received raising: the
    C handler (read_split in it) and _on_readable log and close alike."""
    outcomes = []
    for handler in (kstamp._readable, kstamp.KernelStampTransport._on_readable):
        c, s, tr, _p = _pair(True)
        try:
            for _ in range(20):  # past TCP's quick-ack start, so that back-to-back writes merge in the queue
                c.send(b"w")
                _settle([s], [1])
                handler(tr)
            p = _RaisesOnCuts()
            p.connection_made(tr)
            tr._protocol = p
            caplog.clear()
            for _attempt in range(10):  # (bounded: until a burst is read as several placed segments)
                for i in range(4):
                    c.send(b"data: %d\n\n" % i)
                    time.sleep(0.0003)
                _settle([s], [36])
                with caplog.at_level("ERROR", logger="deltatap.net.kstamp"):
                    while not tr._lost and _waiting(s):  # (bounded: each call takes what waits)
                        handler(tr)
                if p.got:
                    break
            logged = [(r.getMessage(), r.exc_info[0], str(r.exc_info[1])) for r in caplog.records]
            outcomes.append((logged, [d for d, _ in p.got], tr._lost))
        finally:
            c.close()
            if not tr._lost:
                tr.abort()
    assert outcomes[0] == outcomes[1] == ([("protocol.cuts_received() failed", ValueError, "from cuts_received")],
                                          [b"data: 0\n\ndata: 1\n\ndata: 2\n\ndata: 3\n\n"], True)
