"""Decomposition rows: one row per request, the collector's output and every report's input.

This docstring is the specification of the row; ``deltatap.collector.reports`` and anything reading the
collector's rows files build on it.

A row
-----
:class:`Row` holds, for one request (all the spans of all the observers that saw it, joined):

* identity: ``trace_id`` (hex; the root fragment's when fragments were joined), ``request_id`` (the
  correlation header value, ``x-request-id`` by default), ``join_method`` (:class:`JoinMethod`:
  how the fragments were joined: one trace id, the correlation header, the body fingerprint within a
  time window, or ``unjoined`` for a fragment that could not be joined, see ``join_note``),
  ``start_unix_ns`` (earliest observed point or span start);
* result: ``outcome`` (:class:`deltatap.vocab.Outcome` value), ``http_status`` (the status the
  outermost observer saw), ``firewall_decision`` (``deltatap.firewall.decision``), ``labels``
  (``deltatap.label.*`` attributes without the prefix, plus ``run_id``), ``tokens_in`` /
  ``tokens_out`` with ``tokens_source`` (:class:`TokenSource`: ``usage`` when the stream reported
  usage, ``tokenizer`` when counted by a tokenizer, None when unknown);
* ``points``: generic point name (``<component>.<role>``, :func:`deltatap.vocab.point`) ->
  :class:`PointObs` (Unix ns on the *collector's* clock, i.e. already shifted by the observer's
  clock offset, the observer's clock uncertainty, which observer saw it and from what source). For
  the default topology the draft's names t0..t12 are :data:`deltatap.vocab.DEFAULT_POINT_ALIASES`
  (``Row.t("t7")``). A point nobody observed is absent: never interpolated;
* ``deltas``: delta name -> :class:`DeltaValue` (ns, error bound ns, within-observer flag). Names come
  from :func:`delta_defs` for the topology (see below). A delta whose points are missing is absent;
* ``gaps``: link -> :class:`LinkGaps`, the inter-content-event gap statistics a tap saw on its
  upstream side (what the upstream component released) and its downstream side (what it forwarded);
* ``cascade``: :class:`Cascade`, timeout/cascade facts: when each layer gave up, when the engine
  stopped, how long and how many tokens it kept generating after the first layer gave up, attempts
  per link.

Delta names
-----------
Every delta is defined once, in the registry :mod:`deltatap.collector.deltas` (name, label, the draft's alias
such as ``t5 - t3``, points, component, phase, Prometheus metric); :func:`delta_defs` gives a topology's, and
``docs/reference.md`` ("Deltas") lists the default topology's. For intermediaries I1 .. Ik (gateway, firewall
in the default stack) they are each one's inbound, inbound block and outbound (first and last token) time and
the inter-chunk gap it adds, the engine's queue, prefill, TTFT, decode and time to last token, the client's
system TTFT / time to last token and the output path overhead, each tapped link's own overhead, and the
residual: ``system_ttft`` minus every TTFT term (inbound, engine TTFT, outbound, tap overheads).

The residual is network time plus interaction effects (profiles section 6 "validation"); it is
present only when every term is. Error bounds: a delta between two points seen by one observer
(one clock) has bound 0; otherwise the bound is the sum of both points' clock uncertainties.
Where both exist, within-observer deltas are preferred (DESIGN section 4). A point an observer could
only bound (its span's ``deltatap.stamp.bounds``: a read whose bytes may have waited in the socket, a
write whose bytes may have left later) adds its interval to every delta it takes part in
(:func:`deltatap.core.vocab.delta_bound`); the row keeps those intervals (``point_bounds``) and that part of
each delta's bound (``delta_bounds``).

Flat records
------------
:func:`to_record` / :func:`from_record` convert a row to a flat mapping of scalars with a stable
column set for a topology (:func:`record_columns`), used for Parquet, CSV and JSON lines:
identity and result columns, ``labels`` (JSON object text), ``stamp_bounds`` (JSON object text
``{"points": {point: [before_ns, after_ns]}, "deltas": {delta: ns}}``, empty when every point is exact; null for a side
or a bound that is unknown: a write whose departure nothing observed, :data:`deltatap.core.vocab.BOUND_UNKNOWN` in the
row; that delta's ``err_ns`` then holds only its clock part), then per point ``pt.<point>.unix_ns``,
``pt.<point>.unc_ns``, ``pt.<point>.src`` (``observer/source``), per delta ``d.<delta>.ns``,
``d.<delta>.err_ns``, ``d.<delta>.within`` (bool), per link gap columns
``gap.<link>.{up,down}.{count,mean_ns,p99_ns,max_ns}``, and ``cascade.*``. Missing values are
empty (None / null / empty CSV cell). Integers stay integers (ns), never floats.

Rows files are written and read back by :mod:`deltatap.collector.sinks` (``write_rows`` / ``read_rows``: Parquet,
CSV, JSON lines, chosen by suffix).

Computation over many rows is numpy: :func:`delta_ns` returns one delta as an int64 array with a
validity mask, :func:`delta_columns` (:class:`DeltaColumns`) every delta's values and error bounds at once.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from operator import itemgetter
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NamedTuple

import numpy as np

from deltatap.core import native
from deltatap.core.topology import Topology, default_topology
from deltatap.collector.deltas import DeltaDef, delta_defs, intermediaries  # noqa: F401 - re-exported: the rows' readers import them here
from deltatap.core.vocab import BOUND_UNKNOWN, DEFAULT_POINT_ALIASES, ComponentKind, Role, point

ROW_SCHEMA_VERSION = 1
_acc = native.load("deltatap.collector._columns", __name__)  # DeltaColumns.add_rows in one call (None: the Python below)


class JoinMethod(StrEnum):
    TRACE_ID = "trace_id"  # every fragment shared one trace id
    CORRELATION = "correlation"  # fragments joined on the correlation header (x-request-id)
    FINGERPRINT = "fingerprint"  # fragments joined on the request-body fingerprint within the window
    UNJOINED = "unjoined"  # a fragment that could not be joined (ambiguous or no partner); see join_note


class TokenSource(StrEnum):
    USAGE = "usage"
    TOKENIZER = "tokenizer"


# The small per-row records are NamedTuples: immutable, compared and printed like the frozen dataclasses
# they replace, and several times cheaper to build (a row holds ~20 points and ~25 deltas).


class PointObs(NamedTuple):
    """One observed point, on the collector's clock."""

    unix_ns: int
    uncertainty_ns: int = 0  # the observer's clock uncertainty (0: shares the collector's clock)
    observer: str = ""  # clock domain: "tap:edge", "client:loadgen", "component:engine", ...
    source: str = ""  # "tap", "client", "component", "vllm", "llamacpp", "litellm", "aiperf"


class DeltaValue(NamedTuple):
    ns: int
    error_bound_ns: int = 0
    within_observer: bool = True


class GapStats(NamedTuple):
    """Inter-content-event gaps on one side of a tap."""

    count: int
    mean_ns: int | None = None
    p99_ns: int | None = None
    max_ns: int | None = None


class LinkGaps(NamedTuple):
    up: GapStats | None = None  # as released by the link's upstream component (tap received)
    down: GapStats | None = None  # as forwarded to the link's downstream component


@dataclass(slots=True)
class Cascade:
    """Timeout-cascade facts of one request (profiles section 6, interaction effects)."""

    gave_up_unix_ns: dict[str, int] = field(default_factory=dict)  # component -> when it abandoned the request
    engine_end_unix_ns: int | None = None  # last token / end of the engine's stream
    engine_busy_after_gave_up_ns: int | None = None  # engine_end - first give-up, when someone gave up
    tokens_after_gave_up: int | None = None  # engine tokens out - tokens delivered to the client
    attempts: dict[str, int] = field(default_factory=dict)  # link -> tap spans seen (>1: retries)

    @property
    def first_gave_up(self) -> tuple[str, int] | None:
        if not self.gave_up_unix_ns:
            return None
        comp = min(self.gave_up_unix_ns, key=lambda c: self.gave_up_unix_ns[c])
        return comp, self.gave_up_unix_ns[comp]


@dataclass(slots=True)
class Row:
    trace_id: str
    request_id: str | None = None
    join_method: JoinMethod = JoinMethod.TRACE_ID
    join_note: str = ""
    start_unix_ns: int | None = None
    outcome: str = "ok"
    http_status: int | None = None
    firewall_decision: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    tokens_in: int | None = None
    tokens_out: int | None = None
    tokens_source: TokenSource | None = None
    points: dict[str, PointObs] = field(default_factory=dict)
    deltas: dict[str, DeltaValue] = field(default_factory=dict)
    gaps: dict[str, LinkGaps] = field(default_factory=dict)
    cascade: Cascade = field(default_factory=Cascade)
    trace_ids: tuple[str, ...] = ()  # every joined fragment's trace id
    # points that are intervals, not exact: point -> (before_ns, after_ns), the truth in [t - before, t + after]
    # (deltatap.core.vocab.format_stamp_bounds); and the part of each delta's error bound they make
    point_bounds: dict[str, tuple[int, int]] = field(default_factory=dict)
    delta_bounds: dict[str, int] = field(default_factory=dict)

    def t(self, alias: str) -> PointObs | None:
        """A point by its draft alias (default topology): ``row.t("t7")``."""
        return self.points.get(DEFAULT_POINT_ALIASES[alias])

    def delta_ms(self, name: str) -> float | None:
        d = self.deltas.get(name)
        return None if d is None else d.ns / 1e6


# --------------------------------------------------------------------------------------------
# Delta definitions for a topology: the registry in collector/deltas.py (re-exported here)
# --------------------------------------------------------------------------------------------


def point_names(topology: Topology | None = None) -> list[str]:
    """Every generic point of ``topology`` in path order (client, each intermediary, engine)."""
    topo = topology or default_topology()
    names: list[str] = []
    for c in topo.components:
        if c.kind == ComponentKind.CLIENT:
            roles = [Role.SEND, Role.FIRST_TOKEN_RECEIVED, Role.LAST_TOKEN_RECEIVED, Role.END]
        elif c.kind == ComponentKind.ENGINE:
            roles = [Role.QUEUE, Role.EXEC_START, Role.FIRST_TOKEN, Role.LAST_TOKEN]
        else:
            roles = [Role.IN_ARRIVE, Role.IN_DECISION, Role.IN_EXIT, Role.OUT_FIRST_IN, Role.OUT_FIRST_OUT, Role.OUT_LAST_IN, Role.OUT_LAST_OUT]
        names += [point(c.name, r) for r in roles]
    return names


# --------------------------------------------------------------------------------------------
# Flat records
# --------------------------------------------------------------------------------------------

_BASE_COLUMNS = (
    "schema_version", "trace_id", "request_id", "join_method", "join_note", "start_unix_ns", "outcome",
    "http_status", "firewall_decision", "labels", "tokens_in", "tokens_out", "tokens_source", "trace_ids", "stamp_bounds",
)
_CASCADE_COLUMNS = (
    "cascade.gave_up", "cascade.engine_end_unix_ns", "cascade.engine_busy_after_gave_up_ns",
    "cascade.tokens_after_gave_up", "cascade.attempts",
)
_GAP_FIELDS = ("count", "mean_ns", "p99_ns", "max_ns")


def record_columns(topology: Topology | None = None) -> list[str]:
    """The stable, ordered column set of flat records for ``topology``."""
    topo = topology or default_topology()
    cols = list(_BASE_COLUMNS)
    for p in point_names(topo):
        cols += [f"pt.{p}.unix_ns", f"pt.{p}.unc_ns", f"pt.{p}.src"]
    for d in delta_defs(topo):
        cols += [f"d.{d.name}.ns", f"d.{d.name}.err_ns", f"d.{d.name}.within"]
    for link in topo.links:
        for side in ("up", "down"):
            cols += [f"gap.{link.name}.{side}.{f}" for f in _GAP_FIELDS]
    cols += list(_CASCADE_COLUMNS)
    return cols


def _bound_out(ns: int) -> int | None:
    return None if ns < 0 else ns  # (BOUND_UNKNOWN: JSON null, never a number that reads as a bound)


def _bound_in(v: Any) -> int:
    return BOUND_UNKNOWN if v is None else int(v)


def _bounds_json(row: Row) -> str:
    """The ``stamp_bounds`` column: ``{"points": {point: [before_ns, after_ns]}, "deltas": {delta: ns}}``, an unknown
    side or bound (:data:`deltatap.core.vocab.BOUND_UNKNOWN`) as null."""
    return json.dumps({"points": {k: [_bound_out(b), _bound_out(a)] for k, (b, a) in row.point_bounds.items()},
                       "deltas": {k: _bound_out(b) for k, b in row.delta_bounds.items()}}, sort_keys=True)


def to_record(row: Row, topology: Topology | None = None) -> dict[str, Any]:
    """``row`` as a flat mapping with exactly :func:`record_columns` keys (missing -> None).

    Points, deltas or links outside the topology's column set are kept too (appended), so a
    row is never silently truncated."""
    rec: dict[str, Any] = dict.fromkeys(record_columns(topology))
    rec.update(
        schema_version=ROW_SCHEMA_VERSION, trace_id=row.trace_id, request_id=row.request_id,
        join_method=str(row.join_method), join_note=row.join_note, start_unix_ns=row.start_unix_ns,
        outcome=str(row.outcome), http_status=row.http_status, firewall_decision=row.firewall_decision,
        labels=json.dumps(row.labels, sort_keys=True), tokens_in=row.tokens_in, tokens_out=row.tokens_out,
        tokens_source=None if row.tokens_source is None else str(row.tokens_source),
        trace_ids=",".join(row.trace_ids),
        stamp_bounds=_bounds_json(row) if row.point_bounds or row.delta_bounds else None,
    )
    for name, p in row.points.items():
        rec[f"pt.{name}.unix_ns"] = p.unix_ns
        rec[f"pt.{name}.unc_ns"] = p.uncertainty_ns
        rec[f"pt.{name}.src"] = f"{p.observer}/{p.source}"
    for name, d in row.deltas.items():
        rec[f"d.{name}.ns"] = d.ns
        rec[f"d.{name}.err_ns"] = d.error_bound_ns
        rec[f"d.{name}.within"] = d.within_observer
    for link, g in row.gaps.items():
        for side, stats in (("up", g.up), ("down", g.down)):
            if stats is not None:
                for f in _GAP_FIELDS:
                    rec[f"gap.{link}.{side}.{f}"] = getattr(stats, f)
    c = row.cascade
    rec["cascade.gave_up"] = json.dumps(c.gave_up_unix_ns, sort_keys=True)
    rec["cascade.engine_end_unix_ns"] = c.engine_end_unix_ns
    rec["cascade.engine_busy_after_gave_up_ns"] = c.engine_busy_after_gave_up_ns
    rec["cascade.tokens_after_gave_up"] = c.tokens_after_gave_up
    rec["cascade.attempts"] = json.dumps(c.attempts, sort_keys=True)
    return rec


def _int(v: Any) -> int | None:
    if v is None or v == "" or (isinstance(v, float) and v != v):
        return None
    return int(v)


def _bool(v: Any) -> bool:
    return v in (True, 1, "True", "true", "1")


def from_record(rec: Mapping[str, Any]) -> Row:
    """Inverse of :func:`to_record` (accepts CSV strings, JSON values or Parquet values)."""
    ts = rec.get("tokens_source") or None
    row = Row(
        trace_id=str(rec["trace_id"]),
        request_id=rec.get("request_id") or None,
        join_method=JoinMethod(rec.get("join_method") or "trace_id"),
        join_note=rec.get("join_note") or "",
        start_unix_ns=_int(rec.get("start_unix_ns")),
        outcome=str(rec.get("outcome") or "ok"),
        http_status=_int(rec.get("http_status")),
        firewall_decision=rec.get("firewall_decision") or None,
        labels=json.loads(rec.get("labels") or "{}"),
        tokens_in=_int(rec.get("tokens_in")),
        tokens_out=_int(rec.get("tokens_out")),
        tokens_source=TokenSource(ts) if ts else None,
        trace_ids=tuple(x for x in str(rec.get("trace_ids") or "").split(",") if x),
    )
    sb = rec.get("stamp_bounds")
    if sb:
        doc = json.loads(sb)
        row.point_bounds = {k: (_bound_in(v[0]), _bound_in(v[1])) for k, v in doc.get("points", {}).items()}
        row.delta_bounds = {k: _bound_in(v) for k, v in doc.get("deltas", {}).items()}
    gaps: dict[str, dict[str, dict[str, Any]]] = {}
    for key, v in rec.items():
        if v is None or v == "" or (isinstance(v, float) and v != v):
            continue
        if key.startswith("pt.") and key.endswith(".unix_ns"):
            name = key[3:-8]
            obs, _, src = str(rec.get(f"pt.{name}.src") or "/").partition("/")
            row.points[name] = PointObs(int(v), _int(rec.get(f"pt.{name}.unc_ns")) or 0, obs, src)
        elif key.startswith("d.") and key.endswith(".ns") and not key.endswith(".err_ns"):
            name = key[2:-3]
            row.deltas[name] = DeltaValue(int(v), _int(rec.get(f"d.{name}.err_ns")) or 0, _bool(rec.get(f"d.{name}.within", True)))
        elif key.startswith("gap."):
            _, link, side, f = key.split(".", 3) if key.count(".") == 3 else (None, None, None, None)
            if link is not None:
                gaps.setdefault(link, {}).setdefault(side, {})[f] = int(v)
    for link, sides in gaps.items():
        row.gaps[link] = LinkGaps(*(GapStats(**sides[s]) if s in sides and "count" in sides[s] else None for s in ("up", "down")))
    row.cascade = Cascade(
        gave_up_unix_ns={k: int(v) for k, v in json.loads(rec.get("cascade.gave_up") or "{}").items()},
        engine_end_unix_ns=_int(rec.get("cascade.engine_end_unix_ns")),
        engine_busy_after_gave_up_ns=_int(rec.get("cascade.engine_busy_after_gave_up_ns")),
        tokens_after_gave_up=_int(rec.get("cascade.tokens_after_gave_up")),
        attempts={k: int(v) for k, v in json.loads(rec.get("cascade.attempts") or "{}").items()},
    )
    return row


# --------------------------------------------------------------------------------------------
# numpy views
# --------------------------------------------------------------------------------------------


def delta_ns(rows: Sequence[Row], name: str) -> tuple[np.ndarray, np.ndarray]:
    """(values int64 ns, valid bool) of delta ``name`` over ``rows``; invalid entries are 0."""
    vals = np.zeros(len(rows), dtype=np.int64)
    valid = np.zeros(len(rows), dtype=bool)
    for i, r in enumerate(rows):
        d = r.deltas.get(name)
        if d is not None:
            vals[i] = d.ns
            valid[i] = True
    return vals, valid


class DeltaColumns:
    """Every delta's values and error bounds over rows added one at a time (while each row is fresh in
    memory), for the aggregates of a batch: :meth:`columns` -> delta -> (values, error bounds) in ns, in
    row order, deltas in first-seen order; int64 arrays, or tuples of ints when a value does not fit in
    int64 (the aggregates then raise as numpy does). Consecutive rows with the same deltas (the usual
    case) are held as one block."""

    __slots__ = ("_blocks", "_keys", "_ns", "_err")

    def __init__(self) -> None:
        self._blocks: list[tuple[tuple[str, ...], list[int], list[int]]] = []
        self._keys: tuple[str, ...] | None = None
        self._ns: list[int] = []
        self._err: list[int] = []

    def add(self, row: Row) -> None:
        d = row.deltas
        self.add_values(tuple(d), d.values())

    def add_rows(self, rows: list[Row]) -> None:
        """:meth:`add` for each row in order (``collector/_columns.c`` takes the batch in one call)."""
        i, n = 0, len(rows)
        while i < n:
            if _acc is not None:
                try:
                    i = _acc.add_rows(self._blocks, rows, i)
                finally:
                    if self._blocks:
                        self._keys, self._ns, self._err = self._blocks[-1]
            if i < n:  # a row the accelerator does not take (or none): the Python way
                self.add(rows[i])
                i += 1

    def add_values(self, keys: tuple[str, ...], vals: Iterable[DeltaValue]) -> None:
        """One row's deltas given as their names and values, in the same order."""
        if keys != self._keys:
            self._keys, self._ns, self._err = keys, [], []
            self._blocks.append((keys, self._ns, self._err))
        self._ns.extend(map(_NS, vals))
        self._err.extend(map(_ERR, vals))

    def columns(self) -> dict[str, tuple[np.ndarray, np.ndarray] | tuple[tuple[int, ...], tuple[int, ...]]]:
        try:
            return self._columns(lambda v, k: np.array(v, dtype=np.int64).reshape(-1, k).T)
        except OverflowError:
            return self._columns(lambda v, k: [tuple(v[j::k]) for j in range(k)])

    def _columns(self, split: Callable[[list[int], int], Any]) -> dict[str, Any]:
        pieces: dict[str, list[tuple[Any, Any]]] = {}
        for keys, ns, err in self._blocks:
            k = len(keys)
            if not k:
                continue
            for name, v, e in zip(keys, split(ns, k), split(err, k), strict=True):
                c = pieces.get(name)
                if c is None:
                    pieces[name] = [(v, e)]
                else:
                    c.append((v, e))
        out: dict[str, Any] = {}
        for name, ps in pieces.items():
            if len(ps) == 1:
                out[name] = ps[0]
            elif isinstance(ps[0][0], tuple):
                out[name] = (sum((v for v, _ in ps), ()), sum((e for _, e in ps), ()))
            else:
                out[name] = (np.concatenate([v for v, _ in ps]), np.concatenate([e for _, e in ps]))
        return out


_NS, _ERR = itemgetter(0), itemgetter(1)


def delta_columns(rows: Iterable[Row]) -> dict[str, tuple[np.ndarray, np.ndarray] | tuple[tuple[int, ...], tuple[int, ...]]]:
    """:meth:`DeltaColumns.columns` of ``rows``."""
    cols = DeltaColumns()
    cols.add_rows(rows if isinstance(rows, list) else list(rows))
    return cols.columns()
