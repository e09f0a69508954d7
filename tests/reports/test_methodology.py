"""TTFT, TTFT by input length, ITL and the minimum viable report, exact over hand-made rows."""

from __future__ import annotations

import math

import numpy as np
import pytest

from deltatap.collector.reports.methodology import chunk_gap_table, chunk_gaps_from_records, itl_per_request_from_records, itl_table, ttft_by_input_table
from deltatap.collector.reports.registry import ReportInputs, build_report
from tests.reports.factories import MS, S, T0, row


def ten_rows():
    # TTFT 1..10 ms; input 100 tokens for odd i, 300 for even; 11 tokens out in (ttft + 100 ms)
    return [
        row(i, tokens_in=100 if i % 2 else 300, tokens_out=11,
            deltas_ms={"system_ttft": float(i), "system_ttlt": i + 100.0},
            points_ns={"client.send": T0, "client.end": T0 + 2 * S})
        for i in range(1, 11)
    ]


def test_ttft_table_exact():
    s = build_report(ReportInputs(rows=ten_rows()), sections=["ttft"]).section("ttft")
    v = {r["metric"]: r["value"] for r in s.table("ttft").records()}
    assert v["Requests"] == 10
    assert v["TTFT P50"] == pytest.approx(5.5) and v["TTFT P90"] == pytest.approx(9.1) and v["TTFT P95"] == pytest.approx(9.55)
    assert v["TTFT P99"] == pytest.approx(9.91) and v["TTFT P99.9"] == pytest.approx(9.991)
    assert (v["TTFT Mean"], v["TTFT Min"], v["TTFT Max"]) == (5.5, 1.0, 10.0)
    assert s.notes == ["TTFT sample count: 10.", "Fewer than 1000 samples: TTFT P99 is not accurate to 10% (methodology §5.1.4.3)."]
    by_in = s.table("ttft_by_input").records()
    assert by_in == [
        {"input_tokens": "0-256", "count": 5, "p50_ms": 5.0, "p95_ms": pytest.approx(8.6), "p99_ms": pytest.approx(8.92)},
        {"input_tokens": "256-512", "count": 5, "p50_ms": 6.0, "p95_ms": pytest.approx(9.6), "p99_ms": pytest.approx(9.92)},
    ]


def test_ttft_by_input_uses_open_last_bucket():
    t = ttft_by_input_table(np.array([1.0, 2.0, 3.0]), np.array([5000.0, 4096.0, np.nan]))
    assert t.records() == [{"input_tokens": "4096+", "count": 2, "p50_ms": 1.5, "p95_ms": pytest.approx(1.95), "p99_ms": pytest.approx(1.99)}]


def test_chunk_gaps_from_records_exclude_ttft_and_are_exact():
    recs = [
        {"send_unix_ns": T0, "first_token_unix_ns": T0 + 50 * MS, "chunk_unix_ns": [T0 + 50 * MS, T0 + 60 * MS, T0 + 80 * MS]},
        {"send_unix_ns": T0, "first_token_unix_ns": T0 + 50 * MS, "chunk_unix_ns": [T0 + 50 * MS, T0 + 70 * MS]},
        {"send_unix_ns": T0, "chunk_unix_ns": [T0 + 50 * MS]},  # one token: no gap
    ]
    per = chunk_gaps_from_records(recs)
    assert [list(a) for a in per] == [[10.0, 20.0], [20.0]]
    v = {r["metric"]: r["value"] for r in chunk_gap_table(per).records()}
    assert v["inter-chunk gap samples"] == 3 and v["inter-chunk gap P50"] == 20.0 and v["inter-chunk gap Mean"] == pytest.approx(50 / 3)
    assert v["inter-chunk gap Std Dev"] == pytest.approx(math.sqrt(200 / 9)) and v["P99/P50 Ratio"] == 1.0
    assert v["Jitter (per-request std dev of the inter-chunk gaps) P50"] == 2.5 and v["Max pause (per-request max inter-chunk gap) P99"] == 20.0


def test_itl_per_request_and_inter_chunk_gap_are_two_named_figures():
    """A firewall releasing tokens in windows: chunk gaps mostly 0, yet each request's ITL is 10 ms.
    One name for both ("ITL P50 0.0 ms" next to the load summary's ITL) read as a contradiction."""
    burst = [T0 + 50 * MS] * 4 + [T0 + 90 * MS] * 4 + [T0 + 120 * MS]  # 9 tokens in 3 windows
    recs = [
        {"phase": "measure", "status": "ok", "output_tokens": 9, "first_token_unix_ns": burst[0], "last_token_unix_ns": burst[-1], "chunk_unix_ns": burst},
        {"phase": "measure", "status": "http_error", "output_tokens": 0, "chunk_unix_ns": []},
        {"phase": "warmup", "status": "ok", "output_tokens": 3, "first_token_unix_ns": T0, "last_token_unix_ns": T0 + 99 * MS, "chunk_unix_ns": [T0, T0 + 99 * MS]},
    ]
    assert list(itl_per_request_from_records(recs)) == [pytest.approx(70 / 8)]
    s = build_report(ReportInputs(rows=ten_rows(), records=recs), sections=["itl"]).section("itl")
    itl = {r["metric"]: r["value"] for r in s.table("itl").records()}
    gaps = {r["metric"]: r["value"] for r in s.table("chunk_gaps").records()}
    assert itl["ITL (per request) requests"] == 1 and itl["ITL (per request) P50"] == pytest.approx(8.75)
    assert gaps["inter-chunk gap P50"] == 0.0 and gaps["inter-chunk gap samples"] == 8
    every_label = [str(r[0]) for t in s.tables for r in t.rows]
    assert not [x for x in every_label if x.startswith("ITL ") and not x.startswith("ITL (per request)")], every_label
    assert any("ITL (per request) = (last token - first token)" in n for n in s.notes)


def test_minimum_viable_report_text_and_values():
    meta = {"model": "deltatap-ref", "sut_boundary": "compound", "workload": {"workload": "synthetic-uniform"}, "load_model": "open-loop 5 req/s", "hardware": {"accelerator_summary": "CPU only (2 cores) + 8 GB RAM"}}
    s = build_report(ReportInputs(rows=ten_rows(), metadata=meta), sections=["minimum"]).section("minimum")
    text = s.text
    assert text.startswith("=== LLM Benchmark Report (Minimum) ===") and text.rstrip().endswith("=== End Report ===")
    for line in ("Model: deltatap-ref", "Hardware: CPU only (2 cores) + 8 GB RAM", "Workload: synthetic-uniform",
                 "Request Count: 10", "Test Duration: 2.00 s", "TTFT P50: 5.5 ms", "TTFT P99: 9.9 ms",
                 "TPOT P50: 10.00 ms", "Max Throughput: 55.0 tok/s (achieved in this run)",
                 "Throughput at P99 TTFT < 500ms: 55.0 tok/s"):
        assert line in text, line
    assert s.data["tpot_p99_ms"] == pytest.approx(10.0) and s.data["throughput_tok_s"] == pytest.approx(55.0)
