"""CPU the tap's stream observer spends per response read (in-process, no sockets): StreamObserver.feed plus the
relay's forwarded() call after each read, three ways in the same process, interleaved:

- ``python``: the Python parser and the Python observer (what ``DELTATAP_NATIVE=0`` runs);
- ``c-parser``: the C event-stream parser, then one Python ``take`` per event (the path before
  deltatap.core._content: session 16);
- ``c-observer``: ``SseParser.observe``, one C call per read (deltatap.core._content).
- ``c-base`` (with ``--base DIR``): the same, with the ``_content`` extension built in another checkout ``DIR``
  (a before/after of a change to _content.c in one process, the paths alternating; e.g. a worktree of the previous
  commit after ``pip install -e`` there, or ``python setup.py build_ext --inplace``).

Streams: ``mock`` is benchmarks/tap_mock_upstream.py's (a role event, ``--tokens`` content events, usage,
[DONE]: what benchmarks/tap_cpu.py sends), ``vllm`` the same events shaped as vLLM sends them (id, created,
model, logprobs and finish_reason null in every chunk), ``burst`` the vllm events read 8 per read. Each read is
stamped 1 ms after the previous one. Figures: median over the rounds of process CPU µs per read and per content
event; paths alternate each round in a shuffled order.

    .venv/bin/python benchmarks/observer_cpu.py [--responses 5000] [--rounds 5] [--tokens 64] [--base DIR] [--keep-text]

``--keep-text``: every observer keeps each content event's text (``parts``, as the load generator's
``ClientStream(keep_text=True)``), and each response's text is checked.

Writes benchmarks/results/observer_cpu.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import time
from pathlib import Path

from deltatap.core import sse
from deltatap.core.gap_stats import GapStats

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from tap_mock_upstream import DONE, ROLE, token  # noqa: E402


def vllm_event(delta: dict, finish: str | None = None, usage: dict | None = None) -> bytes:
    obj = {"id": "chatcmpl-4f1b2c", "object": "chat.completion.chunk", "created": 1763980000, "model": "meta-llama/Llama-3.1-8B-Instruct",
           "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
    if usage is not None:
        obj["choices"] = []
        obj["usage"] = usage
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def streams(tokens: int) -> dict[str, list[bytes]]:
    usage = b'data: {"object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":8,"completion_tokens":%d}}\n\n' % tokens
    mock = [ROLE, *(token(i) for i in range(tokens)), usage, DONE]
    vllm = [vllm_event({"role": "assistant", "content": ""}), *(vllm_event({"content": f" tok{i}"}) for i in range(tokens)),
            vllm_event({}, "stop"), vllm_event({}, usage={"prompt_tokens": 8, "completion_tokens": tokens, "total_tokens": tokens + 8}),
            DONE]
    burst = [b"".join(vllm[i:i + 8]) for i in range(0, len(vllm), 8)]
    return {"mock": mock, "vllm": vllm, "burst": burst}


KEEP = {"text": False}  # --keep-text
BASE: dict = {}  # c-base: the other build's module, and the observer class that feeds its parser


def load_base(folder: str) -> str | None:
    """Load ``folder``'s built deltatap/core/_content extension under another name (the module's own state is its
    own); None when it loaded, else why not."""
    import importlib.machinery
    import importlib.util

    found = sorted(Path(folder, "deltatap", "core").glob("_content.*.so"))
    if not found:
        return f"no built _content extension under {folder}/deltatap/core (build it there first)"
    name = "deltatap_base._content"  # (the init function's name comes from the last part)
    loader = importlib.machinery.ExtensionFileLoader(name, str(found[0]))
    spec = importlib.util.spec_from_file_location(name, str(found[0]), loader=loader)
    if spec is None:
        return f"cannot load {found[0]}"
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    import heapq

    from deltatap.core.gap_stats import _LOG_GAMMA
    mod.setup(sse.SseEvent)
    mod.setup_observer(sse.FORMATS["openai-chat"], sse.FORMATS["openai-completions"], heapq.heappush, heapq.heapreplace, _LOG_GAMMA)

    class BaseGaps(mod.GapCore):  # type: ignore[name-defined,misc]
        __slots__ = ()
        mean_ns = GapStats.mean_ns
        quantile_ns = GapStats.quantile_ns
        p99_ns = GapStats.p99_ns

    class BaseObserver(sse.StreamObserver):
        def feed(self, data: bytes, t_mono_ns: int, bound_ns: int = 0) -> int:  # StreamObserver.feed's C line
            p = self.parser
            if self._native and type(p) is mod.SseParser:
                return p.observe(self, data, t_mono_ns, bound_ns)
            raise AssertionError("c-base: not its parser")

    BASE.update(mod=mod, gaps=BaseGaps, cls=BaseObserver)
    return None


def observer(path: str) -> sse.StreamObserver:
    if path == "c-base":
        obs = BASE["cls"](path="/v1/chat/completions")
        obs.parser = BASE["mod"].SseParser()
        obs.gaps = BASE["gaps"]()  # (forwarded() reads gaps_forwarded with this build's gaps_observe: this build's)
        if KEEP["text"]:
            obs.parts = []
        return obs
    obs = sse.StreamObserver(path="/v1/chat/completions")
    if path != "c-observer":
        obs._native = False
        obs.gaps, obs.gaps_forwarded = GapStats(), GapStats()
        if path == "python":
            obs.parser = sse._PySseParser()
        elif sse._acc is not None:
            obs.parser = sse._acc.SseParser()
    if KEEP["text"]:
        obs.parts = []
    return obs


def run(reads: list[bytes], responses: int, path: str, tokens: int) -> float:
    """CPU seconds to observe ``responses`` responses."""
    t = 1_000_000
    c0 = time.process_time()
    for _ in range(responses):
        obs = observer(path)
        for data in reads:
            t += 1_000_000
            if obs.feed(data, t, 0):
                obs.forwarded(t + 10_000, 0)
        obs.finish(t)
    spent = time.process_time() - c0
    assert obs.tokens == tokens and obs.done and obs.gaps.count == tokens - 1, path
    assert not KEEP["text"] or len(obs.parts) == tokens, path
    return spent


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--responses", type=int, default=5000, help="responses per path, stream and round")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--tokens", type=int, default=64, help="content events per response")
    p.add_argument("--base", metavar="DIR", help="also c-base: the _content extension built in checkout DIR (before/after)")
    p.add_argument("--keep-text", action="store_true", help="observers keep each content event's text (the load generator's keep_text)")
    p.add_argument("--out", default=str(HERE / "results" / "observer_cpu.json"))
    args = p.parse_args()
    KEEP["text"] = args.keep_text
    if sse._observe_acc is None:
        print("deltatap.core._content is not built (or DELTATAP_NATIVE turns it off): nothing to compare", file=sys.stderr)
        return 2
    paths = ["python", "c-parser", "c-observer"]
    if args.base:
        why = load_base(args.base)
        if why:
            print(f"--base {args.base}: {why}", file=sys.stderr)
            return 2
        paths.append("c-base")
    by_stream = streams(args.tokens)
    spent: dict[str, dict[str, list[float]]] = {s: {p: [] for p in paths} for s in by_stream}
    for name, reads in by_stream.items():
        for path in paths:
            run(reads, 50, path, args.tokens)  # warm-up
    for rnd in range(args.rounds):
        for name, reads in by_stream.items():
            order = list(paths)
            random.Random(rnd).shuffle(order)
            for path in order:
                spent[name][path].append(run(reads, args.responses, path, args.tokens))
    figures: dict = {}
    for name, reads in by_stream.items():
        figures[name] = {"reads_per_response": len(reads)}
        for path in paths:
            s = statistics.median(spent[name][path])
            figures[name][path] = {"us_per_read": round(s / (args.responses * len(reads)) * 1e6, 3),
                                   "us_per_content_event": round(s / (args.responses * args.tokens) * 1e6, 3),
                                   "us_per_response": round(s / args.responses * 1e6, 1)}
        figures[name]["c-observer_vs_c-parser"] = round(figures[name]["c-observer"]["us_per_response"] / figures[name]["c-parser"]["us_per_response"], 3)
        if "c-base" in paths:
            figures[name]["c-observer_vs_c-base"] = round(figures[name]["c-observer"]["us_per_response"] / figures[name]["c-base"]["us_per_response"], 3)
    result = {
        "command": "python benchmarks/observer_cpu.py " + " ".join(sys.argv[1:]),
        "what": "process CPU per response read of StreamObserver.feed (+ forwarded() after a read with content), median of the "
                "rounds: python = Python parser and observer, c-parser = C parser + Python take per event (session 16), "
                "c-observer = SseParser.observe (deltatap.core._content)" + (f", c-base = the same built in {args.base}" if args.base else ""),
        "tokens_per_response": args.tokens,
        "keep_text": args.keep_text,
        "responses_per_round": args.responses,
        "rounds": args.rounds,
        "figures": figures,
        "machine": {"python": platform.python_version(), "platform": platform.platform()},
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
