"""Session 26 (rate): the C reader callback (kstamp's ``readable``) hands a read to a protocol that takes
StampedProtocol.data_received unchanged as that method would - on_data(data, rx_mono_ns, rx_bound_ns) - without its
frame; a protocol whose class or instance has its own data_received, or whose ``kernel`` is not the transport, gets
data_received called as before. Real loopback connections, the transport driven by hand."""

from __future__ import annotations

import time

import pytest

from deltatap.net import kstamp
from deltatap.net.conn import StampedProtocol
from deltatap.net.pktstamp import packet_log
from tests.kernel.kstamp_rig import close_pairs, stamped_pair, stamping_kept

pytestmark = pytest.mark.skipif(kstamp._readable is None, reason="the C reader callback is not built or DELTATAP_NATIVE=0")


class Rec(StampedProtocol):
    def __init__(self) -> None:
        self.got: list = []
        self.own = 0

    def on_data(self, data: bytes, t: int, bound: int) -> None:
        k = self.transport
        self.got.append((data, t, bound, k.rx_mono_ns, k.rx_bound_ns))


class OwnData(Rec):
    def data_received(self, data: bytes) -> None:
        self.own += 1
        super().data_received(data)


class Boom(Rec):
    def on_data(self, data: bytes, t: int, bound: int) -> None:
        raise RuntimeError("on_data failed")


def _exchange(proto: type, setup=None, n: int = 5) -> tuple:
    with stamping_kept():
        pair = stamped_pair(True, packet_log=packet_log() is not None, proto=proto)
        c, s, tr, p = pair
        try:
            if setup is not None:
                setup(p)
            sent = b""
            for i in range(n):
                chunk = b"x%03d" % i * (1 + i)
                c.sendall(chunk)
                sent += chunk
                deadline = time.monotonic() + 5
                while sum(len(g[0]) for g in p.got) < len(sent) and not tr._lost:
                    assert time.monotonic() < deadline
                    kstamp._readable(tr)
                    time.sleep(0.0005)
            return sent, p, tr
        finally:
            close_pairs([pair])
            s.close()


def test_on_data_takes_the_read_stamp_as_data_received_gives_it() -> None:
    sent, p, _tr = _exchange(Rec)
    assert b"".join(g[0] for g in p.got) == sent
    assert all(type(g[0]) is bytes for g in p.got)
    assert all(t == rx and bound == rxb for _d, t, bound, rx, rxb in p.got)  # (the stamp the transport held, as given)
    assert p.own == 0


def test_a_class_or_instance_data_received_is_called() -> None:
    sent, p, _tr = _exchange(OwnData)
    assert b"".join(g[0] for g in p.got) == sent
    assert p.own == len(p.got) > 0

    inst: list[bytes] = []

    def own(proto) -> None:
        proto.data_received = lambda data: (inst.append(data), proto.got.append((data, 0, 0, 0, 0)))

    sent, p, _tr = _exchange(Rec, own)
    assert b"".join(inst) == sent  # (the instance's attribute, not on_data straight)


def test_a_protocol_whose_kernel_is_not_the_transport_stamps_in_python() -> None:
    def unhook(proto) -> None:
        proto.kernel = None  # (data_received's reference branch: its own mono_ns() and bound)

    sent, p, _tr = _exchange(Rec, unhook)
    assert b"".join(g[0] for g in p.got) == sent
    assert all(t >= rx for _d, t, _b, rx, _rb in p.got)  # (read after the kernel's stamp, by data_received itself)


def test_on_data_raising_ends_the_connection_as_data_received_raising_does() -> None:
    _sent, p, tr = _exchange(Boom, n=1)
    assert tr._lost and p.got == []
    assert isinstance(p.lost_exc, RuntimeError)
