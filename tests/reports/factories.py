"""Tiny decomposition-row factories for report tests: every number is set by hand."""

from __future__ import annotations

from deltatap.collector.rows import Cascade, DeltaValue, PointObs, Row

MS = 1_000_000
S = 1_000_000_000
T0 = 1_700_000_000 * S  # a fixed Unix time for t0


def row(i: int = 0, *, deltas_ms: dict[str, float] | None = None, points_ns: dict[str, int] | None = None, **kw) -> Row:
    r = Row(trace_id=f"{i:032x}", request_id=f"req-{i}", start_unix_ns=T0, **kw)
    for name, ms in (deltas_ms or {}).items():
        r.deltas[name] = DeltaValue(int(round(ms * MS)))
    for name, ns in (points_ns or {}).items():
        r.points[name] = PointObs(ns)
    return r


def cascade(gave_up: dict[str, int], engine_end: int, after_ns: int | None = None, tokens: int | None = None, attempts: dict[str, int] | None = None) -> Cascade:
    return Cascade(gave_up_unix_ns=gave_up, engine_end_unix_ns=engine_end, engine_busy_after_gave_up_ns=after_ns, tokens_after_gave_up=tokens, attempts=attempts or {})
