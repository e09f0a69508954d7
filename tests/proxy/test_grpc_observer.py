"""The sans-I/O gRPC observer (deltatap.proxy.grpc), network-free: framing over any split, per-message stamps, the
KServe v2 decoder against messages the protobuf library encodes, the first-content-token rule, status -> outcome."""

from __future__ import annotations

import gzip
import random

import pytest

from deltatap.core.sse import StreamObserver
from deltatap.core.vocab import Attr, Outcome, TapEvent
from deltatap.proxy.grpc import (
    FIRST_TOKEN_CONTENT, FIRST_TOKEN_MESSAGE, GrpcFramer, GrpcObserver, grpc_timeout_ns, is_grpc, outcome_for_status,
)
from deltatap.proxy.record import TapRecord
from deltatap.proxy.record import events as record_events
from tests.proxy.kserve_proto import STREAM_INFER, frame, stream_response

MS_NS = 1_000_000


def _splits(data: bytes, rng: random.Random, n: int) -> list[bytes]:
    cuts = sorted(rng.sample(range(1, len(data)), min(n, len(data) - 1)))
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)])]


def test_framer_any_split_gives_the_same_messages():
    rng = random.Random(7)
    msgs = [bytes(rng.randrange(256) for _ in range(rng.choice([0, 1, 4, 5, 300, 70_000]))) for _ in range(30)]
    wire = b"".join(frame(m, compressed=i % 3 == 0) for i, m in enumerate(msgs))
    for trial in range(20):
        f = GrpcFramer()
        got = []
        for piece in _splits(wire, rng, rng.randrange(1, 200)):
            got.extend(f.feed(piece))
        f.finish()
        assert [g.data for g in got] == msgs
        assert [g.compressed for g in got] == [i % 3 == 0 for i in range(30)]
        assert not f.truncated and f.messages == 30


def test_framer_truncated_and_not_grpc():
    f = GrpcFramer()
    assert f.feed(frame(b"abcdef")[:-2]) == []
    f.finish()
    assert f.truncated
    g = GrpcFramer()
    assert g.feed(b"HTTP/1.1 200 OK\r\n") == []  # flag byte 'H': not gRPC framing, parsing stops
    assert g.malformed and g.feed(frame(b"x")) == []


def test_unknown_method_every_message_is_a_content_unit_with_its_stamp():
    obs = GrpcObserver("/echo.Echo/Stream")
    assert isinstance(obs, StreamObserver)
    wire = [frame(b"a"), frame(b"") + frame(b"bc"), frame(b"def")[:3], frame(b"def")[3:]]
    for i, chunk in enumerate(wire):
        obs.feed(chunk, 1000 * (i + 1), bound_ns=i)
        obs.forwarded(1000 * (i + 1) + 50)
    obs.finish(9000)
    assert obs.messages == 4 and obs.content_events == 4
    assert list(obs.arrival_mono_ns) == [1000, 2000, 2000, 4000]
    assert list(obs.arrival_bound_ns) == [0, 1, 1, 3]
    assert obs.first_token_mono_ns == 1000 and obs.first_token_forwarded_mono_ns == 1050
    assert obs.last_token_mono_ns == 4000 and obs.last_token_forwarded_mono_ns == 4050
    assert (obs.first_message_mono_ns, obs.last_message_mono_ns) == (1000, 4000)
    assert obs.gaps.count == 3 and obs.chunks == 4 and obs.message_bytes == 6
    assert obs.format == "grpc-message" and obs.first_token_source == FIRST_TOKEN_MESSAGE
    a = obs.span_attributes()
    assert a[Attr.RPC_SERVICE] == "echo.Echo" and a[Attr.RPC_METHOD] == "Stream" and a[Attr.FIRST_TOKEN_SOURCE] == "message"


@pytest.mark.parametrize("raw", [True, False])
def test_kserve_stream_first_content_token_skips_empty_and_whitespace(raw):
    obs = GrpcObserver(STREAM_INFER)
    msgs = [stream_response(None, raw=raw), stream_response("", raw=raw), stream_response("  ", raw=raw),
            stream_response("Hello", raw=raw), stream_response(" world", raw=raw), stream_response("", raw=raw, final=True)]
    wire = b"".join(frame(m) for m in msgs)
    rng = random.Random(3)
    t = 0
    for piece in _splits(wire, rng, 40):  # split anywhere: stamps are those of the piece completing each message
        t += 10
        obs.feed(piece, t)
    obs.finish(t + 1)
    ends = []
    pos = 0
    for m in msgs:
        pos += len(m) + 5
        ends.append(pos)
    # the stamp of the piece that completed message i
    cum, stamp_of = 0, []
    t = 0
    for piece in _splits(wire, random.Random(3), 40):
        t += 10
        cum += len(piece)
        stamp_of.append((cum, t))
    expect = [next(ts for c, ts in stamp_of if c >= e) for e in ends]
    assert list(obs.arrival_mono_ns) == expect
    assert obs.first_token_mono_ns == expect[3]  # "Hello": not the empty ones, not the whitespace-only one
    assert obs.leading_whitespace_events == 1
    assert obs.content_events == 3 and obs.tokens == 3
    assert obs.last_token_mono_ns == expect[4]
    assert obs.done and obs.format == "kserve-v2" and obs.first_token_source == FIRST_TOKEN_CONTENT
    assert obs.facts.model == "llm" and obs.facts.response_id == "r1"
    assert obs.malformed == 0


def test_kserve_gzip_compressed_messages_and_garbage():
    obs = GrpcObserver(STREAM_INFER, encoding="gzip")
    obs.feed(frame(gzip.compress(stream_response("Hi")), compressed=True), 5)
    assert obs.first_token_mono_ns == 5 and obs.compressed_messages == 1
    bad = GrpcObserver(STREAM_INFER)
    bad.feed(frame(b"\xff\xff\xff"), 1)  # not a protobuf message
    bad.feed(frame(stream_response("x", error="boom")), 2)
    assert bad.undecodable == 1 and bad.first_token_mono_ns == 2
    assert bad.facts.error == "error"
    snappy = GrpcObserver(STREAM_INFER, encoding="snappy")
    snappy.feed(frame(b"\x01\x02", compressed=True), 1)
    assert snappy.undecodable == 1 and snappy.first_token_mono_ns is None
    assert snappy.span_attributes()[Attr.GRPC_UNDECODABLE] == 1


def test_status_trailers_and_outcomes():
    obs = GrpcObserver("/echo.Echo/Unary")
    obs.trailers([(b"grpc-status", b"4"), (b"grpc-message", b"Deadline%20Exceeded")], 77)
    assert obs.status == 4 and obs.status_message == "Deadline Exceeded" and obs.outcome is Outcome.TIMEOUT
    a = obs.span_attributes()
    assert a[Attr.RPC_GRPC_STATUS] == 4 and a[Attr.ERROR_TYPE] == "DEADLINE_EXCEEDED"
    assert (str(TapEvent.RESPONSE_TRAILERS), 77) in obs.span_events()
    ok = GrpcObserver("/a.B/C")
    ok.trailers([("grpc-status", "0")], 1, trailers_only=True)
    assert ok.outcome is Outcome.OK and ok.trailers_only and Attr.ERROR_TYPE not in ok.span_attributes()
    assert outcome_for_status(None) is None
    assert outcome_for_status(1) is Outcome.CLIENT_CANCEL
    assert outcome_for_status(14) is Outcome.UPSTREAM_ERROR
    assert outcome_for_status(3) is Outcome.HTTP_ERROR
    junk = GrpcObserver("/a.B/C")
    junk.trailers([("grpc-status", "x")], 1)
    assert junk.status == 2  # UNKNOWN


def test_is_grpc():
    assert is_grpc([(b":path", b"/a.B/C"), (b"content-type", b"application/grpc")])
    assert is_grpc([("Content-Type", "application/grpc+proto")])
    assert not is_grpc([("content-type", "application/grpc-web")])
    assert not is_grpc([("content-type", "application/json")])


def test_grpc_timeout_and_the_record_outcome():
    assert grpc_timeout_ns(b"300m") == 300 * MS_NS and grpc_timeout_ns("2S") == 2_000_000_000
    assert grpc_timeout_ns("1H") == 3_600_000_000_000 and grpc_timeout_ns("99999999n") == 99_999_999
    for bad in (None, "", "5", "m", "123456789m", "1.5S", "10x", "-1S"):
        assert grpc_timeout_ns(bad) is None, bad
    # a client reset at (or within 1 ms before) its own deadline is the deadline; earlier it is a cancel
    rec = TapRecord(received=1_000, deadline_ns=300 * MS_NS, downstream_closed=1_000 + 300 * MS_NS - MS_NS // 2)
    assert rec.final_outcome() is Outcome.TIMEOUT
    rec.downstream_closed = 1_000 + 200 * MS_NS
    assert rec.final_outcome() is Outcome.CLIENT_CANCEL
    # otherwise the grpc-status decides (the HTTP status of a gRPC answer is 200)
    obs = GrpcObserver("/a.B/C")
    obs.trailers([(b"grpc-status", b"8")], 2_000)
    done = TapRecord(received=1_000, status=200, stream=obs)
    assert done.final_outcome() is Outcome.HTTP_ERROR
    assert [n for n, _t in record_events(done)] == ["request.received", "response.trailers"]
