"""The load generator's ClientStream is the tap's StreamObserver (the C observer where it is built): fed the same
slices with the same stamps, it finds the same first and last content token, counts, format, facts and end as the
tap's, and as the Python reference (a ContentStream that keeps its text, every event through ``take``); it keeps
what only the client records: every content event's stamp and its text, the reference's on any split of the stream,
finished or not."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from deltatap.core import sse
from deltatap.core.sse import ContentStream, StreamObserver
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


class _Stamps(ContentStream):
    """The Python reference with every content event's stamp (``take`` / ``count`` as defined, no accelerator)."""

    def __init__(self, fmt: str | None = None) -> None:
        super().__init__(fmt, keep_text=True)
        self.times: list[int] = []

    def count(self, got, t_mono_ns, bound_ns=0):
        if got[0]:
            self.times.append(t_mono_ns)
        return super().count(got, t_mono_ns, bound_ns)


# adversarial events next to ordinary ones: escapes, whitespace of every kind, invalid UTF-8, duplicate keys, finish
# reasons, errors, non-object choices, completions events after chat ones
_EVENTS = st.sampled_from([
    b'{"choices":[{"delta":{"content":"a"}}]}', b'{"choices":[{"delta":{"content":" "}}]}',
    b'{"choices":[{"delta":{"content":"\\u00a0\\n"}}]}', b'{"choices":[{"delta":{"content":"\\ud83d\\ude00"}}]}',
    b'{"choices":[{"delta":{"content":"\xe2\x80\x83"}}]}', b'{"choices":[{"delta":{"content":"\xff"}}]}',
    b'{"choices":[{"delta":{"content":"x","content":"y"}}]}', b'{"choices":[{"delta":{"role":"assistant"}}]}',
    b'{"choices":[{"delta":{},"finish_reason":"stop"}]}', b'{"choices":[7,{"delta":{"content":"z"}}]}',
    b'{"choices":[{"text":"t"}],"object":"text_completion"}', b'{"error":{"type":"overloaded"}}',
    b'{"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2}}', b'{"model":"m","id":"c1","choices":[]}',
    b"[DONE]", b"", b"not json", b"{", b'{"choices":[{"delta":{"reasoning_content":"r"}}]}',
])


@settings(max_examples=300, deadline=None)
@given(st.lists(_EVENTS, max_size=12), st.sampled_from([b"\n", b"\r\n", b"\r"]), st.lists(st.integers(min_value=1, max_value=600), max_size=12),
       st.booleans(), st.sampled_from([None, "openai-chat", "openai-completions"]))
def test_client_stream_matches_the_python_reference(events, eol, cuts, finished, fmt):
    data = b"".join(b"data: " + e + eol + eol for e in events) + (b"data: " + events[0] + eol if events and not finished else b"")
    client, ref = ClientStream(format=fmt), _Stamps(fmt)
    for i, piece in enumerate(_slices(data, cuts)):
        client.feed(piece, 1_000 + 10 * i, i % 2)
        ref.feed(piece, 1_000 + 10 * i, i % 2)
    if finished:
        client.finish(9_999, 3)
        ref.finish(9_999, 3)
    assert client.event_times == ref.times and client.text == ref.text
    assert (client.first_token_mono_ns, client.first_token_bound_ns, client.last_token_mono_ns, client.last_bound_ns) == (
        ref.first_token_mono_ns, ref.first_token_bound_ns, ref.last_token_mono_ns, ref.last_token_bound_ns)
    assert (client.events, client.content_events, client.tokens, client.malformed, client.leading_whitespace, client.done,
            client.format, client.facts) == (ref.events, ref.content_events, ref.tokens, ref.malformed,
                                            ref.leading_whitespace_events, ref.done, ref.format, ref.facts)


def test_client_stream_reads_with_the_c_observer_where_it_is_built():
    client = ClientStream(format="openai-chat")
    assert ClientStream._native is StreamObserver._native
    if sse._ObservingParser is not None:
        assert type(client.parser) is sse._ObservingParser and client._native
    client.feed(MIXED, 5)
    assert client.text == "\n  think{\"a\": 1}done ü"


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
