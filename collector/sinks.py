"""Rows files: Parquet (pyarrow), CSV and JSON lines, chosen by suffix; written in batches, read back whole.

Columns are :func:`deltatap.collector.rows.record_columns` for the topology (stable across runs); Parquet
columns are typed (int64 ns, bool, string). A point or delta outside the topology's column set
(a span naming a component the topology lacks) is dropped from the file with one warning.
"""

from __future__ import annotations

import csv
import json
import logging
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from deltatap.collector.batch import records
from deltatap.collector.rows import ROW_SCHEMA_VERSION, Row, from_record, record_columns
from deltatap.core.config import ConfigError
from deltatap.core.topology import Topology

log = logging.getLogger("deltatap.collector")

ROW_FORMATS = {".parquet": "parquet", ".csv": "csv", ".jsonl": "jsonl", ".json": "jsonl"}
_INT_SUFFIXES = (".unix_ns", ".unc_ns", ".ns", ".err_ns", ".count", ".mean_ns", ".p99_ns", ".max_ns")
_INT_COLUMNS = {"schema_version", "start_unix_ns", "http_status", "tokens_in", "tokens_out", "cascade.engine_end_unix_ns", "cascade.engine_busy_after_gave_up_ns", "cascade.tokens_after_gave_up"}


def column_type(name: str) -> pa.DataType:
    if name in _INT_COLUMNS or name.endswith(_INT_SUFFIXES):
        return pa.int64()
    if name.endswith(".within"):
        return pa.bool_()
    return pa.string()


def row_format(path: str | Path) -> str:
    fmt = ROW_FORMATS.get(Path(path).suffix.lower())
    if fmt is None:
        raise ConfigError(f"{path}: unknown rows format; expected a deltatap rows file named *.parquet, *.csv or *.jsonl, or a run directory")
    return fmt


class RowWriter:
    """Appends rows to one file; ``close()`` finishes it (Parquet needs its footer)."""

    def __init__(self, path: str | Path, topology: Topology) -> None:
        self.path = Path(path)
        self.format = row_format(self.path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.columns = record_columns(topology)
        self.topology = topology
        self.rows_written = 0
        self._warned = False
        self._pq: pq.ParquetWriter | None = None
        self._fh = None
        self._csv: Any = None
        if self.format == "parquet":
            self.schema = pa.schema([(c, column_type(c)) for c in self.columns])
        else:
            self._fh = self.path.open("w", encoding="utf-8", newline="")
            if self.format == "csv":
                self._csv = csv.DictWriter(self._fh, fieldnames=self.columns, extrasaction="ignore")
                self._csv.writeheader()

    def _records(self, rows: Iterable[Row]) -> list[dict[str, Any]]:
        recs = []
        known = set(self.columns)
        for rec in records(rows if isinstance(rows, list) else list(rows), self.topology):  # a block's rows: from its columns
            if not self._warned and len(rec) > len(known):
                extra = sorted(set(rec) - known)[:5]
                log.warning("%s: columns outside topology %r dropped (e.g. %s)", self.path, self.topology.name, extra)
                self._warned = True
            recs.append(rec)
        return recs

    def write(self, rows: list[Row]) -> None:
        if not rows:
            return
        recs = self._records(rows)
        if self.format == "parquet":
            table = pa.Table.from_pydict({c: [r.get(c) for r in recs] for c in self.columns}, schema=self.schema)
            if self._pq is None:
                self._pq = pq.ParquetWriter(self.path, self.schema)
            self._pq.write_table(table)
        elif self.format == "csv":
            self._csv.writerows(recs)
            self._fh.flush()
        else:
            for r in recs:
                self._fh.write(json.dumps({c: r.get(c) for c in self.columns}) + "\n")
            self._fh.flush()
        self.rows_written += len(rows)

    def close(self) -> None:
        if self.format == "parquet":
            if self._pq is None:  # no rows: still leave a readable, empty file
                pq.write_table(self.schema.empty_table(), self.path)
            else:
                self._pq.close()
        elif self._fh is not None:
            self._fh.close()


def write_rows(rows: list[Row], path: str | Path, topology: Topology) -> Path:
    w = RowWriter(path, topology)
    try:
        w.write(rows)
    finally:
        w.close()
    return w.path


ROWS_EXPECTED = "a deltatap rows file (written by `deltatap collect` or `deltatap report --out`)"


def _read_parquet(path: Path) -> list[dict[str, Any]]:
    try:
        return pq.read_table(path).to_pylist()
    except (pa.ArrowException, OSError) as exc:
        why = re.sub(r"^Could not open Parquet input source '.*?': ", "", str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        raise ConfigError(f"{path}: not a readable Parquet file ({why}); expected {ROWS_EXPECTED}") from None


def _not_text(path: Path, exc: UnicodeDecodeError) -> ConfigError:
    return ConfigError(f"{path}: not a text file (byte {exc.start} is not UTF-8); expected {ROWS_EXPECTED}")


def _read_csv(path: Path) -> list[dict[str, Any]]:
    try:
        with path.open(encoding="utf-8", newline="") as fh:
            reader = csv.DictReader(fh)
            if "trace_id" not in (reader.fieldnames or ()):  # a rows CSV always has its header (RowWriter writes it first)
                raise ConfigError(f"{path}: no trace_id column in its header; expected {ROWS_EXPECTED}")
            return list(reader)
    except UnicodeDecodeError as exc:
        raise _not_text(path, exc) from None
    except csv.Error as exc:
        raise ConfigError(f"{path}: not a CSV file ({exc}); expected {ROWS_EXPECTED}") from None


def _one_document(path: Path) -> bool:
    """Whether the file is one (pretty-printed) JSON document: a report's JSON given where JSON lines belong."""
    try:
        json.loads(path.read_text(encoding="utf-8"))
    except ValueError:  # JSONDecodeError and UnicodeDecodeError
        return False
    return True


def read_jsonl(path: Path, expected: str = "JSON lines") -> list[dict[str, Any]]:
    """Every non-blank line of a JSON-lines file; a bad line is a ConfigError naming the file and line."""
    out = []
    try:
        with path.open(encoding="utf-8") as fh:
            for i, line in enumerate(fh, 1):
                if line.strip():
                    try:
                        out.append(json.loads(line))
                    except json.JSONDecodeError as exc:
                        if not out and _one_document(path):
                            raise ConfigError(f"{path}: one JSON document, not JSON lines; expected {expected}") from None
                        raise ConfigError(f"{path}:{i}: not JSON ({exc.msg})") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not a text file (byte {exc.start} is not UTF-8); expected {expected}") from None
    return out


_READERS: dict[str, Callable[[Path], list[dict[str, Any]]]] = {"parquet": _read_parquet, "csv": _read_csv,
                                                               "jsonl": lambda p: read_jsonl(p, ROWS_EXPECTED)}


def read_rows(path: str | Path) -> list[Row]:
    """Rows from a file written by :class:`RowWriter` (any of the three formats)."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"{p}: file not found")
    recs = _READERS[row_format(p)](p)
    versions = {r.get("schema_version") for r in recs}
    if recs and {str(v) for v in versions} != {str(ROW_SCHEMA_VERSION)}:  # (a CSV's are strings)
        found = sorted("missing" if v is None else str(v) for v in versions)
        raise ConfigError(f"{p}: rows schema_version {', '.join(found)}; this deltatap reads {ROW_SCHEMA_VERSION} "
                          f"(docs/collector.md; re-create the rows with this deltatap's `deltatap report --from SPANS --out DIR`)")
    try:
        return [from_record(r) for r in recs]
    except (KeyError, ValueError, TypeError, AttributeError) as exc:
        raise ConfigError(f"{p}: not a deltatap rows file ({exc})") from None
