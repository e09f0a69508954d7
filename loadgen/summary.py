"""AIPerf-style metrics over the records, pure numpy (no stamping here).

Per-request metrics (AIPerf metric reference; times from the record's ``*_unix_ns`` fields):

* ``ttft``  first content token - T_submit (``request_written_unix_ns``, else ``send_unix_ns``)
* ``ttst``  second content event - first content event
* ``request_latency`` end of the response - T_submit
* ``inter_token_latency``  (last token - first token) / (OSL - 1), OSL in reference tokens
* ``inter_chunk_latency``  every gap between consecutive content events (methodology 4.6.3 option A)
* ``output_token_throughput_per_user``  1 / ITL
* ``input_sequence_length`` / ``output_sequence_length``  reference tokens (cl100k_base, option B);
  the server's usage (option A) is summarised beside them when it reported one
* ``schedule_lag``  actual send - planned send (coordinated omission made visible)
* ``send_overhead`` request written - send call (connection set-up and client work)

Aggregates: request/error counts per status and error kind, benchmark duration (first send to last
end), request throughput, output token throughput, totals.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

PERCENTILES = (1, 5, 10, 25, 50, 75, 90, 95, 99, 99.9)
ISL_BUCKETS = (0, 256, 512, 1024, 2048, 4096)  # methodology 5.1.4.2


def stats(values: Any, scale: float = 1.0) -> dict[str, float | int] | None:
    """count/mean/std/min/max and percentiles of ``values`` divided by ``scale``; None when empty."""
    a = np.asarray(values, dtype=float)
    if a.size == 0:
        return None
    a = a / scale
    out: dict[str, float | int] = {
        "count": int(a.size), "mean": float(a.mean()), "std": float(a.std()), "min": float(a.min()), "max": float(a.max()),
    }
    for p, v in zip(PERCENTILES, np.percentile(a, PERCENTILES), strict=True):
        out[f"p{p:g}".replace(".", "_")] = float(v)
    return out


def _submit(r: dict[str, Any]) -> int | None:
    return r["request_written_unix_ns"] if r.get("request_written_unix_ns") is not None else r.get("send_unix_ns")


def summarize(records: list[dict[str, Any]], token_source: str = "reference") -> dict[str, Any]:
    """The summary of ``records`` (phase ``measure`` only). Times in ms, throughputs per second."""
    recs = [r for r in records if r.get("phase", "measure") == "measure"]
    ok = [r for r in recs if r["status"] == "ok"]
    ms = 1e6
    ttft, ttst, lat, itl, icl, tpu, isl, osl, lag, overhead = ([] for _ in range(10))
    u_in, u_out = [], []
    buckets: dict[str, list[float]] = {}
    for r in recs:
        if r.get("schedule_lag_ns") is not None:
            lag.append(r["schedule_lag_ns"])
        if r.get("request_written_unix_ns") is not None and r.get("send_unix_ns") is not None:
            overhead.append(r["request_written_unix_ns"] - r["send_unix_ns"])
    for r in ok:
        sub = _submit(r)
        chunks = r.get("chunk_unix_ns") or []
        isl.append(r["input_tokens"])
        if r.get("output_tokens") is not None:
            osl.append(r["output_tokens"])
        if r.get("usage_input_tokens") is not None:
            u_in.append(r["usage_input_tokens"])
        if r.get("usage_output_tokens") is not None:
            u_out.append(r["usage_output_tokens"])
        if sub is None:
            continue
        if r.get("end_unix_ns") is not None:
            lat.append(r["end_unix_ns"] - sub)
        ft = r.get("first_token_unix_ns")
        if ft is not None:
            ttft.append(ft - sub)
            lo = max(b for b in ISL_BUCKETS if r["input_tokens"] >= b)
            hi = next((b for b in ISL_BUCKETS if b > lo), None)
            buckets.setdefault(f"[{lo}-{hi})" if hi else f"[{lo}+)", []).append((ft - sub) / ms)
        if len(chunks) >= 2:
            ttst.append(chunks[1] - chunks[0])
            icl.extend(np.diff(chunks).tolist())
        n_out = r.get("output_tokens")
        lt = r.get("last_token_unix_ns")
        if ft is not None and lt is not None and n_out and n_out > 1 and lt > ft:
            v = (lt - ft) / (n_out - 1)
            itl.append(v)
            tpu.append(1e9 / v)
    sends = [r["send_unix_ns"] for r in recs if r.get("send_unix_ns") is not None]
    ends = [r["end_unix_ns"] for r in recs if r.get("end_unix_ns") is not None]
    duration_s = (max(ends) - min(sends)) / 1e9 if sends and ends else 0.0
    total_osl = int(sum(osl))
    status_counts = Counter(r["status"] for r in recs)
    kinds = Counter(r["error_kind"] for r in recs if r.get("error_kind"))
    return {
        "request_count": len(ok),
        "error_request_count": len(recs) - len(ok),
        "requests_total": len(recs),
        "status_counts": dict(sorted(status_counts.items())),
        "error_kinds": dict(sorted(kinds.items())),
        "benchmark_duration_s": duration_s,
        "request_throughput_per_s": len(ok) / duration_s if duration_s > 0 else None,
        "output_token_throughput_per_s": total_osl / duration_s if duration_s > 0 else None,
        "total_isl": int(sum(isl)),
        "total_osl": total_osl,
        "max_in_flight_observed": None,
        "metrics_ms": {
            "ttft": stats(ttft, ms),
            "ttst": stats(ttst, ms),
            "request_latency": stats(lat, ms),
            "inter_token_latency": stats(itl, ms),
            "inter_chunk_latency": stats(icl, ms),
            "schedule_lag": stats(lag, ms),
            "send_overhead": stats(overhead, ms),
        },
        "output_token_throughput_per_user": stats(tpu),
        "input_sequence_length": stats(isl),
        "output_sequence_length": stats(osl),
        "usage_input_tokens": stats(u_in),
        "usage_output_tokens": stats(u_out),
        "ttft_by_input_length_ms": {k: stats(v) for k, v in sorted(buckets.items(), key=lambda kv: int(kv[0][1:].split("-")[0].rstrip("+)")))},
        "token_counting": {
            "isl_osl": f"{token_source} tokenizer (methodology 4.4.2 option B)",
            "usage_*": "server-reported usage (option A), where the server sent it",
        },
        "itl_method": "ITL = (last token - first token) / (OSL - 1) with OSL in reference tokens; "
        "inter_chunk_latency = time between content events (methodology 4.6.3 option A)",
        "ttft_definition": "first content token (5.1.3.1): first non-whitespace content event; T_submit = request's last byte written",
    }
