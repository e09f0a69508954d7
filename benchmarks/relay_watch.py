"""CPU the tap's relay spends watching one response read (in-process, no sockets): the C accelerator
(``native``: :data:`deltatap.proxy.relay._watch_read`, proxy/_relay.c, what :meth:`Upstream.data_received` calls for a
read of body bytes alone: framing, counters, observer and its forwarded bookkeeping in one C call), the Python hot
path (``hot``: :meth:`deltatap.proxy.relay.Upstream._watch` after the framing reader's ``feed``, which the accelerator
replaces and which runs when it is off or not built) and the general loop it replaced (``reference``:
:meth:`Upstream._watch_events`, the relay's watch step before the hot path).

Each response is the stream benchmarks/tap_mock_upstream.py writes (aiohttp, chunked: the head, a role event,
``--tokens`` content events, a usage event, [DONE], the last chunk), read one write per read. Only the body reads
between the head and the last chunk are timed (process CPU time), through the same framing reader and stream
observer either way (the C observer, when built), so the difference is the relay's own per-read steps. Paths
alternate each round (shuffled); figures are the median of the rounds.

A busy tap reads a whole response at once, as one cuts list (one piece per packet:
:meth:`Upstream.cuts_received`); the second figure is the CPU per response of ``cuts_received`` on the whole
response (head, body pieces, end: the span built at the end is in it, the same either way) with the accelerator
(``cuts_native``) and without it (``cuts_python``).

    .venv/bin/python benchmarks/relay_watch.py [--responses 20000] [--rounds 5] [--tokens 8]

Writes benchmarks/results/relay_watch.json.
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

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from deltatap.core.fingerprint import Fingerprinter
from deltatap.core.native import status as native_status
from deltatap.proxy import TapOptions
from deltatap.proxy.record import TapRecord
from deltatap.proxy import relay
from deltatap.proxy.relay import Downstream, Exchange, Upstream
from deltatap.proxy.server import Tap
from deltatap.proxy.spans import begin
from deltatap.telemetry.tracer import setup_telemetry

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from tap_mock_upstream import DONE, ROLE, token  # noqa: E402


def reads(tokens: int) -> list[bytes]:
    """The mock upstream's response, one read per write (aiohttp frames each write as one chunk)."""
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n"
    usage = b'data: {"object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":8,"completion_tokens":%d}}\n\n' % tokens
    events = [ROLE, *(token(i) for i in range(tokens)), usage, DONE]
    return [head, *(b"%x\r\n" % len(e) + e + b"\r\n" for e in events), b"0\r\n\r\n"]


PATHS = ("native", "hot", "reference")


def run(tap: Tap, stream: list[bytes], responses: int, path: str) -> float:
    """CPU seconds spent watching the body reads of ``responses`` responses."""
    spent = 0.0
    t = 1_000_000
    for _ in range(responses):
        d = Downstream(tap)
        d.closed = True  # (no socket: no head timer)
        up = Upstream(tap)
        up.down, d.up = d, up
        ex = Exchange(TapRecord(received=t, method="POST", path="/v1/chat/completions"), begin({}), Fingerprinter(tap.fp_key), b"POST")
        ex.request_done = True
        tap.exchange_started()
        d.exchanges.append(ex)
        reader = up.reader
        reader.expect(b"POST")
        watch = up._watch_events if path == "reference" else up._watch
        native = relay._watch_read if path == "native" else None
        up._watch(d, stream[0], reader.feed(stream[0]), t, 0, t + 10, 0)  # the head (untimed)
        c0 = time.process_time()
        if native is not None:  # (as Upstream.data_received: the C call, the Python path for what it does not take)
            for data in stream[1:-1]:
                t += 1_000_000
                if not native(up, d, data, t, 0, t + 10, 0):
                    watch(d, data, reader.feed(data), t, 0, t + 10, 0)
        else:
            for data in stream[1:-1]:
                t += 1_000_000
                watch(d, data, reader.feed(data), t, 0, t + 10, 0)
        spent += time.process_time() - c0
        up._watch(d, stream[-1], reader.feed(stream[-1]), t, 0, t + 10, 0)  # the end (untimed: the span is built)
        assert ex.done and ex.rec.stream is not None and ex.rec.stream.tokens == len(stream) - 5
    return spent


class _Sent(Downstream):
    """A downstream side without a socket: each write stamped as a kernel-stamped write is, exact and placed."""

    def send(self, data: bytes) -> tuple[int, int]:
        self.last_write_mono = t = (self.last_write_mono or 0) + 10
        self.last_write_bound, self.unplaced = 0, None
        return t, 0


def run_cuts(tap: Tap, stream: list[bytes], responses: int, native: bool) -> float:
    """CPU seconds spent in ``cuts_received`` on ``responses`` whole responses, each read as one cuts list."""
    data = b"".join(stream)
    pieces, pos, t = [], 0, 1_000_000
    for w in stream:
        t += 1_000_000
        pieces.append((pos, pos + len(w), t, 0))
        pos += len(w)
    saved = relay._watch_cuts
    relay._watch_cuts = saved if native else None
    spent = 0.0
    try:
        for _ in range(responses):
            d = _Sent(tap)
            d.closed = True  # (no socket: no head timer)
            up = Upstream(tap)
            up.down, d.up = d, up
            ex = Exchange(TapRecord(received=t, method="POST", path="/v1/chat/completions"), begin({}), Fingerprinter(tap.fp_key), b"POST")
            ex.request_done = True
            tap.exchange_started()
            d.exchanges.append(ex)
            up.reader.expect(b"POST")
            c0 = time.process_time()
            up.cuts_received(data, pieces)
            spent += time.process_time() - c0
            assert ex.done and ex.rec.stream is not None and ex.rec.stream.tokens == len(stream) - 5
    finally:
        relay._watch_cuts = saved
    return spent


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--responses", type=int, default=20000, help="responses per path per round")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--tokens", type=int, default=8)
    p.add_argument("--out", default=str(HERE / "results" / "relay_watch.json"))
    args = p.parse_args()
    telemetry = setup_telemetry("deltatap-bench", exporter=InMemorySpanExporter())
    tap = Tap(TapOptions(upstream="http://127.0.0.1:9", link="fw-engine"), telemetry)
    stream = reads(args.tokens)
    body_reads = len(stream) - 2
    paths = [p for p in PATHS if p != "native" or relay._watch_read is not None]
    per_read: dict[str, list[float]] = {p: [] for p in paths}
    for path in paths:
        run(tap, stream, 200, path)  # warm-up
    cuts_paths = ["cuts_native", "cuts_python"] if relay._watch_cuts is not None else ["cuts_python"]
    per_response: dict[str, list[float]] = {p: [] for p in cuts_paths}
    for path in cuts_paths:
        run_cuts(tap, stream, 200, path == "cuts_native")  # warm-up
    for rnd in range(args.rounds):
        order = list(paths) + cuts_paths
        random.Random(rnd).shuffle(order)
        for path in order:
            if path in per_response:
                s = run_cuts(tap, stream, args.responses, path == "cuts_native")
                per_response[path].append(s / args.responses * 1e6)
                continue
            s = run(tap, stream, args.responses, path)
            per_read[path].append(s / (args.responses * body_reads) * 1e6)
    telemetry.shutdown()
    med = {k: round(statistics.median(v), 3) for k, v in per_read.items()}
    med_cuts = {k: round(statistics.median(v), 2) for k, v in per_response.items()}
    result = {
        "command": "python benchmarks/relay_watch.py " + " ".join(sys.argv[1:]),
        "what": "process CPU microseconds per response body read spent in the relay's watch step (framing and stream "
                "observer included): native = the C accelerator relay._watch_read (proxy/_relay.c; absent when not built or "
                "DELTATAP_NATIVE turns it off), hot = Upstream._watch after Reader.feed (the Python path), reference = "
                "Upstream._watch_events (the loop every read went through before the hot path); median of the rounds",
        "accelerators": native_status(),
        "tokens_per_stream": args.tokens,
        "body_reads_per_response": body_reads,
        "responses_per_round": args.responses,
        "us_per_read": med,
        "us_per_read_rounds": {k: [round(x, 3) for x in v] for k, v in per_read.items()},
        "saved_us_per_response": round((med["reference"] - med["hot"]) * body_reads, 2),
        "native_saved_us_per_response": round((med["hot"] - med["native"]) * body_reads, 2) if "native" in med else None,
        "cuts_us_per_response": med_cuts,
        "cuts_us_per_response_rounds": {k: [round(x, 2) for x in v] for k, v in per_response.items()},
        "machine": {"python": platform.python_version(), "platform": platform.platform()},
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({"us_per_read": med, "saved_us_per_response": result["saved_us_per_response"],
                      "native_saved_us_per_response": result["native_saved_us_per_response"], "cuts_us_per_response": med_cuts}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
