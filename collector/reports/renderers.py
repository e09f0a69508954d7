"""Renderer registry: each output format registers under a name; :func:`write_report` writes them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from deltatap.collector.reports.model import Report
from deltatap.collector.reports.render_csv import render_csv
from deltatap.collector.reports.render_html import render_html
from deltatap.collector.reports.render_json import render_json
from deltatap.collector.reports.render_markdown import render_markdown
from deltatap.core.config import ConfigError

# name -> report -> {relative file name: text}
RENDERERS: dict[str, Callable[[Report], dict[str, str]]] = {}


def register_renderer(name: str, fn: Callable[[Report], dict[str, str]]) -> None:
    if name in RENDERERS:
        raise ValueError(f"renderer {name!r} registered twice")
    RENDERERS[name] = fn


def _single(filename: str, fn: Callable[[Report], str]) -> Callable[[Report], dict[str, str]]:
    return lambda report: {filename: fn(report)}


register_renderer("markdown", _single("report.md", render_markdown))
register_renderer("json", _single("report.json", render_json))
register_renderer("html", _single("report.html", render_html))
register_renderer("csv", lambda report: {f"csv/{k}": v for k, v in render_csv(report).items()})


def parse_formats(value: str) -> list[str]:
    names = [v.strip() for v in value.split(",") if v.strip()]
    if names == ["all"]:
        return list(RENDERERS)
    unknown = [n for n in names if n not in RENDERERS]
    if unknown or not names:
        raise ConfigError(f"--formats: unknown format(s) {unknown or value!r}; choose from {sorted(RENDERERS)} or 'all'")
    return names


def write_report(report: Report, out_dir: str | Path, formats: list[str] | None = None, stem: str = "") -> dict[str, Path]:
    """Write ``report`` in each format under ``out_dir``; returns {format: main file}. ``stem`` prefixes
    file names so several reports can share a directory (``guardrails-report.md``)."""
    out = Path(out_dir)
    written: dict[str, Path] = {}
    for name in formats or list(RENDERERS):
        files = RENDERERS[name](report)
        for rel, text in files.items():
            p = out / (f"{stem}{rel}" if "/" not in rel else rel.replace("csv/", f"{stem}csv/", 1))
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text, encoding="utf-8")
            written.setdefault(name, p if len(files) == 1 else p.parent)
    return written
