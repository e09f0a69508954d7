"""`deltatap stack all --taps --clock-sync URL`: every tap of the chain estimates its clock offset to the
collector; and a tap started before its collector answers retries promptly (0.5 s, 1 s, 2 s ...) instead
of waiting the 60 s resync period, so the dashboard's clock-offset panel fills as soon as the collector is up."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

from deltatap.collector.service import CollectorOptions, start_collector
from deltatap.stack.chain import load_stack_config, start_stack
from tests.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]


async def _until(pred, timeout_s: float) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if pred():
            return time.monotonic() - t0
        await asyncio.sleep(0.05)
    raise AssertionError(f"not within {timeout_s} s")


async def test_taps_started_before_the_collector_sync_within_seconds(telemetry) -> None:
    port = free_port()
    cfg = load_stack_config(ROOT / "configs" / "demo.yaml")
    stack = await start_stack(cfg, lambda service: telemetry, taps=True, ephemeral=True, clock_sync=f"http://127.0.0.1:{port}")
    collector = None
    try:
        assert all(t.tap.clock is None for t in stack.taps.values())  # nobody answers /v1/clock yet
        await asyncio.sleep(0.8)
        collector = await start_collector(CollectorOptions(otlp_grpc=None, otlp_http=f"127.0.0.1:{port}"))
        waited = await _until(lambda: all(t.tap.clock is not None for t in stack.taps.values()), 10.0)
        assert waited < 5.0, waited  # the retries back off from 0.5 s; not the 60 s resync period
        for t in stack.taps.values():
            assert abs(t.tap.clock.offset_ns) < 50_000_000 and t.tap.clock.samples > 0  # same host: tiny offset
            assert "deltatap_tap_clock_offset_seconds" in t.tap.metrics.render().decode()
    finally:
        await stack.close()
        if collector is not None:
            await collector.close()


def test_clock_sync_needs_taps_and_a_url() -> None:
    for argv, said in ((["--clock-sync", "http://127.0.0.1:4318"], "give it with --taps"), (["--taps", "--clock-sync", "127.0.0.1:4318"], "expected the collector's base URL")):
        p = subprocess.run([sys.executable, "-m", "deltatap.app.cli", "stack", "all", "--config", "demo", "--ephemeral", *argv],
                           capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert p.returncode == 2 and said in p.stderr and "Traceback" not in p.stderr, p.stderr
