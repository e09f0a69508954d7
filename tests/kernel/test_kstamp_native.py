"""The stamped read path's C twin (deltatap/net/_pktring.c ``read_one``, ``read_split`` and ``to_mono``) against the
Python reference in deltatap/net/kstamp.py, on real loopback connections with the packet log.

``read_one`` replaces :meth:`KernelStampTransport._one_segment` with what it calls (the ``TCP_INFO`` counters, the
stamped ``recvmsg``, the stamp's move to the monotonic scale, the queue-empty bookkeeping, ``READ_LAG``) up to the
protocol's ``data_received``; ``read_split`` the rest of the read where several segments wait (the one-byte peek, the
counters again, the placement from the packet log, ``MERGED_READS``) up to ``cuts_received``. Two connections get the same writes (split writes, several writes merged into one read,
late reads, end of stream), one read by the C twin and one by the reference (``transport._fast = None``): each must
hand its protocol the bytes in the same deliveries, each stamped within the send that carried its last byte, with the
same bounds (0: exact). A third connection switches between the two at random per read: the bookkeeping one leaves is
what the other continues from (its stream offset stays the kernel's, so the packet log keeps placing merged reads).
Needs CAP_NET_RAW (the packet log) and the built accelerator."""

from __future__ import annotations

import fcntl
import random
import socket
import struct
import termios
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deltatap.net import kstamp, pktstamp
from tests.kernel.kstamp_rig import SLACK_NS, close_pairs, read_to_eof, stamped_pair, stamping_kept
from tests.kernel.kstamp_rig import PieceRecorder as Recorder
from tests.kernel.kstamp_rig import HandLoop as _Loop  # noqa: F401 (test_kstamp_s21_state and test_kstamp_tapcpu import it from here)

pytestmark = [
    pytest.mark.skipif(pktstamp.packet_log() is None, reason="per-packet stamps need CAP_NET_RAW (a packet socket)"),
    pytest.mark.skipif(kstamp._read_one is None, reason="deltatap.net._pktring is not built (or DELTATAP_NATIVE turns it off)"),
]

US = 1_000


@pytest.fixture(autouse=True, scope="module")
def _stamping_on():
    """Kernel stamping on for the whole module (:func:`tests.kernel.kstamp_rig.stamping_kept`)."""
    with stamping_kept():
        yield


def _pair(fast: bool, cls: type = kstamp.KernelStampTransport):
    return stamped_pair(fast, packet_log=True, proto=Recorder, cls=cls)


def _waiting(s: socket.socket) -> int:
    return struct.unpack("i", fcntl.ioctl(s.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0]


def _settle(socks, want: list[int]) -> None:
    """Until each socket holds the bytes sent to it (loopback: at once; bounded)."""
    deadline = time.monotonic() + 5
    while any(_waiting(s) < n for s, n in zip(socks, want, strict=True)):
        assert time.monotonic() < deadline, "the bytes did not arrive"
        time.sleep(0.0005)


def _check_stamps(p: Recorder, windows: list[tuple[int, int, int]], read_at: list[int]) -> None:
    """Each piece: its stamp no earlier than the send that carried its last byte began, no later than the read;
    ``t - bound`` no later than the send of its first byte ended. ``windows``: (end offset, t0, t1) per write."""
    pos = 0
    for i, (data, pieces) in enumerate(p.got):
        for start, end, t, bound in pieces:
            first = next(w for w in windows if w[0] > pos + start)
            last = next(w for w in windows if w[0] >= pos + end)
            assert bound >= 0
            assert t >= last[1] - SLACK_NS, (i, (t - last[1]) / US)
            assert t <= read_at[i] + SLACK_NS, (i, (t - read_at[i]) / US)
            assert t - bound <= first[2] + SLACK_NS, (i, (t - bound - first[2]) / US)
            if bound == 0:  # exact: within the send of its last byte
                assert t <= last[2] + SLACK_NS, (i, (t - last[2]) / US)
        pos += len(data)


steps = st.lists(
    st.tuples(
        st.lists(st.sampled_from([1, 7, 100, 1000, 1448, 9000, 30_000]), min_size=1, max_size=4),  # writes before a read
        st.sampled_from([0, 0, 50, 300]),  # µs between them (0: back to back, merged in one read)
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(steps=steps)
def test_the_c_read_hands_over_what_the_reference_does(steps) -> None:
    pairs = [_pair(True), _pair(False)]
    try:
        sent = [0, 0]
        windows: list[list[tuple[int, int, int]]] = [[], []]
        read_at: list[list[int]] = [[], []]
        lag_before = kstamp.READ_LAG.count
        for sizes, gap_us in steps:
            for size in sizes:
                for j, (c, _s, _tr, _p) in enumerate(pairs):
                    t0 = time.perf_counter_ns()
                    c.sendall(b"%c" % (65 + len(windows[j]) % 26) * size)
                    t1 = time.perf_counter_ns()
                    sent[j] += size
                    windows[j].append((sent[j], t0, t1))
                if gap_us:
                    time.sleep(gap_us / 1e6)
            _settle([s for _c, s, _tr, _p in pairs], [n - tr._rx_off for n, (_c, _s, tr, _p) in zip(sent, pairs, strict=True)])
            for j, (_c, s, tr, p) in enumerate(pairs):
                before = len(p.got)
                while _waiting(s):  # (a read takes at most the read buffer's 256 KiB)
                    tr._on_readable()
                read_at[j].extend([time.perf_counter_ns()] * (len(p.got) - before))
        for j, (_c, _s, tr, p) in enumerate(pairs):
            data = b"".join(d for d, _ in p.got)
            assert len(data) == sent[j] and tr._rx_off == sent[j]
            assert data == b"".join(b"%c" % (65 + i % 26) * (w[0] - (windows[j][i - 1][0] if i else 0)) for i, w in enumerate(windows[j]))
            _check_stamps(p, windows[j], read_at[j])
        (_, _, tr_c, p_c), (_, _, tr_py, p_py) = pairs
        # the same deliveries: piece boundaries, and which pieces are exact, where both connections' segments were alike
        shape = [[(d, [(a, b, bound == 0) for a, b, _t, bound in pieces]) for d, pieces in p.got] for *_x, p in pairs]
        assert shape[0] == shape[1], (tr_c._segs_in, tr_py._segs_in)
        assert kstamp.READ_LAG.count > lag_before
        # end of stream: both tell their protocol once
        for c, _s, tr, p in pairs:
            c.shutdown(socket.SHUT_WR)
        read_to_eof(pairs, lambda tr: tr._on_readable())
    finally:
        close_pairs(pairs)


def test_switching_between_the_c_and_the_python_read_keeps_the_bookkeeping() -> None:
    """One connection, each read made by the C twin or the reference at random: the stream offset each leaves is the
    kernel's (bytes received minus bytes waiting), merged reads keep being placed from the packet log, every byte
    arrives once."""
    rng = random.Random(15)
    c, s, tr, p = _pair(True)
    try:
        # past TCP's quick-ack start, so that writes sent while the reader is late merge in its queue
        for _ in range(20):
            c.send(b"w")
            time.sleep(0.001)
            tr._on_readable()
        placed = kstamp.MERGED_READS["packets"]
        sent = len(b"".join(d for d, _ in p.got))
        expect = b"w" * sent
        for i in range(300):
            for _ in range(rng.choice([1, 1, 2, 4])):
                msg = b"data: %d\n\n" % i
                c.send(msg)
                expect += msg
                sent += len(msg)
                time.sleep(rng.choice([0, 0.0001]))
            _settle([s], [sent - tr._rx_off])
            tr._fast = kstamp._read_one if rng.random() < 0.5 else None
            tr._on_readable()
            counts = pktstamp.tcp_counters(s)
            assert counts is not None and tr._rx_off == counts[1] - _waiting(s)
            assert tr._segs_in <= counts[0]
        while _waiting(s):
            tr._on_readable()
        assert b"".join(d for d, _ in p.got) == expect
        assert kstamp.MERGED_READS["packets"] > placed  # merged reads were placed segment by segment
    finally:
        c.close()
        tr.abort()


@settings(max_examples=3000, deadline=None)
@given(age_ns=st.one_of(st.integers(-2 * 10**6, 70 * 10**9), st.sampled_from([0, -(10**18), 10**18])), zero=st.booleans())
def test_to_mono_matches_the_reference(age_ns: int, zero: bool) -> None:
    """A kernel stamp ``age_ns`` old (negative: from the future; huge: the wall clock stepped), or 0: the C twin returns
    what the reference does (the same value where it is fixed by the stamp; between the reference's readings of now
    where it is now)."""
    k = 0 if zero else max(1, time.time_ns() - age_ns)
    r1 = kstamp._to_mono_ref(k)
    got = kstamp._read_one and kstamp._pktacc.to_mono(k)
    r2 = kstamp._to_mono_ref(k)
    if r1 == r2:
        assert got == r1
    else:
        assert r1 <= got <= r2
