"""Python calls per request on the tap's request path with an engine-like answer (issue 15, session 27 "relay"), A/B
by source trees: benchmarks/request_calls_s26_cold.py's count (one client connection, one request at a time, cProfile
on between SIGUSR1 and SIGUSR2, ``--otlp none``) with the fixed upstream answering each request with a chunked
``text/event-stream`` of openai-chat chunks (role, ``--tokens`` content deltas, a finish chunk with usage, ``[DONE]``),
one chunk per event, in one write: the format is detected and the events taken as an engine's are (request_calls_s26's
own answer, ``{"choices":[]}``, is an event no format recognises: its calls per request count the format search).

    .venv/bin/python benchmarks/request_calls_s27_relay.py --tree base=/tmp/s27base --tree new=. --out FILE [--requests 2000]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import request_calls_s26_cold as _rc  # noqa: E402
from tap_cpu_ab import parse_trees  # noqa: E402


def engine_response(tokens: int) -> bytes:
    """A chunked SSE answer as an OpenAI-compatible engine streams it (one HTTP chunk per event)."""
    def chunk(delta: dict, finish: str | None = None, usage: dict | None = None) -> bytes:
        obj: dict = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "mock",
                     "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        if usage is not None:
            obj["usage"] = usage
        return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"

    events = [chunk({"role": "assistant", "content": ""})] + [chunk({"content": f"tok{i} "}) for i in range(tokens)]
    events.append(chunk({}, "stop", {"prompt_tokens": 5, "completion_tokens": tokens, "total_tokens": 5 + tokens}))
    events.append(b"data: [DONE]\n\n")
    body = b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events) + b"0\r\n\r\n"
    return b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n" + body


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tree", action="append", required=True, metavar="NAME=DIR")
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--tokens", type=int, default=4)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    args.out = str(Path(args.out).resolve())
    trees = parse_trees(args.tree)
    if trees is None:
        return 2
    return _rc.run("request_calls_s27_relay", trees, args, engine_response(args.tokens), tokens=args.tokens)


if __name__ == "__main__":
    sys.exit(main())
