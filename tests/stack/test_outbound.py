"""The firewall's OutboundStream, without a network: its events are classified by the core's ContentStream (the
same first content token, counts, format and facts as the tap's StreamObserver on any split of the stream), and
each event is held with its own content text until its window is inspected, rewritten or blocked."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from deltatap.core.sse import ContentStream, StreamObserver

from deltatap.stack.config import OutboundInspection
from deltatap.stack.delays import DelaySampler
from deltatap.stack.firewall.outbound import OutboundStream
from deltatap.stack.firewall.rules import RuleSet

# the real llama.cpp capture: a role-only event, 64 content tokens, finish, usage + timings, [DONE]
CAPTURE = (Path(__file__).resolve().parents[1] / "fixtures" / "sse" / "llamacpp-chat-completions.sse").read_bytes()
WORDS = [json.loads(line[6:])["choices"][0]["delta"].get("content") for line in CAPTURE.decode().splitlines()
         if line.startswith('data: {"choices":[{') and '"content":"' in line]


def _outbound(mode: str = "streaming", window: int = 4, rules: list[dict] | None = None) -> OutboundStream:
    cfg = OutboundInspection.model_validate({"mode": mode, "window_tokens": window, "rules": rules or []})
    return OutboundStream(cfg, RuleSet(cfg.rules), DelaySampler(1), "/v1/chat/completions")


async def _drain(out: OutboundStream) -> bytes:
    sent = b""
    while out.ready(end=True):
        data, _content = await out.release()
        sent += data
    return sent


def _read(sent: bytes) -> ContentStream:
    seen = ContentStream(keep_text=True)
    seen.feed(sent, 1)
    seen.finish(2)
    return seen


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=len(CAPTURE) - 1), max_size=40))
def test_outbound_stream_classifies_as_the_tap_does(cuts):
    out, tap = _outbound(), StreamObserver(path="/v1/chat/completions")
    edges = [0, *sorted(set(cuts)), len(CAPTURE)]
    for i, (a, b) in enumerate(zip(edges, edges[1:])):
        out.feed(CAPTURE[a:b], 100 + i)
        tap.feed(CAPTURE[a:b], 100 + i)
    out.finish(999)
    tap.finish(999)
    assert out.first_in == tap.first_token_mono_ns is not None and out.last_in == tap.last_token_mono_ns
    assert out.content_events == tap.content_events == 64 and out.held_tokens == tap.tokens
    assert (out.format, out.facts, out.done) == (tap.format, tap.facts, tap.done)
    assert [h.text for h in out.held if h.text] == WORDS  # each held event with its own text
    assert len(out.held) == tap.events


async def test_windows_release_every_event_and_rewrite_within_them():
    out = _outbound(window=4, rules=[{"name": "pip", "keywords": ["Pip"], "action": "modify", "replacement": "Pop"}])
    out.feed(CAPTURE, 1)
    out.finish(2)
    sent = await _drain(out)
    assert out.windows == out.checks == 16 and not out.blocked  # 64 tokens in windows of 4
    seen = _read(sent)
    assert seen.content_events == 64 and seen.done and seen.facts.output_tokens == 64
    assert seen.first_token_mono_ns == 1 and not seen.malformed
    assert seen.text == "".join(WORDS).replace("Pip", "Pop") != "".join(WORDS)


async def test_a_blocking_window_ends_the_stream_with_content_filter():
    out = _outbound(window=8, rules=[{"name": "lamp", "keywords": ["old lamp"], "action": "block"}])
    out.feed(CAPTURE, 1)
    out.finish(2)
    sent = await _drain(out)
    assert out.blocked and out.verdict.rules == ["lamp"]
    seen = _read(sent)
    assert seen.done and seen.facts.finish_reasons == ["content_filter"]
    assert seen.text == "".join(WORDS[: seen.content_events]) and "lamp" not in seen.text
    assert seen.content_events % 8 == 0 and seen.content_events < 64


async def test_buffered_is_one_window_and_hybrid_holds_then_streams():
    buffered = _outbound(mode="buffered")
    half = CAPTURE.index(b"lighthouse")
    buffered.feed(CAPTURE[:half], 1)
    assert buffered.held_tokens > 0 and not buffered.ready(end=False)  # nothing leaves before the end
    buffered.feed(CAPTURE[half:], 2)
    buffered.finish(3)
    await _drain(buffered)
    assert buffered.windows == 1
    hybrid = OutboundStream(OutboundInspection(mode="hybrid", hybrid_buffer_tokens=16, window_tokens=8), RuleSet([]),
                            DelaySampler(1), "/v1/chat/completions")
    hybrid.feed(CAPTURE, 1)
    hybrid.finish(2)
    await _drain(hybrid)
    assert hybrid.windows == 1 + (64 - 16) // 8
