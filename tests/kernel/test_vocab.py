from deltatap.core.vocab import (
    DEFAULT_LINKS,
    DEFAULT_POINT_ALIASES,
    DRAFT_DELTAS,
    ComponentKind,
    TapEvent,
    tap_point,
)


def test_every_draft_delta_names_known_points():
    for name, (end, start) in DRAFT_DELTAS.items():
        assert end in DEFAULT_POINT_ALIASES and start in DEFAULT_POINT_ALIASES, name


def test_default_taps_observe_the_design_points():
    kinds = {"client": ComponentKind.CLIENT, "gateway": ComponentKind.GATEWAY, "firewall": ComponentKind.FIREWALL, "engine": ComponentKind.ENGINE}
    alias = {v: k for k, v in DEFAULT_POINT_ALIASES.items()}
    seen = {}
    for link in DEFAULT_LINKS:
        for ev in TapEvent:
            p = tap_point(ev, link.downstream, kinds[link.downstream], link.upstream, kinds[link.upstream])
            if p in alias:
                seen[(link.name, ev.value)] = alias[p]
    # DESIGN section 2's table
    assert seen[("edge", "request.forwarded")] == "t1"
    assert seen[("edge", "first_token.received")] == "t11"
    assert seen[("gw-fw", "request.received")] == "t2"
    assert seen[("gw-fw", "request.forwarded")] == "t3"
    assert seen[("gw-fw", "first_token.received")] == "t10"
    assert seen[("fw-engine", "request.received")] == "t5"
    assert seen[("fw-engine", "request.forwarded")] == "t6"
    assert seen[("fw-engine", "first_token.received")] == "t7"
    assert seen[("fw-engine", "last_token.received")] == "t8"
    assert seen[("fw-engine", "first_token.forwarded")] == "t9"
    assert seen[("edge", "request.received")] == "t0"
    assert seen[("edge", "first_token.forwarded")] == "t12"
