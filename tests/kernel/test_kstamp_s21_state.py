"""The stamped transport's counters held in C (deltatap/net/_pktring.c ``transport_base`` and ``ReadLag``) against the
Python definitions they stand in for (plain slots of :class:`deltatap.net.kstamp.KernelStampTransport`,
:class:`deltatap.net.kstamp.ReadLag`).

Where the C read path is built, the transport's per-read and per-write counts are C long longs of its base class under
the slots' names, and ``READ_LAG`` is the C ``ReadLag``: what Python reads and writes through them must behave as the
slots and the Python class do (ints in, the same ints out; ``rx_mono_ns`` / ``last_write_mono_ns`` None until set), and
the C read paths' counting the same as ``ReadLag.add``. The read and write paths themselves are compared with the
Python reference on loopback connections in test_kstamp_native.py and test_kstamp_write.py (both on this class)."""

from __future__ import annotations

import random
import socket

import pytest

from deltatap.net import kstamp
from tests.kernel.test_kstamp_native import _Loop, _pair, _waiting

native = pytest.mark.skipif(kstamp._read_one is None, reason="deltatap.net._pktring is not built (or DELTATAP_NATIVE turns it off)")


class _Proto:
    def connection_made(self, transport) -> None:
        pass

    def connection_lost(self, exc) -> None:
        pass


@pytest.fixture
def transport():
    with socket.create_server(("127.0.0.1", 0)) as lsock:
        c = socket.create_connection(lsock.getsockname(), timeout=5)
        s, _ = lsock.accept()
    tr = kstamp.KernelStampTransport(_Loop(), s, _Proto())
    yield tr
    tr.abort()  # (closes s and stops the packet log watching its port: the log is process-wide)
    c.close()


def _lags(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    edges = [0, 1, 2, 3, -1, -(2**40), 2**47 - 1, 2**47, 2**47 + 1, 2**62, 2**63 - 1]
    edges += [2**i + d for i in range(63) for d in (-1, 0, 1) if 0 <= 2**i + d < 2**63]
    return edges + [rng.choice((rng.randrange(-(10**6), 10**9), rng.randrange(2**63))) for _ in range(n)]


@native
def test_read_lag_twin_counts_as_the_definition():
    ref, twin = kstamp.ReadLag(), kstamp._pktacc.ReadLag()
    for ns in _lags(21, 3000):
        ref.add(ns)
        twin.add(ns)
    assert twin.buckets == ref.buckets and len(twin.buckets) == 48
    assert (twin.count, twin.total_ns) == (ref.count, ref.total_ns)
    with pytest.raises(TypeError):
        twin.add(1.5)
    assert type(kstamp.READ_LAG) is kstamp._pktacc.ReadLag  # (what the C read paths count into, and /metrics reads)


@native
def test_transport_state_reads_as_slots(transport):
    tr = transport
    assert type(tr).__mro__[1] is kstamp._TransportBase and kstamp._STATE_SLOTS == ()
    # the reference's __init__ values, read back through the C members
    assert (tr.rx_mono_ns, tr.rx_bound_ns, tr.last_write_mono_ns, tr.last_write_bound_ns, tr.writes, tr._tx_off) == (None, 0, None, 0, 0, 0)
    assert tr._empty_mono > 0
    rng = random.Random(5)
    names = ("_segs_in", "_rx_off", "_empty_mono", "rx_bound_ns", "_tx_off", "writes", "last_write_bound_ns", "rx_mono_ns",
             "last_write_mono_ns")
    for _ in range(200):
        name = rng.choice(names)
        value = rng.choice((0, -1, 1, 2**63 - 1, -(2**63), rng.randrange(-(2**62), 2**62)))
        setattr(tr, name, value)
        assert getattr(tr, name) == value and type(getattr(tr, name)) is int
    tr._rx_off += 7  # (the reference's augmented assignments)
    for name in ("rx_mono_ns", "last_write_mono_ns"):
        setattr(tr, name, None)
        assert getattr(tr, name) is None
    for name in names:
        with pytest.raises(TypeError):
            setattr(tr, name, "1")
        with pytest.raises((TypeError, AttributeError)):
            delattr(tr, name)
    with pytest.raises(OverflowError):
        tr._rx_off = 2**63


@native
def test_c_paths_refuse_other_objects():
    """The C read and write paths touch the counters in place: anything but kstamp's transport is refused, not read."""

    class Other:
        _sock = None

    for call in (lambda: kstamp._read_one(Other()), lambda: kstamp._read_split(Other()),
                 lambda: kstamp._send(None, Other(), b"x"), lambda: kstamp._read_packets(Other(), 0)):
        with pytest.raises(TypeError):
            call()


@pytest.mark.skipif(kstamp.packet_log() is None, reason="the split path needs the packet log (CAP_NET_RAW)")
@pytest.mark.parametrize("c_path", [False, True] if kstamp._read_one is not None else [False])
def test_split_path_takes_the_counters_the_segment_check_read(c_path):
    """Several segments waiting: the one-segment check (``read_one`` / ``_one_segment``) keeps the TCP counters it read
    in ``_split_counts`` and the split path that follows takes them instead of reading them again (one getsockopt less),
    leaving ``_segs_in`` at that count and ``_split_counts`` empty; every byte is handed over once, in order."""
    c, s, tr, p = _pair(c_path)
    got_bytes = lambda: b"".join(d for d, _ in p.got)  # noqa: E731 - every byte handed over so far, in order
    splits = 0
    try:
        sent = b""
        for i in range(20):
            for j in range(4):  # (four writes while the reader waits: several segments)
                msg = b"data: %d.%d\n\n" % (i, j)
                c.send(msg)
                sent += msg
            deadline = 200_000
            while _waiting(s) < len(sent) - len(got_bytes()) and deadline:
                deadline -= 1
            counts = kstamp.tcp_counters(s)
            several = counts[0] - tr._segs_in > 1
            splits += several
            if c_path:
                got = kstamp._read_one(tr)
                assert (got is False) == several
                if got is False:
                    assert tr._split_counts == counts  # (nothing arrived since: the same reading)
                    tr._several()
                elif got.__class__ is bytes:
                    p.data_received(got)
            else:
                view = kstamp._read_view()
                if not tr._one_segment(view):
                    assert several and tr._split_counts == counts
                    tr._read_merged(view)
            assert tr._split_counts is None and tr._segs_in == counts[0]
            assert got_bytes() == sent[: len(got_bytes())]
        while _waiting(s):
            tr._on_readable()
        assert got_bytes() == sent and splits >= 5  # (the split path was taken)
    finally:
        tr.abort()
        c.close()
