"""Session 26 (rate): a stamped transport's packet-log keys and sequence anchors (``_tkey``, ``_pkey``, ``_iss1``,
``_irs1``) held in the C transport state where it is built (the key as its 12-byte pattern, read by the C send's and
split read's packet-log looks without a tuple of four objects): read back as set, None where unset, and a key the
pattern cannot hold refused at once, the old value kept. The C send and split read that use them are compared with the
Python reference in test_kstamp_native / test_kstamp_s25_perf / test_kstamp_write."""

from __future__ import annotations

import socket

import pytest

from deltatap.net import kstamp
from deltatap.net.pktstamp import packet_log
from tests.kernel.kstamp_rig import close_pairs, stamped_pair, stamping_kept

pytestmark = pytest.mark.skipif(not kstamp.enabled(), reason="kernel stamps off (DELTATAP_KERNEL_STAMPS=0 or not Linux)")

_C_STATE = kstamp._TransportBase is not kstamp.asyncio.Transport  # (the C base: DELTATAP_NATIVE left on, built)


def test_keys_and_anchors_read_back() -> None:
    with stamping_kept():
        pair = stamped_pair(True, packet_log=packet_log() is not None)
        c, s, tr, _p = pair
        try:
            local, peer = s.getsockname(), s.getpeername()
            if tr._plog is not None:
                assert tr._tkey == (socket.inet_aton(local[0]), local[1], socket.inet_aton(peer[0]), peer[1])
                assert tr._pkey == (socket.inet_aton(peer[0]), peer[1], socket.inet_aton(local[0]), local[1])
                assert [type(x) for x in tr._tkey] == [bytes, int, bytes, int]
            else:
                assert tr._tkey is None and tr._pkey is None
            assert tr._iss1 is None and tr._irs1 is None
            key = (b"\x7f\x00\x00\x01", 65535, b"\x0a\x01\x02\x03", 0)
            for name in ("_tkey", "_pkey"):
                setattr(tr, name, key)
                assert getattr(tr, name) == key
                setattr(tr, name, None)
                assert getattr(tr, name) is None
                setattr(tr, name, key)
            for name, v in (("_iss1", 0), ("_irs1", 0xFFFFFFFF), ("_iss1", 12345)):
                setattr(tr, name, v)
                assert getattr(tr, name) == v
                setattr(tr, name, None)
                assert getattr(tr, name) is None
            if _C_STATE:  # a key or anchor the C state cannot hold: refused, the old value kept
                for bad, exc in (((b"\x7f\x00\x00", 1, b"\x7f\x00\x00\x01", 2), ValueError),
                                 ((b"\x7f\x00\x00\x01", 70000, b"\x7f\x00\x00\x01", 2), OverflowError),
                                 ((b"\x7f\x00\x00\x01", 1, b"\x7f\x00\x00\x01"), TypeError), ("key", TypeError)):
                    with pytest.raises(exc):
                        tr._tkey = bad
                    assert tr._tkey == key
                with pytest.raises(TypeError):
                    tr._iss1 = "1"
                assert tr._iss1 is None
                with pytest.raises(TypeError):
                    del tr._pkey
        finally:
            close_pairs([pair])
            s.close()


@pytest.mark.skipif(not _C_STATE, reason="the C transport state is not built or DELTATAP_NATIVE=0")
def test_c_send_without_a_key_raises_as_the_reference() -> None:
    """A watched connection whose ``_tkey`` was cleared: the C send's packet-log look raises TypeError, as
    ``PacketLog.newest_segment(None, ...)``'s pattern does in the reference (no silent placement without a key)."""
    with stamping_kept():
        pair = stamped_pair(True, packet_log=packet_log() is not None)
        c, s, tr, _p = pair
        try:
            if tr._plog is None:
                pytest.skip("no packet log here (CAP_NET_RAW)")
            tr.write(b"a" * 10)  # (the first write finds the anchor)
            assert c.recv(100) == b"a" * 10
            assert tr._iss1 is not None
            tr._tkey = None
            with pytest.raises(TypeError):
                tr.write(b"b" * 10)
        finally:
            close_pairs([pair])
            s.close()
