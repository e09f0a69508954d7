"""The files a collector run or a report leaves in its output directory.

* ``summary.json``        delta -> {p50_ms, p90_ms, p95_ms, p99_ms, p999_ms, mean_ms, min_ms, max_ms, count, error_bound_ms,
                           bounded_share, bound_mean_ms, bound_max_ms, unbounded_share}
* ``summary.csv`` / ``summary.md``   the same as a table
* ``decomposition.md`` / ``.csv`` / ``.json``   the profiles draft section 6 table
* ``sketches.json``       the mergeable aggregate (``deltatap report --from a/sketches.json b/sketches.json``)
* ``stats.json``          collector counters (spans, traces, evictions, late spans, joins)
* ``provenance.json``     deltatap.core.provenance: the senders' versions (their spans' resource attributes), the
  models asked for, the topology hash, the suite version, the hardware class
* ``rows.parquet`` (or ``.csv`` / ``.jsonl``) is written by the row sink during the run
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from deltatap.collector.sketches import Aggregator
from deltatap.collector.table import decomposition, render_csv, render_json, render_markdown, summary_csv, summary_json, summary_markdown
from deltatap.core.topology import Topology


def write_outputs(agg: Aggregator, topo: Topology, out: str | Path, stats: dict[str, Any] | None = None, stat: str = "p50_ms") -> dict[str, Path]:
    d = Path(out)
    d.mkdir(parents=True, exist_ok=True)
    lines = decomposition(agg, topo, stat)
    files = {
        "summary.json": summary_json(agg, topo),
        "summary.csv": summary_csv(agg, topo),
        "summary.md": summary_markdown(agg, topo),
        "decomposition.md": render_markdown(lines, agg, stat),
        "decomposition.csv": render_csv(lines, agg, stat),
        "decomposition.json": render_json(lines, agg, stat),
        "sketches.json": json.dumps(agg.to_dict()),
    }
    if stats is not None:
        files["stats.json"] = json.dumps(stats, indent=2)
    written = {}
    for name, text in files.items():
        p = d / name
        p.write_text(text, encoding="utf-8")
        written[name] = p
    return written


def note_senders(spans, seen: dict[Any, dict], models: set[str]) -> None:
    """Remember each sender's attributes (service.name/version, component) once, and the models the requests asked
    for: what ``provenance.json`` says about the run's components. A live span (``collector.compact``) is read once
    per layout (the service, version and model are part of it), so this costs a set look-up per span."""
    for s in spans:
        layout = getattr(s, "layout", None)
        if layout is not None:
            if layout in seen:
                continue
            seen[layout] = {}
        model = s.attrs.get("gen_ai.request.model")
        if model:
            models.add(str(model))
        key = (s.attrs.get("service.name"), s.attrs.get("deltatap.component"))
        if key not in seen:
            seen[key] = s.attrs


def write_provenance(out: str | Path, tool: str, topo: Topology, seen: dict[tuple, dict], models: set[str],
                     inputs: dict[str, Any] | None = None) -> Path:
    """``provenance.json`` (:func:`deltatap.core.provenance.provenance`) in the output directory."""
    from deltatap.core.provenance import provenance, versions_from_span_attrs

    extra: dict[str, Any] = {"models": sorted(models)}
    if inputs:
        extra["inputs"] = inputs
    rec = provenance(tool=tool, topology=topo, components=versions_from_span_attrs(seen.values()), extra=extra)
    p = Path(out) / "provenance.json"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(rec, indent=2, default=str) + "\n", encoding="utf-8")
    return p
