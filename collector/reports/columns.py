"""Columns of a set of decomposition rows as numpy arrays (float ms, NaN where missing)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from collector.rows import Row, delta_ns
from deltatap.topology import Topology
from deltatap.vocab import ComponentKind, Role, point

BLOCK_DECISIONS = ("block_pattern", "block_analysis", "block")


def delta_ms(rows: Sequence[Row], name: str) -> np.ndarray:
    vals, valid = delta_ns(rows, name)
    out = vals.astype(float) / 1e6
    out[~valid] = np.nan
    return out


def point_ns(rows: Sequence[Row], name: str) -> np.ndarray:
    """A generic point's Unix ns as float64 (NaN where unobserved)."""
    return np.array([r.points[name].unix_ns if name in r.points else np.nan for r in rows], dtype=float)


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
    e2e = delta_ms(rows, "system_ttlt")
    c = topology.client.name
    send, end = point_ns(rows, point(c, Role.SEND)), point_ns(rows, point(c, Role.END))
    fallback = (end - send) / 1e6
    return np.where(np.isfinite(e2e), e2e, fallback)


def run_window_s(rows: Sequence[Row], topology: Topology) -> float:
    """Seconds from the first client send (or row start) to the last client end / last token."""
    c = topology.client.name
    starts = point_ns(rows, point(c, Role.SEND))
    starts = np.where(np.isfinite(starts), starts, ints(rows, "start_unix_ns"))
    ends = np.fmax(point_ns(rows, point(c, Role.END)), point_ns(rows, point(c, Role.LAST_TOKEN_RECEIVED)))
    if not np.isfinite(starts).any() or not np.isfinite(ends).any():
        return float("nan")
    return float((np.nanmax(ends) - np.nanmin(starts)) / 1e9)


def output_throughput(rows: Sequence[Row], topology: Topology) -> float:
    """Output tokens delivered per second of the run (successful requests only)."""
    ok = np.array([r.outcome == "ok" for r in rows], dtype=bool)
    toks = ints(rows, "tokens_out")
    window = run_window_s(rows, topology)
    if not np.isfinite(window) or window <= 0:
        return float("nan")
    return float(np.nansum(toks[ok]) / window)
