"""Which requests a delta describes: one rule the reports, the plots and ``/metrics`` all read.

A row carries every delta whose two points were observed, but some of those values describe no
real latency, and a table or curve that keeps them shows impossible numbers:

* a *last-token* delta (``phase == "last"``: ``*_outbound_last``, ``engine_decode``, ``system_ttlt``
  ...) of a stream that did not complete: a stream cut by a timeout has a "last" token in front of
  the cut and another behind it, and their difference can be −150 ms;
* a *block* delta (``<fw>_inbound_block``, t4 - t3) of a request that was not blocked: the firewall
  stamps its decision point for every request, and the block latency is the time to refuse;
* a *first-token* delta or TTFT view of a refused (blocked) request: a 403 is answered without a
  first token, so its "TTFT" at the gateway is the refusal time and makes the gateway look faster
  than the engine.

:func:`applicable_deltas` is that rule for one row; :func:`exclusions` counts, per reason, the
requests a view leaves out, so every table can say what it left out next to itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from deltatap.collector.deltas import ITL, LAST, SIGNED_PHASES, SYSTEM_TTFT, TAP, DeltaDef  # noqa: F401 - SIGNED_PHASES re-exported
from deltatap.collector.rows import Row

REASONS = {
    "refused": "refused or blocked (no first token)",
    "cut": "stream cut before its end (timeout, error or cancel)",
    "not_blocked": "not blocked (block latency is the time to refuse)",
}


def is_refused(row: Row) -> bool:
    return row.outcome == "refused" or (row.firewall_decision or "").startswith("block")


def is_complete(row: Row) -> bool:
    return row.outcome == "ok"


def exclusion_reason(row: Row, d: DeltaDef) -> str | None:
    """Why delta ``d`` of ``row`` is not a latency of that request, or None when it is."""
    return _reason(d, is_refused(row), is_complete(row))


def _reason(d: DeltaDef, refused: bool, complete: bool) -> str | None:
    """:func:`exclusion_reason` for a row that is (not) refused and (not) complete: nothing else of the row counts."""
    if d.refused_only:
        return None if refused else "not_blocked"
    if refused:
        return "refused"
    if d.phase in (LAST, ITL) and not complete:
        return "cut"
    return None


def is_signed(d: DeltaDef) -> bool:
    return d.signed


def applicable_deltas(row: Row, defs: Sequence[DeltaDef]) -> dict:
    """``row.deltas`` without the values :func:`exclusion_reason` rules out (tap overheads always kept)."""
    by_name = {d.name: d for d in defs}
    out = {}
    for k, v in row.deltas.items():
        d = by_name.get(k)
        if d is None or d.phase == TAP or exclusion_reason(row, d) is None:
            out[k] = v
    return out


def applicable_keys(keys: Sequence[str], refused: bool, complete: bool, by_name: dict[str, DeltaDef]) -> tuple[int, ...]:
    """Positions of the deltas :func:`applicable_deltas` keeps among ``keys`` (a row's delta names, in order) of a
    row that is (not) refused and (not) complete: the same for every such row, so a batch works it out once."""
    out = []
    for i, k in enumerate(keys):
        d = by_name.get(k)
        if d is None or d.phase == TAP or _reason(d, refused, complete) is None:
            out.append(i)
    return tuple(out)


def applicable_rows(rows: Iterable[Row], defs: Sequence[DeltaDef]) -> list[Row]:
    """Copies of ``rows`` holding only their applicable deltas (the rows themselves are left alone)."""
    return [replace(r, deltas=applicable_deltas(r, defs)) for r in rows]


@dataclass(frozen=True)
class Excluded:
    refused: int = 0
    cut: int = 0
    other: int = 0  # no first token for another reason (error before the first token)

    @property
    def total(self) -> int:
        return self.refused + self.cut + self.other

    def sentence(self, what: str) -> str:
        parts = [f"{n} {label}" for n, label in ((self.refused, "refused or blocked"), (self.cut, "cut by a timeout or error"), (self.other, "without a first token")) if n]
        return f"{what}: none excluded." if not parts else f"{what}: excluded {', '.join(parts)}."


def ttft_view(rows: Sequence[Row]) -> tuple[list[bool], Excluded]:
    """Mask of the requests a TTFT view keeps (a first token reached the client, not refused) and what it left out."""
    keep, refused, other = [], 0, 0
    for r in rows:
        if is_refused(r):
            refused += 1
            keep.append(False)
        elif SYSTEM_TTFT not in r.deltas:
            other += 1
            keep.append(False)
        else:
            keep.append(True)
    return keep, Excluded(refused=refused, other=other)


def completed_view(rows: Sequence[Row]) -> tuple[list[bool], Excluded]:
    """Mask of completed streams (last-token views) and what it left out."""
    keep = [is_complete(r) for r in rows]
    refused = sum(1 for r, k in zip(rows, keep, strict=True) if not k and is_refused(r))
    cut = sum(1 for r, k in zip(rows, keep, strict=True) if not k and not is_refused(r))
    return keep, Excluded(refused=refused, cut=cut)
