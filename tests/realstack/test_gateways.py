"""The alternatives in the gateway and firewall positions, each with taps on every link:

* nginx (proxy_buffering off) and HAProxy (option http-no-delay) in Envoy's place, LiteLLM behind:
  the gateway's inbound/outbound deltas and the residual are reported for every request, and the
  stream is not batched (the gateway adds little to the longest pause between chunks);
* deltatap's reference firewall in LiteLLM's place behind Envoy: its inbound delta includes the 5 ms
  inspection cost it is configured with - the decomposition charges a known delay to the right component.
"""

from __future__ import annotations

import json
import uuid

import numpy as np
import pytest
from realstack_support import delta_ms, pt, start_stack, stop_stack, stream_until_cut, summary_ms

from deltatap.core.vocab import Role

pytestmark = [pytest.mark.realstack, pytest.mark.timeout(300)]

N = 5
BODY = {"model": "gemma", "stream": True, "max_tokens": 24, "ignore_eos": True,
        "messages": [{"role": "user", "content": "Describe the harbour at dawn in a few sentences."}]}


def _drive(r, gateway: str, firewall: str) -> list:
    rids = [f"{gateway}-{uuid.uuid4()}" for _ in range(N)]
    for rid in rids:
        got = stream_until_cut(r.stack.entry_url, BODY, rid, api_key=r.stack.api_key)
        assert got["status"] == 200 and got["done"], f"{gateway}: request {rid} did not complete: {got}"
    rows = {row.request_id: row for row in r.collector.rows() if row.request_id in rids}
    assert set(rows) == set(rids), f"{gateway}: requests without a joined row: {sorted(set(rids) - set(rows))}"
    out = list(rows.values())
    for row in out:
        for comp, role in ((gateway, Role.IN_ARRIVE), (gateway, Role.IN_EXIT), (gateway, Role.OUT_FIRST_IN), (gateway, Role.OUT_FIRST_OUT),
                           (firewall, Role.IN_ARRIVE), ("llama-server", Role.FIRST_TOKEN)):
            assert pt(row, comp, role) is not None, f"{row.request_id}: point {comp}.{role} missing"
        for name in (f"{gateway}_inbound", f"{gateway}_outbound", "residual"):
            assert name in row.deltas, f"{row.request_id}: delta {name} missing; have {sorted(row.deltas)}"
    return out


@pytest.mark.parametrize("config,gateway", [("configs/realstack-nginx-litellm.yaml", "nginx"),
                                            ("configs/realstack-haproxy-litellm.yaml", "haproxy")])
def test_alternative_gateway_deltas(config, gateway):
    r = start_stack(config, f"{gateway}-litellm")
    try:
        rows = _drive(r, gateway, "litellm")
        pause_added = delta_ms(rows, f"{gateway}_max_pause_added")
        # an unbuffered gateway passes chunks on as they come: no added pause near HAProxy's ~250 ms batching
        assert pause_added.size == N and float(np.median(pause_added)) < 100, (
            f"{gateway} batches the stream: max pause added per request {pause_added.tolist()} ms")
        report = {k: summary_ms(delta_ms(rows, k)) for k in
                  (f"{gateway}_inbound", f"{gateway}_outbound", f"{gateway}_max_pause_added", "litellm_inbound", "engine_ttft", "residual")}
        (r.run_dir / "gateway-report.json").write_text(json.dumps(report, indent=2))
        print(json.dumps(report, indent=2))
    finally:
        stop_stack(r)


def test_reference_firewall_cost_is_charged_to_it():
    r = start_stack("configs/realstack-envoy-reffw.yaml", "envoy-reffw")
    try:
        rows = _drive(r, "envoy", "ref-firewall")
        inbound = delta_ms(rows, "ref-firewall_inbound")
        assert inbound.size == N
        # configured: inbound inspection fixed 5 ms (no jitter); the rest is the firewall's own HTTP handling
        assert (inbound >= 5.0).all(), f"reference firewall inbound below its configured 5 ms cost: {inbound.tolist()}"
        assert float(np.median(inbound)) < 5.0 + 30.0, f"reference firewall inbound far above 5 ms: {inbound.tolist()}"
        envoy_in = delta_ms(rows, "envoy_inbound")
        assert float(np.median(envoy_in)) < float(np.median(inbound)), "the 5 ms cost was charged to Envoy, not the firewall"
        report = {k: summary_ms(delta_ms(rows, k)) for k in ("envoy_inbound", "envoy_outbound", "ref-firewall_inbound",
                                                             "ref-firewall_outbound", "engine_ttft", "residual")}
        print(json.dumps(report, indent=2))
    finally:
        stop_stack(r)
