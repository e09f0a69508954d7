"""Garbage-collector pauses: what stalls a deltatap process's event loop the longest, and the cure.

A full (generation 2) collection scans every tracked object the process holds. After the imports a tap,
the load generator or a reference component holds ~60k of them (aiohttp, OpenTelemetry, pydantic, numpy),
and on this project's 2-core machine one full collection of them took 40-55 ms (measured: ``gc.collect(2)``
right after importing ``deltatap.proxy.server``, ``deltatap.loadgen.run`` and ``deltatap.app.cli``, quiet
machine). CPython starts one whenever the objects that survived young collections since the last full one
exceed a quarter of the long-lived heap, i.e. every few thousand requests of churn; while it runs, no read
is taken, so a first token that arrived just before waits in the socket, the next token arrives, the kernel
merges the two in the receive queue and the read's stamp is the later one (issue 14: first-token points late
by whole inter-token gaps).

:func:`settle` moves what is alive at start-up out of every later collection (``gc.freeze``: the imports
never die) and keeps CPython's thresholds, so a full collection then scans only what was allocated since:
measured 0.003 ms instead of 40 ms. Every process that serves or reads streams calls it once, after its
start-up, before traffic. :data:`PAUSES` times every collection (``gc.callbacks``), so the pauses a
process still takes are visible (the tap's ``/metrics``). ``DELTATAP_GC_FREEZE=0`` skips the freeze (the
timing stays), for measuring what it is worth.
"""

from __future__ import annotations

import gc
import os
import time
from dataclasses import dataclass, field

__all__ = ["PAUSES", "GcPauses", "settle"]


@dataclass
class GcPauses:
    """Counts, total and longest pause per generation since :meth:`install`."""

    count: list[int] = field(default_factory=lambda: [0, 0, 0])
    total_ns: list[int] = field(default_factory=lambda: [0, 0, 0])
    max_ns: list[int] = field(default_factory=lambda: [0, 0, 0])
    _t0: int = 0
    _installed: bool = False

    def install(self) -> None:
        if not self._installed:
            gc.callbacks.append(self._callback)
            self._installed = True

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.perf_counter_ns()
            return
        ns = time.perf_counter_ns() - self._t0
        g = min(int(info.get("generation", 0)), 2)
        self.count[g] += 1
        self.total_ns[g] += ns
        if ns > self.max_ns[g]:
            self.max_ns[g] = ns


PAUSES = GcPauses()


def _freeze_survivors(phase: str, info: dict) -> None:
    """``gc`` callback: after each full collection, move what survived it out of every later one (``gc.freeze``).

    A full collection scans every long-lived tracked object. A tap holding 10,000 streams holds ~58 of them per
    stream (transports, protocols, readers, observers, their lists and dicts: ~600k), and each full collection of
    them stalled its loop 0.4-0.75 s (benchmarks/soak.py, ``deltatap_process_gc_pause_max_seconds``): ten of them
    while the streams opened (CPython runs one whenever the survivors grow by a quarter), every read meanwhile late
    by as much. Frozen, a later full collection scans only what became long-lived since the last one. What a stream
    holds is freed by reference counting when it ends (tests/proxy/test_soak_gc.py: no tracked object of a closed
    stream waits for the collector), so freezing it keeps nothing alive; only garbage in a reference cycle that was
    alive at a full collection stays until exit. ``DELTATAP_GC_FREEZE=0`` turns this off with the start-up freeze."""
    if phase == "stop" and info.get("generation") == 2:
        gc.freeze()


def settle(*, freeze_survivors: bool = False) -> None:
    """Once per process, after start-up and before traffic: collect, freeze what is alive out of every later
    collection, and time the collections that still happen (:data:`PAUSES`); with ``freeze_survivors`` (the tap's),
    also freeze what each later full collection leaves alive (:func:`_freeze_survivors`). Process-wide: call it from a
    command's entry point, not from a library or a test that shares the interpreter."""
    freeze = os.environ.get("DELTATAP_GC_FREEZE", "1").strip().lower() not in ("0", "off", "false", "no")
    if freeze:
        gc.collect()
        gc.freeze()
    PAUSES.install()  # (after its own collection: that one is start-up, not a pause in traffic)
    if freeze and freeze_survivors and _freeze_survivors not in gc.callbacks:
        gc.callbacks.append(_freeze_survivors)  # (after PAUSES's: a pause is timed without the freeze)
