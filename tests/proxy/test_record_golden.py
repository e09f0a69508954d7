"""The tap's span contents held to a golden: attributes, events, status, ids and the finish counters of generated
exchanges, as the record and span code produced them before its per-request work was cut (issue 15, session 19).

Each case is a :class:`deltatap.proxy.record.TapRecord` built as the relay fills one — normal streams (OpenAI chat,
completions, Anthropic, llama.cpp timings; split at random read points, forwarded with bounds), JSON answers with
usage, tap timeouts, upstream errors and resets, client cancels (at a gRPC-style deadline too), WebSocket tunnels,
request captures (valid, malformed, duplicate keys, booleans, non-objects), redacted queries, wide stamp bounds, and
incoming trace contexts (none, plain, with ``tracestate``, other versions, malformed) — then handed to
:meth:`deltatap.proxy.server.Tap.finish` of a tap whose processor keeps the span. What came out is compared with
``record_golden.json``, written by running this module's generator on the tree of the session's start::

    PYTHONPATH=<shim of that tree> .venv/bin/python tests/proxy/test_record_golden.py --write tests/proxy/record_golden.json

(no network: the generator is seeded; span ids come from a seeded generator too).
"""

from __future__ import annotations

import json
import random
import sys
import types
from pathlib import Path

from deltatap.core.clock import to_unix_ns
from deltatap.core.clocksync import ClockEstimate
from deltatap.core.sse import StreamObserver
from deltatap.core.vocab import Outcome, TapEvent
from deltatap.proxy import errors
from deltatap.proxy.options import TapOptions
from deltatap.proxy.record import TapRecord
from deltatap.proxy.server import Tap
from deltatap.proxy.spans import begin
from deltatap.proxy.websocket import WsTunnel
from deltatap.telemetry import spans as tspans
from deltatap.telemetry.tracer import NullExporter, setup_telemetry

GOLDEN = Path(__file__).with_name("record_golden.json")
CASES = 120

_PATHS = ["/v1/chat/completions", "/v1/completions", "/completion", "/v1/messages", "/v1/embeddings", "/v1/responses/",
          "/healthz", "/v1/models", "/", "/v1/chat/completions/"]
_QUERIES = ["", "", "a=1&b=2", "api_key=sk-123&model=x", "keep=yes&secret=no&keep=again", "flag", "x=%20y&&z="]
_METHODS = ["POST", "POST", "GET", "PUT", "HEAD", "DELETE", "FOO"]
_REQUESTS = [
    None, b"", b"{}", b'{"model": "m1", "max_tokens": 7}', b'{"model": "m2", "max_completion_tokens": 12, "stream": true}',
    b'{"model": "m3", "max_output_tokens": 3}', b'{"model": "m4", "n_predict": 64, "max_tokens": true}',
    b'{"model": 5, "max_tokens": 2.5, "max_completion_tokens": 9}', b'{"model": "a", "model": "b", "max_tokens": 1, "max_tokens": 2}',
    b"[1, 2, 3]", b'"text"', b"{not json", b'{"model": "m"} trailing', b'  \n{"model": "ws", "max_tokens": 4}\r\n ',
    b'\xef\xbb\xbf{"model": "bom"}', '{"model": "u16"}'.encode("utf-16"), b'{"model": "caf\xc3\xa9", "max_tokens": -1}',
    b'{"model": "\\u00e9\\ud83d\\ude00"}', b'{"model": "bad\xff"}', b"null", b'{"messages": [], "max_tokens": 10000000000000000000000}',
    b'{"model": "x", "max_tokens": null, "n_predict": 5}', b"\x00\x00", b"{" * 40 + b"}" * 40,
]
_RESPONSES = [
    None, b"", b'{"model": "r1", "id": "cmpl-1", "usage": {"prompt_tokens": 11, "completion_tokens": 22}, '
    b'"choices": [{"finish_reason": "stop"}, {"finish_reason": "length"}, 3]}',
    b'{"model": "claude", "id": "msg_1", "usage": {"input_tokens": 5, "output_tokens": 6}, "stop_reason": "end_turn"}',
    b'{"timings": {"prompt_ms": 1.5, "predicted_ms": 20.25, "prompt_n": 4, "predicted_n": 9, "cache_n": 2}, "model": "llama"}',
    b'{"usage": {"prompt_tokens": "x"}, "choices": null}', b"[]", b"garbage", b'{"usage": {"input_tokens": 1}}',
]


def _sse(fmt: str, rng: random.Random, tokens: int) -> bytes:
    out = []
    if fmt == "openai-chat":
        out.append({"id": "c1", "model": "gm", "choices": [{"delta": {"role": "assistant"}, "index": 0}]})
        for i in range(tokens):
            out.append({"id": "c1", "model": "gm", "choices": [{"delta": {"content": rng.choice([" ", "tok", "\n", f"w{i}"])}, "index": 0}]})
        out.append({"id": "c1", "choices": [{"delta": {}, "finish_reason": rng.choice(["stop", "length"])}]})
        if rng.random() < 0.6:
            out.append({"id": "c1", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": tokens}})
        lines = [f"data: {json.dumps(o)}\n\n" for o in out] + ["data: [DONE]\n\n"]
    elif fmt == "openai-completions":
        out.append({"id": "t1", "model": "cm", "object": "text_completion", "choices": [{"text": "", "index": 0}]})
        for i in range(tokens):
            out.append({"id": "t1", "object": "text_completion", "choices": [{"text": f"t{i}", "index": 0}]})
        out.append({"id": "t1", "object": "text_completion", "choices": [{"text": "", "finish_reason": "stop"}],
                    "timings": {"prompt_ms": 2.0, "predicted_ms": 8.5, "prompt_n": 3, "predicted_n": tokens}})
        lines = [f"data: {json.dumps(o)}\n\n" for o in out] + ["data: [DONE]\n\n"]
    else:  # anthropic
        evs = [("message_start", {"type": "message_start", "message": {"id": "msg_9", "model": "claude-x", "usage": {"input_tokens": 9}}}),
               ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})]
        for i in range(tokens):
            evs.append(("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": f"a{i}"}}))
        evs.append(("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": tokens}}))
        evs.append(("message_stop", {"type": "message_stop"}))
        lines = [f"event: {e}\ndata: {json.dumps(d)}\n\n" for e, d in evs]
    if rng.random() < 0.15:
        lines.insert(1, "data: {broken\n\n")
    if rng.random() < 0.1:
        lines = lines[:-1]  # no terminator: the stream ended with the connection
    return "".join(lines).encode()


def _stream(rng: random.Random, path: str, t: int) -> tuple[StreamObserver, int]:
    fmt = rng.choice(["openai-chat", "openai-chat", "openai-completions", "anthropic"])
    data = _sse(fmt, rng, rng.randint(0, 9) if rng.random() < 0.85 else rng.randint(95, 140))  # (p99 below 100 gaps and above)
    obs = StreamObserver(path=path)
    cuts = sorted(rng.sample(range(1, len(data)), min(len(data) - 1, rng.randint(0, 8) or 130))) if len(data) > 1 else []
    prev = 0
    for cut in cuts + [len(data)]:
        t += rng.randint(1, 3_000_000)
        obs.feed(data[prev:cut], t, rng.choice([0, 0, 10_000, 70_000]))
        prev = cut
        if rng.random() < 0.8:
            obs.forwarded(t + rng.randint(0, 200_000), rng.choice([0, 0, 5_000, 90_000, -1]))
    t += rng.randint(0, 1_000_000)
    obs.finish(t, rng.choice([0, 60_000]))
    obs.forwarded(t + rng.randint(0, 100_000), rng.choice([0, 80_000]))
    return obs, t


def _case(rng: random.Random, i: int) -> tuple[dict, TapRecord]:
    t = 10_000_000_000 + i * 1_000_000_000
    path = rng.choice(_PATHS)
    rec = TapRecord(received=t, method=rng.choice(_METHODS), path=path, query=rng.choice(_QUERIES),
                    client_address=rng.choice([None, "127.0.0.1", "::1"]), request_id=f"rid-{i}", request_id_created=rng.random() < 0.5)
    rec.bounds[TapEvent.REQUEST_RECEIVED] = (rng.choice([0, 0, 40_000, 120_000]), 0)
    headers: dict[str, str] = {}
    kind = rng.choice(["none", "plain", "plain", "state", "v01", "bad", "zero", "unsampled"])
    tid, sid = f"{rng.getrandbits(128):032x}", f"{rng.getrandbits(64):016x}"
    if kind == "plain":
        headers["traceparent"] = f"00-{tid}-{sid}-01"
    elif kind == "unsampled":
        headers["traceparent"] = f"00-{tid}-{sid}-00"
    elif kind == "state":
        headers["traceparent"] = f"00-{tid}-{sid}-01"
        headers["tracestate"] = rng.choice(["vendor=abc", "a=1,b=2", "bad state!!"])
    elif kind == "v01":
        headers["traceparent"] = f"01-{tid}-{sid}-01-extra"
    elif kind == "bad":
        headers["traceparent"] = rng.choice(["garbage", f"00-{tid}-{sid}", f"00-{tid.upper()}-{sid}-01"])
    elif kind == "zero":
        headers["traceparent"] = f"00-{'0' * 32}-{sid}-01"
    # the request side
    if rng.random() < 0.9:
        t += rng.randint(0, 500_000)
        rec.head = t
    if rec.head is not None and rng.random() < 0.85:
        t += rng.randint(0, 2_000_000)
        rec.body_received = t
        rec.bounds[TapEvent.REQUEST_BODY_RECEIVED] = (rng.choice([0, 30_000, 200_000]), 0)
        if rng.random() < 0.9:
            t += rng.randint(0, 300_000)
            rec.forwarded = t
            rec.bounds[TapEvent.REQUEST_FORWARDED] = (0, rng.choice([0, 20_000, 80_000, -1]))
    rec.request_bytes = rng.randint(0, 5000)
    rec.request_capture = bytearray(c) if (c := rng.choice(_REQUESTS)) is not None and rng.random() < 0.5 else c
    rec.fingerprint = rng.choice([None, "", f"{rng.getrandbits(128):032x}"])
    end = rng.random()
    if end < 0.1:  # no response: the tap's own answer (timeout or unreachable)
        failure = rng.choice([errors.TAP_TIMEOUT, errors.connect_failure(ConnectionRefusedError(111, "Connection refused")),
                              errors.connect_failure(OSError(113, "No route to host"))])
        rec.failure = failure
        t += rng.randint(1_000, 9_000_000)
        if failure.outcome == Outcome.TIMEOUT:
            rec.timeout = t
        else:
            rec.upstream_error = t
        rec.status = failure.status
        rec.end = t + rng.randint(0, 100_000)
    elif end < 0.15:  # the client went away before any answer
        t += rng.randint(1_000, 9_000_000)
        rec.downstream_closed = t
        if rng.random() < 0.5:
            rec.deadline_ns = rng.choice([t - rec.received, t - rec.received + 10_000_000_000])
    else:
        t += rng.randint(100_000, 50_000_000)
        rec.response_headers = t
        rec.bounds[TapEvent.RESPONSE_HEADERS] = (rng.choice([0, 0, 90_000]), 0)
        t += rng.randint(0, 200_000)
        rec.response_headers_forwarded = t
        rec.bounds[TapEvent.RESPONSE_HEADERS_FORWARDED] = (0, rng.choice([0, 10_000, 60_000]))
        rec.status = rng.choice([200, 200, 200, 201, 101, 400, 404, 429, 500, 502, 503])
        shape = rng.random()
        if rec.status == 101 and shape < 0.5:
            rec.ws = WsTunnel(rng.random() < 0.5)
            rec.ws.connection_closed(rng.choice(["client", "server"]))
        elif shape < 0.65:
            rec.stream, t = _stream(rng, path, t)
            rec.chunks = rng.randint(1, 20)
        else:
            cap = rng.choice(_RESPONSES)
            rec.response_capture = bytearray(cap) if cap is not None else None
        rec.response_bytes = rng.randint(0, 100_000)
        after = rng.random()
        if after < 0.7:
            t += rng.randint(0, 5_000_000)
            rec.response_end = t
            rec.bounds[TapEvent.RESPONSE_END] = (rng.choice([0, 55_000]), 0)
            rec.end = t + rng.randint(0, 300_000) if rng.random() < 0.9 else None
        elif after < 0.8:
            t += rng.randint(0, 5_000_000)
            rec.failure = errors.TAP_TIMEOUT
            rec.timeout = t
        elif after < 0.9:
            t += rng.randint(0, 5_000_000)
            rec.failure = rng.choice([errors.classify(ConnectionResetError()), errors.Failure(
                Outcome.UPSTREAM_ERROR, 502, "upstream_closed", "the upstream closed the connection before the response ended")])
            rec.upstream_closed = t
        else:
            t += rng.randint(0, 5_000_000)
            rec.downstream_closed = t
    if rng.random() < 0.05:
        rec.outcome = rng.choice(list(Outcome))
    if rng.random() < 0.1:  # a stamp that ties another one (ties keep the logical order)
        rec.response_end = rec.response_headers
    return headers, rec


def _taps() -> list[tuple[Tap, object]]:
    out = []
    for labels, keep, key, clock in (({}, (), None, None),
                                     ({"region": "eu", "run": "7"}, ("keep", "model"), "a-fingerprint-key", ClockEstimate(-1234, 56, 789, 8))):
        kept: list = []
        tel = setup_telemetry("deltatap-tap", exporter=NullExporter())
        tel.processor = types.SimpleNamespace(on_end=kept.append, stats=tel.processor.stats)
        o = TapOptions(upstream="http://127.0.0.1:9/base", link="gw-fw", admin_port=None, labels=labels, query_keep=keep,
                       fingerprint_key=key)
        tap = Tap(o, tel)
        tap.clock = clock
        out.append((tap, kept))
    return out


def _plain(v: object) -> object:
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v


def generate(cases: int = CASES) -> list[dict]:
    """Every case's span (attributes, events relative to its start, status, context) and, at the end, each tap's
    counters."""
    rng = random.Random(20261124)
    tspans._rand.seed(19)
    taps = _taps()
    out: list[dict] = []
    off = to_unix_ns(0)
    for i in range(cases):
        headers, rec = _case(rng, i)
        start = begin(headers)
        (tap, kept), sampling = taps[i % 2], i % 3 == 0
        tap.o.respect_sampling = sampling
        tap.in_flight += 1
        tap.counters.in_flight += 1
        before = len(kept)
        tap.finish(start, rec)
        doc: dict = {"case": i, "trace_headers": start.trace_headers, "outcome": str(rec.outcome)}
        if len(kept) > before:
            s = kept[-1]
            doc["span"] = {
                "name": s[1], "kind": s[2], "trace_id": s[3], "span_id": s[4], "trace_state": s[5], "parent": s[6],
                "remote": s[7], "flags": s[8], "attributes": {k: _plain(v) for k, v in s[9].items()},
                "attribute_order": list(s[9]), "events": [[n, tu - off, a] for n, tu, a in s[10]],
                "start": s[11] - off, "end": s[12] - off, "status": s[13], "description": s[14],
            }
        out.append(doc)
    for n, (tap, _kept) in enumerate(taps):
        c = tap.counters
        out.append({"tap": n, "requests": dict(sorted(c.requests.items())), "upstream_errors": dict(sorted(c.upstream_errors.items())),
                    "in_flight": c.in_flight, "request_bytes": c.request_bytes, "response_bytes": c.response_bytes,
                    "histograms": [[h.counts, h.sum_ns, h.count] for h in (c.overhead_request, c.overhead_first_token, c.upstream_ttft)]})
    return out


def test_spans_match_the_golden():
    got = json.loads(json.dumps(generate()))  # (tuples -> lists, as the golden holds them)
    want = json.loads(GOLDEN.read_text())
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g == w, f"case {w.get('case', w.get('tap'))}"


def test_the_golden_covers_what_it_claims():
    want = json.loads(GOLDEN.read_text())
    spans = [d["span"] for d in want if "span" in d]
    outcomes = {d["outcome"] for d in want if "outcome" in d}
    assert {"ok", "timeout", "upstream_error", "client_cancel", "http_error"} <= outcomes
    assert any(s["trace_state"] for s in spans) and any(s["parent"] is None for s in spans) and any(s["parent"] for s in spans)
    attrs = [s["attributes"] for s in spans]
    for key in ("gen_ai.request.model", "gen_ai.request.max_tokens", "gen_ai.usage.input_tokens", "deltatap.stamp.bounds",
                "url.query", "deltatap.stream.gap.p99_ms", "deltatap.engine.prompt_ms", "error.type", "deltatap.clock.offset_ns"):
        assert any(key in a for a in attrs), key
    assert len(spans) < len([d for d in want if "outcome" in d])  # some left out under respect_sampling


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--write":
        Path(sys.argv[2]).write_text("[\n" + ",\n".join(json.dumps(d, separators=(",", ":")) for d in generate()) + "\n]\n")
    else:
        sys.exit("usage: test_record_golden.py --write PATH")
