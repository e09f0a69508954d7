"""The load generator's ClientStream is the core's ContentStream: fed the same slices with the same stamps, it
finds the same first and last content token, counts, format, facts and end as the tap's StreamObserver, and
keeps what only the client records (every content event's stamp, the text)."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from deltatap.core.sse import StreamObserver
from deltatap.loadgen.stream import ClientStream

# the real llama.cpp capture (64 content tokens, usage and timings, "data: [DONE]" without its blank line)
CAPTURE = (Path(__file__).resolve().parents[1] / "fixtures" / "sse" / "llamacpp-chat-completions.sse").read_bytes()

# whitespace-only first tokens, a malformed event, tool-call and reasoning content, usage
MIXED = b"".join(
    f"data: {d}\n\n".encode()
    for d in [
        json.dumps({"object": "chat.completion.chunk", "model": "m", "choices": [{"delta": {"role": "assistant", "content": None}}]}),
        json.dumps({"choices": [{"delta": {"content": "\n"}}]}),
        "not json",
        json.dumps({"choices": [{"delta": {"content": "  "}}]}),
        json.dumps({"choices": [{"delta": {"reasoning_content": "think"}}]}),
        json.dumps({"choices": [{"delta": {"tool_calls": [{"function": {"arguments": "{\"a\": 1}"}}]}}]}),
        json.dumps({"choices": [{"delta": {"content": "done ü"}, "finish_reason": "stop"}]}),
        json.dumps({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 5}}),
        "[DONE]",
    ]
)


def _slices(data: bytes, cuts: list[int]) -> list[bytes]:
    edges = [0, *sorted({c for c in cuts if 0 < c < len(data)}), len(data)]
    return [data[a:b] for a, b in zip(edges, edges[1:])]


def _both(data: bytes, cuts: list[int]) -> tuple[ClientStream, StreamObserver]:
    client, tap = ClientStream(path=None, format=None), StreamObserver()
    for i, piece in enumerate(_slices(data, cuts)):
        t, bound = 1_000 + 10 * i, i % 3  # a bound that changes from read to read
        client.feed(piece, t, bound)
        tap.feed(piece, t, bound)
    client.finish(9_999, 5)
    tap.finish(9_999, 5)
    return client, tap


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(["capture", "mixed"]), st.lists(st.integers(min_value=1, max_value=16_000), max_size=40))
def test_client_stream_sees_what_the_tap_sees(which, cuts):
    data = CAPTURE if which == "capture" else MIXED
    client, tap = _both(data, cuts)
    assert client.first_token_mono_ns == tap.first_token_mono_ns is not None
    assert client.first_token_bound_ns == tap.first_token_bound_ns
    assert client.event_times[-1] == tap.last_token_mono_ns and client.last_bound_ns == tap.last_token_bound_ns
    assert len(client.event_times) == client.content_events == tap.content_events
    assert client.event_times == sorted(client.event_times)
    assert client.leading_whitespace == tap.leading_whitespace_events
    assert (client.events, client.malformed, client.done, client.format, client.truncated) == (tap.events, tap.malformed, tap.done, tap.format, tap.truncated)
    assert client.facts == tap.facts
    assert client.chunks == tap.chunks


def test_client_stream_keeps_every_stamp_and_the_text():
    client, _ = _both(MIXED, [])  # one read: every content event carries its stamp
    assert client.event_times == [1_000] * 5 and client.first_token_mono_ns == 1_000
    assert client.leading_whitespace == 2 and client.malformed == 1 and client.done
    assert client.text == "\n  think{\"a\": 1}done ü"
    assert (client.facts.input_tokens, client.facts.output_tokens, client.facts.finish_reasons) == (9, 5, ["stop"])

    events = [json.loads(line[6:]) for line in CAPTURE.decode().splitlines() if line.startswith("data: {")]
    expected = "".join(ch["delta"].get("content") or "" for e in events for ch in e["choices"])
    client, _ = _both(CAPTURE, list(range(0, len(CAPTURE), 50)))
    assert client.text == expected and len(client.event_times) == 64


def test_client_stream_counts_malformed_events_before_and_after_the_format():
    client = ClientStream(path=None, format="openai-chat")
    client.feed(b'data: {"foo": 1}\n\ndata: {oops\n\n', 1)  # the format is given: an unknown object is framing
    assert (client.events, client.malformed, client.format) == (2, 1, "openai-chat")
    client = ClientStream()
    client.feed(b'data: {"foo": 1}\n\ndata: 7\n\n', 1)  # nothing recognised yet: both malformed
    assert (client.events, client.malformed, client.format, client.event_times) == (2, 2, None, [])
