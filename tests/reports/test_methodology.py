"""TTFT, TTFT by input length, ITL and the minimum viable report, exact over hand-made rows."""

from __future__ import annotations

import math

import numpy as np
import pytest

from deltatap.collector.reports.methodology import itl_samples_from_records, itl_table, ttft_by_input_table
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


def test_itl_from_records_excludes_ttft_and_is_exact():
    recs = [
        {"send_unix_ns": T0, "first_token_unix_ns": T0 + 50 * MS, "chunk_unix_ns": [T0 + 50 * MS, T0 + 60 * MS, T0 + 80 * MS]},
        {"send_unix_ns": T0, "first_token_unix_ns": T0 + 50 * MS, "chunk_unix_ns": [T0 + 50 * MS, T0 + 70 * MS]},
        {"send_unix_ns": T0, "chunk_unix_ns": [T0 + 50 * MS]},  # one token: no ITL
    ]
    per = itl_samples_from_records(recs)
    assert [list(a) for a in per] == [[10.0, 20.0], [20.0]]
    v = {r["metric"]: r["value"] for r in itl_table(per).records()}
    assert v["ITL Samples"] == 3 and v["ITL P50"] == 20.0 and v["ITL Mean"] == pytest.approx(50 / 3)
    assert v["ITL Std Dev"] == pytest.approx(math.sqrt(200 / 9)) and v["P99/P50 Ratio"] == 1.0
    assert v["Jitter (per-request std dev) P50"] == 2.5 and v["Max pause (per-request max ITL) P99"] == 20.0


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
