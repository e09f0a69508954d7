"""Fixtures for the load generator's functional tests: a known-timing SSE server on loopback."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from loadgen_server import ServerState, start_server  # noqa: E402


@pytest.fixture
async def sse_server():
    """Yields ``(state, base_url)``; tune ``state.first_ms`` / ``interval_ms`` / ``tokens`` per test."""
    state = ServerState()
    runner, port = await start_server(state)
    try:
        yield state, f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()
