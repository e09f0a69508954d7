"""Streaming gap statistics for :mod:`deltatap.core.sse` (re-exported there): count / mean / max / p99 in bounded memory.

``GapStats``: ``observe(t_ns)`` adds the gap since the previous call, ``add(gap_ns)`` adds a gap directly;
``count``, ``mean_ns``, ``max_ns``, ``quantile_ns(q)``, ``p99_ns()``. The 128 largest gaps are kept exactly (p99 is
exact below 12,800 gaps); the others go to a log-bucket sketch with 1 % relative error.

This class is the definition. Where ``deltatap.core._content`` is built, the tap's stream observer keeps its gaps in
that module's ``GapCore`` (the same state, ``observe``, ``add`` and ``mean_ns`` in C, so the observer's C path updates it
without a Python step; its kept gaps are a C array kept with heapq's algorithm, ``_top`` the same list as here, item
for item; ``quantile_ns`` and the rest are this class's own code), which tests/kernel/test_content_native.py and
tests/core/test_gaps_s21.py compare with this class.
"""

from __future__ import annotations

import heapq
import math

_GAMMA = 1.02  # sketch bucket growth: relative error (gamma - 1) / (gamma + 1) < 1 %
_LOG_GAMMA = math.log(_GAMMA)


class GapStats:
    """Streaming count / mean / max / p99 of gaps in ns, in bounded memory."""

    __slots__ = ("count", "total_ns", "max_ns", "_top", "_top_k", "_buckets", "_zeros", "_last")

    def __init__(self, top_k: int = 128) -> None:
        self.count = 0
        self.total_ns = 0
        self.max_ns = 0
        self._top: list[int] = []  # min-heap of the top_k largest gaps
        self._top_k = top_k
        self._buckets: dict[int, int] = {}
        self._zeros = 0
        self._last: int | None = None

    def observe(self, t_ns: int) -> None:
        """Record the gap since the previous ``observe`` (the first call records none)."""
        if self._last is not None:
            self.add(t_ns - self._last)
        self._last = t_ns

    def add(self, gap_ns: int) -> None:
        g = gap_ns if gap_ns > 0 else 0
        self.count += 1
        self.total_ns += g
        if g > self.max_ns:
            self.max_ns = g
        top = self._top
        if len(top) < self._top_k:
            heapq.heappush(top, g)
            return
        if g > top[0]:
            g = heapq.heapreplace(top, g)
        # the sketch holds only gaps outside the exact top-k: every one of them is <= each kept gap,
        # so ranks counted up from the smallest stay right (and short streams never pay for a log)
        if g == 0:
            self._zeros += 1
        else:
            k = math.ceil(math.log(g) / _LOG_GAMMA)
            self._buckets[k] = self._buckets.get(k, 0) + 1

    @property
    def mean_ns(self) -> float:
        return self.total_ns / self.count if self.count else 0.0

    def quantile_ns(self, q: float = 0.99) -> float:
        """Nearest-rank quantile; exact while the rank falls among the kept largest gaps. ``q`` is 0.99 unless given:
        :meth:`p99_ns` is this method."""
        n = self.count
        if not n:
            return 0.0
        rank = math.ceil(q * n)  # 1-based, ascending
        if rank < 1:
            rank = 1
        from_top = n - rank + 1
        top = self._top
        if from_top == 1 and top:  # the largest gap (always kept): max_ns, without a pass over the kept ones
            return float(self.max_ns)
        if from_top <= len(top):
            return float(heapq.nlargest(from_top, top)[-1])
        if rank <= self._zeros:
            return 0.0
        seen = self._zeros
        for k in sorted(self._buckets):
            seen += self._buckets[k]
            if seen >= rank:
                return 2 * _GAMMA**k / (_GAMMA + 1)
        return float(self.max_ns)  # pragma: no cover - counts always add up

    p99_ns = quantile_ns  # ``p99_ns()``: quantile_ns at its default, 0.99 (one call, not a call that makes another)
