"""Fixtures for the reference-stack tests (helpers live in stack_helpers.py)."""

from __future__ import annotations

import aiohttp
import pytest


@pytest.fixture
async def session():
    async with aiohttp.ClientSession() as s:
        yield s
