"""Columns of a set of decomposition rows as numpy arrays (float ms, NaN where missing), and the names
the reports give to metrics that are easily confused (one definition per name, every report reads them here)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from deltatap.collector.deltas import SYSTEM_TTLT
from deltatap.collector.rows import Row, delta_ns
from deltatap.core.topology import Topology
from deltatap.core.vocab import ComponentKind, Role, point

BLOCK_DECISIONS = ("block_pattern", "block_analysis", "block")

# Two inter-token figures, never both called "ITL" (the load generator's summary uses the same two names).
# A firewall that releases tokens in windows makes most chunk gaps ~0 ms (inter-chunk gap P50 0.0 ms) while
# every request's ITL is tens of ms: one name for both read as a contradiction.
ITL_PER_REQUEST = "ITL (per request)"
ITL_PER_REQUEST_DEF = "(last token - first token) / (output tokens - 1), one value per request (AIPerf's inter_token_latency)"
CHUNK_GAP = "inter-chunk gap"
CHUNK_GAP_DEF = "every gap between consecutive content events the client received (methodology §4.6.3 option A, §5.4.5)"


def delta_ms(rows: Sequence[Row], name: str) -> np.ndarray:
    vals, valid = delta_ns(rows, name)
    out = vals.astype(float) / 1e6
    out[~valid] = np.nan
    return out


def point_ns(rows: Sequence[Row], name: str) -> tuple[np.ndarray, np.ndarray]:
    """(Unix ns as int64, observed mask) of a generic point. Kept integer: float64 cannot hold
    today's Unix time in ns to better than ~256 ns."""
    vals = np.array([r.points[name].unix_ns if name in r.points else 0 for r in rows], dtype=np.int64)
    return vals, np.array([name in r.points for r in rows], dtype=bool)


def points_diff_ms(rows: Sequence[Row], end: str, start: str) -> np.ndarray:
    """``end - start`` in ms per row (NaN where either point is missing), computed in integers."""
    e, em = point_ns(rows, end)
    s, sm = point_ns(rows, start)
    out = (e - s).astype(float) / 1e6
    out[~(em & sm)] = np.nan
    return out


def seconds_since_first(rows: Sequence[Row], name: str) -> np.ndarray:
    """A point's time in seconds after its earliest observation in ``rows`` (NaN where missing)."""
    v, m = point_ns(rows, name)
    out = np.full(len(rows), np.nan)
    if m.any():
        out[m] = (v[m] - v[m].min()).astype(float) / 1e9
    return out


def ints(rows: Sequence[Row], attr: str) -> np.ndarray:
    return np.array([np.nan if getattr(r, attr) is None else getattr(r, attr) for r in rows], dtype=float)


def labels(rows: Sequence[Row], key: str) -> np.ndarray:
    return np.array([r.labels.get(key, "") for r in rows], dtype=object)


def decisions(rows: Sequence[Row]) -> np.ndarray:
    return np.array([r.firewall_decision or "" for r in rows], dtype=object)


def is_blocked(rows: Sequence[Row]) -> np.ndarray:
    """Blocked by a firewall: a block decision, or the refused outcome when no decision was recorded."""
    return np.array(
        [(r.firewall_decision or "").startswith("block") or (not r.firewall_decision and r.outcome == "refused") for r in rows],
        dtype=bool,
    )


def components_of_kind(topology: Topology, kind: ComponentKind) -> list[str]:
    return [c.name for c in topology.components if c.kind == kind]


def client_name(topology: Topology) -> str:
    return topology.client.name


def e2e_ms(rows: Sequence[Row], topology: Topology) -> np.ndarray:
    """End-to-end latency: client send to last token (``system_ttlt``), else to the client's end point."""
    e2e = delta_ms(rows, SYSTEM_TTLT)
    c = topology.client.name
    fallback = points_diff_ms(rows, point(c, Role.END), point(c, Role.SEND))
    return np.where(np.isfinite(e2e), e2e, fallback)


def run_window_s(rows: Sequence[Row], topology: Topology) -> float:
    """Seconds from the first client send (or row start) to the last client end / last token."""
    c = topology.client.name
    starts = [r.points[point(c, Role.SEND)].unix_ns if point(c, Role.SEND) in r.points else r.start_unix_ns for r in rows]
    ends = [max((r.points[p].unix_ns for p in (point(c, Role.END), point(c, Role.LAST_TOKEN_RECEIVED)) if p in r.points), default=None) for r in rows]
    starts = [v for v in starts if v is not None]
    ends = [v for v in ends if v is not None]
    if not starts or not ends:
        return float("nan")
    return (max(ends) - min(starts)) / 1e9


def output_throughput(rows: Sequence[Row], topology: Topology) -> float:
    """Output tokens delivered per second of the run (successful requests only)."""
    ok = np.array([r.outcome == "ok" for r in rows], dtype=bool)
    toks = ints(rows, "tokens_out")
    window = run_window_s(rows, topology)
    if not np.isfinite(window) or window <= 0:
        return float("nan")
    return float(np.nansum(toks[ok]) / window)
