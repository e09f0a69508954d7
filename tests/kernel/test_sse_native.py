"""deltatap.core._sse (the C accelerator of deltatap.core.sse.SseParser) against the Python class, the definition.

Differential property tests: the same stream, split at the same random points, goes through the C parser and
the Python reference (``sse._PySseParser``); each read's events, the comment and event counts, and what
``finish`` returns and flags must be equal. Streams are built from the pieces that matter to the rules: field
names with and without a colon and a space, CR, LF and CRLF line ends (a CRLF split across reads), BOMs (at the
start, split, and later where they are data), invalid UTF-8, NUL in ids, ASCII and non-ASCII digits in retry,
comments, oversize lines; and the load generator's and tap's own ContentStream runs both ways over them.
"""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deltatap.core import sse
from deltatap.core.sse import SseEvent

native = pytest.mark.skipif(sse._acc is None, reason="deltatap.core._sse is not built or DELTATAP_NATIVE turns it off")

PIECES = st.sampled_from([
    b"data: ", b"data:", b"data", b"dat", b"event: ", b"event:", b"id: ", b"id:", b"retry: ", b"retry:", b":", b": c", b" ",
    b"\r", b"\n", b"\r\n", b"\r\n", b"\n\n", b"\r\r", b"\xef\xbb\xbf", b"\xef\xbb", b"\xff", b"\xc3", b"\xc3\xa9", b"\xe2\x82",
    b"\x00", b"42", b"007", b"1" * 19, b"1" * 18, "²".encode(), "٣".encode(), b"[DONE]", b"{\"a\": 1}", b"x", b"hello world",
    b"ping", b"message", b"\t", b"a" * 300,
])


def run(parser, pieces: list) -> list:
    out = []
    for piece in pieces:
        out.append(parser.feed(piece))
        out.append((parser.comments, parser.events))
    out.append(parser.finish())
    out.append((parser.comments, parser.events, parser.truncated))
    return out


def cut(data: bytes, points: list[int]) -> list[bytes]:
    bounds = [0, *sorted({p % (len(data) + 1) for p in points}), len(data)]
    return [data[a:b] for a, b in zip(bounds, bounds[1:])]  # (empty pieces kept: feeding b"" must be a no-op)


@native
@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(PIECES, max_size=60), st.lists(st.integers(0, 1 << 14), max_size=12), st.sampled_from([bytes, bytearray, memoryview]))
def test_any_stream_split_anywhere_gives_the_same_events(pieces, points, kind):
    data = b"".join(pieces)
    parts = [kind(p) for p in cut(data, points)]
    assert run(sse.SseParser(), parts) == run(sse._PySseParser(), parts)


FIELDS = st.sampled_from([b"data: ", b"data:", b"data", b"event: ", b"event:", b"id: ", b"id:", b"id", b"retry: ", b"retry:", b":", b"",
                          b"other: ", b"Data: ", b"\xef\xbb\xbfdata: "])
VALUES = st.one_of(
    st.sampled_from([b"", b" ", b"  x", b"[DONE]", b"42", b"007", b"1" * 17, b"1" * 18, b"1" * 19, "\u00b2".encode(), "\u0663".encode(), b"4 2",
                     b"-1", b"\x00", b"a\x00b", b"\xff", b"\xc3", b"\xc3\xa9", b"\xed\xa0\x80", b"\xef\xbb\xbf", b"{}", b"x" * 2000]),
    st.binary(max_size=12).filter(lambda b: b"\r" not in b and b"\n" not in b),
)
LINE_ENDS = st.sampled_from([b"\n", b"\r\n", b"\r"])


@st.composite
def event_stream(draw) -> bytes:
    """Lines of fields with values and line ends, blank lines dispatching: most streams carry several events."""
    out = draw(st.sampled_from([b"", b"\xef\xbb\xbf"]))
    for _ in range(draw(st.integers(0, 30))):
        if draw(st.integers(0, 3)) == 0:
            out += draw(LINE_ENDS)  # a blank line: dispatch
        else:
            out += draw(FIELDS) + draw(VALUES) + draw(LINE_ENDS)
    if draw(st.booleans()):
        out += draw(FIELDS) + draw(VALUES)  # an unterminated last line
    return out


@native
@settings(max_examples=700, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(event_stream(), st.lists(st.integers(0, 1 << 14), max_size=12))
def test_field_lines_split_anywhere_give_the_same_events(data, points):
    parts = cut(data, points)
    assert run(sse.SseParser(), parts) == run(sse._PySseParser(), parts)


@native
@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=400), st.lists(st.integers(0, 400), max_size=8))
def test_random_bytes_give_the_same_events(data, points):
    parts = cut(data, points)
    assert run(sse.SseParser(), parts) == run(sse._PySseParser(), parts)


@native
def test_one_byte_reads_and_oversize_lines():
    rng = random.Random(15)
    for _ in range(200):
        data = b"".join(rng.choice([b"data: ", b"\r", b"\n", b"id: 1", b"event: e", b"x" * rng.randint(0, 5000), b"\xff"]) for _ in range(20))
        parts = [data[i : i + 1] for i in range(len(data))] if len(data) < 3000 else cut(data, [rng.randint(0, len(data)) for _ in range(5)])
        assert run(sse.SseParser(), parts) == run(sse._PySseParser(), parts)
    big = b"data: " + b"y" * (1 << 20) + b"\n\n"
    assert run(sse.SseParser(), cut(big, [7, 5000, 700000])) == run(sse._PySseParser(), cut(big, [7, 5000, 700000]))


@native
def test_the_events_are_the_module_s_sse_event():
    (ev,) = sse.SseParser().feed(b"event: e\nid: 9\nretry: 5\ndata: x\n\n")
    assert type(ev) is SseEvent and ev == SseEvent("x", "e", "9", 5)
    with pytest.raises(TypeError):
        sse.SseParser().feed("text, not bytes")
    with pytest.raises(TypeError):
        sse.SseParser(1)


def _stream(rng: random.Random) -> bytes:
    objs = [{"object": "chat.completion.chunk", "model": "m", "id": "c1", "choices": [{"delta": {"role": "assistant"}}]}]
    for _ in range(rng.randint(0, 12)):
        objs.append({"object": "chat.completion.chunk", "choices": [{"delta": {"content": rng.choice([" ", "a", "é", "\n", "tok"])}}]})
    objs.append({"object": "chat.completion.chunk", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 9}})
    eol = rng.choice(["\n", "\r\n", "\r"])
    text = "".join(f"data: {json.dumps(o, ensure_ascii=rng.random() < 0.5)}{eol}{eol}" for o in objs) + f"data: [DONE]{eol}{eol}"
    return text.encode()


@native
def test_the_tap_s_observer_gives_the_same_record_both_ways():
    rng = random.Random(2026)
    for _ in range(300):
        data = _stream(rng)
        parts = cut(data, [rng.randint(0, len(data)) for _ in range(rng.randint(0, 10))])
        seen = []
        for parser in (sse.SseParser, sse._PySseParser):
            obs = sse.StreamObserver(path="/v1/chat/completions")
            obs.parser = parser()
            counts = [obs.feed(p, 1000 + i) for i, p in enumerate(parts)] + [obs.finish(9999)]
            seen.append((counts, obs.format, obs.events, obs.content_events, obs.tokens, obs.done, obs.malformed, obs.first_token_mono_ns,
                         obs.last_token_mono_ns, obs.leading_whitespace_events, obs.facts, obs.gaps.count, obs.comments, obs.truncated))
        assert seen[0] == seen[1]


@pytest.mark.parametrize("parser", [sse.SseParser, sse._PySseParser], ids=["used", "reference"])
def test_a_read_ending_in_crlf_does_not_swallow_the_next_read_s_lf(parser):
    """A read that ends with a whole CRLF leaves nothing half-read: a blank line (LF) at the start of the next read
    dispatches the event (the reference once took that CRLF for a lone CR and skipped the LF; found by the
    differential test above)."""
    p = parser()
    assert p.feed(b"data: a\r\n") == []
    assert [e.data for e in p.feed(b"\ndata: b\n")] == ["a"]
    assert p.feed(b"data: c\r") == [] and [e.data for e in p.feed(b"\n\n")] == ["b\nc"]


JSON_TEXT = st.one_of(
    st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                 lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=5), c, max_size=4), max_leaves=12).map(json.dumps),
    st.text(alphabet=' \t\n\r{}[]",:0123456789.eE+-truefalsnNaIiy\\u', max_size=30),
)


@settings(max_examples=700, deadline=None)
@given(JSON_TEXT, st.sampled_from(["", " ", "\n", "x", "{}"]), st.sampled_from(["", " ", "\t"]))
def test_event_json_is_decoded_exactly_as_json_loads_does(text, tail, lead):
    """sse decodes each event's data with json's C scanner alone when the value fills the text: the same object, or
    the same error, as json.loads."""
    text = lead + text + tail
    try:
        want = ("ok", json.dumps(json.loads(text)))
    except ValueError as exc:
        want = ("error", str(exc))
    try:
        got = ("ok", json.dumps(sse._decode_json(text)))
    except ValueError as exc:
        got = ("error", str(exc))
    assert got == want


@native
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(event_stream(), st.lists(st.integers(0, 1 << 14), max_size=12))
def test_both_builds_of_the_c_parser_give_the_same_events(data, points):
    """deltatap.core._sse's parser and deltatap.core._content's (the same source built again with the stream observer,
    which sse.SseParser is when both are on) against the reference."""
    parts = cut(data, points)
    want = run(sse._PySseParser(), parts)
    for mod in (sse._acc, sse._observe_acc):
        if mod is not None:
            assert run(mod.SseParser(), parts) == want
