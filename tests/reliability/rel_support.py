"""Helpers of the reliability suite: the request body, a bounded wait, and the figures file."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path


CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}


def chat_body(**extra) -> bytes:
    return json.dumps({**CHAT, **extra}).encode()


async def settle(pred, timeout_s: float = 5.0) -> bool:
    """Wait (bounded) until ``pred()`` is true."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not pred():
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True


def record_figures(section: str, figures: dict, key: str | None = None) -> None:
    """Merge ``figures`` under ``section`` (under ``section``/``key`` with ``key``) into the JSON file named by
    ``$DELTATAP_RELIABILITY_OUT`` (set by .ci/reliability); without it the figures are only printed."""
    import os
    import platform

    print(f"[reliability] {section}{'/' + key if key else ''}: {json.dumps(figures)}")
    out = os.environ.get("DELTATAP_RELIABILITY_OUT")
    if not out:
        return
    path = Path(out)
    data = json.loads(path.read_text()) if path.is_file() else {}
    data.setdefault("machine", {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()})
    if key is None:
        data[section] = figures
    else:
        data.setdefault(section, {})[key] = figures
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
