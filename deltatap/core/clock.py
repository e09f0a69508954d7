"""One clock for every stamp: monotonic ``perf_counter_ns`` anchored once to the wall clock.

Stamps are taken with :func:`mono_ns` (cheap, monotonic, never steps) on the hot path and turned
into Unix nanoseconds with :func:`to_unix_ns` when a span is built. The anchor is taken once per
process, as the narrowest of several (wall, monotonic) bracket samples, so every stamp of a process
shares one offset and same-process deltas are exact.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

mono_ns = time.perf_counter_ns


@dataclass(frozen=True)
class Anchor:
    unix_ns: int  # wall-clock time at ...
    mono_ns: int  # ... this perf_counter_ns reading
    uncertainty_ns: int  # half-width of the bracket the pair was read in

    def to_unix_ns(self, mono: int) -> int:
        return self.unix_ns + (mono - self.mono_ns)

    def to_mono_ns(self, unix: int) -> int:
        return self.mono_ns + (unix - self.unix_ns)


def take_anchor(samples: int = 25) -> Anchor:
    """Read (perf, wall, perf) several times and keep the tightest bracket."""
    best: tuple[int, int, int] | None = None
    for _ in range(samples):
        a = time.perf_counter_ns()
        w = time.time_ns()
        b = time.perf_counter_ns()
        if best is None or (b - a) < (best[2] - best[0]):
            best = (a, w, b)
    assert best is not None
    a, w, b = best
    return Anchor(unix_ns=w, mono_ns=(a + b) // 2, uncertainty_ns=(b - a) // 2 + 1)


ANCHOR = take_anchor()


def to_unix_ns(mono: int) -> int:
    """Unix nanoseconds for a :func:`mono_ns` stamp of this process."""
    return ANCHOR.unix_ns + (mono - ANCHOR.mono_ns)


def now_unix_ns() -> int:
    return to_unix_ns(time.perf_counter_ns())
