"""The benches' figures (PNG, embedded in the HTML report): curves over load levels, per-component
contributions by level, distributions, fits."""

from __future__ import annotations

import io
from collections.abc import Sequence

import numpy as np

from deltatap.app.bench.measure import LevelMetrics
from deltatap.collector.reports.model import Figure


def _png(fig) -> bytes:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def curve(levels: Sequence[LevelMetrics], x_title: str, knee: int | None = None, saturation: int | None = None, name: str = "curve") -> Figure:
    """Achieved throughput and TTFT/TPOT P50/P99 against the load level (§5.3.3 step 4)."""
    plt = _plt()
    x = [m.x for m in levels]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    a.plot(x, [m.output_tok_s for m in levels], "o-", label="achieved (tok/s)")
    a.plot(x, [m.goodput_rps * (m.output_tok_s / m.request_rps if m.request_rps else 0) for m in levels], "s--", label="goodput (tok/s of good requests)")
    a.set_xlabel(x_title)
    a.set_ylabel("output tokens/s")
    a.legend()
    for key, style in (("ttft", "o-"), ("tpot", "s-")):
        for q in ("p50", "p99"):
            b.plot(x, [getattr(getattr(m, key), q) for m in levels], style, alpha=1.0 if q == "p99" else 0.5, label=f"{key.upper()} {q.upper()}")
    b.set_yscale("log")
    b.set_xlabel(x_title)
    b.set_ylabel("ms")
    for idx, lab, col in ((knee, "knee", "tab:orange"), (saturation, "saturation", "tab:red")):
        if idx is not None:
            for ax in (a, b):
                ax.axvline(x[idx], color=col, ls=":", label=lab)
    b.legend(fontsize=7)
    return Figure(name, "Throughput and latency against load", "image/png", _png(fig), "left: achieved throughput; right: TTFT and TPOT percentiles (log scale)")


def components(levels: Sequence[LevelMetrics], stat: str = "p50", name: str = "components") -> Figure | None:
    """Each component's TTFT contribution at each level, stacked."""
    comps: list[str] = []
    for m in levels:
        comps += [c for c in m.deltas if c not in comps and not c.startswith("Residual")]
    if not comps:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(10, 4))
    idx = np.arange(len(levels))
    bottom = np.zeros(len(levels))
    for c in comps:
        v = np.array([max(0.0, (m.deltas.get(c) or {}).get(stat) or 0.0) for m in levels])
        ax.bar(idx, v, bottom=bottom, label=c)
        bottom += v
    ax.set_xticks(idx, [m.label for m in levels], rotation=30, fontsize=7)
    ax.set_ylabel(f"TTFT contribution {stat.upper()} (ms)")
    ax.legend(fontsize=7)
    return Figure(name, f"Per-component TTFT contribution by level ({stat.upper()})", "image/png", _png(fig), "stacked decomposition lines at each load level")


def histogram(values: np.ndarray, title: str, xlabel: str, name: str) -> Figure | None:
    v = values[np.isfinite(values)]
    if not v.size:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.hist(v, bins=min(80, max(10, v.size // 20)))
    ax.set_xlabel(xlabel)
    ax.set_ylabel("samples")
    return Figure(name, title, "image/png", _png(fig))


def scatter_fit(x: np.ndarray, y: np.ndarray, fit_x: np.ndarray, fit_y: np.ndarray, xlabel: str, ylabel: str, name: str, title: str) -> Figure:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(x, y, "o", alpha=0.5, label="requests")
    ax.plot(fit_x, fit_y, "-", label="fit")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.legend()
    return Figure(name, title, "image/png", _png(fig))


def bars(labels: Sequence[str], series: dict[str, Sequence[float]], ylabel: str, name: str, title: str) -> Figure:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 3.5))
    idx = np.arange(len(labels))
    w = 0.8 / max(1, len(series))
    for i, (k, vals) in enumerate(series.items()):
        ax.bar(idx + i * w, list(vals), w, label=k)
    ax.set_xticks(idx + w * (len(series) - 1) / 2, list(labels), fontsize=8)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=7)
    return Figure(name, title, "image/png", _png(fig))
