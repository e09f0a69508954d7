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
    # small buffers: a 200 KB write goes partial (not tiny: a receive window that opens by a few bytes at a time leaves
    # the sender to TCP's zero-window probes, whose timer backs off to seconds)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16384)
    c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32768)
    loop = _Loop()
    p = Proto()
    tr = kstamp.KernelStampTransport(loop, s, p)
    p.connection_made(tr)
    if not packet_log and tr._plog is not None:
        tr._plog.unwatch(tr._pkey[3])  # (as the transport's close does: the log is process-wide, later tests read its ports)
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
        except OSError:  # (BlockingIOError: nothing waits)
            return out
        if not got:
            return out
        out += got


def _flush(c: socket.socket, tr, loop: _Loop, want: int = 0) -> bytes:
    """The peer takes what waits and the transport sends what it buffered, until nothing is left in the transport (or
    the peer is gone) and the peer has at least ``want`` bytes (those in the kernel's send buffer come as it reads);
    bounded in time."""
    got = _drain(c)
    deadline = time.monotonic() + 10
    while (loop.writer is not None or len(got) < want) and c.fileno() >= 0 and not tr._lost:
        assert time.monotonic() < deadline, "the buffered bytes were not sent"
        if loop.writer is not None:
            loop.writer()
        more = _drain(c)
        if not more:
            time.sleep(0.0002)
        got += more
    return got


def _state(tr, p, ret):
    """What must be alike on both connections after a step (stamps taken at different moments: their kinds only)."""
    bound = tr.last_write_bound_ns
    u = tr.unplaced_write
    return {
        "ret": None if ret is None else (ret[1] == -1, ret[1] >= 0),
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
    t, bound = ret
    assert (t, bound) == (p.last_write_mono, p.last_write_bound)
    if not tr._lost and tr.last_write_mono_ns is not None:  # (None: nothing written yet, t is now)
        assert t == tr.last_write_mono_ns and bound == tr.last_write_bound_ns
    assert p.unplaced is tr.unplaced_write or (p.unplaced == tr.unplaced_write)
    if tr.unplaced_write is not None:
        t0, t1, end, _queued, start = tr.unplaced_write
        assert t0 == t and t1 - t0 == bound and end == tr._tx_off and start < end and bound > kstamp._SLOW_SEND_NS


def _check_stream(tr, accepted: bytes) -> None:
    """The bytes handed to the kernel and those buffered are the stream written so far, in order."""
    if tr._lost:
        return
    assert tr._tx_off + tr._wsize == len(accepted)
    assert b"".join(tr._wbuf) == accepted[tr._tx_off:]
    assert (tr._loop.writer is not None) == (tr._wsize > 0)


def _payload(i: int, size: int, kind: str):
    b = bytes([65 + i % 26]) * size
    return b if kind == "bytes" else bytearray(b) if kind == "bytearray" else memoryview(b"." + b)[1:]


send = st.tuples(st.just("send"), st.sampled_from([0, 1, 100, 1448, 9000, 65_536, 400_000]),
                 st.sampled_from(["bytes", "bytearray", "memoryview"]), st.booleans())  # (through the protocol or not)
step = st.one_of(send, send, send, send, st.tuples(st.just("drain")), st.tuples(st.just("reset")), st.tuples(st.just("eof")))


@pytest.mark.parametrize(
    "slow_ns,packet_log,lazy",
    [(30_000, True, False), (0, True, True), (0, True, False), (0, False, False)],
    ids=["usual", "all-slow-lazy", "all-slow-placed", "all-slow-no-log"],
)
@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(steps=st.lists(step, min_size=1, max_size=12))
def test_the_c_write_leaves_what_the_reference_leaves(steps, slow_ns, packet_log, lazy, slow_sends_over) -> None:
    """After every step each connection's state is consistent with its own stream; and wherever the kernel took the
    same bytes on both (the same bytes sent and buffered before and after the step: it decides how much a send takes,
    and its acknowledgements' timing may differ between two connections), the two states are the same."""
    if packet_log and pktstamp.packet_log() is None:
        pytest.skip("the packet log needs CAP_NET_RAW")
    slow_sends_over(slow_ns)
    pairs = [_pair(True, packet_log, lazy), _pair(False, packet_log, lazy)]
    got, accepted = [b"", b""], [b"", b""]
    reset = False
    try:
        for i, st_ in enumerate(steps):
            kernel_before = [(tr._tx_off, tr._wsize, tr._lost) for _c, tr, _p, _l in pairs]
            states, slow = [], []
            for j, (c, tr, p, loop) in enumerate(pairs):
                before = dict(kstamp.SLOW_SENDS)
                ret = raised = None
                if st_[0] == "send":
                    _, size, kind, via_protocol = st_
                    data = _payload(i, size, kind)
                    takes = size and not tr._lost and not tr._eof
                    try:
                        ret = p.send(data) if via_protocol else tr.write(data)
                    except RuntimeError as exc:  # (after write_eof)
                        raised = str(exc)
                    if takes and raised is None:
                        accepted[j] += bytes(data)
                    if ret is not None:
                        _check_own(tr, p, ret)
                elif st_[0] == "drain":
                    got[j] += _flush(c, tr, loop)
                elif st_[0] == "reset":
                    reset = True
                    if c.fileno() >= 0:
                        c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")
                        c.close()
                        time.sleep(0.001)
                else:
                    tr.write_eof()
                _check_stream(tr, accepted[j])
                states.append({**_state(tr, p, ret), "raised": raised})
                slow.append({k: kstamp.SLOW_SENDS[k] - before[k] for k in before})
            kernel_after = [(s["tx_off"], s["wsize"], s["lost"]) for s in states]
            if kernel_before[0] == kernel_before[1] and kernel_after[0] == kernel_after[1]:
                assert states[0] == states[1], (i, st_)
                if slow_ns == 0 and not packet_log:
                    assert slow[0] == slow[1], (i, st_)  # (counted as bounded, each the same)
            else:  # (the kernel took different amounts: what each did with them is checked above)
                assert states[0]["writes"] == states[1]["writes"] and states[0]["raised"] == states[1]["raised"], (i, st_)
        for j, (c, tr, _p, loop) in enumerate(pairs):
            got[j] += _flush(c, tr, loop, 0 if reset else len(accepted[j]) - len(got[j]))
            assert got[j] == accepted[j][: len(got[j])]
            if not reset:
                assert got[j] == accepted[j]
        assert accepted[0] == accepted[1] or reset
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
