"""deltatap.core._content (StreamObserver.feed in one C call per read) against the Python observer, the definition.

Differential property tests: the same stream, split at the same random points and stamped with the same clock,
goes through a StreamObserver on the C path (``SseParser.observe``) and one on the Python path (the Python
parser, ``take``, ``count``, ``GapStats``); after every read the two observers' complete state must be equal:
every counter, the first and last token's stamps and bounds, leading whitespace events, the facts, both gap
statistics (their kept gaps and sketch too), the format, done, malformed, the unforwarded count and flags, the
parser's counts, and what each call returned. Streams mix what engines send (OpenAI/vLLM/llama.cpp/LiteLLM chat
chunks, completions, other formats' events, usage in the last chunk, whitespace-only and reasoning content,
role-only and empty deltas, unicode escapes) with what they should not (non-JSON, repeated keys, deep nesting,
huge numbers, control characters, invalid UTF-8, random byte damage), with CR, LF and CRLF line ends and comments.
"""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deltatap.core import sse
from deltatap.core.gap_stats import GapStats

native = pytest.mark.skipif(sse._observe_acc is None, reason="deltatap.core._content is not built or DELTATAP_NATIVE turns it off")

_SLOTS = [s for s in sse.ContentStream.__slots__ + sse.StreamObserver.__slots__
          if s not in ("parser", "gaps", "gaps_forwarded", "__dict__")]  # (gaps: below)


def _gaps(g: GapStats) -> tuple:
    return (g.count, g.total_ns, g.max_ns, sorted(g._top), g._top, g._buckets, g._zeros, g._last, g.p99_ns())


def state(obs: sse.StreamObserver) -> dict:
    out = {k: getattr(obs, k) for k in _SLOTS}
    out.update({k: v for k, v in vars(obs).items() if k not in ("gaps", "gaps_forwarded", "_native")})
    out["gaps"] = _gaps(obs.gaps)
    out["gaps_forwarded"] = _gaps(obs.gaps_forwarded)
    out["parser"] = (obs.parser.comments, obs.parser.events, obs.parser.truncated)
    out["flags"] = (obs.unforwarded, obs.first_token_in_last_chunk)
    return out


def pair(format: str | None, path: str | None, keep_text: bool = False) -> tuple[sse.StreamObserver, sse.StreamObserver]:
    """The C observer and the Python one; ``keep_text``: both keep each content event's text in ``parts`` (as the load
    generator's ClientStream(keep_text=True) does)."""
    c = sse.StreamObserver(format, path)
    py = sse.StreamObserver(format, path)
    if keep_text:
        c.parts, py.parts = [], []
    py._native = False
    py.parser = sse._PySseParser()
    py.gaps, py.gaps_forwarded = GapStats(), GapStats()
    assert type(c.parser) is sse._ObservingParser
    return c, py


def call(f, *args):
    try:
        return f(*args)
    except Exception as exc:  # the same exceptions both ways (none expected)
        return ("raised", type(exc).__name__)


def run_both(data: bytes, points: list[int], format: str | None, path: str | None, steps: list[int], fwd: list[bool],
             keep_text: bool = False) -> None:
    c, py = pair(format, path, keep_text)
    bounds = [0, *sorted({p % (len(data) + 1) for p in points}), len(data)]
    t = 1_000_000
    for i, (a, b) in enumerate(zip(bounds, bounds[1:])):
        t += steps[i % len(steps)] if steps else 1000
        piece = data[a:b]
        bound = (i * 37) % 500
        assert call(c.feed, piece, t, bound) == call(py.feed, piece, t, bound)
        assert state(c) == state(py), f"after read {i}"
        if fwd and fwd[i % len(fwd)]:
            c.forwarded(t + 5, 2)
            py.forwarded(t + 5, 2)
    t += 1000
    assert call(c.finish, t, 7) == call(py.finish, t, 7)
    assert state(c) == state(py)


# ---- events --------------------------------------------------------------------------------------------------

# (drawn from a random.Random seeded by hypothesis: a stream costs a few ms to build, where composite draws cost ten times that)
TEXTS = ["", " ", "  ", "\n", "\t", " \n ", "\u00a0", "\u3000", "\u2003 ", "\u200b", "\x85", "\x1c", "\x0b", "tok", " tok", "é", "日本", "😀",
         "\ud83d", "a\"b", "\\", "/", "\b", "\f\r", "x" * 300, " \u2028", "\u205f\u00a0 ",
         " the", "Hello", ",", " world", ".", " 42", "{\"", " caf\u00e9"]  # (plain ones: kept text the C path keeps itself)
OTHER_VALUES = [None, 0, 1, True, False, [], {}, ["x"], {"a": "b"}, 1.5]
FINISH = [None, None, None, "stop", "length", "", 5, "stop", "tool_calls", "st\"op", "é", "\u00e9", True, False, 1.5, [], {}, ["stop"],
          {"type": "stop"}, " ", "😀"]
IDS = ["chatcmpl-1", "chatcmpl-2", "", "c\"1", "c\\d", "é-1", "\u2028", "😀", 7, 1.5, None, True, [], {"id": "x"}]
MODELS = ["m", "meta-llama/Llama-3.1-8B-Instruct", "", "m/é", "\tm", "m\"q", None, 3, False, ["m"], {}]
OBJECTS = ["chat.completion.chunk", "chat.completion.chunk", "text_completion", "x", "", "chat.completion.chunk ", 5, None,
           ["chat.completion.chunk"]]
INTS = [0, 1, 8, 4096, -1, 2**40, 2**70, -(2**70)]


def usage(rng: random.Random) -> object:
    """What engines put in usage (ints, nested details, extra keys) and what they should not (floats, bools, strings...)."""
    r = rng.random()
    if r < 0.1:
        return rng.choice([None, "x", 7, [], True, [{"prompt_tokens": 1}]])
    u: dict = {}
    for key in rng.sample(["prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details", "completion_tokens_details",
                           "input_tokens", "cached"], rng.randint(0, 5)):
        if key.endswith("details"):
            u[key] = rng.choice([None, {"cached_tokens": 3}, {"reasoning_tokens": 2, "audio_tokens": None}, []])
        else:
            u[key] = rng.choice(INTS) if rng.random() < 0.75 else rng.choice([None, 1.0, 2.5, -0.0, 1e20, True, False, "3", [3], {"n": 3}])
    return u


def value(rng: random.Random) -> object:
    r = rng.random()
    if r < 0.6:
        return rng.choice(TEXTS)
    if r < 0.8:
        return "".join(rng.choice(" a\u00a0\u3000é\t\n\u2029😀\x00") for _ in range(rng.randint(0, 4)))
    return rng.choice(OTHER_VALUES)


def chat_chunk(rng: random.Random) -> dict:
    obj: dict = {}
    for key, choices in (("id", IDS), ("object", OBJECTS), ("created", [1700000000, 1.5]),
                         ("model", MODELS), ("system_fingerprint", [None, "fp"]), ("service_tier", ["default"])):
        if rng.random() < 0.6:
            obj[key] = rng.choice(choices)
    choices_: list = []
    for i in range(rng.choice([0, 1, 1, 1, 2, 3, 9, 10])):
        if rng.random() < 0.06:
            choices_.append(rng.choice([None, 3, "x", []]))
            continue
        ch: dict = {"index": i}
        if rng.random() < 0.9:
            delta: dict = {}
            for key in rng.sample(["role", "content", "reasoning_content", "reasoning", "refusal", "tool_calls", "function_call", "audio"],
                                  rng.randint(0, 4)):
                if key == "role":
                    delta[key] = "assistant"
                elif key == "tool_calls":
                    delta[key] = rng.choice([None, [], [{"index": 0, "function": {"arguments": "{\"a\""}}], [{"function": {"name": "f"}}], {}])
                else:
                    delta[key] = value(rng)
            ch["delta"] = delta
        else:
            ch["delta"] = rng.choice([None, "x", [], 3])
        if rng.random() < 0.5:
            ch["finish_reason"] = rng.choice(FINISH)
        if rng.random() < 0.5:
            ch["logprobs"] = rng.choice([None, {"content": [{"token": "a", "logprob": -0.1}]}])
        choices_.append(ch)
    r = rng.randint(0, 20)
    if r == 0:
        obj["choices"] = rng.choice([None, 5, "abc", {"a": 1}, True])
    elif r != 1:
        obj["choices"] = choices_
    if rng.random() < 0.3:
        obj["usage"] = usage(rng)
    for key in ("timings", "error"):
        if rng.random() < 0.12:
            obj[key] = rng.choice([None, None, {"prompt_tokens": 3, "completion_tokens": 9}, {"prompt_n": 2, "predicted_ms": 1.5},
                                   {"type": "overloaded"}, "x", 7])
    if rng.random() < 0.5:  # JSON order is the engine's, not ours
        items = list(obj.items())
        rng.shuffle(items)
        obj = dict(items)
    return obj


def completions_chunk(rng: random.Random) -> dict:
    obj: dict = {"object": rng.choice(["text_completion", "x", "chat.completion.chunk"])} if rng.random() < 0.8 else {}
    if rng.random() < 0.5:
        obj["model"] = rng.choice(MODELS)
    if rng.random() < 0.5:
        obj["id"] = rng.choice(IDS)
    choices: list = []
    for i in range(rng.choice([0, 1, 1, 1, 2, 3, 9])):
        ch: dict = {"index": i}
        if rng.random() < 0.85:
            ch["text"] = value(rng)
        if rng.random() < 0.5:
            ch["finish_reason"] = rng.choice(FINISH)
        choices.append(ch if rng.random() < 0.92 else rng.choice([None, "t", 1]))
    obj["choices"] = choices
    if rng.random() < 0.3:
        obj["usage"] = usage(rng)
    return obj


OTHER = [
    {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "hi"}},
    {"type": "message_start", "message": {"model": "claude", "id": "msg", "usage": {"input_tokens": 4}}},
    {"type": "response.output_text.delta", "delta": "yo"},
    {"content": "x", "stop": False},
    {"content": "", "stop": True, "timings": {"predicted_n": 3}},
    [1, 2], "str", 5, None, {}, {"a": {"b": [1, {"c": None}]}},
]

RAW = [
    "[DONE]", "", " [DONE]", "[DONE] ", "not json", "{", "}", "{\"choices\": [", "NaN", "{\"a\": NaN}", "{\"a\": Infinity}", "{\"a\": -Infinity}",
    "{\"a\": 1e999}", "{\"a\": -0.0e+5}", "{\"a\": 01}", "{\"a\": 1.}", "{\"a\": .5}", "{\"a\": +1}", "{\"a\": -}", "{\"a\": tru}",
    "{\"choices\": [{\"delta\": {\"content\": \"a\"}}], \"choices\": []}",
    "{\"choices\": [{\"delta\": {\"content\": \"a\", \"content\": \"\"}}]}",
    "{\"choices\": [{\"delta\": {\"content\": \"\", \"content\": \" \"}}]}",
    "{\"choices\": [{\"delta\": {\"content\": \"a\"}, \"delta\": {}}]}",
    "{\"choices\": [{\"delta\": {\"content\": \"a\"}, \"finish_reason\": null, \"finish_reason\": \"stop\"}]}",
    "{\"choices\": [{\"delta\": {\"\\u0063ontent\": \"a\"}}]}",
    "{\"\\u0063hoices\": [{\"delta\": {\"content\": \"a\"}}]}",
    "{\"choices\": [{\"delta\": {\"content\": \"\\u0020\\u00a0\"}}]}",
    "{\"choices\": [{\"delta\": {\"content\": \"\\ud83d\\ude00\"}}]}",
    "{\"choices\": [{\"delta\": {\"content\": \"\\ud83d\"}}]}",
    "{\"choices\": [{\"delta\": {\"content\": \"\\u12\"}}]}",
    "{\"choices\": [{\"delta\": {\"content\": \"\\x\"}}]}",
    "{\"choices\": [{\"delta\": {\"content\": \"a\tb\"}}]}",
    "{\"choices\": [{\"delta\": {\"content\": \"\t\"}}]}",
    "{\"choices\": [{\"delta\": {\"content\": \"a\"}},]}",
    "{\"choices\": [{\"delta\": {\"content\": \"a\"}}],}",
    "{\"choices\": [{\"delta\": {\"content\": \"a\"}}]} x",
    "{\"choices\": [{\"delta\": {\"content\": \"a\"}}]} {}",
    " \t{\"choices\": [{\"delta\": {\"content\": \"a\"}}]} \r",
    "{\"choices\":[{\"delta\":{\"content\":\"a\"}}]}",
    "{\"choices\"\n:\n[{\"delta\": {\"content\": \"a\"}}]}",
    "{\"a\": " + "1" * 5000 + "}", "{\"a\": " + "1" * 60 + "}", "{\"a\": 1" + "0" * 70 + ".5}",
    "{\"a\": " + "[" * 40 + "]" * 40 + "}", "{\"a\": " + "[" * 60 + "]" * 60 + "}", "[" * 3000 + "]" * 3000,
    "{\"a\": " + "{\"b\": " * 45 + "1" + "}" * 45 + "}",
    "{\"choices\": [{\"delta\": {\"content\": \"a\"}, \"x\": " + "[" * 50 + "]" * 50 + "}]}",
    "{\"id\": \"a\", \"id\": \"b\", \"choices\": [{\"delta\": {}}]}", "{\"model\": 1, \"model\": \"m\", \"choices\": []}",
    "{\"choices\": [], \"usage\": {\"prompt_tokens\": 1, \"prompt_tokens\": 2}}",
    "{\"choices\": [], \"usage\": {\"completion_tokens\": 1}, \"usage\": null}",
    "{\"choices\": [], \"usage\": {\"\\u0070rompt_tokens\": 5}}", "{\"choices\": [], \"usage\": {\"prompt_tokens\": 1E2}}",
    "{\"choices\": [], \"usage\": {\"prompt_tokens\": -0}}", "{\"choices\": [], \"usage\": {\"prompt_tokens\": 0001}}",
    "{\"choices\": [], \"usage\": {\"prompt_tokens\": " + "9" * 64 + "}}",
    "{\"choices\": [], \"usage\": {\"prompt_tokens\": " + "9" * 65 + "}}",
    "{\"choices\": [], \"usage\": {\"prompt_tokens\": 3, \"x\": " + "[" * 45 + "]" * 45 + "}}",
    "{\"object\": \"chat.completion.chunk\", \"object\": \"x\", \"choices\": []}",
    "{\"object\": \"chat.completion.chun\\u006b\", \"choices\": []}", "{\"object\": \"text_completion\"}",
    "{\"choices\": [{\"delta\": {}, \"finish_reason\": \"stop\"}, {\"delta\": {}, \"finish_reason\": \"stop\"}]}",
    "{\"choices\": [" + ", ".join("{\"text\": \"\", \"finish_reason\": \"r%d\"}" % i for i in range(9)) + "]}",
    "{\"choices\": [" + ", ".join("{\"delta\": {}, \"finish_reason\": \"r%d\"}" % i for i in range(8)) + "]}",
    "{\"choices\": [{\"delta\": {}, \"finish_reason\": \"\\u0073top\"}]}",
    "{\"choices\": [{\"delta\": {}, \"finish_reason\": \"st\\op\"}]}",
    "{\"choices\": [{\"x\": 1}, {\"delta\": {\"content\": \"a\"}}]}", "{\"choices\": [5, {\"text\": \"a\"}]}",
    "{\"model\": \"m\\u00e9\", \"id\": \"\\\"\", \"choices\": [{\"delta\": {}}]}",
]
DAMAGE = [0x00, 0x1F, 0x22, 0x5C, 0x7B, 0x7D, 0x80, 0xC3, 0xE2, 0xFF, 0x20, 0x2C, 0x3A, 0x5D]


def event_data(rng: random.Random, head: bool = False) -> bytes:
    kind = 0 if head else rng.randint(0, 9)
    if kind <= 4:
        obj = chat_chunk(rng)
    elif kind <= 5:
        obj = completions_chunk(rng)
    elif kind == 6:
        obj = rng.choice(OTHER)
    else:
        return rng.choice(RAW).encode()
    text = json.dumps(obj, ensure_ascii=rng.random() < 0.5, separators=rng.choice([(",", ":"), (", ", ": "), (" , ", " : ")]))
    raw = text.encode("utf-8", "surrogatepass")
    r = rng.randint(0, 12)
    if r == 0 and raw:  # damage: a random byte somewhere
        i = rng.randrange(len(raw))
        raw = raw[:i] + bytes([rng.choice(DAMAGE)]) + raw[i + 1:]
    elif r == 1 and raw:
        raw = raw[: rng.randrange(len(raw))]  # cut short
    elif r == 2:
        raw = raw.replace(b'"', b'"\xff', 1)
    return raw.replace(b"\r", b" ").replace(b"\n", b" ")


def sse_stream(rng: random.Random) -> bytes:
    eol = rng.choice([b"\n", b"\r\n", b"\r"])
    out = rng.choice([b"", b"", b"\xef\xbb\xbf", b": hello" + eol + eol])
    for i in range(rng.randint(0, 25)):
        extra = rng.randint(0, 12)
        if extra == 0:
            out += b": ping" + eol
        elif extra == 1:
            out += b"event: " + rng.choice([b"message", b"content_block_delta", b"error"]) + eol
        elif extra == 2:
            out += b"id: 7" + eol
        data = event_data(rng, i == 0 and rng.random() < 0.5)  # (often a chat chunk first: the C path detects it)
        if rng.random() < 0.06 and len(data) > 2:  # one event over two data lines (joined with "\n")
            i = len(data) // 2
            out += b"data: " + data[:i] + eol + b"data:" + data[i:] + eol + eol
        else:
            out += rng.choice([b"data: ", b"data: ", b"data:"]) + data + eol + eol
    if rng.random() < 0.5:
        out += b"data: [DONE]" + eol + rng.choice([eol, b""])
    return out


FORMATS = [(None, "/v1/chat/completions"), (None, "/v1/chat/completions"), (None, "/v1/completions"), (None, None), (None, None),
           ("openai-chat", None), ("openai-completions", None), (None, "/v1/messages"), (None, "/v1/responses"), (None, "/completion")]


@native
@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**64))
def test_the_observer_s_state_after_each_read_is_the_python_s(seed):
    rng = random.Random(seed)
    data = sse_stream(rng)
    points = [rng.randint(0, 1 << 14) for _ in range(rng.randint(0, 10))]
    fmt = rng.choice(FORMATS)
    steps = [rng.choice([0, 1, 3, 1000, 250_000, 7_000_000]) for _ in range(rng.randint(1, 5))]
    fwd = [rng.random() < 0.5 for _ in range(rng.randint(0, 4))]
    run_both(data, points, fmt[0], fmt[1], steps, fwd, rng.random() < 0.4)


@native
@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**64))
def test_one_byte_and_random_reads_of_any_events(seed):
    rng = random.Random(seed)
    data = b"".join(b"data: " + event_data(rng) + b"\n\n" for _ in range(rng.randint(0, 12)))
    points = list(range(len(data))) if len(data) < 400 else [rng.randint(0, 1 << 12) for _ in range(30)]  # one byte per read
    fmt = rng.choice(FORMATS)
    run_both(data, points, fmt[0], fmt[1], [1], [True, False], rng.random() < 0.4)


@native
def test_long_streams_fill_the_kept_gaps_and_the_sketch():
    """Hundreds of content events (more than the 128 kept gaps), several per read and one per read."""
    rng = random.Random(1517)
    for _ in range(30):
        objs = [{"id": "c", "model": "m", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}]
        for i in range(rng.randint(100, 400)):
            objs.append({"id": "c", "model": "m", "object": "chat.completion.chunk",
                         "choices": [{"index": 0, "delta": {rng.choice(["content", "reasoning_content"]): rng.choice([" ", "\n", "a", f" t{i}"])},
                                      "finish_reason": None, "logprobs": None}], "usage": None})
        objs.append({"id": "c", "model": "m", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
        objs.append({"id": "c", "model": "m", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": len(objs)}})
        data = b"".join(b"data: " + json.dumps(o).encode() + b"\n\n" for o in objs) + b"data: [DONE]\n\n"
        points = [rng.randint(0, len(data)) for _ in range(rng.randint(50, 500))]
        steps = [rng.choice([0, 1, 17, 900, 40_000, 3_000_000, 2**40]) for _ in range(7)]
        run_both(data, points, None, rng.choice(["/v1/chat/completions", None]), steps, [rng.random() < 0.5 for _ in range(3)],
                 rng.random() < 0.5)


@native
def test_ordinary_events_take_no_python_step():
    """The point of the accelerator: a read of ordinary chat chunks never calls take (a counting subclass would lose
    the C path, so the observer's take is wrapped on the instance)."""
    obs = sse.StreamObserver(path="/v1/chat/completions")
    calls = []
    real = sse.ContentStream.take
    obs.take = lambda ev, t, b=0: calls.append(ev) or real(obs, ev, t, b)  # type: ignore[method-assign]
    head = b'data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
    assert obs.feed(head, 10) == 0 and not calls  # the first event: the format detected, the model and id kept, in C
    assert (obs.format, obs.facts.model, obs.facts.response_id) == ("openai-chat", "m", "c")
    tok = b'data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"content":" hi"},"finish_reason":null}]}\n\n'
    assert obs.feed(tok * 3, 20) == 3 and obs.feed(tok, 30) == 1 and not calls
    assert (obs.content_events, obs.first_token_mono_ns, obs.last_token_mono_ns, obs.gaps.count, obs.unforwarded) == (4, 20, 30, 3, (4, True))
    end = (b'data: {"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
           b'data: {"id":"c","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7,'
           b'"prompt_tokens_details":{"cached_tokens":0}}}\n\ndata: [DONE]\n\n')
    assert obs.feed(end, 40) == 0 and not calls and obs.done
    assert (obs.facts.input_tokens, obs.facts.output_tokens, obs.facts.finish_reasons, obs.events) == (3, 4, ["stop"], 8)
    unusual = b'data: {"choices":[],"usage":{"prompt_tokens":3.0}}\n\n'  # (a float is not an int: Python decides)
    assert obs.feed(unusual, 50) == 0 and len(calls) == 1 and obs.facts.input_tokens == 3


@native
def test_kept_text_is_extract_s_text_without_a_python_step():
    """keep_text (the load generator's ClientStream(keep_text=True)): each content event's text is appended to parts in
    C, as extract joins it (per choice, the delta's keys in _CHAT_TEXT_KEYS order, not the JSON's); an escaped content
    string goes to take, which unescapes it."""
    obs = sse.StreamObserver(path="/v1/chat/completions")
    obs.parts = []
    calls = []
    real = sse.ContentStream.take
    obs.take = lambda ev, t, b=0: calls.append(ev) or real(obs, ev, t, b)  # type: ignore[method-assign]
    two = (b'data: {"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"refusal":"R","content":" A\xc3\xa9"}},'
           b'{"index":1,"delta":{"reasoning":"","reasoning_content":"T","content":"B"}}]}\n\n')
    assert obs.feed(two, 10) == 1 and not calls and obs.parts == [" A\u00e9RBT"]
    assert obs.feed(b'data: {"choices":[{"delta":{"content":"\\u00e9\\n"}}]}\n\n', 20) == 1 and len(calls) == 1
    assert obs.parts[-1] == "\u00e9\n" and obs.text == " A\u00e9RBT\u00e9\n"


def test_a_subclass_that_overrides_take_gets_the_python_path():
    class Keeping(sse.StreamObserver):
        def take(self, ev, t, bound=0):
            return sse.ContentStream.take(self, ev, t, bound)

    assert Keeping._native is False and (sse.StreamObserver._native is (sse._ObservingParser is not None))


@pytest.mark.parametrize("bad", [b'data: {"choices": 5}\n\n', b'data: ' + b"[" * 5000 + b"]" * 5000 + b"\n\n",
                                 b'data: {"choices": [{"delta": {"content": "a"}}], "choices": 7}\n\n'])
def test_malformed_events_count_and_never_raise(bad):
    """Both paths: a choices that is no list carries nothing; JSON nested deeper than json recurses is malformed."""
    obs = sse.StreamObserver("openai-chat")
    assert obs.feed(bad, 1) == 0 and obs.events == 1 and obs.content_events == 0
    assert obs.malformed == (1 if b"[[[" in bad else 0)


@native
@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["observe", "add", "observe_n"]),
                          st.one_of(st.integers(-10**6, 10**6), st.integers(0, 2**50), st.sampled_from([0, 1, 2**52]))), max_size=400),
       st.sampled_from([1, 3, 128]), st.integers(1, 5))
def test_the_c_gap_stats_is_gap_stats(ops, top_k, n):
    """GapCore (observe, add, and gaps_observe's n observes at once) against GapStats; quantiles read the same state."""
    c, py = sse._GapCore(top_k), GapStats(top_k)
    for op, v in ops:
        if op == "observe":
            c.observe(v)
            py.observe(v)
        elif op == "add":
            c.add(v)
            py.add(v)
        else:
            sse._gaps_observe(c, v, n)
            for _ in range(n):
                py.observe(v)
        assert _gaps(c) == _gaps(py)
    for q in (0.0, 0.5, 0.9, 0.99, 1.0):
        assert c.quantile_ns(q) == py.quantile_ns(q)
    assert c.mean_ns == py.mean_ns


@native
def test_the_c_gap_stats_refuses_a_sum_past_2_63_ns():
    """GapCore counts in C long long: a total past 292 years of gaps raises instead of growing (GapStats would grow)."""
    g = sse._GapCore()
    g.add(2**62)
    g.add(2**62 - 1)
    with pytest.raises(OverflowError):
        g.add(1)
    assert (g.count, g.total_ns) == (2, 2**63 - 1)


@native
@pytest.mark.parametrize("fail_on", ["usage", "nope"])
def test_a_take_that_raises_leaves_the_state_the_python_leaves(fail_on):
    """take raising mid-read on an event it is handed (an extension's take, or memory): the parser still reads the whole
    chunk, the counters of the events before it stay, the events after it are not taken, no gap or unforwarded count
    is added, the error propagates; the next read goes on from there."""
    tok = b'data: {"choices":[{"delta":{"content":"x"}}]}\n\n'
    usage = b'data: {"choices":[],"usage":{"prompt_tokens":1.0,"completion_tokens":2}}\n\n'  # (a float: Python's)
    data = tok + usage + tok + b"data: nope\n\n" + tok + b": c\n\n" + tok
    seen = []
    for obs in pair("openai-chat", None):
        real = sse.ContentStream.take

        def take(ev, t, b=0, obs=obs, real=real):
            if fail_on in ev.data:
                raise MemoryError("boom")
            return real(obs, ev, t, b)

        obs.feed(tok, 5)
        obs.take = take  # type: ignore[method-assign]
        with pytest.raises(MemoryError):
            obs.feed(data, 10)
        del obs.take
        seen.append(state(obs))
        assert obs.feed(tok + tok, 20) == 2
        seen.append(state(obs))
    assert seen[0] == seen[2] and seen[1] == seen[3]
