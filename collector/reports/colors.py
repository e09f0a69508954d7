"""One colour per component, everywhere: every plot, the HTML page and the Grafana dashboard read it here.

A component keeps its colour from plot to plot (the firewall is orange in the stacked bar, the
waterfall, the CDF and on the dashboard), so a reader who has learnt it once reads every picture at
a glance. Colours go by component *kind* (a topology's firewall is orange whatever its name); a
second component of the same kind gets the next shade of that kind; the parts that are not
components (the taps' own overhead, the residual, the network) have fixed neutral colours.
``tests/deploy/test_dashboard.py``-style checks compare the dashboard's overrides with :data:`KIND_COLORS`.
"""

from __future__ import annotations

from deltatap.collector.deltas import RESIDUAL_PHASE, TAP, delta_defs
from deltatap.core.topology import Topology

# a colour-blind-safe palette (Okabe-Ito), one per kind
KIND_COLORS: dict[str, str] = {
    "client": "#000000",
    "gateway": "#0072B2",  # blue
    "firewall": "#E69F00",  # orange
    "engine": "#009E73",  # green
    "router": "#CC79A7",  # pink
    "cache": "#56B4E9",  # sky blue
    "proxy": "#D55E00",  # vermillion
}
# parts of the time that are not a component's
TAPS = "taps"
RESIDUAL = "residual"
NETWORK = "network + taps"
PART_COLORS: dict[str, str] = {TAPS: "#7F7F7F", RESIDUAL: "#C7C7C7", NETWORK: "#B0A8B9"}
# second and further components of one kind: the kind's colour, lighter
_SHADES = (1.0, 0.65, 0.4)
FALLBACK = "#8C564B"


def _lighten(hex_color: str, keep: float) -> str:
    r, g, b = (int(hex_color[i : i + 2], 16) for i in (1, 3, 5))
    mix = lambda c: round(c * keep + 255 * (1 - keep))  # noqa: E731
    return f"#{mix(r):02X}{mix(g):02X}{mix(b):02X}"


def component_colors(topology: Topology) -> dict[str, str]:
    """Component name -> colour for every component of ``topology``, plus the taps, residual and network."""
    out: dict[str, str] = {}
    seen: dict[str, int] = {}
    for c in topology.components:
        kind = str(c.kind)
        i = seen.get(kind, 0)
        seen[kind] = i + 1
        base = KIND_COLORS.get(kind, FALLBACK)
        out[c.name] = _lighten(base, _SHADES[min(i, len(_SHADES) - 1)])
    out.update(PART_COLORS)
    return out


def color_of(name: str, topology: Topology) -> str:
    """The colour of a component (by name), of a part (taps, residual, network), else by kind name."""
    return component_colors(topology).get(name) or KIND_COLORS.get(name) or PART_COLORS.get(name) or FALLBACK


def color_of_delta(delta: str, topology: Topology) -> str:
    """The colour of the component a delta is charged to (``firewall_outbound`` -> the firewall's; a tap's
    overhead -> the taps'; the residual -> the residual's), for plots keyed by delta or decomposition line."""
    d = delta_defs(topology).get(delta)
    if d is None:
        return FALLBACK
    if d.phase == TAP:
        return PART_COLORS[TAPS]
    if d.phase == RESIDUAL_PHASE:
        return PART_COLORS[RESIDUAL]
    return color_of(d.component, topology) if d.component else FALLBACK
