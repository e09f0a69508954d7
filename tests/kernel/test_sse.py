"""deltatap.core.sse: the sans-I/O SSE parser, format extractors, first-content-token rule and gap stats."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deltatap.core.sse import FORMATS, ContentStream, GapStats, SseParser, StreamObserver, detect_format, format_for_path

# the real llama.cpp capture from shared/fixtures, vendored next to the tests
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "sse" / "llamacpp-chat-completions.sse"


def sse(*objs, event: str | None = None, eol: str = "\n") -> bytes:
    out = []
    for o in objs:
        data = o if isinstance(o, str) else json.dumps(o)
        head = f"event: {event}{eol}" if event else ""
        out.append(f"{head}data: {data}{eol}{eol}")
    return "".join(out).encode()


def feed_split(obs: StreamObserver, data: bytes, cuts: list[int], t0: int = 1_000) -> list[int]:
    """Feed ``data`` split at ``cuts``; chunk i is stamped t0 + i."""
    bounds = [0, *sorted(set(c for c in cuts if 0 < c < len(data))), len(data)]
    return [obs.feed(data[a:b], t0 + i) for i, (a, b) in enumerate(zip(bounds, bounds[1:]))]


# ---- the parser ---------------------------------------------------------------------------


@pytest.mark.parametrize("eol", ["\n", "\r\n", "\r"])
def test_line_endings_and_fields(eol):
    raw = f": hello{eol}event: ping{eol}id: 7{eol}retry: 150{eol}data: a{eol}data:b{eol}{eol}data: c{eol}{eol}".encode()
    p = SseParser()
    evs = p.feed(raw)
    assert [(e.event, e.data, e.id, e.retry) for e in evs] == [("ping", "a\nb", "7", 150), ("", "c", "7", None)]
    assert p.comments == 1


def test_crlf_split_between_reads_is_one_line_end():
    p = SseParser()
    assert p.feed(b"data: x\r") == []
    assert p.feed(b"\n") == []  # the LF completes the CR: still no blank line
    evs = p.feed(b"\r\n")
    assert [e.data for e in evs] == ["x"]


def test_bom_split_and_unterminated_tail():
    p = SseParser()
    assert p.feed(b"\xef\xbb") == []
    assert [e.data for e in p.feed(b"\xbfdata: 1\n\ndata: 2\n")] == ["1"]
    assert [e.data for e in p.finish()] == ["2"] and not p.truncated
    p.feed(b"data: 3\n\ndata: par")
    assert p.finish() == [] and p.truncated


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=400), max_size=30), st.sampled_from(["\n", "\r\n", "\r"]))
def test_any_split_gives_same_events(cuts, eol):
    objs = [{"choices": [{"delta": {"content": f"tok{i} ü"}}]} for i in range(12)]
    raw = sse(*objs, eol=eol) + f": keepalive{eol}{eol}".encode() + sse("[DONE]", eol=eol)
    whole = StreamObserver()
    whole.feed(raw, 0)
    split = StreamObserver()
    feed_split(split, raw, cuts)
    assert split.events == whole.events == 13
    assert split.content_events == whole.content_events == 12
    assert split.comments == 1 and split.done


# ---- the real llama.cpp capture ------------------------------------------------------------


def test_llamacpp_capture_role_only_first_then_content_usage_and_timings():
    raw = FIXTURE.read_bytes()
    obs = StreamObserver(path="/v1/chat/completions")
    # feed in 7-byte pieces: every event is split across reads
    for i in range(0, len(raw), 7):
        obs.feed(raw[i : i + 7], i)
    assert not obs.done  # the capture ends "data: [DONE]\n" without the blank line
    obs.finish(len(raw))
    assert obs.format == "openai-chat"
    assert obs.done
    # the first event is role-only (content: null): the first content token comes from the second
    second_event_end = raw.index(b"\n\n", raw.index(b"\n\n") + 2) + 2
    assert obs.first_token_mono_ns is not None
    assert obs.first_token_mono_ns == ((second_event_end - 1) // 7) * 7
    assert obs.content_events == obs.tokens == 64
    assert obs.facts.output_tokens == 64 and obs.facts.input_tokens == 132
    assert obs.facts.timings == {"cache_n": 0, "prompt_n": 132, "prompt_ms": 289.562, "predicted_n": 64, "predicted_ms": 1145.437}
    assert obs.facts.finish_reasons == ["length"]
    assert obs.facts.model == "MODEL.gguf"
    assert obs.gaps.count == 63


# ---- each format: role-only / empty / null / framing never count as first token -----------


CASES = {
    "openai-chat": (
        "/v1/chat/completions",
        [
            {"object": "chat.completion.chunk", "model": "m", "choices": [{"index": 0, "delta": {"role": "assistant"}}]},
            {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": ""}}]},
            {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": None}}]},
            {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "Hi"}}]},
            {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
            {"object": "chat.completion.chunk", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 1}},
            "[DONE]",
        ],
        (5, 1),
    ),
    "openai-completions": (
        "/v1/completions",
        [
            {"object": "text_completion", "model": "m", "choices": [{"index": 0, "text": ""}]},
            {"object": "text_completion", "choices": [{"index": 0, "text": "Hi"}]},
            {"object": "text_completion", "choices": [{"index": 0, "text": "", "finish_reason": "length"}], "usage": {"prompt_tokens": 5, "completion_tokens": 1}},
            "[DONE]",
        ],
        (5, 1),
    ),
    "responses": (
        "/v1/responses",
        [
            {"type": "response.created", "response": {"id": "r1", "model": "m", "status": "in_progress"}},
            {"type": "response.output_item.added", "output_index": 0, "item": {"type": "message", "role": "assistant"}},
            {"type": "response.content_part.added", "part": {"type": "output_text", "text": ""}},
            {"type": "response.output_text.delta", "delta": ""},
            {"type": "response.output_text.delta", "delta": "Hi"},
            {"type": "response.output_text.done", "text": "Hi"},
            {"type": "response.completed", "response": {"id": "r1", "model": "m", "status": "completed", "usage": {"input_tokens": 5, "output_tokens": 1}}},
        ],
        (5, 1),
    ),
    "anthropic": (
        "/v1/messages",
        [
            {"type": "message_start", "message": {"id": "msg_1", "model": "claude", "usage": {"input_tokens": 5, "output_tokens": 1}}},
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
            {"type": "ping"},
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": ""}},
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi"}},
            {"type": "content_block_stop", "index": 0},
            {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 1}},
            {"type": "message_stop"},
        ],
        (5, 1),
    ),
    "llamacpp": (
        "/completion",
        [
            {"content": "", "stop": False, "id_slot": 0},
            {"content": "Hi", "stop": False, "id_slot": 0},
            {"content": "", "stop": True, "model": "g", "tokens_predicted": 1, "tokens_evaluated": 5, "stop_type": "limit", "timings": {"prompt_n": 5, "prompt_ms": 1.5, "predicted_n": 1, "predicted_ms": 2.0, "cache_n": 0}},
        ],
        (5, 1),
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("eol", ["\n", "\r\n"])
@pytest.mark.parametrize("with_path", [True, False])
def test_format_first_content_token(name, eol, with_path):
    path, events, (inp, out) = CASES[name]
    anthropic = name == "anthropic"
    chunks = [sse(e, event=(e["type"] if anthropic and isinstance(e, dict) else None), eol=eol) for e in events]
    obs = StreamObserver(path=path if with_path else None)
    content_index = next(i for i, e in enumerate(events) if isinstance(e, dict) and "Hi" in json.dumps(e) and "done" not in json.dumps(e))
    for i, c in enumerate(chunks):
        n = obs.feed(c, 100 + i)
        obs.forwarded(200 + i)
        assert n == (1 if i == content_index else 0), (name, i)
    assert obs.format == name
    assert obs.first_token_mono_ns == 100 + content_index
    assert obs.first_token_forwarded_mono_ns == 200 + content_index
    assert obs.last_token_mono_ns == 100 + content_index
    assert obs.content_events == 1 and obs.tokens == 1
    assert obs.done
    assert (obs.facts.input_tokens, obs.facts.output_tokens) == (inp, out)
    assert obs.facts.finish_reasons


def test_whitespace_only_first_token_is_skipped_but_counted():
    obs = StreamObserver("openai-chat")
    obs.feed(sse({"choices": [{"delta": {"content": "\n\n"}}]}), 1)
    obs.feed(sse({"choices": [{"delta": {"content": "Hello"}}]}), 2)
    assert obs.first_token_mono_ns == 2
    assert obs.leading_whitespace_events == 1
    assert obs.content_events == 2


def test_many_events_in_one_read_and_tool_calls_and_reasoning():
    obs = StreamObserver()
    raw = sse(
        {"choices": [{"delta": {"role": "assistant", "content": None}}]},
        {"choices": [{"delta": {"reasoning_content": "think"}}]},
        {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{\"a"}}]}}]},
    )
    assert obs.feed(raw, 5) == 2
    assert obs.first_token_mono_ns == 5 and obs.first_token_in_last_chunk
    assert obs.gaps.count == 1 and obs.gaps.max_ns == 0


def test_non_json_and_unknown_events_are_framing():
    obs = StreamObserver()
    obs.feed(b": comment\n\ndata: not json\n\nevent: x\ndata: {\"foo\": 1}\n\n", 1)
    assert obs.events == 2 and obs.content_events == 0 and obs.format is None
    assert obs.malformed == 2  # not JSON; JSON that no format recognises


# ---- ContentStream: the one classifier the tap, the load generator and the firewall share ----


def test_content_stream_malformed_text_and_first_token():
    cs = ContentStream(keep_text=True)
    raw = (
        b"data: not json\n\n"  # malformed
        b"data: [1, 2]\n\n"  # JSON, but no format recognises it: malformed
        b"data:\n\n"  # empty data: framing
        + sse({"object": "chat.completion.chunk", "choices": [{"delta": {"role": "assistant"}}]})
        + sse({"choices": [{"delta": {"content": " \n"}}]})
    )
    assert cs.feed(raw, 10, 3) == 1
    assert (cs.format, cs.malformed, cs.events, cs.content_events, cs.leading_whitespace_events) == ("openai-chat", 2, 5, 1, 1)
    assert cs.first_token_mono_ns is None and (cs.last_token_mono_ns, cs.last_token_bound_ns) == (10, 3)
    # a data value with one more space than the field's own still decodes as JSON
    assert cs.feed(b'data:  {"choices": [{"delta": {"content": "Hi"}}]}\n\n', 20, 7) == 1
    assert (cs.first_token_mono_ns, cs.first_token_bound_ns) == (20, 7)
    cs.feed(b'data: {"foo": 1}\n\n', 30)  # once the format is known, an event it does not read is framing
    assert cs.malformed == 2 and not cs.done
    cs.feed(b"data: [DONE]\n", 40)  # the blank line never comes: finish() dispatches it
    assert cs.finish(41) == 0 and cs.done and not cs.truncated
    assert cs.parts == [" \n", "Hi"] and cs.text == " \nHi" and cs.tokens == 2

    quiet = ContentStream("openai-chat")  # the tap's default: no text kept
    quiet.feed(sse({"choices": [{"delta": {"content": "Hi"}}]}), 1)
    assert quiet.parts is None and quiet.text == "" and quiet.content_events == 1


def test_content_stream_take_per_event_matches_feed():
    raw = FIXTURE.read_bytes()
    whole = ContentStream(path="/v1/chat/completions")
    whole.feed(raw, 5)
    whole.finish(6)
    by_event = ContentStream(path="/v1/chat/completions")
    texts = []
    for ev in [*by_event.parser.feed(raw), *by_event.parser.finish()]:
        text, tokens, _done = by_event.take(ev, 5)
        texts.append(text)
        assert tokens == (1 if text else 0)
    assert sum(1 for t in texts if t) == whole.content_events == by_event.content_events == 64
    assert (by_event.first_token_mono_ns, by_event.done, by_event.facts) == (whole.first_token_mono_ns, whole.done, whole.facts)
    with pytest.raises(ValueError, match="unknown stream format 'nope'"):
        ContentStream("nope")


def test_detectors_and_path_hints_cover_all_formats():
    assert set(FORMATS) == {"openai-chat", "openai-completions", "responses", "anthropic", "llamacpp"}
    for name, (path, events, _) in CASES.items():
        assert format_for_path(path) == name
        first = next(e for e in events if isinstance(e, dict))
        assert detect_format(first, first.get("type", "") if name == "anthropic" else "") == name
    assert format_for_path("/health") is None


def test_in_stream_error_type_recorded_without_text():
    obs = StreamObserver("openai-chat")
    obs.feed(sse({"error": {"type": "server_error", "message": "secret prompt text"}}), 1)
    assert obs.facts.error == "server_error"


# ---- gap statistics ----------------------------------------------------------------------


def _exact_p99(values):
    s = sorted(values)
    import math

    return s[max(1, math.ceil(0.99 * len(s))) - 1]


@pytest.mark.parametrize("n", [1, 2, 50, 1000, 12_799])
def test_gap_stats_exact_while_small(n):
    rng = random.Random(n)
    vals = [rng.randrange(0, 10_000_000) for _ in range(n)]
    g = GapStats()
    for v in vals:
        g.add(v)
    assert g.count == n and g.max_ns == max(vals)
    assert g.mean_ns == pytest.approx(sum(vals) / n)
    assert g.p99_ns() == _exact_p99(vals)


def test_gap_stats_bounded_and_within_one_percent_beyond():
    rng = random.Random(1)
    vals = [int(rng.lognormvariate(15, 1)) for _ in range(100_000)]
    g = GapStats()
    for v in vals:
        g.add(v)
    assert len(g._top) == 128 and len(g._buckets) < 2000
    assert g.p99_ns() == pytest.approx(_exact_p99(vals), rel=0.01)


def test_gap_stats_observe_uses_differences():
    g = GapStats()
    for t in (10, 15, 35):
        g.observe(t)
    assert (g.count, g.max_ns, g.mean_ns) == (2, 20, 12.5)
