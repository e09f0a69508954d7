"""deltatap around AIPerf -> Envoy -> LiteLLM (content filter) -> llama.cpp, all real, on loopback.

What is checked per request (AIPerf sends 10 streamed chat requests through the edge tap):
* every AIPerf record joins the taps' spans on its X-Request-ID, and the fw-engine tap's span is in the
  same request (LiteLLM forwarded traceparent), never by a body-fingerprint guess;
* engine TTFT seen by the fw-engine tap (t7 - t6) agrees with llama.cpp's own ``timings.prompt_ms``
  within a few ms: their difference is the engine's queue + HTTP handling (t6a - t6);
* Envoy's and LiteLLM's inbound/outbound deltas and the residual are reported for every request;
* AIPerf's TTFT is set beside the edge tap's view of the same request (t11 - t1): the difference is
  the client-side and loopback time that AIPerf's number contains, so it is never negative when both use
  the same first-token rule (AIPerf's own TTFT also counts a whitespace-only first token; deltatap does
  not, so AIPerf's own figure can be one inter-token gap shorter - reported, not asserted).
The figures go to runs/realstack-tests/envoy-litellm-*/decomposition-report.json and the test output.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
import uuid

import numpy as np
import pytest

from realstack_support import aiperf_records, delta_ms, pt, run_aiperf, summary_ms

from deltatap.collector.rows import JoinMethod
from deltatap.core.vocab import Role

pytestmark = [pytest.mark.realstack, pytest.mark.timeout(480)]

N_REQUESTS = 10
# t7 - t6 (tap) minus llama.cpp's prompt_ms is llama-server's HTTP handling + tokenising + slot start (a few
# ms on a quiet machine) plus the time llama-server's threads wait for a CPU. That wait has no bound on a busy
# machine (CI runs this tier right after a cold build: at load ~50 one request's difference reached 72.6 ms at
# prompt_ms 468, 16 %; an earlier run 72 ms, 9 %), so a request's difference is bounded only from below: the
# tap's interval contains llama.cpp's prefill, it can never be shorter than prompt_ms by more than the stamps'
# error. The systematic agreement is the median's, which one late request cannot move.
TOL_EARLY_MS = 2.0  # per request: engine TTFT (tap) >= prompt_ms - 2 ms
MEDIAN_FIXED_MS, MEDIAN_FRACTION = 5.0, 0.03  # and the median difference <= 5 ms + 3 % of the median prompt_ms


def test_decomposition_with_aiperf(envoy_litellm, tools):
    stack, col, run_dir = envoy_litellm.stack, envoy_litellm.collector, envoy_litellm.run_dir
    export = run_aiperf(tools, stack.entry_url, run_dir / "aiperf", requests=N_REQUESTS, concurrency=1, api_key=stack.api_key)
    recs = aiperf_records(export)
    assert len(recs) == N_REQUESTS, f"AIPerf wrote {len(recs)} records, expected {N_REQUESTS}"
    errors = {rid: r["error"] for rid, r in recs.items() if r["error"]}
    assert not errors, f"AIPerf requests failed through the real stack: {errors}"

    assert col.ingest_files([export]) == N_REQUESTS
    rows = {r.request_id: r for r in col.rows() if r.request_id in recs}
    assert set(rows) == set(recs), f"AIPerf records not joined to tap spans: {sorted(set(recs) - set(rows))}"
    rows_l = list(rows.values())

    fingerprint = [r.request_id for r in rows_l if r.join_method == JoinMethod.FINGERPRINT]
    assert not fingerprint, f"joined only by body fingerprint (trace context / correlation lost): {fingerprint}"
    for r in rows_l:
        for comp, role in (("envoy", Role.IN_ARRIVE), ("envoy", Role.OUT_FIRST_OUT), ("litellm", Role.IN_ARRIVE),
                           ("llama-server", Role.QUEUE), ("llama-server", Role.EXEC_START), ("llama-server", Role.FIRST_TOKEN)):
            assert pt(r, comp, role) is not None, f"{r.request_id}: point {comp}.{role} missing; points {sorted(r.points)}"
        assert r.points[f"llama-server.{Role.EXEC_START}"].source == "llamacpp"
        # LiteLLM's own spans joined the request's trace: its guardrail's end is t4, between t3 and t5 (taps)
        assert r.points[f"litellm.{Role.IN_DECISION}"].source == "litellm" and r.firewall_decision == "allow"
        assert pt(r, "litellm", Role.IN_ARRIVE) < pt(r, "litellm", Role.IN_DECISION) < pt(r, "litellm", Role.IN_EXIT)
        assert r.points[f"client.{Role.SEND}"].source == "aiperf"

    # engine TTFT (tap) vs llama.cpp's own prompt_ms, per request. llama.cpp's prompt_ms ends at its first
    # token; the tap's t7 is the first NON-whitespace token, one or more decode steps later when the model
    # starts with " " or "\n" - those requests are reported, not compared.
    per_request, ws_first = [], []
    for r in rows_l:
        ttft = r.deltas["engine_ttft"].ns / 1e6
        prompt_ms = r.deltas["engine_prefill"].ns / 1e6  # = timings.prompt_ms (t7 - t6a)
        item = (r.request_id, ttft, prompt_ms, ttft - prompt_ms)
        (ws_first if recs[r.request_id]["whitespace_first"] else per_request).append(item)
    assert len(per_request) >= 3, f"too few requests whose first token was not whitespace to compare: {per_request}"
    early = [p for p in per_request if p[3] < -TOL_EARLY_MS]
    assert not early, f"engine TTFT (tap) shorter than llama.cpp's own prompt_ms by over {TOL_EARLY_MS} ms: {early}"
    median_diff = float(np.median([abs(p[3]) for p in per_request]))
    median_prompt = float(np.median([p[2] for p in per_request]))
    assert median_diff <= MEDIAN_FIXED_MS + MEDIAN_FRACTION * median_prompt, (
        f"median |engine TTFT - prompt_ms| {median_diff:.1f} ms at median prompt_ms {median_prompt:.0f} ms: {per_request}")

    # AIPerf TTFT vs the edge tap's t11 - t1. deltatap's first content token is the first one that is not
    # whitespace; AIPerf's TTFT counts a whitespace-only first token (Gemma often starts with " " or "\n"), so
    # the like-for-like comparison uses AIPerf's own chunk times (raw export) under deltatap's rule.
    diffs, diffs_own = [], []
    for rid, r in rows.items():
        edge_ms = (pt(r, "envoy", Role.OUT_FIRST_OUT) - pt(r, "envoy", Role.IN_ARRIVE)) / 1e6
        assert recs[rid]["visible_ttft_ms"] is not None, f"{rid}: no non-whitespace content chunk in AIPerf's raw export"
        diffs.append(recs[rid]["visible_ttft_ms"] - edge_ms)
        diffs_own.append(recs[rid]["ttft_ms"] - edge_ms)
    diffs_a = np.array(diffs)
    assert (diffs_a > -0.5).all(), f"AIPerf's first-content time shorter than the edge tap's t11-t1 (impossible on one host): {diffs}"

    for name in ("envoy_inbound", "envoy_outbound", "litellm_inbound", "litellm_outbound", "residual"):
        got = [r.request_id for r in rows_l if name not in r.deltas]
        assert not got, f"delta {name} missing for {got}"
    report = {
        "requests": N_REQUESTS,
        "join_methods": sorted({str(r.join_method) for r in rows_l}),
        "engine_ttft_minus_prompt_ms": summary_ms(np.array([p[3] for p in per_request])),
        "engine_ttft_ms": summary_ms(delta_ms(rows_l, "engine_ttft")),
        "envoy_inbound_ms": summary_ms(delta_ms(rows_l, "envoy_inbound")),
        "envoy_outbound_ms": summary_ms(delta_ms(rows_l, "envoy_outbound")),
        "litellm_inbound_ms": summary_ms(delta_ms(rows_l, "litellm_inbound")),
        "litellm_outbound_ms": summary_ms(delta_ms(rows_l, "litellm_outbound")),
        "residual_ms": summary_ms(delta_ms(rows_l, "residual")),
        "aiperf_first_content_minus_edge_t11_t1_ms": summary_ms(diffs_a),
        "aiperf_own_ttft_minus_edge_t11_t1_ms": summary_ms(np.array(diffs_own)),
        "requests_whose_first_token_was_whitespace": len(ws_first),
        "whitespace_first_engine_ttft_minus_prompt_ms": [p[3] for p in ws_first],
        "per_request": [{"x_request_id": rid, "engine_ttft_ms": t, "llama_prompt_ms": p} for rid, t, p, _ in per_request],
    }
    (run_dir / "decomposition-report.json").write_text(json.dumps(report, indent=2))
    print(json.dumps({k: v for k, v in report.items() if k != "per_request"}, indent=2))


def test_content_filter_blocks_before_the_engine(envoy_litellm):
    stack, col = envoy_litellm.stack, envoy_litellm.collector
    rid = f"blocked-{uuid.uuid4()}"
    body = {"model": "gemma", "stream": True, "max_tokens": 8,
            "messages": [{"role": "user", "content": "tell me the forbidden-launch-codes now"}]}
    req = urllib.request.Request(f"{stack.entry_url}/v1/chat/completions", data=json.dumps(body).encode(), method="POST",
                                 headers={"content-type": "application/json", "authorization": f"Bearer {stack.api_key}", "x-request-id": rid})
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=60)
    assert err.value.code == 400
    assert "forbidden-launch-codes" in err.value.read().decode()
    rows = [r for r in col.rows() if r.request_id == rid]
    assert len(rows) == 1, f"no single row for the blocked request {rid}"
    row = rows[0]
    assert row.http_status == 400
    assert pt(row, "litellm", Role.IN_ARRIVE) is not None  # the gw-fw tap saw it reach LiteLLM
    assert pt(row, "llama-server", Role.QUEUE) is None, "a blocked request must never reach llama.cpp"
    # LiteLLM's spans joined the request's trace: its guardrail's end is t4 and its status the decision
    assert row.points[f"litellm.{Role.IN_DECISION}"].source == "litellm", f"no LiteLLM guardrail span joined: {sorted(row.points)}"
    assert row.firewall_decision == "block_pattern"
    assert "litellm_inbound_block" in row.deltas and row.deltas["litellm_inbound_block"].ns > 0
