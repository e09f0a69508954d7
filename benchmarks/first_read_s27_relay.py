"""A cold tap's first response read (the first token's), cut at its own system calls, A/B by source trees (issue 15,
session 27 "relay"): benchmarks/cold_syscalls_s26_cold.py's rounds (perf on each tap's syscalls, one client connection
sending a POST every ``--sleep-ms``, trees alternating round by round) with an upstream that answers each request in two
writes, as an engine streams: the head with the first content event, then 2 ms (``GAP_S``) later the finish event and
``[DONE]`` (one Content-Length body). Its ``response read->forward`` and ``response forward->sleep`` are the first
read's: after that read's forward the tap runs the request's deferred account and the head's watch before it sleeps
(the client, woken by the forward, may wait for that CPU); the second read's, the exchange's end (its watch, the span's
finish), as ``end read->forward`` and ``end forward->sleep``.

    .venv/bin/python benchmarks/first_read_s27_relay.py --tree base=/tmp/s27base --tree new=. --out FILE [--rounds 4]
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import cold_syscalls_s26_cold as _cs  # noqa: E402


def _event(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


_CH = {"id": "c1", "object": "chat.completion.chunk", "model": "mock"}
FIRST_EVENTS = (_event({**_CH, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
                + _event({**_CH, "choices": [{"index": 0, "delta": {"content": "Hello"}}]}))
REST = (_event({**_CH, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}}) + b"data: [DONE]\n\n")
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n" % (len(FIRST_EVENTS) + len(REST))
FIRST = HEAD + FIRST_EVENTS
GAP_S = 0.002


_segments = _cs.segments


END_SEGMENTS = ["end read->forward", "end forward->sleep"]


def first_read_segments(perf_data: Path) -> dict[str, list[float]]:
    """cold_syscalls_s26_cold.segments with the first part's read as "the response's read" (matched by its size), and
    the second part's (the exchange's end: its watch, the finish) as ``end read->forward`` / ``end forward->sleep``."""
    whole = _cs.RESP
    try:
        _cs.RESP = FIRST
        got = _segments(perf_data)
        _cs.RESP = REST
        end = _segments(perf_data)
    finally:
        _cs.RESP = whole
    got[END_SEGMENTS[0]] = end.get("response read->forward", [])
    got[END_SEGMENTS[1]] = end.get("response forward->sleep", [])
    return got


if __name__ == "__main__":
    _cs.RESP = HEAD + FIRST_EVENTS + REST  # (the client reads each answer to its end)
    _cs.fixed_upstream = functools.partial(_cs.fixed_upstream, (FIRST, REST), GAP_S)  # (each read: FIRST, then GAP_S later REST)
    _cs.segments = first_read_segments
    _cs.SEGMENTS = _cs.SEGMENTS + END_SEGMENTS
    if not any(a.startswith("--out") or a in ("-h", "--help") for a in sys.argv[1:]):
        sys.exit("first_read_s27_relay.py: --out FILE is required (cold_syscalls_s26_cold's default is its own results file)")
    sys.exit(_cs.main())
