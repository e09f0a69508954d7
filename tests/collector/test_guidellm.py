"""GuideLLM's benchmarks JSON as client-side records (collector.ingest, guidellm): a real GuideLLM 0.8.1 run against
the reference stack (tests/fixtures/guidellm/README.md), joined with the components' own spans of the same requests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from deltatap.app.cli import main
from deltatap.collector.ingest import guidellm_records, load, load_topology_offline
from deltatap.collector.sinks import read_rows

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "guidellm"


def _guidellm_requests() -> dict[str, dict]:
    doc = json.loads((FIX / "benchmarks.json").read_text())
    return {r["request_id"]: r for b in doc["benchmarks"] for r in b["requests"]["successful"]}


def test_records_carry_guidellm_times_and_tokens():
    doc = json.loads((FIX / "benchmarks.json").read_text())
    recs = guidellm_records(doc, "benchmarks.json")
    reqs = _guidellm_requests()
    assert len(recs) == len(reqs) == 30
    for rec in recs:
        r = reqs[rec["source_request_id"]]
        ttft_ms = (rec["first_token_unix_ns"] - rec["send_unix_ns"]) / 1e6
        assert ttft_ms == pytest.approx(r["time_to_first_token_ms"], abs=1e-3)
        assert rec["output_tokens"] == r["output_metrics"]["text_tokens"] and rec["status"] == "ok" and rec["request_id"] == ""


def test_report_joins_guidellm_with_the_components_spans(tmp_path, capsys):
    rc = main(["report", "--from", str(FIX / "components.otlp.jsonl"), str(FIX / "benchmarks.json"), "--topology", str(FIX / "topology.yaml"),
               "--format", "json", "--out", str(tmp_path)])
    assert rc == 0
    err = capsys.readouterr().err
    assert "GuideLLM benchmarks JSON; using 30 requests" in err and "matched by send time to the requests the taps and components saw: 30" in err
    rows = list(read_rows(tmp_path / "rows.parquet"))
    assert len(rows) == 30  # one row per request: GuideLLM's client side joined to the components' spans, none alone
    reqs = sorted(_guidellm_requests().values(), key=lambda r: r["info"]["timings"]["request_start"])
    rows.sort(key=lambda r: r.points["client.send"].unix_ns)
    for row, req in zip(rows, reqs, strict=True):
        assert row.points["client.send"].source == "client" and row.points["gateway.in.arrive"].source == "component"
        assert row.deltas["system_ttft"].ns / 1e6 == pytest.approx(req["time_to_first_token_ms"], abs=1e-3)
        # causal along the path: the client sent before the gateway received, and got the token after the gateway released it
        assert row.points["client.send"].unix_ns <= row.points["gateway.in.arrive"].unix_ns
        assert row.points["gateway.out.first_out"].unix_ns <= row.points["client.first_token_received"].unix_ns
        assert row.tokens_out == req["output_metrics"]["text_tokens"]


def test_unmatched_guidellm_requests_stay_client_only(tmp_path):
    loaded = load([FIX / "benchmarks.json"], load_topology_offline(FIX / "topology.yaml"))
    assert any("30 with no request reaching the system" in line for line in loaded.found)
    assert len(loaded.spans) == 30 and all(s.service == "guidellm" for s in loaded.spans)


def test_not_guidellm_says_so(tmp_path):
    bad = tmp_path / "b.json"
    bad.write_text(json.dumps({"benchmarks": [{"requests": {"successful": [{"request_id": "x"}]}}]}))
    assert main(["report", "--from", str(bad)]) == 2
