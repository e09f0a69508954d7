"""Session 26 (rate): StreamObserver.finish with no event left (the usual end) skips _events' frame where the C observer
runs; the observer's state after it is what _events leaves (compared with an observer that takes the Python path: a
subclass with its own _events, as any subclass that overrides it does)."""

from __future__ import annotations

import random

from deltatap.core.sse import StreamObserver

_SLOTS = ("events", "content_events", "tokens", "malformed", "leading_whitespace_events", "done", "first_token_mono_ns",
          "first_token_bound_ns", "last_token_mono_ns", "last_token_bound_ns", "chunks", "bytes", "first_chunk_mono_ns",
          "_unforwarded", "_unforwarded_first", "_last_had_first", "format")


class _PyPath(StreamObserver):
    def _events(self, events, t_mono_ns, bound_ns):  # (its own _events: the Python path, feed and finish)
        return StreamObserver._events(self, events, t_mono_ns, bound_ns)


def _chunk(i: int, text: str) -> bytes:
    return b'data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"content":"%s"}}]}\n\n' % (
        text.encode())


def _stream(rng: random.Random) -> list[bytes]:
    parts = [b'data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"role":"assistant"}}]}\n\n']
    parts += [_chunk(i, rng.choice(["a", " ", "b c", ""])) for i in range(rng.randrange(0, 5))]
    end = rng.randrange(4)
    if end == 0:
        parts.append(b"data: [DONE]\n\n")
    elif end == 1:
        parts.append(_chunk(9, "tail")[:-2])  # an unterminated last event: finish hands it over
    elif end == 2:
        parts.append(b"data: [DONE]")  # unterminated [DONE]
    blob = b"".join(parts)
    cuts = sorted(rng.sample(range(1, len(blob)), min(3, len(blob) - 1)))
    return [blob[a:b] for a, b in zip([0, *cuts], [*cuts, len(blob)])]


def test_finish_state_matches_the_python_path() -> None:
    rng = random.Random(2026)
    native_seen = StreamObserver._native
    for case in range(300):
        chunks = _stream(rng)
        obs, ref = StreamObserver(path="/v1/chat/completions"), _PyPath(path="/v1/chat/completions")
        assert not ref._native
        for i, c in enumerate(chunks):
            t = 1_000 + 10 * i
            assert obs.feed(c, t, i % 2) == ref.feed(c, t, i % 2)
            if i == 1:
                obs.forwarded(t + 1)
                ref.forwarded(t + 1)
        assert obs.finish(5_000, 3) == ref.finish(5_000, 3), case
        for name in _SLOTS:
            assert getattr(obs, name) == getattr(ref, name), (case, name)
        assert obs.first_token_in_last_chunk == ref.first_token_in_last_chunk
        assert obs.finish(6_000) == ref.finish(6_000) == 0  # (again: nothing left)
        assert obs._last_had_first is ref._last_had_first is False
    assert native_seen == StreamObserver._native
