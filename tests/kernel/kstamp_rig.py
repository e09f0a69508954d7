"""The rig the kernel-stamped read tests share (test_kstamp_native, test_kstamp_s25_perf): protocols that record what
a :class:`deltatap.net.kstamp.KernelStampTransport` hands them, the loop a transport driven by hand asks for, a
loopback pair whose server side such a transport reads, and kernel stamping kept on while a test runs."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Callable, Iterator

from deltatap.net import kstamp
from tests.kernel.test_kstamp import _wait_kernel_stamping

SLACK_NS = 20_000  # a kernel stamp on the mono scale vs the sender's readings around its send (the offset's error)


class Recorder:
    """Records each delivery as ``(bytes, t, bound)``. It has no ``cuts_received``: a read the transport splits at
    packet arrivals comes as one ``data_received`` per piece."""

    def __init__(self) -> None:
        self.got: list = []
        self.eof = 0
        self.transport = None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        assert type(data) is bytes
        self.got.append((data, self.transport.rx_mono_ns, self.transport.rx_bound_ns))

    def eof_received(self) -> bool:
        self.eof += 1
        return True

    def connection_lost(self, exc) -> None:
        pass


class PieceRecorder(Recorder):
    """Records each delivery as ``(bytes, [(start, end, t, bound), ...])``: one piece for a ``data_received``, a split
    read's pieces for a ``cuts_received``."""

    def data_received(self, data: bytes) -> None:
        assert type(data) is bytes
        tr = self.transport
        self.got.append((data, [(0, len(data), tr.rx_mono_ns, tr.rx_bound_ns)]))

    def cuts_received(self, data: bytes, pieces) -> None:
        self.got.append((data, list(pieces)))


class HandLoop:
    """What the transport asks of a loop when it is driven by hand (its read handler called directly)."""

    def add_reader(self, *a) -> None:
        pass

    remove_reader = add_writer = remove_writer = add_reader

    def call_soon(self, cb, *args) -> None:
        cb(*args)


def stamped_pair(fast: bool, *, packet_log: bool, proto: type = Recorder, cls: type = kstamp.KernelStampTransport):
    """A loopback connection ``(client socket, server socket, transport, protocol)``: the server side read by ``cls``
    on a :class:`HandLoop` into a ``proto``, watched by the packet log or not (as ``packet_log`` says it must be);
    ``fast`` False: the Python reference's reads (``transport._fast = None``)."""
    with socket.create_server(("127.0.0.1", 0)) as lsock:
        c = socket.create_connection(lsock.getsockname(), timeout=5)
        s, _ = lsock.accept()
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.setsockopt(socket.SOL_SOCKET, kstamp.SO_TIMESTAMPING, kstamp.RX_FLAGS)
    p = proto()
    tr = cls(HandLoop(), s, p)
    p.connection_made(tr)
    assert (tr._plog is not None) == packet_log, "the packet log does not watch the connection" if packet_log else "it does"
    if not fast:
        tr._fast = None
    return c, s, tr, p


def read_to_eof(pairs, read: Callable) -> None:
    """Each pair's client has shut its sending side: its transport read (``read(transport)``) until its protocol was
    told the end of stream, once (bounded)."""
    deadline = time.monotonic() + 5
    for _c, _s, tr, p in pairs:
        while not p.eof:
            assert time.monotonic() < deadline
            read(tr)
            time.sleep(0.0002)
        assert p.eof == 1


def close_pairs(pairs) -> None:
    for c, _s, tr, _p in pairs:
        c.close()
        if not tr._lost:
            tr.abort()


@contextlib.contextmanager
def stamping_kept() -> Iterator[None]:
    """Kernel stamping on while the block runs: Linux turns it off again (from a workqueue) once the last socket that
    asked for it closes, and on again only shortly after the next one asks (its first packets unstamped)."""
    keep = socket.socket()
    try:
        keep.setsockopt(socket.SOL_SOCKET, kstamp.SO_TIMESTAMPING, kstamp.RX_FLAGS)
        _wait_kernel_stamping()
        yield
    finally:
        keep.close()
