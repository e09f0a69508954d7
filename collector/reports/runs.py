"""Loading a run for the reports: a rows file or a run directory.

A run directory holds the collector's rows file (``rows.parquet``, ``rows.csv`` or ``rows.jsonl``,
read by :func:`deltatap.collector.sinks.read_rows`), and optionally the load generator's ``records.jsonl``
(docs/records.md), a ``topology.yaml`` and a ``run.json`` with run metadata (seed, workload,
config hash, ...). ``deltatap demo`` writes exactly this layout.

The records may live elsewhere (``--records out/load/records.jsonl``): the load generator's ``run.json``
beside them is read too, and what Appendix C.1 asks for (model, hardware, software, SUT boundary,
workload, load model) is taken from it where the run directory's own ``run.json`` does not say
(:func:`c1_from_loadgen`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deltatap.collector.rows import Row
from deltatap.core.config import ConfigError
from deltatap.core.topology import Topology

ROWS_FILES = ("rows.parquet", "rows.jsonl", "rows.csv")
RECORDS_FILE = "records.jsonl"
META_FILE = "run.json"
TOPOLOGY_FILE = "topology.yaml"
PROVENANCE_FILE = "provenance.json"  # deltatap.core.provenance, written by collect and report


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


def _read_json(path: Path) -> dict[str, Any]:
    from deltatap.collector.ingest import read_json_object

    return read_json_object(path, f"run metadata ({path.name})")


def _load_model(meta: dict[str, Any]) -> str | None:
    o = meta.get("options") or {}
    mode = meta.get("mode") or o.get("mode")
    if o.get("rate"):
        s = f"open-loop {o.get('arrival', 'poisson')} {o['rate']:g} req/s"
    elif o.get("batch") or mode == "batch":
        s = f"barrier batches of {o.get('batch')}"
    elif o.get("concurrency") or mode == "closed":
        s = f"closed-loop concurrency {o.get('concurrency') or 1}"
    else:
        return None
    if o.get("requests"):
        s += f", {o['requests']} requests"
    if o.get("duration_s"):
        s += f", {o['duration_s']:g} s"
    return s


def c1_from_loadgen(meta: dict[str, Any], summary: dict[str, Any] | None = None) -> dict[str, Any]:
    """Appendix C.1 fields (``model``, ``hardware``, ``software``, ``sut_boundary``, ``load_model``, ``workload``)
    from the load generator's ``run.json`` (loadgen/run.py) and ``summary.json``, where it knows them.
    The load generator runs beside the system under test, so hardware is what its GPU report saw, if anything."""
    o = meta.get("options") or {}
    out: dict[str, Any] = {}
    model = meta.get("model") or o.get("model")
    if model:
        out["model"] = model
    target = o.get("target")
    if target:
        out["sut_boundary"] = f"compound: everything behind {target} (as the load generator saw it)"
        version = f" {meta['deltatap_version']}" if meta.get("deltatap_version") else ""
        out["software"] = f"not recorded; {o.get('endpoint') or 'chat'} API at {target}, driven by the deltatap{version} load generator"
    gpu = (summary or {}).get("gpu") or {}
    names = [str(g.get("name")) for g in gpu.get("gpus") or gpu.get("devices") or [] if isinstance(g, dict) and g.get("name")]
    if gpu.get("available") and names:
        counts: dict[str, int] = {}
        for n in names:
            counts[n] = counts.get(n, 0) + 1
        out["hardware"] = {"accelerator_summary": ", ".join(f"{n} x {c}" for n, c in counts.items()) + " (seen by the load generator's host)"}
    else:
        out["hardware"] = {"accelerator_summary": "not recorded (the load generator's run.json has no hardware class)"}
    lm = _load_model(meta)
    if lm:
        out["load_model"] = lm
    if meta.get("workload") is not None:
        out["workload"] = meta["workload"]
    return out


def _is_loadgen_meta(meta: dict[str, Any]) -> bool:
    return "run_id" in meta and isinstance(meta.get("options"), dict)


def _metadata(base: Path, rec_path: Path | None) -> dict[str, Any]:
    """The run directory's run.json, filled in from the load generator's run.json beside the records."""
    meta = _read_json(base / META_FILE) if (base / META_FILE).is_file() else {}
    lg_path = rec_path.parent / META_FILE if rec_path is not None else None
    lg = meta if lg_path is None or not lg_path.is_file() or lg_path.resolve() == (base / META_FILE).resolve() else _read_json(lg_path)
    if lg and _is_loadgen_meta(lg):
        summary_path = (lg_path or base / META_FILE).parent / "summary.json"
        summary = _read_json(summary_path) if summary_path.is_file() else None
        filled = c1_from_loadgen(lg, summary)
        if lg is not meta:
            meta = {**meta, "load_generator": lg}
        meta = {**filled, **{k: v for k, v in meta.items() if v not in (None, "", {})}}
    return _with_provenance(meta, base, lg)


def _with_provenance(meta: dict[str, Any], base: Path, lg: dict[str, Any] | None) -> dict[str, Any]:
    """Fill C.1 from the provenance records the run left (deltatap.core.provenance): the load generator's (its
    run.json's ``provenance``: seed, workload bytes, the target's versions, its host's hardware class) first,
    then the collector's ``provenance.json`` (the versions the spans carried, the topology)."""
    from deltatap.collector.reports.metadata import with_provenance

    provs = [p for p in ((lg or {}).get("provenance"), meta.get("provenance")) if isinstance(p, dict)]
    if (base / PROVENANCE_FILE).is_file():
        provs.append(_read_json(base / PROVENANCE_FILE))
    if not provs:
        return meta
    merged = dict(provs[0])
    merged["components"] = {}
    for p in reversed(provs):
        merged["components"].update(p.get("components") or {})
    for p in provs[1:]:
        for k, v in p.items():
            if merged.get(k) is None and v is not None:
                merged[k] = v
    return with_provenance(meta, merged)


def load_run(path: str | Path, label: str = "run", records: str | Path | None = None) -> RunData:
    from deltatap.collector.ingest import check_record, load_topology_offline
    from deltatap.collector.sinks import read_jsonl, read_rows

    p = Path(path)
    rows_path = _rows_file(p)
    run = RunData(label=label, path=p, rows=list(read_rows(rows_path)))
    base = rows_path.parent
    rec_path = Path(records) if records else base / RECORDS_FILE
    if records and not rec_path.is_file():
        raise ConfigError(f"--records {rec_path}: {'a directory; name its records.jsonl' if rec_path.is_dir() else 'file not found'}")
    if rec_path.is_file():
        run.records = read_jsonl(rec_path, "the load generator's records.jsonl (JSON lines, docs/records.md)")
        for i, doc in enumerate(run.records, 1):
            check_record(doc, f"{rec_path}:{i}")
    run.metadata = _metadata(base, rec_path if rec_path.is_file() else None)
    if (base / TOPOLOGY_FILE).is_file():
        run.topology = load_topology_offline(base / TOPOLOGY_FILE)
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
