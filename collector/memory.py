"""Hand freed heap memory back to the system when a collector's RSS has grown (glibc's ``malloc_trim``).

gRPC's C core inflates a compressed OTLP/gRPC message on one of its own threads and refuses one that inflates
past the 64 MiB limit (RESOURCE_EXHAUSTED): bounded, but glibc gives such a thread its own malloc arena, and
an arena keeps its 64 MiB heap after the message is freed. 40 such messages took ``deltatap collect`` from
121 to 331 MiB RSS, in steps of 68 MiB (benchmarks/collector_abuse.py ``--oversized 0 --bombs 0 --invalid 0
--grpc-bombs 40``). ``MALLOC_ARENA_MAX=1`` in the environment keeps it at 126-127 MiB, but set from inside
the process (``mallopt``) it came too late: an arena made during start-up is reused by gRPC's threads.
``malloc_trim(0)`` returns the free pages of every arena: with a :class:`Trimmer` checked every second,
the same run came back to 133-138 MiB within 2 s of each step.

A trim walks the heap: 30-57 ms for a fragmented 650 MB heap (measured on this project's 2-core machine), so
it runs only when RSS has grown by ``grow_bytes`` since the last trim, not on a clock. Elsewhere than glibc
(musl, macOS) there is no ``malloc_trim`` and :func:`trimmer` returns None.
"""

from __future__ import annotations

import ctypes
import os

__all__ = ["Trimmer", "rss_bytes", "trimmer"]

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss_bytes() -> int | None:
    """This process's resident set size (``/proc/self/statm``), or None where there is no /proc."""
    try:
        with open("/proc/self/statm", "rb") as fh:
            return int(fh.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return None


class Trimmer:
    """``check()`` now and then (the collector's ticker, every ``interval_s``): trims when RSS grew by ``grow_bytes``."""

    def __init__(self, trim, grow_bytes: int = 32 * 1024 * 1024) -> None:
        self._trim = trim
        self.grow_bytes = grow_bytes
        self._after = rss_bytes() or 0
        self.trims = 0

    def check(self) -> bool:
        rss = rss_bytes()
        if rss is None:
            return False
        if rss < self._after:  # freed on its own: the bar follows it down
            self._after = rss
            return False
        if rss - self._after < self.grow_bytes:
            return False
        self._trim()
        self.trims += 1
        self._after = rss_bytes() or rss
        return True


def trimmer(grow_bytes: int = 32 * 1024 * 1024) -> Trimmer | None:
    """A :class:`Trimmer` over glibc's ``malloc_trim(0)``, or None where the C library has none."""
    try:
        f = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    if rss_bytes() is None:
        return None
    f.argtypes, f.restype = [ctypes.c_size_t], ctypes.c_int
    return Trimmer(lambda: f(0), grow_bytes)
