"""The collector's sans-I/O core: spans in, rows out.

``ingest(spans, now)`` feeds the assembler; ``tick(now)`` closes due traces, joins fragments, builds
rows, aggregates them and hands them to the listeners (row sink, re-export); ``flush()`` does the
same for everything still open (end of an offline file, shutdown). ``now`` is the caller's monotonic
clock in seconds. The receivers, the offline reader and the tests all drive this one class.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from deltatap.collector.assembly import TraceAssembler
from deltatap.collector.batch import build_rows, columns_of, settle
from deltatap.collector.decompose import Decomposer
from deltatap.collector.join import Group, Joiner
from deltatap.collector.metrics import DeltaHistograms
from deltatap.collector.rows import JoinMethod, Row, delta_defs
from deltatap.collector.sketches import Aggregator
from deltatap.collector.spans import SpanRecord
from deltatap.core.topology import Topology, default_topology


@dataclass(frozen=True)
class PipelineOptions:
    grace_s: float = 2.0
    orphan_wait_s: float = 10.0
    max_open_traces: int = 200_000
    join_window_s: float = 5.0
    join_hold_s: float = 1.0
    keep_rows: int = 100_000  # rows kept in memory for .rows() (oldest dropped beyond)
    sketch_accuracy: float = 0.005


class Pipeline:
    def __init__(self, topology: Topology | None = None, options: PipelineOptions | None = None) -> None:
        self.topo = topology or default_topology()
        self.opts = options or PipelineOptions()
        o = self.opts
        self.assembler = TraceAssembler(grace_s=o.grace_s, orphan_wait_s=o.orphan_wait_s, max_open=o.max_open_traces, late_memory=max(o.max_open_traces, 10_000))
        self.decomposer = Decomposer(self.topo)  # every cache of the decomposition lives here, for this topology
        self.joiner = Joiner(self.topo, window_s=o.join_window_s, hold_s=o.join_hold_s, decomposer=self.decomposer)
        self.aggregator = Aggregator(o.sketch_accuracy)
        self.hist = DeltaHistograms(delta_defs(self.topo))
        self.kept: collections.deque[Row] = collections.deque(maxlen=o.keep_rows if o.keep_rows > 0 else None)
        self.listeners: list[Callable[[list[Row]], None]] = []
        self.decode_errors: dict[str, int] = {"grpc": 0, "http": 0}
        self.forward_dropped = 0
        self.joined: dict[str, int] = {m.value: 0 for m in JoinMethod}
        # Scale-out (docs/scaleout.md): a shard collector hands a request it holds only part of (a fragment
        # whose partners went to other shards) to the joining collector instead of emitting a partial row.
        self.handoff: Callable[[list], None] | None = None
        self.handed_off = 0

    def ingest(self, spans: Iterable[SpanRecord], now: float) -> None:
        for frag in self.assembler.add(spans, now):
            self.joiner.add(frag, now)

    def _rows(self, groups: list[Group]) -> list[Row]:
        if self.handoff is not None:
            whole = self.joiner.complete
            for g in groups:
                if not whole(g):
                    self.handoff(g.spans)
                    self.handed_off += 1
            groups = [g for g in groups if whole(g)]
        rows = build_rows(self.decomposer, groups)  # held as columns per block where they can be (collector/batch.py)
        if rows:
            deltas = columns_of(rows)  # every row's deltas, for both aggregates
            settle(rows)  # kept for a while: out of the garbage collector's sight where nothing can form a cycle
            joined = self.joined
            for r in rows:
                joined[r.join_method] += 1  # a JoinMethod finds its value's key
            cols = deltas.columns()
            shared: dict = {}  # both aggregates take mostly the same columns: each one's sketch buckets worked out once
            self.aggregator.add_rows(rows, cols, shared)
            self.hist.add_rows(rows, cols, shared)
            self.kept.extend(rows)
            for fn in self.listeners:
                fn(rows)
        return rows

    def tick(self, now: float) -> list[Row]:
        for frag in self.assembler.poll(now):
            self.joiner.add(frag, now)
        return self._rows(self.joiner.poll(now))

    def flush(self, now: float = 0.0) -> list[Row]:
        for frag in self.assembler.flush(now):
            self.joiner.add(frag, now)
        return self._rows(self.joiner.flush())

    def snapshot(self) -> dict[str, Any]:
        a, j = self.assembler.stats, self.joiner.stats
        return {
            "spans_received": a.spans_received, "traces_opened": a.traces_opened, "traces_closed": a.traces_closed,
            "traces_evicted": a.traces_evicted, "late_spans": a.late_spans, "open_traces": self.assembler.open_traces,
            "pending_groups": self.joiner.pending, "joined": dict(self.joined), "ambiguous": j.ambiguous,
            "outcomes": dict(self.aggregator.outcomes), "rows": self.aggregator.rows, "decode_errors": dict(self.decode_errors),
            "forward_dropped": self.forward_dropped, "handed_off": self.handed_off,
        }
