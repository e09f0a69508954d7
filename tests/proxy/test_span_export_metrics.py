"""The tap's /metrics accounts for every span: ended = exported + dropped (every reason listed) + queued, read from
one consistent snapshot, while its collector is unreachable; the tap's telemetry shuts down within its deadline."""

from __future__ import annotations

import asyncio
import time

import aiohttp
from prometheus_client.parser import text_string_to_metric_families
from tap_helpers import free_port

from deltatap.proxy import TapOptions, start_tap
from deltatap.telemetry.tracer import DROP_REASONS, setup_telemetry

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
REQUESTS = 40
DEADLINE_S = 1.0


def span_samples(text: str) -> dict:
    out: dict = {"dropped": {}}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "deltatap_tap_spans_dropped_total":
                out["dropped"][s.labels["reason"]] = s.value
            elif s.name in ("deltatap_tap_spans_ended_total", "deltatap_tap_spans_exported_total", "deltatap_tap_spans_queued"):
                out[s.name] = s.value
    return out


async def test_metrics_account_for_every_span_with_the_collector_down(upstream):
    tel = setup_telemetry("deltatap-test-accounting", otlp=f"http://127.0.0.1:{free_port()}", shutdown_deadline_s=DEADLINE_S)
    tap = await start_tap(TapOptions(link="edge", upstream=upstream.url), tel)
    readings = []
    try:
        async with aiohttp.ClientSession() as s:
            for i in range(REQUESTS):
                async with s.post(tap.url + "/v1/chat/completions?first_ms=1&n=2", json=CHAT) as r:
                    assert r.status == 200
                    await r.read()
                if i % 10 == 9:
                    async with s.get(tap.admin_url + "/metrics") as r:
                        readings.append(span_samples(await r.text()))
            for _ in range(300):  # until the failed export shows (bounded: ~15 s)
                async with s.get(tap.admin_url + "/metrics") as r:
                    readings.append(span_samples(await r.text()))
                if readings[-1]["dropped"]["export_failed"] >= REQUESTS:
                    break
                await asyncio.sleep(0.05)
    finally:
        await tap.close(grace_s=1)
        t0 = time.monotonic()
        await asyncio.get_running_loop().run_in_executor(None, tel.shutdown)
        took = time.monotonic() - t0
    for m in readings:
        assert set(m["dropped"]) == set(DROP_REASONS)
        ended = m["deltatap_tap_spans_ended_total"]
        assert ended == m["deltatap_tap_spans_exported_total"] + sum(m["dropped"].values()) + m["deltatap_tap_spans_queued"], m
    ended = [m["deltatap_tap_spans_ended_total"] for m in readings]
    assert ended == sorted(ended) and ended[-1] == REQUESTS and len(readings) > 4
    last = readings[-1]
    assert last["dropped"]["export_failed"] == REQUESTS and last["deltatap_tap_spans_queued"] == 0, last
    assert last["deltatap_tap_spans_exported_total"] == 0
    assert took < DEADLINE_S + 1.5
    c = tel.stats.snapshot()
    assert c.ended == REQUESTS and c.dropped == REQUESTS and c.unaccounted == 0
