"""Joining trace fragments into requests (DESIGN section 3).

A request normally arrives as one closed trace (one trace id). A component that drops
``traceparent`` splits it: the taps behind it start a new trace. Fragments are joined, in order:

1. **correlation header**: fragments carrying the same ``deltatap.request_id`` are one request
   (joined as soon as the second one arrives);
2. **body fingerprint**: when a group is due (``hold_s`` after its last fragment; a group that does not
   cover the whole chain, from the client or first link to the last link, waits ``incomplete_hold_s``,
   by default the join window, for its partner to close), it is matched with
   a pending group that carries the same ``deltatap.body.fingerprint``, started within ``window_s``,
   and covers the complementary links (one's tapped links all outside the other's). The match is
   made only when the two groups are each other's only candidates (transitively: the candidate
   graph around them holds exactly these two); otherwise every group involved is emitted
   ``unjoined`` with a note naming how many fragments competed, and counted in ``ambiguous``:
   never guessed.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any

from deltatap.collector.assembly import Fragment
from deltatap.collector.compact import CompactSpan
from deltatap.collector.decompose import Decomposer
from deltatap.collector.rows import JoinMethod
from deltatap.core.topology import Topology


@dataclass
class JoinStats:
    groups_emitted: int = 0
    joined_trace_id: int = 0
    joined_correlation: int = 0
    joined_fingerprint: int = 0
    ambiguous: int = 0


@dataclass(slots=True)
class Group:
    """One request: the fragments joined so far."""

    gid: int
    fragments: list[Fragment] = field(default_factory=list)
    rids: set[str] = field(default_factory=set)
    fps: set[str] = field(default_factory=set)
    lo: int = 10**9  # outermost tapped link index covered (-1: the client)
    hi: int = -10**9  # innermost
    start_ns: int | None = None
    method: JoinMethod = JoinMethod.TRACE_ID
    note: str = ""
    due: float = 0.0

    @property
    def spans(self) -> list:
        fr = self.fragments
        return list(fr[0].spans) if len(fr) == 1 else [s for f in fr for s in f.spans]

    @property
    def trace_ids(self) -> list[str]:
        return [f.trace_id for f in self.fragments]


class Joiner:
    def __init__(self, topo: Topology, window_s: float = 5.0, hold_s: float = 1.0, incomplete_hold_s: float | None = None,
                 decomposer: Decomposer | None = None) -> None:
        if window_s < 0 or hold_s < 0:
            raise ValueError("window_s and hold_s must be >= 0")
        self.incomplete_hold_s = max(hold_s, window_s if incomplete_hold_s is None else incomplete_hold_s)
        self.topo = topo
        self.window_ns = int(window_s * 1e9)
        self.hold_s = hold_s
        self.stats = JoinStats()
        self._link_index = {x.name: i for i, x in enumerate(topo.links)}
        self._last_link = len(topo.links) - 1
        self._groups: dict[int, Group] = {}
        self._by_rid: dict[str, int] = {}
        self._by_fp: dict[str, set[int]] = {}
        self._heap: list[tuple[float, int]] = []
        self._next = 0
        self._decomposer = decomposer or Decomposer(topo)
        self._by_layout: dict = {}  # compact span layout -> (link index, reader of start, request id, fingerprint) or False

    def _facts(self, span) -> tuple:
        """(link index, start, request id, body fingerprint) of a span (:meth:`Decomposer.join_facts`)."""
        return self._facts_of((span,))[0]

    def _facts_of(self, spans) -> list[tuple]:
        """:meth:`_facts` of each span; a compact span whose layout says where they are is read alone
        (:meth:`~deltatap.collector.compact.Layout.start_and`)."""
        out = []
        append, by_layout = out.append, self._by_layout
        for span in spans:
            if span.__class__ is CompactSpan:
                read = by_layout.get(span.layout)
                if read is None:
                    read = self._layout_facts(span)
                if read:
                    append(read(span))
                    continue
            append(self._decomposer.join_facts(span))
        return out

    def _layout_facts(self, span: CompactSpan) -> Any:
        dec, lay = self._decomposer, span.layout
        prog, _ = dec.program(span)
        read = lay.start_and(dec.link_of(prog), prog.p_rid, prog.p_fp) if dec.layout_reader(lay) is prog else None
        if len(self._by_layout) >= 4096:
            self._by_layout.clear()
        got = self._by_layout[lay] = False if read is None else read
        return got

    @property
    def pending(self) -> int:
        return len(self._groups)

    # ---- building groups -------------------------------------------------------------------
    def _absorb(self, g: Group, f: Fragment) -> None:
        g.fragments.append(f)
        rids, fps = g.rids, g.fps
        lo, hi, start_ns = g.lo, g.hi, g.start_ns
        for idx, st, rid, fp in self._facts_of(f.spans):
            if rid:
                rids.add(str(rid))
            if fp:
                fps.add(str(fp))
            if idx is not None:
                if idx < lo:
                    lo = idx
                if idx > hi:
                    hi = idx
            if st and (start_ns is None or st < start_ns):
                start_ns = st
        g.lo, g.hi, g.start_ns = lo, hi, start_ns

    def _covers_all(self, g: Group) -> bool:
        """True when ``g`` holds the client and the innermost link: no fragment can be complementary to
        it (see _complementary), so it is never a fingerprint candidate nor has one."""
        return g.lo <= -1 and g.hi >= self._last_link

    def complete(self, g: Group) -> bool:
        """``g`` covers the first (or the client) through the last tapped link: a whole request, short hold."""
        return g.lo <= 0 and g.hi >= self._last_link

    def _index(self, g: Group) -> None:
        for r in g.rids:
            self._by_rid[r] = g.gid
        if not self._covers_all(g):  # only a fragment that lacks links can pair by fingerprint
            for fp in g.fps:
                self._by_fp.setdefault(fp, set()).add(g.gid)

    def _unindex(self, g: Group) -> None:
        for r in g.rids:
            if self._by_rid.get(r) == g.gid:
                del self._by_rid[r]
        for fp in g.fps:
            s = self._by_fp.get(fp)
            if s is not None:
                s.discard(g.gid)
                if not s:
                    del self._by_fp[fp]

    def _merge(self, into: Group, other: Group) -> None:
        self._unindex(other)
        del self._groups[other.gid]
        for f in other.fragments:
            self._absorb(into, f)
        self._index(into)

    def add(self, frag: Fragment, now: float) -> None:
        g = Group(self._next)
        self._next += 1
        self._absorb(g, frag)
        by_rid = self._by_rid
        hits = [by_rid[r] for r in g.rids if r in by_rid]
        for gid in sorted(set(hits)) if hits else ():
            other = self._groups[gid]
            self._unindex(other)
            del self._groups[gid]
            for f in other.fragments:
                self._absorb(g, f)
            g.method = JoinMethod.CORRELATION
            if other.method == JoinMethod.FINGERPRINT:
                g.method = JoinMethod.FINGERPRINT
        self._groups[g.gid] = g
        self._index(g)
        complete = self.complete(g)
        g.due = now + (self.hold_s if complete else self.incomplete_hold_s)
        heapq.heappush(self._heap, (g.due, g.gid))

    # ---- fingerprint fallback --------------------------------------------------------------
    def _complementary(self, a: Group, b: Group) -> bool:
        if a.lo > a.hi or b.lo > b.hi:
            return False
        return a.hi < b.lo or b.hi < a.lo

    def _candidates(self, g: Group) -> list[Group]:
        out: dict[int, Group] = {}
        for fp in g.fps:
            for gid in self._by_fp.get(fp, ()):
                if gid == g.gid or gid in out:
                    continue
                h = self._groups[gid]
                if not self._complementary(g, h):
                    continue
                if g.start_ns is not None and h.start_ns is not None and abs(g.start_ns - h.start_ns) > self.window_ns:
                    continue
                if g.rids and h.rids and g.rids & h.rids:
                    continue
                out[gid] = h
        return list(out.values())

    def _component(self, g: Group) -> list[Group]:
        """Every pending group linked to ``g`` by fingerprint candidacy (transitively)."""
        seen = {g.gid: g}
        todo = [g]
        while todo:
            for h in self._candidates(todo.pop()):
                if h.gid not in seen:
                    seen[h.gid] = h
                    todo.append(h)
        return list(seen.values())

    def _emit(self, g: Group) -> Group:
        self._unindex(g)
        del self._groups[g.gid]
        st = self.stats
        st.groups_emitted += 1
        if g.method == JoinMethod.TRACE_ID:
            st.joined_trace_id += 1
        elif g.method == JoinMethod.CORRELATION:
            st.joined_correlation += 1
        elif g.method == JoinMethod.FINGERPRINT:
            st.joined_fingerprint += 1
        return g

    def _finish(self, g: Group) -> list[Group]:
        if self._covers_all(g):  # the usual request: nothing to pair it with
            return [self._emit(g)]
        comp = self._component(g)
        if len(comp) == 2:
            h = comp[1] if comp[0] is g else comp[0]
            self._merge(g, h)
            g.method = JoinMethod.FINGERPRINT
        elif len(comp) > 2:
            # several fragments could pair up: report every one of them, guess none
            for x in comp:
                x.method, x.note = JoinMethod.UNJOINED, f"ambiguous: {len(comp)} fragments share the body fingerprint within the window"
            self.stats.ambiguous += len(comp)
            return [self._emit(x) for x in comp]
        return [self._emit(g)]

    def poll(self, now: float) -> list[Group]:
        out: list[Group] = []
        while self._heap and self._heap[0][0] <= now:
            _, gid = heapq.heappop(self._heap)
            g = self._groups.get(gid)
            if g is None or g.due > now:
                continue
            out.extend(self._finish(g))
        return out

    def flush(self) -> list[Group]:
        """Emit every pending group (offline input, shutdown), oldest request first."""
        order = sorted(self._groups.values(), key=lambda g: (g.start_ns or 0, g.gid))
        out: list[Group] = []
        for g in order:
            if g.gid in self._groups:
                out.extend(self._finish(g))
        self._heap.clear()
        return out
