"""Loading the runs to compare and building the comparison (pure: the renderers only format it).

A run is given as ``PATH`` or ``LABEL=PATH``. ``PATH`` is a rows file (``rows.parquet``/``.csv``/``.jsonl`` as
the collector writes them), a directory holding one (a ``deltatap collect --out`` or ``report --out`` directory,
a demo directory), or a directory with exactly one such directory below it, at most two levels down (a bench
or referee work directory: ``RUN/collector/rows.parquet``). The run is read by the reports' loader
(:func:`deltatap.collector.reports.runs.load_run`), so its provenance (``run.json``, ``provenance.json``) comes along.

Every run after the baseline (the first, or ``--baseline LABEL``) is compared with it, per delta of the topology
(:func:`deltatap.collector.rows.delta_defs`) that both runs observed, over their successful requests, at each
percentile asked for.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from deltatap.collector.compare.stats import DiffCI, MannWhitney, Threshold, bootstrap_percentile_diff, mann_whitney, verdict
from deltatap.collector.reports.columns import delta_ms
from deltatap.collector.reports.runs import ROWS_FILES, RunData, load_run
from deltatap.collector.rows import DeltaDef, delta_defs
from deltatap.core.config import ConfigError
from deltatap.core.provenance import flag_outliers
from deltatap.core.topology import default_topology

DEFAULT_PERCENTILES = (50.0, 90.0, 99.0)
MIN_MW_SAMPLES = 8


def _find_rows_dir(p: Path) -> Path:
    if p.is_file():
        return p
    if not p.is_dir():
        raise ConfigError(f"{p}: no such file or directory (expected a rows file, or a collector, report or bench output directory)")
    if any((p / n).is_file() for n in ROWS_FILES):
        return p
    found = sorted({f.parent for n in ROWS_FILES for pattern in (f"*/{n}", f"*/*/{n}") for f in p.glob(pattern)})
    if len(found) == 1:
        return found[0]
    if found:
        listing = ", ".join(str(f) for f in found[:6]) + (" ..." if len(found) > 6 else "")
        raise ConfigError(f"{p}: holds {len(found)} runs ({listing}); name each one to compare, e.g. LABEL={found[0]}")
    raise ConfigError(f"{p}: no rows file here or below it (looked for {', '.join(ROWS_FILES)}); write one with `deltatap collect --out DIR`")


def _default_label(p: Path) -> str:
    d = p.parent if p.is_file() else p
    name = d.resolve().name
    return d.resolve().parent.name if name in ("collector", "rows") else name


def load_runs(specs: Sequence[str]) -> list[RunData]:
    if len(specs) < 2:
        raise ConfigError("give at least two runs to compare: deltatap compare RUN_A RUN_B [RUN_C ...]")
    runs: list[RunData] = []
    for spec in specs:
        label, sep, path = spec.partition("=")
        if not sep or "/" in label or not label:
            label, path = "", spec
        src = _find_rows_dir(Path(path))
        run = load_run(src, label or _default_label(src))
        if not run.rows:
            raise ConfigError(f"{path}: the rows file holds no request")
        base = run.label
        k = 2
        while any(r.label == run.label for r in runs):
            run.label = f"{base}#{k}"
            k += 1
        runs.append(run)
    return runs


@dataclass
class DeltaComparison:
    name: str
    component: str | None
    description: str
    n_a: int
    n_b: int
    cis: list[DiffCI]
    verdicts: list[str]
    mw: MannWhitney
    resampled: np.ndarray = field(repr=False)  # (len(percentiles), resamples) differences, for plots
    a_ms: np.ndarray = field(repr=False)
    b_ms: np.ndarray = field(repr=False)


@dataclass
class Pair:
    baseline: str
    candidate: str
    deltas: list[DeltaComparison]

    def regressions(self) -> list[tuple[str, float]]:
        return [(d.name, ci.q) for d in self.deltas for ci, v in zip(d.cis, d.verdicts, strict=True) if v == "regression"]


@dataclass
class Comparison:
    runs: list[RunData]
    baseline: str
    percentiles: list[float]
    threshold: Threshold
    level: float
    resamples: int
    seed: int
    pairs: list[Pair]
    run_summaries: list[dict[str, Any]]
    notes: list[str]
    outliers: list[dict[str, Any]]


def _ok(run: RunData) -> list:
    return [r for r in run.rows if r.outcome == "ok"]


def _provenance_summary(run: RunData) -> dict[str, Any]:
    m = run.metadata or {}
    prov = m.get("provenance") or {}
    hw = m.get("hardware") or prov.get("hardware") or {}
    ok = _ok(run)
    return {
        "label": run.label, "path": str(run.path), "requests": len(run.rows), "ok": len(ok),
        "seed": m.get("seed", prov.get("seed")), "suite_version": m.get("suite_version") or prov.get("suite_version"),
        "workload_sha256": m.get("workload_sha256") or prov.get("workload_sha256"),
        "topology_sha256": m.get("topology_sha256") or prov.get("topology_sha256"),
        "deltatap_version": prov.get("deltatap_version") or m.get("deltatap_version"),
        "hardware": hw.get("accelerator_summary"), "hardware_fingerprint": hw.get("fingerprint_hash"),
    }


def _mismatch_notes(summaries: list[dict[str, Any]], baseline: str) -> list[str]:
    base = next(s for s in summaries if s["label"] == baseline)
    notes = []
    for key, what in (("hardware_fingerprint", "hardware class"), ("workload_sha256", "workload bytes"), ("topology_sha256", "topology"),
                      ("suite_version", "suite version"), ("deltatap_version", "deltatap version")):
        for s in summaries:
            if s is not base and base.get(key) and s.get(key) and s[key] != base[key]:
                notes.append(f"{s['label']} and {baseline} differ in {what}: a difference below mixes it with whatever was changed on purpose.")
    return notes


# an upper bound on --resamples: the resampled differences are held per delta and pair (a billion took the
# memory of the host, and a numpy allocation that large does not see Ctrl-C)
MAX_RESAMPLES = 100_000


def compare(runs: list[RunData], baseline: str | None = None, percentiles: Sequence[float] = DEFAULT_PERCENTILES,
            threshold: Threshold | None = None, level: float = 0.95, resamples: int = 2000, seed: int = 0,
            deltas: Sequence[str] | None = None) -> Comparison:
    threshold = threshold or Threshold(5.0, True)
    labels = [r.label for r in runs]
    base_label = baseline or labels[0]
    if base_label not in labels:
        raise ConfigError(f"--baseline {base_label!r}: no such run; runs: {', '.join(labels)}")
    for q in percentiles:
        if not 0 <= q <= 100:
            raise ConfigError(f"--percentiles {q:g}: must be between 0 and 100")
    if not 0 < level < 1:
        raise ConfigError(f"--confidence {level:g}: must be between 0 and 1 (0.95 for 95 %)")
    if not 100 <= resamples <= MAX_RESAMPLES:
        raise ConfigError(f"--resamples {resamples}: use between 100 and {MAX_RESAMPLES} (2000 is the default; every "
                          "resample of every delta is kept in memory for the plots)")
    base = next(r for r in runs if r.label == base_label)
    topo = base.topology or default_topology()
    defs: list[DeltaDef] = delta_defs(topo)
    known = [d.name for d in defs]
    if deltas:
        unknown = [d for d in deltas if d not in known]
        if unknown:
            raise ConfigError(f"--deltas {', '.join(unknown)}: not a delta of topology {topo.name!r}; deltas: {', '.join(known)}")
        defs = [d for d in defs if d.name in deltas]
    qs = [float(q) for q in percentiles]
    base_rows = _ok(base)
    base_vals = {d.name: delta_ms(base_rows, d.name) for d in defs}
    pairs = []
    for k, run in enumerate(r for r in runs if r.label != base_label):
        rows = _ok(run)
        out: list[DeltaComparison] = []
        for j, d in enumerate(defs):
            a, b = base_vals[d.name], delta_ms(rows, d.name)
            na, nb = int(np.isfinite(a).sum()), int(np.isfinite(b).sum())
            if not na or not nb:
                continue
            cis, resampled = bootstrap_percentile_diff(a, b, qs, resamples, level, seed + 7919 * k + j)
            out.append(DeltaComparison(d.name, d.component, d.description, na, nb, cis, [verdict(c, threshold) for c in cis],
                                       mann_whitney(a, b), resampled, a[np.isfinite(a)], b[np.isfinite(b)]))
        pairs.append(Pair(base_label, run.label, out))
    summaries = [_provenance_summary(r) for r in runs]
    notes = _mismatch_notes(summaries, base_label)
    small = sorted({f"{p.candidate}: {d.name}" for p in pairs for d in p.deltas if min(d.n_a, d.n_b) < MIN_MW_SAMPLES})
    if small:
        notes.append(f"Fewer than {MIN_MW_SAMPLES} requests on a side ({'; '.join(small[:5])}{' ...' if len(small) > 5 else ''}): "
                     "the Mann-Whitney p-value and the bootstrap interval are rough there.")
    if not any(p.deltas for p in pairs):
        raise ConfigError("no delta was observed in both the baseline and another run: nothing to compare")
    return Comparison(runs, base_label, qs, threshold, level, resamples, seed, pairs, summaries, notes, _outliers(runs, defs, summaries))


def _outliers(runs: list[RunData], defs: list[DeltaDef], summaries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Repeated runs (3 or more of one hardware class and workload): a run whose median of a delta lies beyond
    3 sigma of the other runs of its cluster is flagged (llm-speed: flagged, never dropped)."""
    if len(runs) < 3:
        return []
    clusters = [(s.get("hardware_fingerprint"), s.get("workload_sha256")) for s in summaries]
    out = []
    for d in defs:
        med = [float(np.nanmedian(v)) if np.isfinite(v := delta_ms(_ok(r), d.name)).any() else math.nan for r in runs]
        for r, m, flag in zip(runs, med, flag_outliers(med, clusters), strict=True):
            if flag:
                out.append({"run": r.label, "delta": d.name, "p50_ms": m})
    return out
