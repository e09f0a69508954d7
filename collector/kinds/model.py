"""The language a span kind is described in: which spans it matches, what each event observes, what each
attribute says (with its unit), and where its clock comes from.

A :class:`SpanKind` is data plus one function, ``site(view, topo)``: given what a span's *layout* says (its
name, service, event names and the values of the kind's ``shape`` attributes) it returns a :class:`Site`,
the kind's description specialised to that layout: the observer (clock domain), the component it speaks for,
what each event name observes (:class:`Emit`, :class:`GiveUp`, :class:`EngineEnd`), observations at the span's
start or end (:class:`Edge`), observations computed from an attribute (:class:`Derived`) and any facts that
hold only there. :mod:`deltatap.collector.kinds.compile` turns a Site and a layout's attribute positions into
one reader; nothing here runs per span.

Units: a number's unit is its factor to nanoseconds (:data:`NS`, :data:`MS`, :data:`S`). Clocks: every time
a kind reads is the observer's wall clock (Unix ns), moved onto the collector's by the span's stated
``deltatap.clock.offset_ns`` (uncertainty ``deltatap.clock.uncertainty_ns``); an observer that states none
shares the collector's clock.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from deltatap.collector.observations import RANK_COMPONENT, RANK_FALLBACK, RANK_TAP, RANK_TELEMETRY
from deltatap.core.topology import Topology
from deltatap.core.vocab import Attr

__all__ = ["CLOCK", "MS", "NS", "RANK_COMPONENT", "RANK_FALLBACK", "RANK_TAP", "RANK_TELEMETRY", "S", "Derived", "Edge", "Emit", "EngineEnd",
           "Fact", "GiveUp", "Into", "Match", "Site", "SpanKind", "SpanView"]

NS, MS, S = 1, 1_000_000, 1_000_000_000  # a unit: nanoseconds per unit
CLOCK = (Attr.CLOCK_OFFSET_NS, Attr.CLOCK_UNCERTAINTY_NS)  # the clock every observer may state on its span (ns)


class Into(Enum):
    """Where a fact goes in the request's :class:`~deltatap.collector.observations.Extracted` (the compiler knows
    each sink's rule)."""

    REQUEST_ID = "request id (str), every span's kept"
    HTTP_STATUS = "HTTP status (int) per observer"
    OUTCOME = "outcome (str) per observer"
    DECISION = "firewall decision (str): the first, or a component's"
    LABELS = "every attribute under this prefix: a label (str), the first wins"
    RUN_ID = "the run_id label, unless a label named it"
    TOKENS_IN = "tokens in (int) per observer"
    TOKENS_OUT = "tokens out (int) per observer"
    TOKENS_IN_UNLESS_STATED = "tokens in (int) per observer, unless the span's usage stated them"
    TOKENS_OUT_UNLESS_STATED = "tokens out (int) per observer, unless the span's usage stated them"
    AFTER_DISCONNECT = "tokens the engine generated after the client left (int)"
    # per link, from the latest attempt on that link (taps)
    OVERHEAD_REQUEST = "tap overhead, request received -> forwarded (ns)"
    OVERHEAD_FIRST_TOKEN = "tap overhead, first token received -> forwarded (ns)"
    GAP_COUNT = "inter-token gaps counted"
    GAP_UP_MEAN = "mean gap as received from upstream"
    GAP_UP_P99 = "p99 gap as received from upstream"
    GAP_UP_MAX = "max gap as received from upstream"
    GAP_DOWN_MEAN = "mean gap as forwarded downstream"
    GAP_DOWN_P99 = "p99 gap as forwarded downstream"
    GAP_DOWN_MAX = "max gap as forwarded downstream"
    CONTENT_EVENTS = "content events read from upstream (int)"


PER_LINK = frozenset({Into.OVERHEAD_REQUEST, Into.OVERHEAD_FIRST_TOKEN, Into.GAP_COUNT, Into.GAP_UP_MEAN, Into.GAP_UP_P99, Into.GAP_UP_MAX,
                      Into.GAP_DOWN_MEAN, Into.GAP_DOWN_P99, Into.GAP_DOWN_MAX, Into.CONTENT_EVENTS})


@dataclass(frozen=True)
class Fact:
    """Attribute ``attr`` (a prefix for :attr:`Into.LABELS`) says ``into``, in ``unit``. ``fallback``: for an
    overhead the tap did not state, the (received, forwarded) events whose difference it is."""

    attr: str
    into: Into
    unit: int = NS
    fallback: tuple[str, str] | None = None


@dataclass(frozen=True)
class Emit:
    """The event's time is an observation of ``point`` (source and rank: the site's unless given). ``engine_end``:
    it is also the end of the engine's stream. ``unless``: not when the span also has that event."""

    point: str
    source: str | None = None
    rank: int | None = None
    engine_end: bool = False
    unless: str | None = None


@dataclass(frozen=True)
class GiveUp:
    """The event is ``component`` giving up on the request (the earliest one counts)."""

    component: str


@dataclass(frozen=True)
class EngineEnd:
    """The event is the end of the engine's stream (the latest one counts)."""


Action = Emit | GiveUp | EngineEnd


@dataclass(frozen=True)
class Edge:
    """The span's ``start`` or ``end`` observes ``point`` (None: only the engine's end, when ``engine_end``, and only
    when the span states an end). ``attempt_is_time``: ties between such observations go to the later time, not
    the later span start."""

    at: str  # "start" | "end"
    point: str | None
    source: str | None = None
    rank: int | None = None
    engine_end: bool = False
    attempt_is_time: bool = False


@dataclass(frozen=True)
class Derived:
    """``point`` = the time of ``base`` (an event's first occurrence, or "start") plus the sum of the first
    alternative whose attributes are all present, each ``(attr, unit, sign)``, rounded to ns one by one."""

    point: str
    base: str
    alternatives: tuple[tuple[tuple[str, int, int], ...], ...]
    source: str | None = None
    rank: int | None = None
    engine_end: bool = False


@dataclass(frozen=True)
class Site:
    """A kind's description for one layout (see the module docstring)."""

    observer: str
    source: str
    rank: int
    events: Mapping[str, Action] = field(default_factory=dict)  # event name -> what it observes
    edges: tuple[Edge, ...] = ()
    derived: tuple[Derived, ...] = ()
    facts: tuple[Fact, ...] = ()  # after the kind's own facts
    link: str | None = None  # per-link facts and attempts go to this link (taps)
    component: str = ""
    decides: bool = False  # its firewall decision replaces an earlier observer's
    decision: tuple[str, Mapping[str, int]] | None = None  # a decision of its own: (value, strength per value)
    tokenizer: bool = False  # its token counts come from a tokenizer
    bounds: bool = False  # it may state intervals for its events (deltatap.stamp.bounds)
    values: Mapping[str, Any] = field(default_factory=dict)  # anything else the kind needs (the joiner's link)


@dataclass(frozen=True)
class SpanView:
    """What a layout says of its spans when a Site is made: name, service, the string attributes that are part of
    the layout (every attribute, for a span read the plain way), the attribute keys and the event names."""

    name: str
    service: str
    attrs: Mapping[str, Any]
    keys: frozenset[str]
    event_names: tuple[str, ...]

    def get(self, key: str) -> Any:
        return self.attrs.get(key)


@dataclass(frozen=True)
class Match:
    """A span is of a kind when every condition stated here holds (a kind matches when one of its Matches does)."""

    observer: str | None = None  # deltatap.observer value
    name: str | None = None
    name_prefix: str | None = None
    service: str | None = None
    has: str | None = None  # an attribute present

    def __call__(self, view: SpanView) -> bool:
        return ((self.observer is None or view.get(Attr.OBSERVER) == self.observer)
                and (self.name is None or view.name == self.name)
                and (self.name_prefix is None or view.name.startswith(self.name_prefix))
                and (self.service is None or view.service == self.service)
                and (self.has is None or self.has in view.keys))


@dataclass(frozen=True)
class SpanKind:
    """One kind of span: how to recognise it and what it says. ``shape``: the attributes whose *values* the site
    depends on (a layout that holds them per span is read the plain way). ``common``: it carries the facts every
    deltatap observer states (:data:`deltatap.collector.kinds.common.FACTS`) and its start counts as the request's."""

    name: str
    match: tuple[Match, ...]
    site: Callable[[SpanView, Topology], Site | None]
    shape: tuple[str, ...] = ()
    facts: tuple[Fact, ...] = ()
    common: bool = True
    reads: tuple[str, ...] = ()  # attributes read by ``site`` or its facts that appear nowhere above

    def matches(self, view: SpanView) -> bool:
        return any(m(view) for m in self.match)

    def attributes(self) -> set[str]:
        """Every attribute this kind reads (the live decoder keeps exactly these, see kinds.attrs_read)."""
        out = {*self.shape, *self.reads, *CLOCK, *(f.attr for f in self.facts)}
        out |= {m.has for m in self.match if m.has} | ({Attr.OBSERVER} if any(m.observer for m in self.match) else set())
        return out
