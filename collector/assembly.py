"""Trace assembly with bounded memory.

Spans are grouped by trace id into *open traces*. A trace closes ``grace_s`` after its latest span
arrived once its outermost span (one with no parent) is in; a trace whose root never arrives (its
parent lives in a process that exports nothing) closes ``orphan_wait_s`` after its latest span. Times
are the collector's own monotonic clock at arrival, so slow or skewed observer clocks cannot keep a
trace open. At most ``max_open`` traces are open: the oldest is closed early (an *eviction*, counted)
to make room. A span that arrives for a trace closed within the last ``late_memory`` closes is a
*late span*: counted and dropped, never silently merged into a finished row.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field

from deltatap.collector.spans import SpanRecord


@dataclass
class AssemblyStats:
    spans_received: int = 0
    traces_opened: int = 0
    traces_closed: int = 0
    traces_evicted: int = 0
    late_spans: int = 0


class _Open:
    __slots__ = ("spans", "first", "last", "rooted")

    def __init__(self, now: float) -> None:
        self.spans: list[SpanRecord] = []
        self.first = now
        self.last = now
        self.rooted = False


@dataclass(slots=True)
class Fragment:
    """A closed trace: every span received for one trace id."""

    trace_id: str
    spans: list[SpanRecord]
    evicted: bool = False
    closed_at: float = 0.0


@dataclass
class TraceAssembler:
    grace_s: float = 2.0
    orphan_wait_s: float = 10.0
    max_open: int = 200_000
    late_memory: int = 200_000
    stats: AssemblyStats = field(default_factory=AssemblyStats)

    def __post_init__(self) -> None:
        if self.grace_s < 0 or self.orphan_wait_s < 0:
            raise ValueError("grace_s and orphan_wait_s must be >= 0")
        if self.max_open < 1:
            raise ValueError("max_open must be >= 1")
        self._open: dict[str, _Open] = {}  # insertion order = age, for eviction
        self._heap: list[tuple[float, str]] = []
        self._closed: OrderedDict[str, None] = OrderedDict()

    @property
    def open_traces(self) -> int:
        return len(self._open)

    def add(self, spans: Iterable[SpanRecord], now: float) -> list[Fragment]:
        """Add received spans; returns traces closed early to respect ``max_open``."""
        evicted: list[Fragment] = []
        opened = self._open
        closed = self._closed
        stats = self.stats
        touched: dict[str, _Open] = {}
        n = 0
        for sp in spans:
            n += 1
            tid = sp.trace_id
            tr = opened.get(tid)
            if tr is None:
                if tid in closed:
                    stats.late_spans += 1
                    continue
                tr = opened[tid] = _Open(now)
                stats.traces_opened += 1
                if len(opened) > self.max_open:
                    old_tid = next(iter(opened))
                    evicted.append(self._close(old_tid, now, evicted=True))
            tr.spans.append(sp)
            if not tr.rooted and not sp.parent_span_id:  # (rooted once, rooted for good)
                tr.rooted = True
            touched[tid] = tr
        stats.spans_received += n
        for tid, tr in touched.items():
            tr.last = now
            if tid in opened:
                heapq.heappush(self._heap, (now + (self.grace_s if tr.rooted else self.orphan_wait_s), tid))
        return evicted

    def _close(self, tid: str, now: float, evicted: bool = False) -> Fragment:
        tr = self._open.pop(tid)
        self._closed[tid] = None
        if len(self._closed) > self.late_memory:
            self._closed.popitem(last=False)
        self.stats.traces_closed += 1
        if evicted:
            self.stats.traces_evicted += 1
        return Fragment(tid, tr.spans, evicted, now)

    def poll(self, now: float) -> list[Fragment]:
        """Close every trace whose deadline has passed."""
        out: list[Fragment] = []
        heap = self._heap
        while heap and heap[0][0] <= now:
            _, tid = heapq.heappop(heap)
            tr = self._open.get(tid)
            if tr is None:
                continue
            if tr.last + (self.grace_s if tr.rooted else self.orphan_wait_s) <= now:
                out.append(self._close(tid, now))
        if len(heap) > 4 * max(1, len(self._open)) + 1024:  # drop stale entries left by re-pushes
            self._heap = [(d, t) for d, t in heap if t in self._open]
            heapq.heapify(self._heap)
        return out

    def flush(self, now: float = 0.0) -> list[Fragment]:
        """Close every open trace (end of an offline file, shutdown)."""
        out = [self._close(tid, now) for tid in list(self._open)]
        self._heap.clear()
        return out
