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
end), request throughput, output token throughput, totals; and ``problems``: the failures grouped by
kind, HTTP status and message, each with a one-line description (:func:`describe_problem`) that names
the HTTP status and the server's own message, or what could not be reached and why.

Two inter-token figures, named apart: ``inter_token_latency`` is AIPerf's *per-request* ITL (one value
per request, averaged over its tokens); ``inter_chunk_latency`` is the distribution of every gap between
content events - what ``deltatap report`` calls the inter-chunk gap (its ITL is the per-request one, as here).
"""

from __future__ import annotations

from collections import Counter
from http import HTTPStatus
from typing import Any

import numpy as np

from deltatap.core.sse import itl_per_request_ns

MAX_PROBLEM_GROUPS = 20
ITL_PER_REQUEST_LABEL = "ITL per request, AIPerf"  # (last token - first token) / (tokens - 1), one value per request
ITL_GAPS_LABEL = "chunk gaps"  # every gap between content events: deltatap report's "inter-chunk gap"
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


def problem_groups(records: list[dict[str, Any]], limit: int = MAX_PROBLEM_GROUPS) -> list[dict[str, Any]]:
    """Records with an ``error_kind`` grouped by (kind, HTTP status, message), most frequent first; the
    message is the server's own (``server_message``) for non-2xx answers, else the record's ``error``."""
    groups: Counter[tuple[str, int | None, str | None]] = Counter()
    for r in records:
        kind = r.get("error_kind")
        if not kind:
            continue
        status = r.get("http_status") if kind in ("http_status", "refused") else None
        msg = r.get("server_message") if kind in ("http_status", "refused") else None
        groups[(kind, status, msg or r.get("error"))] += 1
    out = []
    for (kind, status, msg), n in sorted(groups.items(), key=lambda kv: (-kv[1], kv[0][0], kv[0][1] or 0, kv[0][2] or "")):
        g = {"kind": kind, "http_status": status, "message": msg, "count": n}
        g["text"] = describe_problem(g)
        out.append(g)
    return out[:limit]


def describe_problem(g: dict[str, Any]) -> str:
    """One line for a problem group, e.g. ``HTTP 404 x20: The model 'default' does not exist`` or
    ``cannot connect to 127.0.0.1:9 (connection refused) - 20 requests; is the server running?``."""
    kind, status, msg, n = g["kind"], g.get("http_status"), g.get("message"), g["count"]
    if kind in ("http_status", "refused") and status is not None:
        if not msg or msg.startswith(f"HTTP {status}"):  # no message of the server's own: the status phrase
            try:
                msg = HTTPStatus(status).phrase
            except ValueError:
                msg = "no message"
        head = f"HTTP {status}" if kind == "http_status" else f"refused (HTTP {status})"
        return f"{head} x{n}: {msg}"
    if kind == "unreachable":
        hint = ("does this host trust its certificate (SSL_CERT_FILE, SSL_CERT_DIR)?" if msg and "certificate" in msg else
                "does the server speak TLS there (else use http://)?" if msg and "TLS" in msg else "is the server running?")
        return f"{msg or 'cannot connect'} - {n} request{'s' if n != 1 else ''}; {hint}"
    return f"{kind} x{n}: {msg}" if msg else f"{kind} x{n}"


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
        v = itl_per_request_ns(ft, r.get("last_token_unix_ns"), r.get("output_tokens"))
        if v is not None:
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
        "problems": problem_groups(recs),
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
        "itl_method": "inter_token_latency = ITL per request, AIPerf: (last token - first token) / (OSL - 1) with OSL in "
        "reference tokens, one value per request; inter_chunk_latency = every gap between content events "
        "(methodology 4.6.3 option A), the distribution deltatap report calls the inter-chunk gap (5.4.5)",
        "ttft_definition": "first content token (5.1.3.1): first non-whitespace content event; T_submit = request's last byte written",
    }
