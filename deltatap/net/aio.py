"""Event-loop helpers: every deltatap server and client runs on uvloop."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on a uvloop event loop (falls back to asyncio's loop if uvloop is absent)."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a hard dependency; keep the CLI usable anyway
        return asyncio.run(coro)
    return uvloop.run(coro)


# uvloop's timers have millisecond granularity and may fire up to ~0.7 ms early or late, so a plain
# ``asyncio.sleep`` cannot hit an instant to better than a millisecond. Sleep on the timer until
# ``spin_ns`` before the target, then yield to the loop (``sleep(0)``) until the target has passed:
# other tasks keep running while it waits.
DEFAULT_SPIN_NS = 1_500_000


async def sleep_until(t_mono_ns: int, spin_ns: int = DEFAULT_SPIN_NS) -> None:
    """Wait until the ``deltatap.clock.mono_ns`` instant ``t_mono_ns``, to within a loop iteration."""
    from deltatap.core.clock import mono_ns

    d = t_mono_ns - mono_ns()
    if d > spin_ns:
        await asyncio.sleep((d - spin_ns) / 1e9)
    while mono_ns() < t_mono_ns:
        await asyncio.sleep(0)


async def sleep_coarse_until(t_mono_ns: int) -> None:
    """Timer-only wait (may end up to ~1 ms off), for work that is not itself timed; always yields
    to the loop at least once."""
    from deltatap.core.clock import mono_ns

    d = t_mono_ns - mono_ns()
    await asyncio.sleep(d / 1e9 if d > 0 else 0)
