"""The stamped write's C twin (deltatap/net/_pktring.c ``send``) against the Python reference
(:meth:`deltatap.net.kstamp.KernelStampTransport._write` and :meth:`deltatap.net.conn.StampedProtocol.send`), on real
loopback connections.

Two connections get the same generated steps - writes of every size (bytes, bytearray, memoryview; through the
protocol's ``send`` or the transport's ``write``), with small socket buffers so that sends go partial or take nothing,
a peer that drains, a peer that resets, ``write_eof`` - one written by the C twin and one by the reference
(``transport._wfast = None``). After every step the transports and protocols must be in the same state: what ``send``
returned (a stamp, and a bound of -1 exactly where the other's is), bytes sent and buffered, the buffered bytes
themselves, the write count, the slow-send rule's outcome (every send slow, or none; placed now, kept for later, or
counted as bounded without the packet log), closing, lost and why; and the peers get the same bytes."""

from __future__ import annotations

import socket
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deltatap.net import kstamp, pktstamp
from deltatap.net.conn import StampedProtocol
from tests.kernel.test_kstamp import slow_sends_over  # noqa: F401  (a fixture)

pytestmark = pytest.mark.skipif(kstamp._send is None, reason="deltatap.net._pktring is not built (or DELTATAP_NATIVE turns it off)")


class _Loop:
    """What the transport asks of a loop when it is driven by hand: a registered writer is called by the test."""

    def __init__(self) -> None:
        self.writer = None

    def add_writer(self, _fd, cb) -> None:
        self.writer = cb

    def remove_writer(self, _fd) -> None:
        self.writer = None

    def add_reader(self, *a) -> None:
        pass

    remove_reader = add_reader

    def call_soon(self, cb, *args) -> None:
        cb(*args)


class Proto(StampedProtocol):
    def on_data(self, data: bytes, t: int, bound: int) -> None:
        pass


def _pair(fast: bool, packet_log: bool, lazy: bool):
    with socket.create_server(("127.0.0.1", 0)) as lsock:
        c = socket.create_connection(lsock.getsockname(), timeout=5)
        s, _ = lsock.accept()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)  # (small: sends go partial after some tens of KiB)
    c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    loop = _Loop()
    p = Proto()
    tr = kstamp.KernelStampTransport(loop, s, p)
    p.connection_made(tr)
    if not packet_log:
        tr._plog = None
    tr.lazy_placement = lazy
    if not fast:
        tr._wfast = None
    return c, tr, p, loop


def _drain(c: socket.socket) -> bytes:
    out = b""
    if c.fileno() < 0:  # (reset and closed)
        return out
    c.setblocking(False)
    while True:
        try:
            got = c.recv(1 << 20)
        except BlockingIOError:
            return out
        except OSError:
            return out
        if not got:
            return out
        out += got


def _state(tr, p, ret):
    """What must be alike on both connections after a step (stamps taken at different moments: their kinds only)."""
    bound = tr.last_write_bound_ns
    u = tr.unplaced_write
    return {
        "ret": None if ret is None else (type(ret).__name__, ret[1] == -1, ret[1] >= 0),
        "bound": (bound == -1, bound >= 0),
        "tx_off": tr._tx_off,
        "wsize": tr._wsize,
        "wbuf": b"".join(tr._wbuf),
        "writes": tr.writes,
        "closing": tr._closing,
        "lost": tr._lost,
        "eof": tr._eof,
        "writer": tr._loop.writer is not None,
        "unplaced": None if u is None else u[2],
        "p.unplaced": None if p.unplaced is None else p.unplaced[2],
        "lost_exc": None if p.lost_exc is None else (type(p.lost_exc).__name__, getattr(p.lost_exc, "errno", None)),
    }


def _check_own(tr, p, ret) -> None:
    """Each connection's own consistency: what send returned is what the protocol and the transport keep."""
    if ret is None:
        return
    t, bound = ret
    assert (t, bound) == (p.last_write_mono, p.last_write_bound)
    if not tr._lost and tr.last_write_mono_ns is not None:  # (None: nothing written yet, t is now)
        assert t == tr.last_write_mono_ns and bound == tr.last_write_bound_ns
    assert p.unplaced is tr.unplaced_write or (p.unplaced == tr.unplaced_write)
    if tr.unplaced_write is not None:
        t0, t1, end = tr.unplaced_write
        assert t0 == t and t1 - t0 == bound and end == tr._tx_off and bound > kstamp._SLOW_SEND_NS


def _payload(i: int, size: int, kind: str):
    b = bytes([65 + i % 26]) * size
    return b if kind == "bytes" else bytearray(b) if kind == "bytearray" else memoryview(b"." + b)[1:]


step = st.one_of(
    st.tuples(st.just("send"), st.sampled_from([0, 1, 100, 1448, 9000, 65_536, 200_000]),
              st.sampled_from(["bytes", "bytearray", "memoryview"]), st.booleans()),
    st.tuples(st.just("drain")),
    st.tuples(st.just("reset")),
    st.tuples(st.just("eof")),
)


@pytest.mark.parametrize(
    "slow_ns,packet_log,lazy",
    [(30_000, True, False), (0, True, True), (0, True, False), (0, False, False)],
    ids=["usual", "all-slow-lazy", "all-slow-placed", "all-slow-no-log"],
)
@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(steps=st.lists(step, min_size=1, max_size=12))
def test_the_c_write_leaves_what_the_reference_leaves(steps, slow_ns, packet_log, lazy, slow_sends_over) -> None:
    if packet_log and pktstamp.packet_log() is None:
        pytest.skip("the packet log needs CAP_NET_RAW")
    slow_sends_over(slow_ns)
    pairs = [_pair(True, packet_log, lazy), _pair(False, packet_log, lazy)]
    got = [b"", b""]
    try:
        for i, st_ in enumerate(steps):
            states, slow = [], []
            for j, (c, tr, p, loop) in enumerate(pairs):
                before = dict(kstamp.SLOW_SENDS)
                ret: object = None
                if st_[0] == "send":
                    _, size, kind, via_protocol = st_
                    data = _payload(i, size, kind)
                    try:
                        ret = p.send(data) if via_protocol else tr.write(data)
                    except RuntimeError as exc:  # (after write_eof)
                        ret = ("raised", str(exc))
                    if ret is not None and ret[0] != "raised":
                        _check_own(tr, p, ret)
                        ret = (ret[0], ret[1])
                elif st_[0] == "drain":
                    for _ in range(50):  # (bounded: each round the peer takes what waits, the transport sends more)
                        got[j] += _drain(c)
                        if loop.writer is None:
                            break
                        loop.writer()
                elif st_[0] == "reset":
                    if c.fileno() >= 0:
                        c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")
                        c.close()
                        time.sleep(0.001)
                else:
                    tr.write_eof()
                states.append(_state(tr, p, ret if not (isinstance(ret, tuple) and ret and ret[0] == "raised") else None))
                states[-1]["raised"] = ret[1] if isinstance(ret, tuple) and ret and ret[0] == "raised" else None
                slow.append({k: kstamp.SLOW_SENDS[k] - before[k] for k in before})
            assert states[0] == states[1], (i, st_)
            if slow_ns == 0 and not packet_log:
                assert slow[0] == slow[1], (i, st_)  # (counted as bounded, each the same)
        for j, (c, tr, p, loop) in enumerate(pairs):
            if c.fileno() >= 0:
                for _ in range(50):
                    got[j] += _drain(c)
                    if loop.writer is None:
                        break
                    loop.writer()
        assert got[0] == got[1]
        assert got[0] == b"".join(
            bytes(_payload(i, s[1], "bytes")) for i, s in enumerate(steps) if s[0] == "send"
        )[: len(got[0])]
    finally:
        for c, tr, _p, _l in pairs:
            c.close()
            if not tr._lost:
                tr.abort()


def test_a_write_behind_waiting_bytes_and_after_a_loss_is_the_reference_s() -> None:
    """Where the C twin does nothing (bytes already waiting, a lost connection, nothing to write) the reference runs:
    the write is queued behind the others with the bound -1, or stamped and dropped, as without the accelerator."""
    c, tr, p, loop = _pair(True, False, False)
    try:
        tr._wbuf.append(b"waiting")
        tr._wsize = 7
        t, bound = p.send(b"more")
        assert bound == -1 and t == tr.last_write_mono_ns and b"".join(tr._wbuf) == b"waitingmore" and tr.writes == 1
        assert p.send(b"") == (t, -1) and tr.writes == 1  # (nothing handed to the kernel: not a write)
        tr._wbuf.clear()
        tr._wsize = 0
        tr.abort()
        assert tr._lost
        t2, _b = p.send(b"after")
        assert t2 >= t and tr._tx_off == 0 and tr.writes == 2
    finally:
        c.close()
