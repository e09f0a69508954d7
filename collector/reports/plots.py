"""The HTML page's plots, drawn with matplotlib's Agg backend into PNG bytes, in reading order.

* the decomposition per percentile: one stacked bar per percentile of system TTFT (P50, P90, P99),
  each part labelled with its ms (the headline's numbers, drawn);
* the median request's waterfall: every interval between consecutive timeline points, in order;
* TTFT CDF per boundary, refused requests left out (a 403 has no first token);
* the inter-chunk gap histogram on log axes (a windowed firewall makes most gaps ~0 and a few long);
* per-component TTFT contribution over the run (median per time bin, stacked);
* the cascade timeline: per cascading request, when each layer gave up and how long the engine kept going.

Every plot takes its colours from :mod:`deltatap.collector.reports.colors` (one colour per
component everywhere), spans the page's width and labels its axes with units. A figure names the
report section it belongs to (``Figure.section``), where the HTML page shows it.
"""

from __future__ import annotations

import io
from collections.abc import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from deltatap.collector.applies import completed_view, ttft_view  # noqa: E402
from deltatap.collector.reports.cascade import find_cascades  # noqa: E402
from deltatap.collector.reports.colors import NETWORK, RESIDUAL, TAPS, color_of  # noqa: E402
from deltatap.collector.reports.columns import CHUNK_GAP, delta_ms, points_diff_ms, seconds_since_first  # noqa: E402
from deltatap.collector.reports.decomposition import component_parts, decompose_percentiles  # noqa: E402
from deltatap.collector.reports.methodology import chunk_gaps_from_records  # noqa: E402
from deltatap.collector.reports.model import Figure  # noqa: E402
from deltatap.collector.reports.registry import ReportInputs  # noqa: E402
from deltatap.collector.deltas import ENGINE_TTFT, SYSTEM_TTFT, registry  # noqa: E402
from deltatap.collector.rows import Row, intermediaries  # noqa: E402
from deltatap.core.topology import Topology  # noqa: E402
from deltatap.core.vocab import Role, point  # noqa: E402

WIDTH_IN = 12.0  # every plot spans the page (the HTML page is 1100 px wide, images at 100 %)
DPI = 100
DECADES_FOR_LOG = 1.5  # a value axis goes logarithmic when its data spans more than this many decades


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def spans_decades(v: np.ndarray) -> bool:
    pos = v[np.isfinite(v) & (v > 0)]
    return pos.size > 1 and np.log10(pos.max() / pos.min()) > DECADES_FOR_LOG


def _kept(rows: Sequence[Row], mask: list[bool]) -> list[Row]:
    return [r for r, k in zip(rows, mask, strict=True) if k]


# ------------------------------------------------------------------------------ decomposition bars


def decomposition_bars(rows: Sequence[Row], topology: Topology) -> Figure | None:
    d = decompose_percentiles(rows, topology)
    if not d.bars:
        return None
    parts = list(d.bars[0].parts)
    fig, ax = plt.subplots(figsize=(WIDTH_IN, 0.55 * len(d.bars) + 0.9))
    longest = max(b.band_ms for b in d.bars)
    for i, b in enumerate(d.bars):
        left = 0.0
        for p in parts:
            w = b.parts[p]
            if w <= 0:  # a negative residual (clock error) is not drawn as a bar; the table shows it
                continue
            ax.barh(i, w, left=left, color=color_of(p, topology), edgecolor="white", linewidth=0.6, label=p if i == 0 else None)
            if w >= 0.06 * longest:
                ax.text(left + w / 2, i, f"{w:.1f}", ha="center", va="center", fontsize=9, color="white" if p not in (RESIDUAL, TAPS) else "black")
            left += w
        ax.text(left, i, f"  {b.band_ms:.1f} ms", va="center", fontsize=10, fontweight="bold")
    ax.set_yticks(range(len(d.bars)), [f"{b.label} ({b.requests} req)" for b in d.bars])
    ax.invert_yaxis()
    ax.set_xlim(0, longest * 1.12)
    ax.set_xlabel("system TTFT (ms), split by where the time went")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=len(parts), fontsize=9, frameon=False)
    cap = f"mean of the requests around each percentile of system TTFT; {d.excluded.sentence('requests').lower()}"
    return Figure("decomposition_bars", "System TTFT by part, per percentile", "image/png", _png(fig), cap, section="headline")


# ----------------------------------------------------------------------------------------- CDF


def boundary_ttfts(rows: Sequence[Row], topology: Topology) -> dict[str, np.ndarray]:
    """TTFT as each boundary sees it (ms): client t12-t0, each intermediary's arrive -> first token out, engine t7-t6."""
    reg = registry(topology)
    out = {f"{topology.client.name} ({reg.by_name[SYSTEM_TTFT].formula})": delta_ms(rows, SYSTEM_TTFT)}
    for m in intermediaries(topology):
        out[m] = points_diff_ms(rows, point(m, Role.OUT_FIRST_OUT), point(m, Role.IN_ARRIVE))
    out[f"{topology.engine.name} ({reg.by_name[ENGINE_TTFT].formula})"] = delta_ms(rows, ENGINE_TTFT)
    return {k: v for k, v in out.items() if np.isfinite(v).any()}


def ttft_cdf(rows: Sequence[Row], topology: Topology) -> Figure | None:
    keep, excluded = ttft_view(rows)
    series = boundary_ttfts(_kept(rows, keep), topology)
    if not series:
        return None
    fig, ax = plt.subplots(figsize=(WIDTH_IN, 4.2))
    allv = np.concatenate([v[np.isfinite(v)] for v in series.values()])
    for name, v in series.items():
        x = np.sort(v[np.isfinite(v)])
        ax.step(x, np.arange(1, x.size + 1) / x.size, where="post", label=name, color=color_of(name.split(" ")[0], topology), linewidth=1.6)
    if spans_decades(allv):
        ax.set_xscale("log")
    ax.set_xlabel("TTFT seen at the boundary (ms)" + (", log scale" if spans_decades(allv) else ""))
    ax.set_ylabel("fraction of requests")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3, which="both")
    ax.legend(loc="lower right", fontsize=9)
    cap = f"each boundary's time from request arrival to first token out; {excluded.sentence('requests').lower()}"
    return Figure("ttft_cdf", "TTFT CDF per boundary", "image/png", _png(fig), cap, section="ttft")


# ----------------------------------------------------------------------------------- waterfall


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
    by_points = {(d.start, d.end): d for d in registry(topology) if d.end}
    segs = []
    for (pa, oa), (pb, ob) in zip(seq, seq[1:], strict=False):
        a, b = row.points[pa].unix_ns, row.points[pb].unix_ns
        owner = oa if oa == ob else NETWORK
        d = by_points.get((pa, pb)) if oa == ob else None
        label = f"{pa} -> {pb}" if d is None else d.label
        segs.append((label, owner, (a - t0) / 1e6, (b - a) / 1e6))
    return segs


def median_row(rows: Sequence[Row]) -> Row | None:
    keep, _ = ttft_view(rows)
    ttft = delta_ms(rows, SYSTEM_TTFT)
    idx = np.flatnonzero(np.isfinite(ttft) & np.asarray(keep, dtype=bool))
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
    fig, ax = plt.subplots(figsize=(WIDTH_IN, 0.3 * len(segs) + 1.4))
    for i, (label, owner, start, width) in enumerate(segs):
        ax.barh(i, max(width, 1e-3), left=start, color=color_of(owner, topology))
        ax.text(start + max(width, 0), i, f" {width:.2f} ms", va="center", fontsize=8)
    ax.set_yticks(range(len(segs)), [s[0] for s in segs], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ms after the client sent the request")
    handles = [plt.Rectangle((0, 0), 1, 1, color=color_of(o, topology)) for o in owners]
    ax.legend(handles, owners, fontsize=8, loc="lower right")
    ax.grid(axis="x", alpha=0.3)
    ttft = r.deltas[SYSTEM_TTFT].ns / 1e6
    return Figure("waterfall", "Waterfall of the median request", "image/png", _png(fig),
                  f"request {r.request_id or r.trace_id}, system TTFT {ttft:.2f} ms", section="headline")


# ------------------------------------------------------------------------------- gap histogram

GAP_FLOOR_MS = 0.01  # gaps below this (tokens released in one write) are drawn at it on the log axis


def itl_histogram(inputs: ReportInputs) -> Figure | None:
    per = chunk_gaps_from_records([r for r in inputs.records if r.get("status", "ok") == "ok"])
    if per:
        v, what = np.concatenate(per), f"every {CHUNK_GAP} of completed streams at the client (load generator records)"
    else:
        keep, _ = completed_view(inputs.rows)
        rows = _kept(inputs.rows, keep)
        link = inputs.topology.links[0].name if inputs.topology.links else ""
        v = np.array([r.gaps[link].down.mean_ns / 1e6 for r in rows if link in r.gaps and r.gaps[link].down and r.gaps[link].down.mean_ns is not None])
        what = f"mean {CHUNK_GAP} per completed request at the {link} tap"
    v = v[np.isfinite(v)]
    if not v.size:
        return None
    clipped = np.clip(v, GAP_FLOOR_MS, None)
    tiny = int((v < GAP_FLOOR_MS * 10).sum())
    fig, ax = plt.subplots(figsize=(WIDTH_IN, 3.8))
    hi = max(float(clipped.max()), GAP_FLOOR_MS * 10)
    bins = np.logspace(np.log10(GAP_FLOOR_MS), np.log10(hi * 1.05), 60)
    ax.hist(clipped, bins=bins, color=color_of(inputs.topology.client.name, inputs.topology))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(f"{CHUNK_GAP} (ms, log scale; gaps under {GAP_FLOOR_MS:g} ms drawn at {GAP_FLOOR_MS:g})")
    ax.set_ylabel("gaps (count, log scale)")
    ax.grid(alpha=0.3, which="both")
    share = tiny / v.size
    cap = (f"{what}. {share:.0%} of the gaps are under {GAP_FLOOR_MS * 10:g} ms: a component that releases tokens in windows "
           "(the reference firewall's streaming inspection, outbound.window_tokens) writes several tokens at once, so the gaps inside "
           "a window are ~0 and the gap before each window carries the whole wait. Two modes on a log axis, not a spike at 0.")
    return Figure("itl_histogram", f"{CHUNK_GAP} histogram", "image/png", _png(fig), cap, section="itl")  # name kept: the HTML anchor


# ------------------------------------------------------------------------- contribution over time


def contribution_series(rows: Sequence[Row], topology: Topology) -> dict[str, np.ndarray]:
    """Per request, each part's TTFT contribution (ms): :func:`decomposition.component_parts`."""
    return component_parts(rows, topology)


def contribution_over_time(rows: Sequence[Row], topology: Topology, bins: int = 20) -> Figure | None:
    keep, excluded = ttft_view(rows)
    rows = _kept(rows, keep)
    t = seconds_since_first(rows, point(topology.client.name, Role.SEND))
    ok = np.isfinite(t) & np.isfinite(delta_ms(rows, SYSTEM_TTFT))
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
    fig, ax = plt.subplots(figsize=(WIDTH_IN, 4))
    ax.stackplot(centers, *stacked, labels=list(series), colors=[color_of(k, topology) for k in series])
    ax.set_xlabel("seconds into the run (s)")
    ax.set_ylabel("TTFT contribution, median per bin (ms)")
    ax.legend(fontsize=9, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=len(series), frameon=False)
    ax.grid(alpha=0.3)
    cap = f"median of each part's TTFT contribution per time bin, stacked; {excluded.sentence('requests').lower()}"
    return Figure("contribution_over_time", "Per-component contribution over time", "image/png", _png(fig), cap, section="decomposition")


# ------------------------------------------------------------------------------ cascade timeline


def cascade_timeline(rows: Sequence[Row], topology: Topology, max_requests: int = 20) -> Figure | None:
    cases = sorted(find_cascades(rows, topology), key=lambda c: -c.engine_busy_s)[:max_requests]
    if not cases:
        return None
    client, engine = topology.client.name, topology.engine.name
    fig, ax = plt.subplots(figsize=(WIDTH_IN, 0.45 * len(cases) + 1.6))
    for i, c in enumerate(cases):
        ax.barh(i + 0.18, c.client_error_s, height=0.3, color=color_of(client, topology), label="client waiting for an answer" if i == 0 else None)
        ax.barh(i - 0.18, c.engine_end_s - c.engine_start_s, left=c.engine_start_s, height=0.3, color=color_of(engine, topology),
                label="engine generating" if i == 0 else None)
        ax.barh(i - 0.18, c.after_gave_up_s, left=c.engine_end_s - c.after_gave_up_s, height=0.3, color="none", hatch="///", edgecolor="#B22222",
                label="engine work after the give-up (for nobody)" if i == 0 else None)
        ax.plot([c.gave_up_s, c.gave_up_s], [i - 0.42, i + 0.42], color=color_of(c.gave_up_by, topology), linewidth=2.5,
                label=f"{c.gave_up_by} gives up" if i == 0 else None)
        ax.text(c.engine_end_s, i - 0.18, f"  {c.engine_busy_s:.2f} s engine, {c.after_gave_up_s:.2f} s after give-up", va="center", fontsize=8)
    ax.set_yticks(range(len(cases)), [c.request_id for c in cases], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("seconds after the client sent the request (s)")
    ax.set_xlim(0, max(c.engine_end_s for c in cases) * 1.35)
    ax.grid(axis="x", alpha=0.3)
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=4, fontsize=9, frameon=False)
    return Figure("cascade_timeline", "Timeout cascades: who gave up, and how long the engine kept going", "image/png", _png(fig),
                  f"the {len(cases)} costliest cascades; the hatched part is engine time after the first layer gave up", section="cascades")


def report_figures(inputs: ReportInputs) -> list[Figure]:
    rows, topo = inputs.rows, inputs.topology
    figs = [decomposition_bars(rows, topo), waterfall(rows, topo), ttft_cdf(rows, topo), itl_histogram(inputs),
            contribution_over_time(rows, topo), cascade_timeline(rows, topo)]
    return [f for f in figs if f is not None]
