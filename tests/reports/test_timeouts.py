"""Declared timeouts: the draft's 10 s / 15 s / 30 s example and retry totals, exact."""

from __future__ import annotations

from deltatap.collector.reports.timeouts import declared_timeouts_section, find_mismatches
from deltatap.core.topology import ComponentSpec, LinkModel, Topology


def topo(client=None, gateway=None, firewall=None, engine=None, gw_retries=0) -> Topology:
    return Topology(
        components=[
            ComponentSpec(name="client", kind="client", timeout_s=client),
            ComponentSpec(name="gateway", kind="gateway", timeout_s=gateway, retries=gw_retries),
            ComponentSpec(name="firewall", kind="firewall", timeout_s=firewall),
            ComponentSpec(name="engine", kind="engine", timeout_s=engine),
        ],
        links=[
            LinkModel(name="edge", downstream="client", upstream="gateway"),
            LinkModel(name="gw-fw", downstream="gateway", upstream="firewall"),
            LinkModel(name="fw-engine", downstream="firewall", upstream="engine"),
        ],
    )


def test_draft_example_flags_firewall_and_engine_against_the_gateway():
    ms = find_mismatches(topo(gateway=10, firewall=15, engine=30))
    assert [(m.kind, m.component, m.outer, m.inner_s, m.outer_s) for m in ms] == [
        ("inner_longer", "firewall", "gateway", 15, 10),
        ("inner_longer", "engine", "gateway", 30, 10),
    ]
    assert ms[0].excess_s == 5
    section = declared_timeouts_section(topo(gateway=10, firewall=15, engine=30))
    t = section.table("declared_timeouts")
    assert t.row_by("component", "engine")["binding_deadline_s"] == 10
    assert t.row_by("component", "engine")["status"] == "longer than gateway"
    assert t.row_by("component", "gateway")["status"] == "ok"
    assert t.row_by("component", "client")["status"] == "no timeout declared"
    assert "firewall waits up to 15 s for its upstream but gateway gives up after 10 s" in section.notes[0]


def test_retries_whose_total_outlasts_the_client_are_flagged():
    ms = find_mismatches(topo(client=20, gateway=8, gw_retries=2))
    assert [(m.kind, m.component, m.outer, m.inner_s, m.outer_s) for m in ms] == [("retries_exceed", "gateway", "client", 24, 20)]
    row = declared_timeouts_section(topo(client=20, gateway=8, gw_retries=2)).table("declared_timeouts").row_by("component", "gateway")
    assert row["worst_case_s"] == 24 and row["retries"] == 2 and row["status"] == "retries outlast client"


def test_consistent_timeouts_have_no_mismatch():
    assert find_mismatches(topo(client=60, gateway=30, firewall=20, engine=10)) == []
    assert find_mismatches(topo(client=30, gateway=10, gw_retries=1)) == []  # 20 s <= 30 s
    s = declared_timeouts_section(topo())
    assert s.data["mismatches"] == [] and "declares no timeouts" in s.notes[0]
