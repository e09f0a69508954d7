"""The HTML page's plots, drawn with matplotlib's Agg backend into PNG bytes.

* TTFT CDF per boundary: what a client, the gateway, the firewall and the engine each see as TTFT;
* the median request's waterfall: every interval between consecutive timeline points, in order;
* the inter-chunk gap histogram (client gaps from the load generator's records, else the edge tap's per-request mean);
* per-component TTFT contribution over the run (median per time bin, stacked).
"""

from __future__ import annotations

import io
from collections.abc import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from deltatap.collector.reports.columns import delta_ms, points_diff_ms, seconds_since_first  # noqa: E402
from deltatap.collector.reports.columns import CHUNK_GAP  # noqa: E402
from deltatap.collector.reports.methodology import chunk_gaps_from_records  # noqa: E402
from deltatap.collector.reports.model import Figure  # noqa: E402
from deltatap.collector.reports.registry import ReportInputs  # noqa: E402
from deltatap.collector.rows import Row, intermediaries  # noqa: E402
from deltatap.core.topology import Topology  # noqa: E402
from deltatap.core.vocab import Role, point  # noqa: E402

COLORS = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c", "#ccb974", "#64b5cd"]


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def boundary_ttfts(rows: Sequence[Row], topology: Topology) -> dict[str, np.ndarray]:
    """TTFT as each boundary sees it (ms): client t12-t0, each intermediary's arrive -> first token out, engine t7-t6."""
    out = {f"{topology.client.name} (t12 - t0)": delta_ms(rows, "system_ttft")}
    for m in intermediaries(topology):
        out[m] = points_diff_ms(rows, point(m, Role.OUT_FIRST_OUT), point(m, Role.IN_ARRIVE))
    out[f"{topology.engine.name} (t7 - t6)"] = delta_ms(rows, "engine_ttft")
    return {k: v for k, v in out.items() if np.isfinite(v).any()}


def ttft_cdf(rows: Sequence[Row], topology: Topology) -> Figure | None:
    series = boundary_ttfts(rows, topology)
    if not series:
        return None
    fig, ax = plt.subplots(figsize=(8, 4.2))
    for i, (name, v) in enumerate(series.items()):
        x = np.sort(v[np.isfinite(v)])
        ax.step(x, np.arange(1, x.size + 1) / x.size, where="post", label=name, color=COLORS[i % len(COLORS)])
    ax.set_xlabel("TTFT (ms)")
    ax.set_ylabel("fraction of requests")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    return Figure("ttft_cdf", "TTFT CDF per boundary", "image/png", _png(fig), "each boundary's time from request arrival to first token out")


def path_points(topology: Topology) -> list[tuple[str, str]]:
    """(generic point, owner) along the request and first-token path, in time order."""
    mids = intermediaries(topology)
    c, e = topology.client.name, topology.engine.name
    seq = [(point(c, Role.SEND), c)]
    for m in mids:
        seq += [(point(m, Role.IN_ARRIVE), m), (point(m, Role.IN_EXIT), m)]
    seq += [(point(e, Role.QUEUE), e), (point(e, Role.EXEC_START), e), (point(e, Role.FIRST_TOKEN), e)]
    for m in reversed(mids):
        seq += [(point(m, Role.OUT_FIRST_IN), m), (point(m, Role.OUT_FIRST_OUT), m)]
    seq.append((point(c, Role.FIRST_TOKEN_RECEIVED), c))
    return seq


def waterfall_segments(row: Row, topology: Topology) -> list[tuple[str, str, float, float]]:
    """(label, owner, start ms after t0, width ms) between consecutive observed points."""
    seq = [(p, owner) for p, owner in path_points(topology) if p in row.points]
    if len(seq) < 2:
        return []
    t0 = row.points[seq[0][0]].unix_ns
    segs = []
    for (pa, oa), (pb, ob) in zip(seq, seq[1:], strict=False):
        a, b = row.points[pa].unix_ns, row.points[pb].unix_ns
        owner = oa if oa == ob else "network + taps"
        label = f"{pa} -> {pb}" if oa != ob else _segment_name(pa, pb)
        segs.append((label, owner, (a - t0) / 1e6, (b - a) / 1e6))
    return segs


def _segment_name(pa: str, pb: str) -> str:
    comp, _, ra = pa.partition(".")
    rb = pb.partition(".")[2]
    names = {("in.arrive", "in.exit"): "inbound", ("out.first_in", "out.first_out"): "outbound",
             ("queue", "exec_start"): "queue", ("exec_start", "first_token"): "prefill", ("queue", "first_token"): "queue + prefill"}
    return f"{comp} {names.get((ra, rb), ra + ' -> ' + rb)}"


def median_row(rows: Sequence[Row]) -> Row | None:
    ttft = delta_ms(rows, "system_ttft")
    idx = np.flatnonzero(np.isfinite(ttft))
    if not idx.size:
        return None
    order = idx[np.argsort(ttft[idx], kind="stable")]
    return rows[int(order[(order.size - 1) // 2])]


def waterfall(rows: Sequence[Row], topology: Topology) -> Figure | None:
    r = median_row(rows)
    segs = waterfall_segments(r, topology) if r is not None else []
    if not segs:
        return None
    owners = list(dict.fromkeys(o for _, o, _, _ in segs))
    color = {o: COLORS[i % len(COLORS)] for i, o in enumerate(owners)}
    fig, ax = plt.subplots(figsize=(9, 0.35 * len(segs) + 1.4))
    for i, (label, owner, start, width) in enumerate(segs):
        ax.barh(i, max(width, 1e-3), left=start, color=color[owner])
        ax.text(start + max(width, 0), i, f" {width:.2f} ms", va="center", fontsize=7)
    ax.set_yticks(range(len(segs)), [s[0] for s in segs], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("ms after the client sent the request")
    handles = [plt.Rectangle((0, 0), 1, 1, color=color[o]) for o in owners]
    ax.legend(handles, owners, fontsize=7, loc="upper right")
    ax.grid(axis="x", alpha=0.3)
    ttft = r.deltas["system_ttft"].ns / 1e6
    return Figure("waterfall", "Waterfall of the median request", "image/png", _png(fig), f"request {r.request_id or r.trace_id}, system TTFT {ttft:.2f} ms")


def itl_histogram(inputs: ReportInputs) -> Figure | None:
    per = chunk_gaps_from_records(inputs.records)
    if per:
        v, what = np.concatenate(per), f"every {CHUNK_GAP} at the client (load generator records)"
    else:
        link = inputs.topology.links[0].name if inputs.topology.links else ""
        v = np.array([r.gaps[link].down.mean_ns / 1e6 for r in inputs.rows if link in r.gaps and r.gaps[link].down and r.gaps[link].down.mean_ns is not None])
        what = f"mean {CHUNK_GAP} per request at the {link} tap"
    if not v.size:
        return None
    fig, ax = plt.subplots(figsize=(8, 3.8))
    ax.hist(v, bins=min(60, max(10, int(np.sqrt(v.size)))), color=COLORS[0])
    ax.set_xlabel(f"{CHUNK_GAP} (ms)")
    ax.set_ylabel("count")
    ax.grid(alpha=0.3)
    return Figure("itl_histogram", f"{CHUNK_GAP} histogram", "image/png", _png(fig), what)  # name kept: the HTML anchor


def contribution_series(rows: Sequence[Row], topology: Topology) -> dict[str, np.ndarray]:
    """Per request, each component's TTFT contribution (ms): intermediaries' inbound + outbound,
    the engine's TTFT, the taps' overhead and the residual."""
    out: dict[str, np.ndarray] = {}
    for m in intermediaries(topology):
        out[m] = np.nan_to_num(delta_ms(rows, f"{m}_inbound")) + np.nan_to_num(delta_ms(rows, f"{m}_outbound"))
    out[topology.engine.name] = delta_ms(rows, "engine_ttft")
    taps = np.zeros(len(rows))
    for link in topology.links:
        taps += np.nan_to_num(delta_ms(rows, f"tap_{link.name}_request")) + np.nan_to_num(delta_ms(rows, f"tap_{link.name}_first_token"))
    out["taps"] = taps
    out["residual"] = delta_ms(rows, "residual")
    return out


def contribution_over_time(rows: Sequence[Row], topology: Topology, bins: int = 20) -> Figure | None:
    t = seconds_since_first(rows, point(topology.client.name, Role.SEND))
    ok = np.isfinite(t) & np.isfinite(delta_ms(rows, "system_ttft"))
    if ok.sum() < 2:
        return None
    series = contribution_series(rows, topology)
    edges = np.linspace(0, float(np.nanmax(t[ok])) + 1e-9, min(bins, int(ok.sum())) + 1)
    centers = (edges[:-1] + edges[1:]) / 2
    which = np.digitize(t, edges) - 1
    used = [b for b in range(len(centers)) if (ok & (which == b)).any()]  # empty bins are left out, not drawn as 0
    stacked = []
    for v in series.values():
        med = [float(np.nanmedian(v[ok & (which == b)])) if np.isfinite(v[ok & (which == b)]).any() else 0.0 for b in used]
        stacked.append(np.clip(med, 0, None))
    centers = centers[used]
    fig, ax = plt.subplots(figsize=(9, 4))
    ax.stackplot(centers, *stacked, labels=list(series), colors=COLORS[: len(series)], alpha=0.85)
    ax.set_xlabel("seconds into the run")
    ax.set_ylabel("TTFT contribution, median per bin (ms)")
    ax.legend(fontsize=7, loc="upper left")
    ax.grid(alpha=0.3)
    return Figure("contribution_over_time", "Per-component contribution over time", "image/png", _png(fig), "median of each component's TTFT contribution per time bin, stacked")


def report_figures(inputs: ReportInputs) -> list[Figure]:
    rows, topo = inputs.rows, inputs.topology
    figs = [ttft_cdf(rows, topo), waterfall(rows, topo), itl_histogram(inputs), contribution_over_time(rows, topo)]
    return [f for f in figs if f is not None]
