"""``deltatap tap --workers N``: N processes on one port (SO_REUSEPORT), one admin port summing their metrics."""

from __future__ import annotations

import asyncio
import os
import signal
import sys

import aiohttp
import pytest

from deltatap.proxy.workers import sum_metrics

pytestmark = pytest.mark.timeout(90)


def test_sum_metrics_adds_counters_and_histograms_and_keeps_the_largest_offset():
    a = ('# HELP deltatap_tap_requests Requests\n# TYPE deltatap_tap_requests counter\n'
         'deltatap_tap_requests_total{link="e",outcome="ok"} 3.0\n'
         '# HELP deltatap_tap_clock_offset_seconds Offset\n# TYPE deltatap_tap_clock_offset_seconds gauge\n'
         'deltatap_tap_clock_offset_seconds{link="e"} 0.002\n'
         '# HELP h Hist\n# TYPE h histogram\nh_bucket{le="0.001"} 1.0\nh_bucket{le="+Inf"} 2.0\nh_count 2.0\nh_sum 0.5\n')
    b = a.replace("} 3.0", "} 4.0").replace("0.002", "0.005").replace("h_count 2.0", "h_count 5.0")
    out = sum_metrics([a, b])
    assert 'deltatap_tap_requests_total{link="e",outcome="ok"} 7.0' in out
    assert 'deltatap_tap_clock_offset_seconds{link="e"} 0.005' in out
    assert "h_count 7.0" in out and 'h_bucket{le="+Inf"} 4.0' in out and "h_sum 1.0" in out


async def test_two_workers_share_the_port_and_the_admin_port_sums_them(upstream, tmp_path):
    from tests.conftest import free_port

    port, admin = free_port(), free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "deltatap.app.cli", "tap", "--link", "edge", "--listen", f"127.0.0.1:{port}", "--admin", f"127.0.0.1:{admin}",
        "--upstream", upstream.url, "--otlp", "none", "--workers", "2", "--grace-s", "2",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    try:
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
        assert f"http://127.0.0.1:{port}" in line and "2 workers" in line, line
        for _ in range(30):  # a new connection per request: the kernel spreads them over the workers
            async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/status/200") as r:
                assert r.status == 200
        async with aiohttp.ClientSession() as s:
            async with s.get(f"http://127.0.0.1:{admin}/metrics") as r:
                text = await r.text()
            async with s.get(f"http://127.0.0.1:{admin}/healthz") as r:
                health = await r.json()
        assert 'deltatap_tap_requests_total{link="edge",outcome="ok"} 30.0' in text
        assert 'deltatap_tap_connections_total{link="edge"} 30.0' in text
        assert health["status"] == "ok" and health["workers"] == 2 and health["worker_status"] == ["ok", "ok"]
    finally:
        proc.send_signal(signal.SIGTERM)
        out = (await asyncio.wait_for(proc.stdout.read(), 30)).decode()
        await proc.wait()
    assert "2 workers stopped" in out and out.count("stopped; spans exported") == 2
