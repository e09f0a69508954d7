"""Event-loop helpers: every deltatap server and client runs on uvloop."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on a uvloop event loop (falls back to asyncio's loop if uvloop is absent)."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a hard dependency; keep the CLI usable anyway
        return asyncio.run(coro)
    return uvloop.run(coro)
