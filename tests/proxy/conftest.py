"""Fixtures for the tap tests: a controllable upstream and taps in front of it."""

from __future__ import annotations

import pytest
from tap_helpers import start_upstream

from deltatap.proxy import TapOptions, start_tap


@pytest.fixture
async def upstream():
    up = await start_upstream()
    yield up
    await up.runner.cleanup()


@pytest.fixture
async def make_tap(telemetry):
    started = []

    async def make(upstream_url: str, **kw):
        kw.setdefault("link", "fw-engine")
        tap = await start_tap(TapOptions(upstream=upstream_url, **kw), telemetry)
        started.append(tap)
        return tap

    yield make
    for tap in started:
        await tap.close(grace_s=1)


@pytest.fixture
async def tap(upstream, make_tap):
    return await make_tap(upstream.url)
