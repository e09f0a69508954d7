"""Waiting for an absolute ``mono_ns`` instant without blocking the event loop.

uvloop's timers have millisecond granularity and may fire up to ~0.7 ms early or late, so a plain
``asyncio.sleep`` cannot hit a send time to better than a millisecond. :func:`sleep_until` sleeps on
the timer until ``spin_ns`` before the target, then yields to the loop (``sleep(0)``) until the
target has passed: other tasks - reading streams, sending - keep running while it waits.
"""

from __future__ import annotations

import asyncio

from deltatap.clock import mono_ns

DEFAULT_SPIN_NS = 1_500_000


async def sleep_until(t_mono_ns: int, spin_ns: int = DEFAULT_SPIN_NS) -> None:
    d = t_mono_ns - mono_ns()
    if d > spin_ns:
        await asyncio.sleep((d - spin_ns) / 1e9)
    while mono_ns() < t_mono_ns:
        await asyncio.sleep(0)


async def sleep_coarse_until(t_mono_ns: int) -> None:
    """Timer-only wait (may end up to ~1 ms off), for work that is not itself a timed send; always
    yields to the loop at least once."""
    d = t_mono_ns - mono_ns()
    await asyncio.sleep(d / 1e9 if d > 0 else 0)
