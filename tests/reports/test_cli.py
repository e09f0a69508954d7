"""`deltatap guardrails`, `deltatap cascade` and `deltatap summary` over rows files on disk."""

from __future__ import annotations

import json

import pytest

from deltatap.collector.sinks import write_rows
from deltatap.app.cli import main
from deltatap.core.topology import default_topology
from tests.reports.factories import MS, S, T0, cascade, row
from tests.reports.htmlcheck import parse_page


def run_dir(path, ttft_ms: float, blocked: bool = False, cascading: bool = False):
    rows = []
    for i in range(4):
        dec = "block_pattern" if blocked and i == 0 else "allow"
        r = row(i, tokens_in=100, tokens_out=20, firewall_decision=dec, outcome="refused" if dec != "allow" else "ok",
                labels={"class": "adversarial" if i == 0 else "benign"},
                deltas_ms={"system_ttft": ttft_ms + i, "system_ttlt": ttft_ms + 100 + i, "firewall_inbound": 3.0, "firewall_inbound_block": 2.0},
                points_ns={"client.send": T0, "client.end": T0 + 1 * S, "engine.queue": T0 + 5 * MS})
        if cascading and i == 3:
            r.cascade = cascade({"gateway": T0 + 500 * MS}, T0 + 900 * MS, 400 * MS, 40)
        rows.append(r)
    path.mkdir(parents=True, exist_ok=True)
    write_rows(rows, path / "rows.parquet", default_topology())
    return path


def test_guardrails_compares_labelled_runs_and_writes_every_format(tmp_path, capsys):
    base, full = run_dir(tmp_path / "base", 100.0), run_dir(tmp_path / "full", 110.0, blocked=True)
    out = tmp_path / "out"
    assert main(["guardrails", "--runs", f"baseline={base}", f"full={full}", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "Guardrail overhead across configurations" in text and "Full Filter" in text
    doc = json.loads((out / "guardrails-report.json").read_text())
    lat = doc["sections"]["guardrail_comparison"]["tables"]["guardrail_latency"]["rows"]
    assert [r["configuration"] for r in lat] == ["Baseline", "Full Filter"]
    assert lat[0]["ttft_p50_ms"] == pytest.approx(101.5) and lat[1]["ttft_p50_ms"] == pytest.approx(111.5)
    assert "guardrails.full" in doc["sections"] and "guardrails.baseline" in doc["sections"]
    acc = doc["sections"]["guardrail_comparison"]["tables"]["guardrail_accuracy"]["rows"]
    assert acc[1] == {"configuration": "Full Filter", "detection": 1.0, "false_positive": 0.0, "over_defense": None}
    assert (out / "guardrails-report.md").is_file() and (out / "guardrails-csv").is_dir()


def test_guardrails_from_a_config_file(tmp_path, capsys):
    base = run_dir(tmp_path / "base", 100.0)
    cfg = tmp_path / "g.yaml"
    cfg.write_text(f"runs: {{baseline: {base}}}\npause_threshold_ms: 2\nformats: json\nout: {tmp_path / 'o'}\n")
    assert main(["guardrails", "--config", str(cfg), "--quiet"]) == 0
    assert (tmp_path / "o" / "guardrails-report.json").is_file() and not (tmp_path / "o" / "guardrails-report.md").exists()


def test_cascade_command_reports_declared_and_observed(tmp_path, capsys):
    d = run_dir(tmp_path / "run", 100.0, cascading=True)
    topo = tmp_path / "t.yaml"
    topo.write_text(
        "components:\n  - {name: client, kind: client, timeout_s: 5}\n  - {name: gateway, kind: gateway, timeout_s: 0.5}\n"
        "  - {name: firewall, kind: firewall}\n  - {name: engine, kind: engine, timeout_s: 3}\n"
        "links:\n  - {name: edge, downstream: client, upstream: gateway}\n  - {name: gw-fw, downstream: gateway, upstream: firewall}\n"
        "  - {name: fw-engine, downstream: firewall, upstream: engine}\n"
    )
    assert main(["cascade", "--rows", str(d), "--topology", str(topo), "--out", str(tmp_path / "o"), "--formats", "json"]) == 0
    text = capsys.readouterr().out
    assert "engine waits up to 3 s for its upstream but gateway gives up after 0.5 s" in " ".join(text.split())
    doc = json.loads((tmp_path / "o" / "cascade-report.json").read_text())
    assert doc["sections"]["cascades"]["data"]["cascades"] == 1
    assert doc["sections"]["cascades"]["data"]["engine_wasted_s"] == pytest.approx(0.895)
    assert doc["sections"]["timeouts"]["data"]["mismatches"][0]["component"] == "engine"


def test_a_directory_without_rows_is_a_clear_error(tmp_path, capsys):
    assert main(["summary", str(tmp_path)]) == 2
    assert "no rows file in this directory" in capsys.readouterr().err


def test_summary_writes_the_html_page(tmp_path, capsys):
    d = run_dir(tmp_path / "run", 100.0)
    assert main(["summary", str(d), "--out", str(tmp_path / "o"), "--quiet"]) == 0
    page = parse_page((tmp_path / "o" / "report.html").read_text())
    assert "minimum" in page.ids and "ttft" in page.ids and page.external_refs == []


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["guardrails"], "give either --runs LABEL=DIR"),
        (["guardrails", "--runs", "baseline"], "expected LABEL=DIR"),
        (["guardrails", "--runs", "a=/nonexistent/x"], "no such file or directory"),
        (["summary", "/nonexistent/run"], "no such file or directory"),
        (["cascade", "--formats", "pdf", "--out", "/tmp/x"], "unknown format"),
    ],
)
def test_bad_input_is_a_clear_error(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err
