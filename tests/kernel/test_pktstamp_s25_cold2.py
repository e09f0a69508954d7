"""The packet log's hand-back off the reads' path (session 25, cold2): a read past ``_due_ns`` arms a loop timer
(:meth:`PacketLog.due`) instead of handing back before its recv; the timer hands back every 20 ms while frames come and
stops after a tick that finds few (a read 20 ms on arms it again); a timer late on the read's own loop, or no running loop, hands back at the read, as
before; a timer left on a closed loop is armed again on the reader's. Reference and C alike (``ring_release``)."""

from __future__ import annotations

import asyncio
import importlib
import struct

import pytest

from deltatap.net.pktstamp import _FRAME, _MAINTAIN_EVERY_NS, PacketLog

try:
    acc = importlib.import_module("deltatap.net._pktring")
except ImportError:
    acc = None

_ACCS = [None] + ([acc] if acc is not None else [])


def _full_log(accel, frames: int = 64) -> PacketLog:
    """A log over a ring of ``frames`` frames, every one filled (status: the user's): a hand-back moves the head to
    ``frames // 2``."""
    ring = bytearray(frames * _FRAME)
    for i in range(frames):
        struct.pack_into("=I", ring, i * _FRAME, 1)
    return PacketLog.over(ring, accel)


async def _until(cond, limit_s: float = 2.0) -> None:
    for _ in range(int(limit_s / 0.005)):
        if cond():
            return
        await asyncio.sleep(0.005)


@pytest.mark.parametrize("accel", _ACCS)
def test_a_read_arms_the_timer_and_the_timer_hands_back_then_stops(accel) -> None:
    log = _full_log(accel)

    async def main() -> None:
        log.read_due()
        assert log._head == 0, "the read handed back on its own path"
        assert log._tick is not None and log._tick[0] is asyncio.get_running_loop()
        log.read_due()  # (not due again: nothing happens)
        await _until(lambda: log._head == 32)
        assert log._head == 32
        await _until(lambda: log._tick is None)  # the next tick found no new frame: idle, disarmed
        assert log._tick is None and log._due_ns == log._last_maintain + _MAINTAIN_EVERY_NS
        log._due_ns = 0  # (20 ms on) a read arms it again
        log.read_due()
        assert log._tick is not None and log._head == 32

    asyncio.run(main())


@pytest.mark.parametrize("accel", _ACCS)
def test_a_late_timer_or_no_loop_hands_back_at_the_read(accel) -> None:
    log = _full_log(accel)

    async def main() -> None:
        log.read_due()
        log._due_ns = 0  # (the tick later than 40 ms: a busy loop)
        log.read_due()
        assert log._head == 32

    asyncio.run(main())
    other = _full_log(accel)
    other.read_due()  # no running loop
    assert other._head == 32 and other._tick is None


@pytest.mark.parametrize("accel", _ACCS)
def test_a_timer_left_on_a_closed_loop_is_armed_again_on_the_readers(accel) -> None:
    log = _full_log(accel)

    async def arm() -> None:
        log.read_due()

    asyncio.run(arm())  # closed with its tick armed
    log._due_ns = 0

    async def main() -> None:
        log.read_due()
        assert log._tick is not None and log._tick[0] is asyncio.get_running_loop()
        await _until(lambda: log._head == 32)
        assert log._head == 32

    asyncio.run(main())
