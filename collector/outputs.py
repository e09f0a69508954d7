"""The files a collector run or a report leaves in its output directory.

* ``summary.json``        delta -> {p50_ms, p90_ms, p95_ms, p99_ms, p999_ms, mean_ms, min_ms, max_ms, count, error_bound_ms}
* ``summary.csv`` / ``summary.md``   the same as a table
* ``decomposition.md`` / ``.csv`` / ``.json``   the profiles draft section 6 table
* ``sketches.json``       the mergeable aggregate (``deltatap report --from a/sketches.json b/sketches.json``)
* ``stats.json``          collector counters (spans, traces, evictions, late spans, joins)
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
