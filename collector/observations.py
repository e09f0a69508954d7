"""What the compiled readers of the span kinds (:mod:`deltatap.collector.kinds`) produce: observations of points
(:class:`Obs`) and the facts of one request (:class:`Extracted`), with the small value readers they share.

``rank`` orders sources when several observe one point: a component's own stamp (0) beats engine
telemetry (1) beats a tap (2); a component's approximate stamp (3, e.g. LiteLLM's start of its upstream
call) only fills a point no tap observed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from deltatap.collector.rows import LinkGaps

RANK_COMPONENT, RANK_TELEMETRY, RANK_TAP, RANK_FALLBACK = 0, 1, 2, 3


class Obs(NamedTuple):
    """One observation of a point (a tuple: built tens of times per request on the hot path)."""

    point: str
    unix_ns: int
    unc_ns: int
    observer: str
    source: str
    rank: int
    attempt_ns: int  # start of the observing span: later attempts (retries) win ties


@dataclass(slots=True)
class Extracted:
    """Everything the spans of one request say, before points are chosen."""

    obs: list[Obs] = field(default_factory=list)
    tap_overhead: dict[str, tuple[int | None, int | None, int]] = field(default_factory=dict)  # link -> (req, ft, attempt)
    gaps: dict[str, LinkGaps] = field(default_factory=dict)
    attempts: dict[str, int] = field(default_factory=dict)
    content_events: dict[str, int] = field(default_factory=dict)  # link -> content events read from upstream
    gave_up: dict[str, int] = field(default_factory=dict)  # component -> earliest give-up (collector clock)
    engine_end: int | None = None
    request_ids: list[str] = field(default_factory=list)
    http_status: dict[str, int] = field(default_factory=dict)  # observer -> status
    outcome: dict[str, str] = field(default_factory=dict)
    firewall_decision: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    tokens: dict[str, tuple[int | None, int | None]] = field(default_factory=dict)  # observer -> (in, out)
    start_ns: int | None = None
    tokenizer_counted: set[str] = field(default_factory=set)  # observers whose token counts come from a tokenizer
    engine_tokens_after_disconnect: int | None = None
    # (observer, point) -> (before_ns, after_ns): an observation that is an interval, not exact (Attr.STAMP_BOUNDS)
    bounds: dict[tuple[str, str], tuple[int, int]] = field(default_factory=dict)
    tap_overhead_bounds: dict[str, tuple[int, int]] = field(default_factory=dict)  # link -> (request, first token) ns


def as_int(v: Any) -> int | None:
    try:
        return None if v is None else int(v)
    except (TypeError, ValueError):
        return None


def as_float(v: Any) -> float | None:
    try:
        return None if v is None else float(v)
    except (TypeError, ValueError):
        return None
