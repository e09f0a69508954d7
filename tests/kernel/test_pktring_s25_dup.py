"""A byte the packet log holds twice — the first copy, then a retransmission of it (a tail-loss probe after a
delayed ACK, an RTO): the bytes were the reader's at the FIRST copy's arrival, and a write's departure is its first
sending. Session 25's wire referee found reads at 200 req/s stamped 5.7-17.2 ms late, stated exact, at a spurious
tail-loss probe's capture: the ring search stopped at the newest segment holding the read's first byte (the probe)
and never saw the copy before it. The Python reference and the C accelerator (both searched here) must keep every
copy, the first one first, and place the bytes at it."""

from __future__ import annotations

import random

import pytest

from deltatap.net.pktstamp import _FRAME
from tests.kernel.test_pktring import _frame, _pair_logs, acc

pytestmark = pytest.mark.skipif(acc is None, reason="deltatap.net._pktring is not built")

KEY = (bytes([127, 0, 0, 1]), 40000, bytes([127, 0, 0, 1]), 8080)
OTHER = (bytes([127, 0, 0, 1]), 40002, bytes([127, 0, 0, 1]), 8080)


class _Plain(random.Random):
    """Frames the log can read: no IP options, a plain TCP header, the whole snap (test_pktring's generator picks)."""

    def random(self) -> float:
        return 0.5

    def choice(self, seq):  # type: ignore[override]
        return seq[0]


def _logs(plan: list[tuple[tuple, int, int, int]], frames: int = 32, head: int = 5):
    ring = bytearray(frames * _FRAME)
    rng = _Plain(7)
    for i, (key, seq, payload, wall_us) in enumerate(plan):
        _frame(ring, (head + i) % frames * _FRAME, rng, key, seq & 0xFFFFFFFF, payload, wall_us * 1000, False)
    return _pair_logs(ring, head)


@pytest.mark.parametrize("base", [1000, (1 << 32) - 30])  # (and wrapping past 2**32)
def test_a_probe_of_the_waiting_bytes_does_not_move_their_arrival(base: int) -> None:
    # the previous read's bytes, the waiting segment, another connection's traffic, then the probe of the waiting one
    plan = [(KEY, base - 100, 100, 1_000), (KEY, base, 60, 2_000), (OTHER, 5, 10, 2_100), (KEY, base, 60, 9_000)]
    for log in _logs(plan):
        segs = log.segments_since(KEY, base & 0xFFFFFFFF)
        assert [w for _s, _e, w in segs] == [2_000_000, 9_000_000]  # both copies, the first first; not the bytes before
        assert log.cuts(KEY, base & 0xFFFFFFFF, 60, 99, 256, 256 * 1024) == ([(60, 2_000_000)], False, None)


def test_a_probe_of_the_last_segment_of_a_merged_read() -> None:
    base = 5000
    plan = [(KEY, base, 40, 1_000), (KEY, base + 40, 40, 1_500), (KEY, base + 40, 40, 8_000)]
    for log in _logs(plan):
        assert log.cuts(KEY, base, 80, 99, 256, 256 * 1024) == ([(40, 1_000_000), (80, 1_500_000)], False, None)


def test_the_first_copy_is_found_when_no_byte_before_it_is_logged() -> None:
    # a connection's first segment (nothing of it before in the ring): the search runs to its limit, and stops there
    base = 77
    plan = [(KEY, base, 50, 1_000), (KEY, base, 50, 4_000)]
    for log in _logs(plan):
        assert [w for _s, _e, w in log.segments_since(KEY, base)] == [1_000_000, 4_000_000]
        assert [w for _s, _e, w in log.segments_since(KEY, base, limit=1)] == [4_000_000]  # (the limit holds)
