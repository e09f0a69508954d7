"""Observed timeout cascades (profiles draft §6, interaction effects).

A cascade is a request where an outer layer gave up (the client, or a gateway/firewall timeout
answering 504) while an inner one kept going. From each row's :class:`collector.rows.Cascade`
and its points this reports, per request and in total: when the client got its error, how long
the engine worked for a result nobody received (the draft's "engine wastes 12 s of compute"), how
much of that came after the first layer gave up, tokens generated for nobody, and retries that
multiplied engine work.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from deltatap.collector.reports.model import Column, Section, Table
from deltatap.collector.reports.registry import ReportInputs, register_section
from deltatap.collector.reports.timeouts import declared_timeouts_section
from deltatap.collector.rows import Row
from deltatap.core.topology import Topology
from deltatap.core.vocab import Role, point


@dataclass(frozen=True)
class CascadeCase:
    request_id: str
    gave_up_by: str
    gave_up_s: float  # after the client sent the request
    client_error_s: float
    engine_start_s: float
    engine_end_s: float
    engine_busy_s: float  # engine time spent on a result nobody received
    after_gave_up_s: float  # part of it after the first layer gave up
    tokens_for_nobody: int | None
    engine_attempts: int

    def sentence(self) -> str:
        toks = f", {self.tokens_for_nobody} tokens generated for nobody" if self.tokens_for_nobody else ""
        return (
            f"client got an error at {self.client_error_s:.2f} s, engine wasted {self.engine_busy_s:.2f} s "
            f"({self.gave_up_by} gave up at {self.gave_up_s:.2f} s; the engine kept generating until "
            f"{self.engine_end_s:.2f} s, {self.after_gave_up_s:.2f} s after that{toks})"
        )


def _pt(row: Row, name: str) -> int | None:
    p = row.points.get(name)
    return None if p is None else p.unix_ns


def find_cascades(rows: Sequence[Row], topology: Topology) -> list[CascadeCase]:
    client, engine = topology.client.name, topology.engine.name
    engine_link = topology.links[-1].name if topology.links else ""
    out: list[CascadeCase] = []
    for r in rows:
        c = r.cascade
        first = c.first_gave_up
        if first is None or c.engine_end_unix_ns is None:
            continue
        who, gave_up = first
        after = c.engine_busy_after_gave_up_ns
        if after is None:
            after = c.engine_end_unix_ns - gave_up
        if after <= 0:
            continue  # the engine had stopped before anyone gave up: no cascade
        t0 = _pt(r, point(client, Role.SEND)) or r.start_unix_ns
        if t0 is None:
            continue
        client_err = c.gave_up_unix_ns.get(client) or _pt(r, point(client, Role.END)) or gave_up
        e_start = _pt(r, point(engine, Role.QUEUE)) or _pt(r, point(engine, Role.EXEC_START)) or gave_up
        out.append(
            CascadeCase(
                request_id=r.request_id or r.trace_id,
                gave_up_by=who,
                gave_up_s=(gave_up - t0) / 1e9,
                client_error_s=(client_err - t0) / 1e9,
                engine_start_s=(e_start - t0) / 1e9,
                engine_end_s=(c.engine_end_unix_ns - t0) / 1e9,
                engine_busy_s=(c.engine_end_unix_ns - e_start) / 1e9,
                after_gave_up_s=after / 1e9,
                tokens_for_nobody=c.tokens_after_gave_up,
                engine_attempts=c.attempts.get(engine_link, 1),
            )
        )
    return out


def retry_stats(rows: Sequence[Row], topology: Topology) -> tuple[int, int]:
    """(requests the engine saw more than once, extra engine attempts in total)."""
    link = topology.links[-1].name if topology.links else ""
    attempts = np.array([r.cascade.attempts.get(link, 1) for r in rows], dtype=int)
    return int((attempts > 1).sum()), int(np.clip(attempts - 1, 0, None).sum())


def cascade_section(rows: Sequence[Row], topology: Topology, max_timelines: int = 20) -> Section:
    cases = find_cascades(rows, topology)
    gave_up_any = sum(1 for r in rows if r.cascade.gave_up_unix_ns and r.outcome != "refused")
    retried, extra = retry_stats(rows, topology)
    section = Section("cascades", "Timeout cascades (observed)")
    summary = Table("cascade_summary", "Cascades: an outer layer gave up while the engine kept going", [Column("metric", "Metric"), Column("value", "Value", "", 3), Column("unit", "Unit")])
    busy = np.array([c.engine_busy_s for c in cases], dtype=float)
    after = np.array([c.after_gave_up_s for c in cases], dtype=float)
    toks = [c.tokens_for_nobody for c in cases if c.tokens_for_nobody is not None]
    summary.add("requests", len(rows), "")
    summary.add("requests where some layer gave up (refusals excluded)", gave_up_any, "")
    summary.add("cascades (engine still working after the give-up)", len(cases), "")
    summary.add("engine time for results nobody received, total", float(busy.sum()), "s")
    summary.add("engine time after the first give-up, total", float(after.sum()), "s")
    summary.add("tokens generated for nobody, total", int(sum(toks)), "tokens")
    summary.add("requests the engine saw more than once (retries)", retried, "")
    summary.add("extra engine attempts from retries", extra, "")
    section.tables.append(summary)
    by_who: dict[str, int] = {}
    for c in cases:
        by_who[c.gave_up_by] = by_who.get(c.gave_up_by, 0) + 1
    timeline = Table(
        "cascade_timelines",
        "Per-request timelines (seconds after the client sent the request)",
        [
            Column("request_id", "Request", whole=True),
            Column("gave_up_by", "Gave up first"),
            Column("gave_up_s", "Gave up at", "s", 3),
            Column("client_error_s", "Client error at", "s", 3),
            Column("engine_start_s", "Engine start", "s", 3),
            Column("engine_end_s", "Engine end", "s", 3),
            Column("engine_busy_s", "Engine wasted", "s", 3),
            Column("after_gave_up_s", "After give-up", "s", 3),
            Column("tokens_for_nobody", "Tokens for nobody", "", 0),
            Column("engine_attempts", "Engine attempts", "", 0),
        ],
    )
    for c in sorted(cases, key=lambda c: -c.engine_busy_s)[:max_timelines]:
        timeline.add(c.request_id, c.gave_up_by, c.gave_up_s, c.client_error_s, c.engine_start_s, c.engine_end_s, c.engine_busy_s, c.after_gave_up_s, c.tokens_for_nobody, c.engine_attempts)
    if len(cases) > max_timelines:
        timeline.footnotes.append(f"The {max_timelines} costliest of {len(cases)} cascades are shown.")
    if cases:
        section.tables.append(timeline)
        typical = sorted(cases, key=lambda c: c.engine_busy_s)[(len(cases) - 1) // 2]
        who = ", ".join(f"{k} {v}" for k, v in sorted(by_who.items()))
        section.notes.append(
            f"{len(cases)} of {len(rows)} requests cascaded (gave up first: {who}); the engine spent {busy.sum():.2f} s "
            f"on results nobody received, {after.sum():.2f} s of it after the first give-up, and generated {sum(toks)} tokens for nobody."
        )
        section.notes.append("Median cascade: " + typical.sentence() + ".")
    else:
        section.notes.append(f"No timeout cascades observed in {len(rows)} requests ({gave_up_any} requests where some layer gave up).")
    if extra:
        section.notes.append(f"Retries multiplied engine work: {retried} requests reached the engine more than once ({extra} extra attempts).")
    section.data = {
        "cascades": len(cases),
        "engine_wasted_s": float(busy.sum()),
        "engine_after_gave_up_s": float(after.sum()),
        "tokens_for_nobody": int(sum(toks)),
        "retried_requests": retried,
        "extra_engine_attempts": extra,
        "gave_up_by": by_who,
    }
    return section


@register_section
class DeclaredTimeouts:
    name = "timeouts"
    order = 70
    title = "Timeout configuration"

    def build(self, inputs: ReportInputs) -> Section | None:
        return declared_timeouts_section(inputs.topology)


@register_section
class ObservedCascades:
    name = "cascades"
    order = 80
    title = "Timeout cascades (observed)"

    def build(self, inputs: ReportInputs) -> Section | None:
        return cascade_section(inputs.rows, inputs.topology) if inputs.rows else None

