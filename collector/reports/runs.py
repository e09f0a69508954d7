"""Loading a run for the reports: a rows file or a run directory.

A run directory holds the collector's rows file (``rows.parquet``, ``rows.csv`` or ``rows.jsonl``,
read by :func:`deltatap.collector.sinks.read_rows`), and optionally the load generator's ``records.jsonl``
(docs/records.md), a ``topology.yaml`` and a ``run.json`` with run metadata (seed, workload,
config hash, ...). ``deltatap demo`` writes exactly this layout.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deltatap.collector.rows import Row
from deltatap.core.config import ConfigError
from deltatap.core.topology import Topology, load_topology

ROWS_FILES = ("rows.parquet", "rows.jsonl", "rows.csv")
RECORDS_FILE = "records.jsonl"
META_FILE = "run.json"
TOPOLOGY_FILE = "topology.yaml"


@dataclass
class RunData:
    label: str
    path: Path
    rows: list[Row]
    records: list[dict[str, Any]] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    topology: Topology | None = None


def _rows_file(path: Path) -> Path:
    if path.is_file():
        return path
    if not path.is_dir():
        raise ConfigError(f"{path}: no such file or directory (expected a run directory or a rows file)")
    for name in ROWS_FILES:
        if (path / name).is_file():
            return path / name
    raise ConfigError(f"{path}: no rows file in this directory (looked for {', '.join(ROWS_FILES)}; write one with `deltatap collect --out {path}`)")


def load_run(path: str | Path, label: str = "run", records: str | Path | None = None) -> RunData:
    from deltatap.collector.sinks import read_jsonl, read_rows

    p = Path(path)
    rows_path = _rows_file(p)
    run = RunData(label=label, path=p, rows=list(read_rows(rows_path)))
    base = rows_path.parent
    rec_path = Path(records) if records else base / RECORDS_FILE
    if records and not rec_path.is_file():
        raise ConfigError(f"--records {rec_path}: file not found")
    if rec_path.is_file():
        run.records = read_jsonl(rec_path)
    if (base / META_FILE).is_file():
        try:
            run.metadata = json.loads((base / META_FILE).read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{base / META_FILE}: not valid JSON ({exc.msg})") from None
    if (base / TOPOLOGY_FILE).is_file():
        run.topology = load_topology(base / TOPOLOGY_FILE)
    return run


def parse_run_specs(specs: Sequence[str]) -> list[tuple[str, str]]:
    """``LABEL=PATH`` pairs (``--runs baseline=runs/a full=runs/b``), labels unique."""
    out: list[tuple[str, str]] = []
    for s in specs:
        label, sep, path = s.partition("=")
        if not sep or not label or not path:
            raise ConfigError(f"--runs {s!r}: expected LABEL=DIR, e.g. baseline=runs/baseline")
        if any(label == lbl for lbl, _ in out):
            raise ConfigError(f"--runs: label {label!r} given twice")
        out.append((label, path))
    return out
