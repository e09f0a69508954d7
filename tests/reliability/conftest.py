"""Fixtures of the reliability suite (marker ``reliability``, run by ``.ci/reliability``): an SSE engine of our
own that records what it received and whether it saw its client go away (tests/reliability/rel_engine.py);
helpers in rel_support.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from rel_engine import start_engine  # noqa: E402


@pytest.fixture
async def engine():
    eng = await start_engine()
    yield eng
    await eng.close()
