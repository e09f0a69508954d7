"""The delta registry: every delta deltatap computes, reports and exports, defined once.

A delta is a :class:`Template` in :data:`GROUPS` — its name pattern, the two points it spans (as roles of
a component), its phase, whether it is a term of the TTFT sum, its human label and description. Everything
else is derived from that line, per topology, by :func:`delta_defs` / :func:`registry`:

* the delta's name for each component or link (``firewall_inbound``, ``tap_edge_request``);
* its **draft alias** (IETF LLM Benchmarking Profiles section 6: ``t5 - t3``), derived from its two points
  through :data:`deltatap.core.vocab.DEFAULT_POINT_ALIASES` — a point has the draft's name when its component
  is the only one of its kind in the topology (the draft's stack has one gateway and one firewall), so a
  firewall named ``fw`` still has ``t5 - t3`` and a second firewall has none (its formula is then written with
  generic points, :attr:`DeltaDef.formula`);
* the Prometheus metric family it is exported under (:attr:`DeltaDef.metric`, a histogram for durations, only
  the signed sum for signed deltas), its unit and its ``component`` label;
* the span name it is re-exported under (:attr:`DeltaDef.span_name`);
* whether it is signed by nature, whether it describes refused requests only (a block latency).

Rows, the decomposition table, every report section, plots, ``/metrics``, the re-exported spans and the delta
table of ``docs/reference.md`` (:func:`reference_markdown`, written by ``python -m deltatap.app.refdoc``) read
this module; ``tests/collector/test_deltas.py`` checks that no other collector module spells a delta name or
alias, and that changing one template here changes the rows, tables, reports and metrics.

Per-topology results are cached with :func:`functools.lru_cache` on a hashable key made of what the deltas
depend on (component names and kinds, link names), at most :data:`CACHE_TOPOLOGIES` topologies: no
module-global dict keyed by ``id()``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from deltatap.core.topology import Topology, default_topology
from deltatap.core.vocab import DEFAULT_COMPONENTS, DEFAULT_POINT_ALIASES, INTERMEDIARY_KINDS, SPAN_DECOMPOSITION_PREFIX, Role, TapEvent, point, tap_point

CACHE_TOPOLOGIES = 64
SEP = " - "  # the draft writes its formulas "t5 - t3"

# phases
FIRST, LAST, ITL, TAP, RESIDUAL_PHASE = "first", "last", "itl", "tap", "residual"
SIGNED_PHASES = (ITL, RESIDUAL_PHASE)  # a component may remove time (a gap it smooths); the residual absorbs clock error

# Prometheus: every delta is one label value of these families (docs/collector.md)
METRIC_PREFIX = "deltatap_collector_delta"
METRIC_UNIT = "seconds"
METRIC_HISTOGRAM = f"{METRIC_PREFIX}_{METRIC_UNIT}"  # durations only: a histogram's _sum must never fall
METRIC_SUM = f"{METRIC_PREFIX}_sum_{METRIC_UNIT}"  # every delta, signed ones included (a gauge)
METRIC_OBSERVATIONS = f"{METRIC_PREFIX}_observations"  # how many values that sum holds
METRIC_QUANTILE = f"{METRIC_PREFIX}_quantile_{METRIC_UNIT}"  # the collector's own quantiles
TAPS_COMPONENT = "taps"  # the ``component`` label of the taps' own overhead

# where a template's points are: the component it is instantiated for, or the topology's client / engine
SELF, CLIENT, ENGINE = "self", "client", "engine"
# what a group of templates is instantiated over
OVER_INTERMEDIARIES, OVER_INTERMEDIARIES_BACK, OVER_ENGINE, OVER_PATH, OVER_LINKS = "intermediaries", "intermediaries, reversed", "engine", "path", "links"


@dataclass(frozen=True, slots=True)
class Template:
    """One delta, before a topology names its components. ``name`` and ``label`` are ``str.format`` patterns
    over ``owner`` (the intermediary or link the delta is instantiated for)."""

    key: str
    name: str
    end: tuple[str, Role] | None  # (SELF | CLIENT | ENGINE, role); None for derived deltas (tap, itl, residual)
    start: tuple[str, Role] | None
    phase: str
    contributes: bool  # a term of the TTFT sum the residual is computed against
    label: str
    description: str
    refused_only: bool = False  # describes refused requests only (the time to block)


def _t(key: str, name: str, end: tuple[str, Role] | None, start: tuple[str, Role] | None, phase: str, contributes: bool, label: str,
       description: str, refused_only: bool = False) -> Template:
    return Template(key, name, end, start, phase, contributes, label, description, refused_only)


# The registry: groups in report order (the order of rows files' columns), each instantiated over its scope.
GROUPS: tuple[tuple[str, tuple[Template, ...]], ...] = (
    (OVER_INTERMEDIARIES, (
        _t("inbound", "{owner}_inbound", (SELF, Role.IN_EXIT), (SELF, Role.IN_ARRIVE), FIRST, True, "{owner} inbound",
           "request held by the component on its way in (gateway: auth, validation, routing; firewall: prompt inspection)"),
        _t("inbound_block", "{owner}_inbound_block", (SELF, Role.IN_DECISION), (SELF, Role.IN_ARRIVE), FIRST, False, "{owner} inbound (block)",
           "time to reach the inbound decision: the time to block, for refused requests", refused_only=True),
    )),
    (OVER_ENGINE, (
        _t("engine_queue", "engine_queue", (SELF, Role.EXEC_START), (SELF, Role.QUEUE), FIRST, False, "engine queue", "wait before execution"),
        _t("engine_prefill", "engine_prefill", (SELF, Role.FIRST_TOKEN), (SELF, Role.EXEC_START), FIRST, False, "engine prefill", "prefill computation"),
        _t("engine_ttft", "engine_ttft", (SELF, Role.FIRST_TOKEN), (SELF, Role.QUEUE), FIRST, True, "engine TTFT", "queue plus prefill, at the engine boundary"),
    )),
    (OVER_INTERMEDIARIES_BACK, (
        _t("outbound", "{owner}_outbound", (SELF, Role.OUT_FIRST_OUT), (SELF, Role.OUT_FIRST_IN), FIRST, True, "{owner} outbound",
           "first token held by the component on its way out (firewall: output inspection; gateway: response processing)"),
    )),
    (OVER_PATH, (
        _t("system_ttft", "system_ttft", (CLIENT, Role.FIRST_TOKEN_RECEIVED), (CLIENT, Role.SEND), FIRST, False, "system TTFT", "client-observed time to first token"),
        _t("output_path_overhead", "output_path_overhead", (CLIENT, Role.FIRST_TOKEN_RECEIVED), (ENGINE, Role.FIRST_TOKEN), FIRST, False,
           "output path overhead", "delay from the engine's first token to the client receiving it"),
    )),
    (OVER_ENGINE, (
        _t("engine_decode", "engine_decode", (SELF, Role.LAST_TOKEN), (SELF, Role.FIRST_TOKEN), LAST, False, "engine decode", "generation time after the first token"),
        _t("engine_ttlt", "engine_ttlt", (SELF, Role.LAST_TOKEN), (SELF, Role.QUEUE), LAST, False, "engine time to last token", "queue, prefill and decode"),
    )),
    (OVER_INTERMEDIARIES_BACK, (
        _t("outbound_last", "{owner}_outbound_last", (SELF, Role.OUT_LAST_OUT), (SELF, Role.OUT_LAST_IN), LAST, False, "{owner} outbound (last token)",
           "last token held by the component on its way out"),
    )),
    (OVER_PATH, (
        _t("system_ttlt", "system_ttlt", (CLIENT, Role.LAST_TOKEN_RECEIVED), (CLIENT, Role.SEND), LAST, False, "system time to last token", "client-observed end-to-end latency"),
        _t("output_path_overhead_last", "output_path_overhead_last", (CLIENT, Role.LAST_TOKEN_RECEIVED), (ENGINE, Role.LAST_TOKEN), LAST, False,
           "output path overhead (last token)", "delay from the engine's last token to the client receiving it"),
    )),
    (OVER_INTERMEDIARIES, (
        _t("itl_added_mean", "{owner}_itl_added_mean", None, None, ITL, False, "{owner} inter-chunk gap added (mean gap)",
           "mean gap between content chunks the component released minus the mean it received"),
        _t("itl_added_p99", "{owner}_itl_added_p99", None, None, ITL, False, "{owner} inter-chunk gap added (p99 gap)", "the same with the p99 gap"),
        _t("max_pause_added", "{owner}_max_pause_added", None, None, ITL, False, "{owner} max pause added", "the same with the longest gap"),
    )),
    (OVER_LINKS, (
        _t("tap_request", "tap_{owner}_request", None, None, TAP, True, "tap {owner} overhead (request)", "the tap's own time, request received -> forwarded"),
        _t("tap_first_token", "tap_{owner}_first_token", None, None, TAP, True, "tap {owner} overhead (first token)",
           "the tap's own time, first content token received -> forwarded"),
    )),
    (OVER_PATH, (
        _t("residual", "residual", None, None, RESIDUAL_PHASE, False, "residual: network + interaction effects",
           "system TTFT minus every TTFT term (intermediaries, engine TTFT, tap overheads): network time plus interaction effects"),
    )),
)

TEMPLATES: dict[str, Template] = {t.key: t for _, ts in GROUPS for t in ts}


def delta_name(key: str, owner: str | None = None) -> str:
    """The name of template ``key``'s delta for ``owner`` (an intermediary or a link; none for the others)."""
    return TEMPLATES[key].name.format(owner=owner)


# the deltas whose name does not depend on the topology, for the readers that want one by name
SYSTEM_TTFT = delta_name("system_ttft")
SYSTEM_TTLT = delta_name("system_ttlt")
ENGINE_TTFT = delta_name("engine_ttft")
RESIDUAL = delta_name("residual")


@dataclass(frozen=True, slots=True)
class DeltaDef:
    """One delta of one topology. The first seven fields are the row's (and keep their old order)."""

    name: str
    end: str  # generic point name (empty for derived deltas: tap, itl, residual)
    start: str
    phase: str  # "first" (TTFT path), "last" (last token), "tap", "itl", "residual"
    component: str | None  # who the delta is charged to (None: the path, or the taps)
    contributes: bool = False  # a term of the TTFT sum the residual is computed against
    description: str = ""  # the human label (kept under this name for the rows' readers; same as ``label``)
    alias: str | None = None  # the draft's formula, "t5 - t3"; None where a point has no draft name
    key: str = ""  # the template
    owner: str | None = None  # the intermediary or link the name was made for
    explanation: str = ""  # what it measures, one sentence
    refused_only: bool = False  # a block latency: describes refused requests only

    @property
    def label(self) -> str:
        return self.description

    @property
    def ttft_term(self) -> bool:
        return self.contributes

    @property
    def signed(self) -> bool:
        return self.phase in SIGNED_PHASES

    @property
    def prefer_within(self) -> bool:
        """Point-to-point deltas take both points from one observer where one saw both (DESIGN section 4)."""
        return bool(self.end)

    @property
    def formula(self) -> str:
        """The draft alias, else the generic points (``firewall.out.last_out - firewall.out.last_in``), else ''."""
        return self.alias or (f"{self.end}{SEP}{self.start}" if self.end else "")

    @property
    def titled(self) -> str:
        """``label (formula)``, or the label alone."""
        return f"{self.label} ({self.formula})" if self.formula else self.label

    @property
    def metric(self) -> str:
        return METRIC_SUM if self.signed else METRIC_HISTOGRAM

    @property
    def unit(self) -> str:
        return METRIC_UNIT

    @property
    def metric_component(self) -> str:
        return self.component or (TAPS_COMPONENT if self.phase == TAP else "")

    @property
    def span_name(self) -> str:
        return f"{SPAN_DECOMPOSITION_PREFIX} {self.name}"


class Deltas(Sequence[DeltaDef]):
    """The deltas of one topology, in report order, with lookups by name and by template."""

    __slots__ = ("defs", "by_name", "_by_key")

    def __init__(self, defs: tuple[DeltaDef, ...]) -> None:
        self.defs = defs
        self.by_name = {d.name: d for d in defs}
        self._by_key = {(d.key, d.owner): d for d in defs}

    def __len__(self) -> int:
        return len(self.defs)

    def __getitem__(self, i: Any) -> Any:
        return self.defs[i]

    def __iter__(self) -> Iterator[DeltaDef]:
        return iter(self.defs)

    def get(self, name: str) -> DeltaDef | None:
        return self.by_name.get(name)

    def of(self, key: str, owner: str | None = None) -> DeltaDef:
        """Template ``key``'s delta for ``owner`` (``deltas.of("inbound", "firewall")``)."""
        return self._by_key[(key, owner)]

    def named(self, key: str, owner: str | None = None) -> str:
        return self.of(key, owner).name

    def of_phase(self, phase: str) -> list[DeltaDef]:
        return [d for d in self.defs if d.phase == phase]


def intermediaries(topology: Topology) -> list[str]:
    return [c.name for c in topology.components[1:-1] if c.kind in INTERMEDIARY_KINDS]


def _key(topology: Topology) -> tuple[tuple[tuple[str, str], ...], tuple[str, ...]]:
    """What the deltas depend on: the chain's (name, kind) and the link names (a few µs; the registry is cached on it)."""
    return tuple([(c.name, str(c.kind)) for c in topology.components]), tuple([x.name for x in topology.links])


def registry(topology: Topology | None = None) -> Deltas:
    """Every delta a row of ``topology`` (default: the draft's stack) can carry, in report order."""
    return _registry(_key(topology or default_topology()))


def delta_defs(topology: Topology | None = None) -> Deltas:
    """:func:`registry` (the name the rows' readers know)."""
    return registry(topology)


def draft_points(components: Sequence[tuple[str, str]]) -> dict[str, str]:
    """Generic point -> the draft's name (t0..t12) for a chain of (name, kind).

    A component has the draft's names (:data:`DEFAULT_POINT_ALIASES`) when it is the only one of its kind and
    the draft's stack has that kind. On the way back the draft names one point per hop where deltatap has two
    (t10: the firewall releases the first token, which is when the gateway receives it; a tap between them
    sees both, :data:`deltatap.core.vocab.TAP_EVENT_OBSERVES`): a point with no name of its own takes the name
    of the other side of its hop, so the gateway's outbound is the draft's ``t11 - t10``."""
    kind_of = {name: str(kind) for name, kind in DEFAULT_COMPONENTS}
    by_kind_role: dict[tuple[str, str], str] = {}
    for t, generic in DEFAULT_POINT_ALIASES.items():
        comp, _, role = generic.partition(".")
        by_kind_role[(kind_of[comp], role)] = t
    count = Counter(kind for _, kind in components)
    out: dict[str, str] = {}
    for name, kind in components:
        if count[kind] == 1:
            for (k, role), t in by_kind_role.items():
                if k == kind:
                    out[point(name, role)] = t
    for (d, dk), (u, uk) in zip(components, components[1:]):
        for got, sent in _HOPS:  # the two sides of one hop: what the downstream side sent / received, and the upstream's
            a, b = tap_point(got, d, dk, u, uk), tap_point(sent, d, dk, u, uk)
            if a in out and b not in out:
                out[b] = out[a]
            elif b in out and a not in out:
                out[a] = out[b]
    return out


_HOPS = ((TapEvent.REQUEST_RECEIVED, TapEvent.REQUEST_FORWARDED), (TapEvent.FIRST_TOKEN_RECEIVED, TapEvent.FIRST_TOKEN_FORWARDED),
         (TapEvent.LAST_TOKEN_RECEIVED, TapEvent.LAST_TOKEN_FORWARDED))


@lru_cache(maxsize=CACHE_TOPOLOGIES)
def _registry(key: tuple[tuple[tuple[str, str], ...], tuple[str, ...]]) -> Deltas:
    components, links = key
    client, engine = components[0][0], components[-1][0]
    mids = [name for name, kind in components[1:-1] if kind in INTERMEDIARY_KINDS]
    aliases = draft_points(components)
    scopes: dict[str, list[str | None]] = {
        OVER_INTERMEDIARIES: list(mids), OVER_INTERMEDIARIES_BACK: list(reversed(mids)),
        OVER_ENGINE: [engine], OVER_PATH: [None], OVER_LINKS: list(links),
    }
    defs: list[DeltaDef] = []
    for over, templates in GROUPS:
        for owner in scopes[over]:
            for t in templates:
                where = {SELF: owner, CLIENT: client, ENGINE: engine}
                end = point(where[t.end[0]], t.end[1]) if t.end else ""
                start = point(where[t.start[0]], t.start[1]) if t.start else ""
                alias = f"{aliases[end]}{SEP}{aliases[start]}" if end in aliases and start in aliases else None
                named = owner if over != OVER_ENGINE else None  # engine deltas are named engine_*, whatever the engine's name
                component = owner if over in (OVER_INTERMEDIARIES, OVER_INTERMEDIARIES_BACK, OVER_ENGINE) else None
                defs.append(DeltaDef(t.name.format(owner=named), end, start, t.phase, component, t.contributes,
                                     t.label.format(owner=named), alias, t.key, named, t.description, t.refused_only))
    return Deltas(tuple(defs))


def reference_markdown(topology: Topology | None = None) -> str:
    """The delta table of docs/reference.md, for ``topology`` (default: the draft's stack)."""
    topo = topology or default_topology()
    out = [
        "## Deltas\n",
        "Every delta a decomposition row carries for the default topology (client -> gateway -> firewall -> engine), in report "
        "order, from the registry in `collector/deltas.py` (one line per delta there; another topology gets the same deltas for "
        "its own intermediaries and links). Draft: the profiles draft section 6 formula where both points have a draft name. "
        "TTFT term: a term of the sum the residual is computed against. Metric: the Prometheus family the delta is a "
        f"`delta` label value of (unit: {METRIC_UNIT}; signed deltas have no histogram).\n",
        "| delta | label | draft | points (end - start) | measures | component | phase | TTFT term | signed | metric |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for d in registry(topo):
        points = f"`{d.end}`{SEP}`{d.start}`" if d.end else "derived"
        out.append(f"| `{d.name}` | {d.label} | {d.alias or ''} | {points} | {d.explanation.replace('|', '/')} | {d.metric_component} | {d.phase} | "
                   f"{'yes' if d.ttft_term else ''} | {'yes' if d.signed else ''} | `{d.metric}` |")
    return "\n".join(out) + "\n"
