"""deltatap.proxy._relay (the C accelerator of the relay's response side) against relay.py's Python, the definition.

The accelerator (:data:`deltatap.proxy.relay._watch_read` / ``_watch_cuts``) takes a read of body bytes alone in one C
call: framing, the record's counters, the stream observer and its ``forwarded`` bookkeeping. Every other read goes
through :meth:`Upstream._watch`, which is also the whole path when the accelerator is off. Here the same generated
response bytes, cut into the same reads and cuts lists with the same stamps, go through
:meth:`Upstream.data_received`, :meth:`Upstream.on_data` and :meth:`Upstream.cuts_received` with the accelerator and
without it; the record, the stream observer (its gap statistics included), the framing reader, the exchange and the
connection's state after every call must be identical, and so must what each call raised.

Responses: SSE (role, content with ASCII / Unicode / whitespace-only text, reasoning, empty and null content,
usage, finish reasons, [DONE], comments, named events, multi-line data, id/retry fields, malformed JSON; LF, CRLF or
CR line ends), JSON (captured) and other types (counted only); chunked (random chunk sizes, extensions, upper-case
hex, trailers, bare-LF chunk ends) or Content-Length, close-delimited last; interim 103; pipelined pairs; malformed
framing (bad chunk sizes, chunk data without its CRLF, overlong chunk lines) and cut-short streams. Then live,
through a tap on 127.0.0.1, both ways.
"""

from __future__ import annotations

import dataclasses
import types

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from _pairs import ScriptedDown, socketless_pair, socketless_tap
from raw_peer import RawUpstream, raw_exchange, reply
from tap_helpers import wait_spans

from deltatap.core.sse import StreamObserver
from deltatap.core.vocab import Attr
from deltatap.net import h1
from deltatap.proxy import relay
from deltatap.proxy.record import TapRecord
from deltatap.proxy.relay import Downstream, Exchange, Upstream
from deltatap.proxy.server import Tap

pytestmark = pytest.mark.skipif(relay._watch_read is None, reason="deltatap.proxy._relay is not built or DELTATAP_NATIVE turns it off")

_CHAT = b'{"id":"c1","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":%s}]}'
_EVENTS = [
    b"data: " + _CHAT % b'{"role":"assistant"}',
    b"data: " + _CHAT % b'{"content":"tok"}',
    b"data: " + _CHAT % b'{"content":" tok2"}',
    b"data: " + _CHAT % b'{"content":" "}',
    b"data: " + _CHAT % b'{"content":"\\n"}',
    b"data: " + _CHAT % '{"content":"\u00e9t\u00e9 \u4e2d"}'.encode(),
    b"data: " + _CHAT % '{"content":"\u00a0"}'.encode(),
    b"data: " + _CHAT % b'{"reasoning_content":"think"}',
    b"data: " + _CHAT % b'{"content":""}',
    b"data: " + _CHAT % b'{"content":null}',
    b'data: {"id":"c1","model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}',
    b'data: {"id":"c1","model":"m","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8}}',
    b'data: {"id":"c2","object":"text_completion","choices":[{"index":0,"text":"abc"}]}',
    b"data: [DONE]",
    b": keep-alive",
    b"data: {not json",
    b"data:",
    b"event: ping\ndata: {}",
    b'data: {"id":"c1","model":"m",\ndata: "choices":[{"index":0,"delta":{"content":"x"}}]}',
    b"id: 7\nretry: 100\ndata: " + _CHAT % b'{"content":"y"}',
    b"data: " + b"[" * 200 + b"]" * 200,
]
_TYPES = {"sse": b"text/event-stream", "json": b"application/json", "text": b"text/plain"}


@st.composite
def sse_body(draw) -> bytes:
    eol = draw(st.sampled_from([b"\n", b"\r\n", b"\r"]))
    events = draw(st.lists(st.sampled_from(_EVENTS), max_size=14))
    body = b"".join(e.replace(b"\n", eol) + eol + eol for e in events)
    if body and draw(st.integers(0, 4)) == 0:
        body = body[: -len(eol)]  # an unterminated last event
    return body


@st.composite
def chunked(draw, body: bytes) -> bytes:
    out = bytearray()
    pos = 0
    malformed = draw(st.integers(0, 6)) == 0
    while pos < len(body):
        size = draw(st.integers(1, max(1, min(len(body) - pos, draw(st.sampled_from([8, 64, 400]))))))
        line = draw(st.sampled_from([b"%x", b"%X", b"%x;ext=1", b"%x ", b"00%x"])) % size
        end = draw(st.sampled_from([b"\r\n", b"\r\n", b"\r\n", b"\n"]))
        if malformed:
            how = draw(st.integers(0, 12))
            if how == 0:
                line = b"zz"
            elif how == 1:
                end = b"XY"
            elif how == 2:
                line = b"1" * 20
            elif how == 3:
                line = b"%x;" % size + b"e" * 70_000
        out += line + b"\r\n" + body[pos : pos + size] + end
        pos += size
    out += b"0\r\n"
    if draw(st.booleans()):
        out += b"X-Trailer: 1\r\n"
    out += b"\r\n"
    return bytes(out)


@st.composite
def responses(draw) -> tuple[bytes, int, bool]:
    """Response bytes for 1 or 2 POSTs, how many, and whether the last is close-delimited."""
    n = draw(st.integers(1, 2))
    out = bytearray()
    close = False
    for i in range(n):
        kind = draw(st.sampled_from(["sse", "sse", "sse", "sse", "json", "text"]))
        if kind == "sse":
            body = draw(sse_body())
        elif kind == "json":
            body = b'{"id":"x","usage":{"prompt_tokens":2,"completion_tokens":1}}'
        else:
            body = draw(st.binary(max_size=300))
        framing = draw(st.sampled_from(["chunked", "chunked", "length", "close"] if i == n - 1 else ["chunked", "length"]))
        if draw(st.integers(0, 5)) == 0:
            out += b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"
        out += b"HTTP/1.1 200 OK\r\nContent-Type: " + _TYPES[kind] + b"\r\n"
        if framing == "chunked":
            out += b"Transfer-Encoding: chunked\r\n\r\n" + draw(chunked(body))
        elif framing == "length":
            out += b"Content-Length: %d\r\n\r\n" % len(body) + body
        else:
            out += b"\r\n" + body
            close = True
    return bytes(out), n, close


@st.composite
def cases(draw):
    """The bytes cut into calls: each call is ("read", piece), ("on_data", piece) or ("cuts", [piece, ...]), with
    stamps: each piece's (t, bound), each call's write (tw, bw) and whether that write is left unplaced."""
    data, n, close = draw(responses())
    if draw(st.integers(0, 4)) == 0:
        data = data[: draw(st.integers(1, len(data)))]  # the connection stops mid-response
    cuts = sorted(set(draw(st.lists(st.integers(1, max(1, len(data) - 1)), max_size=30))))
    pieces = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)]) if b > a]
    calls, t, i = [], 1_000_000, 0
    while i < len(pieces):
        kind = draw(st.sampled_from(["read", "read", "on_data", "cuts"]))
        k = draw(st.integers(1, 5)) if kind == "cuts" else 1
        group = []
        for p in pieces[i : i + k]:
            t += draw(st.integers(1, 5_000_000))
            group.append((p, t, draw(st.sampled_from([0, 0, 7, 1_000_000]))))
        i += k
        write = (t + draw(st.integers(0, 50_000)), draw(st.sampled_from([-1, 0, 1_500, 2_000_000])), draw(st.integers(0, 3)) == 0)
        calls.append((kind, group, write))
    return calls, n, close


def _gaps(g) -> tuple:
    return (g.count, g.total_ns, g.max_ns, g._zeros, sorted(g._top), dict(g._buckets), g._last)


_REC_FIELDS = [f.name for f in dataclasses.fields(TapRecord) if f.name not in ("stream", "ws")]  # (those two: below)


def _snapshot(up: Upstream, d: Downstream, exs: list[Exchange]) -> list:
    """Everything the calls may change, as text (a deep copy that is cheap to take after every call)."""
    r = up.reader
    out: list = [(r._state, r._buf, r._remaining, r.pending_from, r.messages, r.error),
                 (up.last_read_t, up.last_read_bound, up.plain, up.keep_alive), (d.unplaced, len(d.exchanges))]
    for ex in exs:
        snap = [repr([getattr(ex.rec, f) for f in _REC_FIELDS]), ex.final, ex.response_started, ex.last_unplaced, ex.done,
                None if ex.capture_out is None else bytes(ex.capture_out)]
        s = ex.rec.stream
        if s is not None:
            slots = [getattr(s, a) for cls in type(s).__mro__ for a in getattr(cls, "__slots__", ())
                     if a not in ("parser", "_fmt", "gaps", "gaps_forwarded", "__dict__")]  # (those: below)
            snap += [repr(slots), repr({k: v for k, v in vars(s).items() if k not in ("gaps", "gaps_forwarded")}),
                     (s.parser.comments, s.parser.events, s.parser.truncated), _gaps(s.gaps), _gaps(s.gaps_forwarded)]
        out.append(snap)
    return out


def _replay(tap: Tap, calls: list, n: int, close: bool, native: bool, monkeypatch, prepare=None) -> tuple[list, int, list[Exchange]]:
    """Make the calls on one upstream connection with the accelerator on (``native``) or off; returns what each call
    raised and left, how many reads or pieces the accelerator took, and the exchanges."""
    took = 0
    if native:
        watch_read, watch_cuts = relay._relay_acc.watch, relay._relay_acc.watch_cuts

        def counting_read(*a):
            nonlocal took
            r = watch_read(*a)
            took += bool(r)
            return r

        def counting_cuts(*a):
            nonlocal took
            r = watch_cuts(*a)
            took += r - a[4]  # (the pieces from start on that it took)
            return r

        monkeypatch.setattr(relay, "_watch_read", counting_read)
        monkeypatch.setattr(relay, "_watch_cuts", counting_cuts)
    else:
        monkeypatch.setattr(relay, "_watch_read", None)
        monkeypatch.setattr(relay, "_watch_cuts", None)
    up, d, exs = socketless_pair(tap, n, ScriptedDown)
    d.script = [c[2] for c in calls]
    kernel = types.SimpleNamespace(rx_mono_ns=None, rx_bound_ns=0)  # the read's kernel stamp, as the transport hands it
    up.kernel = kernel
    if prepare is not None:
        prepare(exs)
    seen = []
    for kind, group, _write in calls:
        try:
            if kind == "read":
                kernel.rx_mono_ns, kernel.rx_bound_ns = group[0][1], group[0][2]
                up.data_received(group[0][0])
            elif kind == "on_data":
                up.on_data(group[0][0], group[0][1], group[0][2])
            else:
                data, pieces, pos = b"".join(g[0] for g in group), [], 0
                for p, t, b in group:
                    pieces.append((pos, pos + len(p), t, b))
                    pos += len(p)
                up.cuts_received(data, pieces)
            seen.append(None)
        except Exception as exc:  # (the same exception, with the same state left, either way)
            seen.append(repr(exc))
        seen.append(_snapshot(up, d, exs))
    if close:  # the upstream's FIN ends a close-delimited body (Upstream.on_eof's watch of it)
        events = up.reader.feed_eof()
        if events and events[0][0] == h1.END and d.exchanges:
            up._watch(d, b"", events, up.last_read_t, up.last_read_bound, d.last_write_mono or 0, d.last_write_bound)
        seen.append(_snapshot(up, d, exs))
    return seen, took, exs


_SETTINGS = settings(max_examples=400, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.mark.timeout(600)  # (600 generated cases: ~15 s on a quiet 2-core machine, several times that on a loaded one)
@_SETTINGS
@given(case=cases())
def test_accelerator_leaves_every_read_as_the_python_path(case, telemetry, monkeypatch):
    calls, n, close = case
    tap = socketless_tap(telemetry)
    with monkeypatch.context() as m:
        native = _replay(tap, calls, n, close, True, m)[0]
    with monkeypatch.context() as m:
        reference = _replay(tap, calls, n, close, False, m)[0]
    assert native == reference


_STREAM = [
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n",
    *[b"%x\r\n" % (len(e) + 2) + e + b"\n\n\r\n" for e in (_EVENTS[0], *[_EVENTS[1]] * 6, _EVENTS[11])],
    b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n",
]


@pytest.mark.skipif(not StreamObserver._native, reason="deltatap.core._content is not built or turned off: SSE reads take Python's path")
@pytest.mark.parametrize("how", ["read", "on_data", "cuts", "one_cuts_list"])
def test_accelerator_takes_the_body_reads(how, telemetry, monkeypatch):
    """The accelerator is not idle: of a streamed response read one write per read (or as one cuts list after the
    head, or the whole response as one cuts list, as a busy tap reads it), it takes every body read between the head
    and the message's end, and leaves the record as the Python does."""
    tap = socketless_tap(telemetry)
    t = 1_000_000
    if how == "cuts":
        calls = [("read", [(_STREAM[0], t, 0)], (t + 5, 0, False)),
                 ("cuts", [(p, t + 1000 * i, 0) for i, p in enumerate(_STREAM[1:], 1)], (t + 99_000, 0, False))]
    elif how == "one_cuts_list":
        calls = [("cuts", [(p, t + 1000 * i, 0) for i, p in enumerate(_STREAM)], (t + 99_000, 0, False))]
    else:
        calls = [(how, [(p, t + 1000 * i, 0)], (t + 1000 * i + 5, 0, False)) for i, p in enumerate(_STREAM)]
    with monkeypatch.context() as m:
        native, took, exs = _replay(tap, calls, 1, False, True, m)
    with monkeypatch.context() as m:
        reference = _replay(tap, calls, 1, False, False, m)[0]
    assert native == reference
    assert took == len(_STREAM) - 2  # (the head and the read that ends the message are the Python path's)
    assert exs[0].done and exs[0].rec.stream.tokens == 6 and exs[0].rec.chunks == len(_STREAM) - 1


class _Boom(RuntimeError):
    pass


class _Bomb(int):
    """A record counter that fails to add a piece longer than 40 bytes (every body piece of _STREAM but the last)."""

    def __add__(self, other):
        if other > 40:
            raise _Boom("a counter failed")
        return _Bomb(int(self) + other)


@pytest.mark.parametrize("how", ["read", "one_cuts_list"])
@pytest.mark.parametrize("where", ["counter", "take"])
def test_accelerator_raises_what_the_python_raises(how, where, telemetry, monkeypatch):
    """A step that raises mid-read — the record's counter, or the observer's Python ``take`` (for the events the C
    observer hands to it) — gives the same exception, and leaves the same state, either way."""
    tap = socketless_tap(telemetry)
    original = StreamObserver.take

    def take(self, ev, t, bound=0):
        if "role" in ev.data or "usage" in ev.data:
            raise _Boom("take failed")
        return original(self, ev, t, bound)

    def bomb(exs):
        exs[0].rec.response_bytes = _Bomb(0)

    t = 1_000_000
    if how == "read":
        calls = [("read", [(p, t + 1000 * i, 0)], (t + 1000 * i + 5, 0, False)) for i, p in enumerate(_STREAM)]
    else:
        calls = [("cuts", [(p, t + 1000 * i, 0) for i, p in enumerate(_STREAM)], (t + 99_000, 0, False))]
    results = []
    for native in (True, False):
        with monkeypatch.context() as m:
            if where == "take":
                m.setattr(StreamObserver, "take", take)
            results.append(_replay(tap, calls, 1, False, native, m, bomb if where == "counter" else None)[0])
    assert results[0] == results[1]
    if where == "counter":
        assert sum(r is not None and "a counter failed" in r for r in results[0][::2]) == (len(_STREAM) - 2 if how == "read" else 1)


async def live_stream_attrs(make_tap, span_exporter, telemetry, python_path, pause_s: float) -> list[dict]:
    """The span attributes of the same SSE response (written in pieces ``pause_s`` apart) through a tap on 127.0.0.1,
    first as built, then after ``python_path()`` (turning accelerated steps back to their Python definitions); the
    client gets the bytes unchanged both times."""
    up = await RawUpstream().start()
    attrs: list[dict] = []
    try:
        for native in (True, False):
            if not native:
                python_path()
            tap = await make_tap(up.url)
            up.expect(reply(*_STREAM, pause_s=pause_s))
            req = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
            want = b"".join(_STREAM)
            got = await raw_exchange(tap.port, [req], expect=len(want), settle_s=0.05, timeout_s=5)
            assert got.received.endswith(want)
            spans = await wait_spans(span_exporter, telemetry, len(attrs) + 1)
            attrs.append(dict(spans[-1].attributes))
    finally:
        await up.close()
    return attrs


async def test_live_stream_records_the_same_either_way(make_tap, span_exporter, telemetry, monkeypatch):
    """Through a tap on 127.0.0.1, the same SSE response (written in pieces 5 ms apart) with the accelerator and
    without it: the client gets the bytes unchanged and the two spans carry the same tokens, usage, chunk and byte
    counts."""
    def python_path() -> None:
        monkeypatch.setattr(relay, "_watch_read", None)
        monkeypatch.setattr(relay, "_watch_cuts", None)

    attrs = await live_stream_attrs(make_tap, span_exporter, telemetry, python_path, pause_s=0.005)
    keys = (Attr.GENAI_OUTPUT_TOKENS, Attr.GENAI_INPUT_TOKENS, Attr.BODY_BYTES_OUT, Attr.HTTP_STATUS)
    body = sum(len(e) + 2 for e in (_EVENTS[0], *[_EVENTS[1]] * 6, _EVENTS[11])) + 14
    assert [attrs[0].get(k) for k in keys[1:]] == [5, body, 200]
    assert [attrs[0].get(k) for k in keys] == [attrs[1].get(k) for k in keys]
    assert attrs[0].get(Attr.GENAI_OUTPUT_TOKENS) and attrs[0].get(Attr.CHUNKS) and attrs[1].get(Attr.CHUNKS)
