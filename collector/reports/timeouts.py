"""Declared per-layer timeouts from the topology, and the mismatches that cause timeout cascades.

Profiles draft §6 "Timeout Cascades": with a gateway timeout of 10 s, a firewall of 15 s and an
engine of 30 s, the client gets an error at 10 s while the firewall and engine keep working. Two
mismatches are flagged, each against the tightest timeout of the layers outside a component
(closer to the client), because that is the deadline that actually binds:

* ``inner_longer``: a component waits longer for its upstream than some outer layer waits for it;
* ``retries_exceed``: a component's retries (``timeout_s * (1 + retries)``) outlast an outer layer.
"""

from __future__ import annotations

from dataclasses import dataclass

from deltatap.collector.reports.model import Column, Section, Table
from deltatap.core.topology import Topology


@dataclass(frozen=True)
class Mismatch:
    kind: str  # inner_longer | retries_exceed
    component: str
    outer: str
    inner_s: float
    outer_s: float

    @property
    def excess_s(self) -> float:
        return self.inner_s - self.outer_s

    def sentence(self) -> str:
        if self.kind == "inner_longer":
            return (
                f"{self.component} waits up to {self.inner_s:g} s for its upstream but {self.outer} gives up "
                f"after {self.outer_s:g} s: {self.component} and everything behind it can keep working for "
                f"{self.excess_s:g} s after {self.outer} has returned an error"
            )
        return (
            f"{self.component}'s retries can take {self.inner_s:g} s in total, longer than {self.outer}'s "
            f"{self.outer_s:g} s timeout: later attempts run for nobody and multiply upstream work"
        )


def find_mismatches(topology: Topology) -> list[Mismatch]:
    out: list[Mismatch] = []
    comps = topology.components
    for i, comp in enumerate(comps):
        outers = [(c.name, c.timeout_s) for c in comps[:i] if c.timeout_s is not None]
        if comp.timeout_s is None or not outers:
            continue
        outer_name, outer_s = min(outers, key=lambda x: x[1])
        if comp.timeout_s > outer_s:
            out.append(Mismatch("inner_longer", comp.name, outer_name, comp.timeout_s, outer_s))
        total = comp.timeout_s * (1 + comp.retries)
        if comp.retries and total > outer_s:
            out.append(Mismatch("retries_exceed", comp.name, outer_name, total, outer_s))
    return out


def declared_timeouts_section(topology: Topology) -> Section:
    table = Table(
        "declared_timeouts",
        "Declared per-layer timeouts",
        [
            Column("component", "Component"),
            Column("kind", "Kind"),
            Column("timeout_s", "Timeout", "s", 2),
            Column("retries", "Retries", "", 0),
            Column("worst_case_s", "Worst case", "s", 2),
            Column("binding_deadline_s", "Outer deadline", "s", 2),
            Column("status", "Status"),
        ],
    )
    table.footnotes.append("Worst case: timeout x (1 + retries). Outer deadline: the tightest timeout of the layers closer to the client.")
    mismatches = find_mismatches(topology)
    by_comp: dict[str, list[Mismatch]] = {}
    for m in mismatches:
        by_comp.setdefault(m.component, []).append(m)
    for i, comp in enumerate(topology.components):
        outers = [c.timeout_s for c in topology.components[:i] if c.timeout_s is not None]
        worst = comp.timeout_s * (1 + comp.retries) if comp.timeout_s is not None else None
        flags = by_comp.get(comp.name, [])
        if comp.timeout_s is None:
            status = "no timeout declared"
        elif flags:
            status = "; ".join("longer than " + m.outer if m.kind == "inner_longer" else "retries outlast " + m.outer for m in flags)
        else:
            status = "ok"
        table.add(comp.name, str(comp.kind), comp.timeout_s, comp.retries, worst, min(outers) if outers else None, status)
    section = Section("timeouts", "Timeout configuration", tables=[table])
    if mismatches:
        section.notes.extend(m.sentence() + "." for m in mismatches)
    elif any(c.timeout_s is not None for c in topology.components):
        section.notes.append("No timeout mismatches: every inner layer gives up no later than the layers outside it.")
    else:
        section.notes.append("The topology declares no timeouts (set timeout_s per component to check for mismatches).")
    section.data["mismatches"] = [
        {"kind": m.kind, "component": m.component, "outer": m.outer, "inner_s": m.inner_s, "outer_s": m.outer_s}
        for m in mismatches
    ]
    return section
