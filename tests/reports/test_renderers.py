"""Every renderer over one small hand-made report: exact text where it matters, NaN shown as missing."""

from __future__ import annotations

import csv
import io
import json

from rich.console import Console

from deltatap.collector.reports.model import Column, Figure, Report, Section, Table
from deltatap.collector.reports.render_csv import render_csv
from deltatap.collector.reports.render_html import render_html
from deltatap.collector.reports.render_json import render_json
from deltatap.collector.reports.render_markdown import render_markdown
from deltatap.collector.reports.render_terminal import print_report
from deltatap.collector.reports.renderers import parse_formats, write_report
from tests.reports.htmlcheck import parse_page

PNG_1PX = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360000002000001e221bc330000000049454e44ae426082"
)


def small_report() -> Report:
    t = Table("lat", "Latency", [Column("metric", "Metric"), Column("value", "Value", "ms", 2), Column("n", "Count", "", 0)])
    t.add("TTFT P50", 12.3456, 10)
    t.add("TTFT P99", float("nan"), 10)
    t.add("a|b", None, 20000)
    t.footnotes.append("* a footnote")
    s = Section("lat", "Latency section", tables=[t], notes=["First sentence."], data={"x": float("nan"), "y": 2})
    return Report("Test report", metadata={"seed": 7}, sections=[s], figures=[Figure("f", "Fig", "image/png", PNG_1PX)])


def test_markdown_formats_units_missing_and_escapes_pipes():
    md = render_markdown(small_report())
    assert "| Metric | Value (ms) | Count |" in md
    assert "| TTFT P50 | 12.35 | 10 |" in md
    assert "| TTFT P99 | – | 10 |" in md
    assert "| a\\|b | – | 20,000 |" in md
    assert "First sentence." in md and "| seed | 7 |" in md  # metadata: a key/value table, folded at the end
    assert md.index("First sentence.") < md.index("<details><summary>Run metadata</summary>")


def test_csv_keeps_full_precision_and_empty_for_missing():
    files = render_csv(small_report())
    assert list(files) == ["lat.lat.csv"]
    rows = list(csv.reader(io.StringIO(files["lat.lat.csv"])))
    assert rows == [["metric", "value_ms", "n"], ["TTFT P50", "12.3456", "10"], ["TTFT P99", "", "10"], ["a|b", "", "20000"]]


def test_json_is_strict_and_nan_is_null():
    doc = json.loads(render_json(small_report()))
    rows = doc["sections"]["lat"]["tables"]["lat"]["rows"]
    assert rows[0] == {"metric": "TTFT P50", "value": 12.3456, "n": 10}
    assert rows[1]["value"] is None
    assert doc["sections"]["lat"]["data"] == {"x": None, "y": 2}
    assert doc["metadata"] == {"seed": 7}


def test_terminal_prints_tables_and_notes():
    console = Console(record=True, width=120)
    print_report(small_report(), console)
    text = console.export_text()
    assert "Latency section" in text and "First sentence." in text and "12.35" in text and "TTFT P99" in text


def test_html_is_self_contained_and_embeds_the_figure():
    page = parse_page(render_html(small_report()))
    assert page.title == "Test report"
    assert len(page.images) == 1 and page.images[0].startswith(b"\x89PNG")
    assert page.external_refs == []
    assert "table-lat" in page.ids


def test_write_report_writes_every_format(tmp_path):
    written = write_report(small_report(), tmp_path, parse_formats("all"), stem="x-")
    assert (tmp_path / "x-report.md").is_file() and (tmp_path / "x-report.json").is_file()
    assert (tmp_path / "x-report.html").is_file() and (tmp_path / "x-csv" / "lat.lat.csv").is_file()
    assert set(written) == {"markdown", "json", "html", "csv"}


def test_unknown_format_is_a_clear_error():
    import pytest

    from deltatap.core.config import ConfigError

    with pytest.raises(ConfigError, match="unknown format"):
        parse_formats("markdown,pdf")
