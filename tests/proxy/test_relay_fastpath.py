"""The relay's hot path for response reads (:meth:`deltatap.proxy.relay.Upstream._watch`: a read of body bytes
alone is watched without the general loop; :meth:`Upstream.data_received`: a kernel-stamped read forwarded and
watched in one step) against its reference, :meth:`Upstream._watch_events` (the general loop, which handles any read,
as the relay did before the hot path): the same response bytes, cut into the same reads with the same stamps, must
leave the same record, stream observer, exchange state and write stamps either way.

Network-free first: a real :class:`~deltatap.proxy.server.Tap` (not started), relay sides without sockets, real
framing (:mod:`deltatap.net.h1`) and stream observer; responses generated (SSE with content, role, usage, comments,
malformed and empty events, CR LF or LF; JSON; other types; chunked, Content-Length or close-delimited; interim 103;
pipelined pairs; bytes after the last response; cut short) and cut at random points. Then live, through a tap on 127.0.0.1.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from _pairs import socketless_pair, socketless_tap
from raw_peer import RawUpstream, raw_exchange, reply
from tap_helpers import wait_spans

from deltatap.core.vocab import Attr, TapEvent
from deltatap.net import h1
from deltatap.net.conn import StampedProtocol
from deltatap.proxy.relay import Exchange, Upstream
from deltatap.proxy.server import Tap

_EVENTS = {
    "role": b'data: {"id":"c1","model":"m","choices":[{"index":0,"delta":{"role":"assistant"}}]}',
    "token": b'data: {"id":"c1","model":"m","choices":[{"index":0,"delta":{"content":"tok"}}]}',
    "empty": b'data: {"id":"c1","model":"m","choices":[{"index":0,"delta":{"content":""}}]}',
    "usage": b'data: {"id":"c1","model":"m","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8}}',
    "done": b"data: [DONE]",
    "comment": b": keep-alive",
    "bad": b"data: {not json",
}
_TYPES = {"sse": b"text/event-stream", "json": b"application/json", "text": b"text/plain"}
_EXTRA = [b"", b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi", b"garbage\r\n\r\n"]
_STREAM_ATTRS = (
    "chunks", "bytes", "first_chunk_mono_ns", "first_token_forwarded_mono_ns", "last_token_forwarded_mono_ns",
    "first_token_forwarded_bound_ns", "last_token_forwarded_bound_ns", "unforwarded", "events", "content_events", "tokens",
    "malformed", "done", "first_token_mono_ns", "last_token_mono_ns", "first_token_bound_ns", "last_token_bound_ns", "format",
)


@st.composite
def responses(draw) -> tuple[bytes, int, bool]:
    """Response bytes for 1 or 2 POSTs, how many, and whether the last is close-delimited."""
    n = draw(st.integers(1, 2))
    out = bytearray()
    close = False
    for i in range(n):
        kind = draw(st.sampled_from(["sse", "sse", "sse", "json", "text"]))
        eol = draw(st.sampled_from([b"\n", b"\r\n"]))
        if kind == "sse":
            names = draw(st.lists(st.sampled_from(sorted(_EVENTS)), max_size=12))
            body = b"".join(_EVENTS[k] + eol + eol for k in names)
            if draw(st.booleans()) and body:
                body = body[: -len(eol)]  # an unterminated last event (held until the end)
        elif kind == "json":
            body = b'{"id":"x","usage":{"prompt_tokens":2,"completion_tokens":1}}'
        else:
            body = draw(st.binary(max_size=40))
        framing = draw(st.sampled_from(["chunked", "length", "close"] if i == n - 1 else ["chunked", "length"]))
        if draw(st.booleans()):
            out += b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"
        out += b"HTTP/1.1 200 OK\r\nContent-Type: " + _TYPES[kind] + b"\r\n"
        if framing == "chunked":
            out += b"Transfer-Encoding: chunked\r\n\r\n"
            pos = 0
            while pos < len(body):
                size = draw(st.integers(1, max(1, len(body) - pos)))
                out += b"%x\r\n" % size + body[pos : pos + size] + b"\r\n"
                pos += size
            out += b"0\r\n\r\n"
        elif framing == "length":
            out += b"Content-Length: %d\r\n\r\n" % len(body) + body
        else:
            out += b"\r\n" + body
            close = True
    if not close:
        out += draw(st.sampled_from(_EXTRA))
    return bytes(out), n, close


def _snapshot(ex: Exchange) -> dict:
    rec = ex.rec
    snap = {f.name: getattr(rec, f.name) for f in dataclasses.fields(rec) if f.name not in ("stream", "ws", "facts", "bounds")}
    snap["bounds"] = dict(rec.bounds)
    snap["facts"] = dataclasses.asdict(rec.facts)
    s = rec.stream
    if s is not None:
        snap["stream"] = {a: getattr(s, a) for a in _STREAM_ATTRS}
        snap["stream_facts"] = dataclasses.asdict(s.facts)
        snap["gaps"] = [(g.count, g.total_ns, g.max_ns) for g in (s.gaps, s.gaps_forwarded)]
    snap["exchange"] = (ex.final, ex.response_started, ex.last_unplaced, ex.done,
                        None if ex.capture_out is None else bytes(ex.capture_out))
    return snap


def _replay(tap: Tap, pieces: list[bytes], stamps: list[tuple[int, int, int, int, bool]], n: int, close: bool, fast: bool):
    """Feed ``pieces`` as successive reads of one upstream connection, watched by the hot path (``fast``) or by the
    reference loop; returns what each read returned and left, and each exchange's state after."""
    up, d, exs = socketless_pair(tap, n)

    def watch(data: bytes, events: list[tuple], t: int, bound: int, tw: int, bw: int) -> tuple[int, int]:
        if fast:
            return up._watch(d, data, events, t, bound, tw, bw)
        r = up._watch_events(d, data, events, t, bound, tw, bw)
        up.plain = not up.reader.opaque
        return r

    seen = []
    t = bound = tw = bw = 0
    for piece, (t, bound, tw, bw, unplaced) in zip(pieces, stamps):
        if not up.plain:  # (opaque from here: the relay passes the bytes on unwatched by _watch)
            break
        d.unplaced = (t, t + 1, 0) if unplaced else None
        seen.append((watch(piece, up.reader.feed(piece), t, bound, tw, bw), d.unplaced))
        assert up.plain == (not up.reader.opaque)
    if close:  # the upstream's FIN ends a close-delimited body (as Upstream.on_eof does)
        events = up.reader.feed_eof()
        if events and events[0][0] == h1.END and d.exchanges:
            seen.append(watch(b"", events, t, bound, tw + 7, bw))
    return seen, [_snapshot(ex) for ex in exs]


@st.composite
def cases(draw):
    data, n, close = draw(responses())
    if draw(st.integers(0, 3)) == 0:  # the connection stops mid-response (what the record holds then shows too)
        data = data[: draw(st.integers(1, len(data)))]
    cuts = sorted(set(draw(st.lists(st.integers(1, max(1, len(data) - 1)), max_size=24))))
    pieces = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)]) if b > a]
    stamps, t = [], 1_000_000
    for _ in pieces:
        t += draw(st.integers(1, 5_000_000))
        stamps.append((t, draw(st.integers(0, 1_000_000)), t + draw(st.integers(0, 50_000)),
                       draw(st.sampled_from([-1, 0, 1_500, 2_000_000])), draw(st.booleans())))
    return pieces, stamps, n, close


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(case=cases())
def test_hot_path_watches_reads_as_the_reference_loop(case, telemetry):
    pieces, stamps, n, close = case
    tap = socketless_tap(telemetry)
    assert _replay(tap, pieces, stamps, n, close, fast=True) == _replay(tap, pieces, stamps, n, close, fast=False)


def _reference_path(monkeypatch) -> None:
    """The relay as before its hot path: every read through StampedProtocol.data_received → on_data, and _watch's
    general loop for every read."""
    def watch(self, d, data, events, t, bound, tw, bw):
        r = Upstream._watch_events(self, d, data, events, t, bound, tw, bw)
        self.plain = not self.reader.opaque
        return r

    monkeypatch.setattr(Upstream, "data_received", StampedProtocol.data_received)
    monkeypatch.setattr(Upstream, "_watch", watch)


_SSE_WRITES = [
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n",
    *[b"%x\r\n" % (len(_EVENTS[k]) + 2) + _EVENTS[k] + b"\n\n\r\n" for k in ("role", "token", "token", "comment", "token")],
    b"%x\r\n" % (len(_EVENTS["usage"]) + 2) + _EVENTS["usage"] + b"\n\n\r\n" + b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n",
]


@pytest.mark.parametrize("path", ["hot", "reference"])
async def test_relay_paths_record_the_same_stream_live(path, monkeypatch, make_tap, span_exporter, telemetry):
    """Through a tap on 127.0.0.1: an SSE response written in 7 pieces (5 ms apart) reaches the client byte for byte and
    its span carries the same token count, usage, chunk and byte counts whichever path watched it, with every token's
    forwarding stamped no earlier than its arrival."""
    if path == "reference":
        _reference_path(monkeypatch)
    up = await RawUpstream().start()
    try:
        tap = await make_tap(up.url)
        up.expect(reply(*_SSE_WRITES, pause_s=0.005))
        req = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
        want = b"".join(_SSE_WRITES)
        got = await raw_exchange(tap.port, [req], expect=len(want), settle_s=0.05, timeout_s=5)
        assert got.received.endswith(want)
        spans = await wait_spans(span_exporter, telemetry, 1)
        assert len(spans) == 1
        a = spans[0].attributes
        ev = {e.name: e.timestamp for e in spans[0].events}
    finally:
        await up.close()
    assert a[Attr.GENAI_OUTPUT_TOKENS] == 3 and a[Attr.GENAI_INPUT_TOKENS] == 5
    assert a[Attr.CHUNKS] >= 1 and a[Attr.HTTP_STATUS] == 200
    assert a[Attr.BODY_BYTES_OUT] == sum(len(_EVENTS[k]) + 2 for k in ("role", "token", "token", "comment", "token", "usage")) + 14
    for point in ("first_token", "last_token"):
        assert ev[getattr(TapEvent, f"{point.upper()}_RECEIVED")] <= ev[getattr(TapEvent, f"{point.upper()}_FORWARDED")]
