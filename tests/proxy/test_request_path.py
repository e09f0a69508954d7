"""The tap's request path: forwarded first, accounted after (:meth:`deltatap.proxy.relay.Downstream._process`), and the
span's attributes and overhead figures that come of it.

Network-free first: a real :class:`~deltatap.proxy.server.Tap` (not started), a downstream side without a socket and an
upstream side that records its writes; generated request streams (methods, targets, headers, Content-Length, chunked
or no body, pipelined) cut into reads at random points. Whatever the cuts, the upstream gets the same bytes (each head
with the tap's trace context and correlation header), each read's bytes leave in that read's one write, and each
record holds what the request was (method, path, query, body bytes, fingerprint, captured body) and the stamps of the
reads and the write its points are defined by. Then live, through a tap on 127.0.0.1: the attributes the tap builds
with its constants made once are the attributes of :func:`deltatap.proxy.record.attributes`, and the hop bound is
present and bounded.
"""

from __future__ import annotations

import json
import re

import aiohttp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tap_helpers import wait_spans

from deltatap.core.fingerprint import Fingerprinter
from deltatap.core.vocab import Attr, TapEvent
from deltatap.proxy import TapOptions
from deltatap.proxy.record import TapRecord, attributes, record_attributes
from deltatap.proxy.relay import Downstream, Upstream
from deltatap.proxy.server import Tap


class _Up(Upstream):
    """An upstream side without a socket: each write kept, stamped ``(1000 + its index, 7)``."""

    def __init__(self, tap: Tap) -> None:
        super().__init__(tap)
        self.writes: list[bytes] = []

    def send(self, data):  # noqa: D102
        self.writes.append(bytes(data))
        stamp = (1000 + len(self.writes) - 1, 7)
        self.last_write_mono, self.last_write_bound = stamp
        return stamp


class _Down(Downstream):
    def __init__(self, tap: Tap) -> None:
        super().__init__(tap)
        self.closed = True  # (no socket: no head timer)
        self.sniff = None  # (HTTP/1.1: no preface to look for)
        self.finished: list[TapRecord] = []


@st.composite
def requests(draw) -> tuple[bytes, list[dict]]:
    """Pipelined requests: the bytes and, per request, what its record must say and where it ends."""
    out, specs = b"", []
    for _ in range(draw(st.integers(1, 4))):
        method = draw(st.sampled_from(["GET", "POST", "PUT", "FOO"]))
        path = draw(st.sampled_from(["/v1/chat/completions", "/p", "/a/b"]))
        query = draw(st.sampled_from(["", "k=1", "a=b&c="]))
        framing = "none" if method == "GET" else draw(st.sampled_from(["length", "chunked"]))
        if framing == "none":
            body = b""
        elif draw(st.booleans()):
            body = json.dumps({"model": draw(st.sampled_from(["m1", "m2"])), "max_tokens": draw(st.integers(1, 99)),
                               "messages": [{"role": "user", "content": "x" * draw(st.integers(0, 300))}]}).encode()
        else:
            body = draw(st.binary(min_size=0, max_size=400))
        headers = [f"Host: h{draw(st.integers(0, 3))}"]
        for i in range(draw(st.integers(0, 3))):
            headers.append(f"{draw(st.sampled_from(['X-A', 'x-b', 'Accept']))}: v{i}")
        if draw(st.booleans()):
            headers.append(f"traceparent: 00-{'ab' * 16}-{'cd' * 8}-01")
        if draw(st.booleans()):
            headers.append(f"x-request-id: rid-{len(specs)}")
        if framing == "length":
            headers.append(f"Content-Length: {len(body)}")
            encoded = body
        elif framing == "chunked":
            headers.append("Transfer-Encoding: chunked")
            encoded, pos = b"", 0
            while pos < len(body):
                n = draw(st.integers(1, max(1, len(body) - pos)))
                encoded += b"%x\r\n" % n + body[pos : pos + n] + b"\r\n"
                pos += n
            encoded += b"0\r\n\r\n"
        else:
            encoded = b""
        head = (f"{method} {path}{'?' + query if query else ''} HTTP/1.1\r\n" + "".join(h + "\r\n" for h in headers) + "\r\n").encode()
        start = len(out)
        out += head + encoded
        specs.append({"method": method, "path": path, "query": query, "body": body, "start": start,
                      "head_end": start + len(head), "end": len(out)})
    return out, specs


@st.composite
def cases(draw):
    data, specs = draw(requests())
    cuts = sorted(set(draw(st.lists(st.integers(1, max(1, len(data) - 1)), max_size=30))))
    return data, specs, cuts


def _feed(tap: Tap, data: bytes, cuts: list[int]) -> tuple[_Down, _Up, list[tuple[int, int, int]], list[int]]:
    """Feed ``data`` cut at ``cuts`` as reads stamped ``(10 * k, k)``; returns the sides, each read's (start, end, t) and
    the index of the write each read made (-1: none)."""
    d, up = _Down(tap), _Up(tap)
    up.down, d.up = d, up
    tap.finish = lambda span, rec: d.finished.append(rec)  # (the records as the tap would finish them)
    reads, write_of = [], []
    for k, (a, b) in enumerate(zip([0, *cuts], [*cuts, len(data)])):
        if b <= a:
            continue
        before = len(up.writes)
        d.on_data(data[a:b], 10 * (k + 1), k + 1)
        reads.append((a, b, 10 * (k + 1)))
        assert len(up.writes) - before <= 1, "one write per read"
        write_of.append(len(up.writes) - 1 if len(up.writes) > before else -1)
    return d, up, reads, write_of


_TRACE = re.compile(rb"(traceparent: [^\r]*|x-request-id: [0-9a-f]{32})\r\n")


@settings(max_examples=800, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(case=cases())
def test_requests_are_forwarded_then_accounted_whatever_the_reads(case, telemetry):
    data, specs, cuts = case
    tap = Tap(TapOptions(upstream="http://127.0.0.1:9", link="fw-engine"), telemetry)
    d, up, reads, write_of = _feed(tap, data, cuts)
    whole_d, whole_up, _r, _w = _feed(tap, data, [])
    sent = b"".join(up.writes)
    # the same bytes upstream however the reads fell (trace ids and created request ids are new per request)
    assert _TRACE.sub(b"", sent) == _TRACE.sub(b"", b"".join(whole_up.writes))
    assert sent.count(b"traceparent: 00-") == len(specs)
    recs = [ex.rec for ex in d.exchanges]
    assert len(recs) == len(specs) and d.current is None
    for rec, spec in zip(recs, specs):
        def read_at(offset: int) -> int:
            return next(k for k, (a, b, _t) in enumerate(reads) if a <= offset < b)

        assert (rec.method, rec.path, rec.query) == (spec["method"], spec["path"], spec["query"])
        assert rec.request_bytes == len(spec["body"])
        fp = Fingerprinter(tap.fp_key)
        fp.update(spec["body"])
        assert d.exchanges[recs.index(rec)].fp.result() == fp.result()
        assert bytes(d.exchanges[recs.index(rec)].capture) == spec["body"]
        assert rec.received == reads[read_at(spec["start"])][2]  # the read with the head's first byte
        assert rec.head == reads[read_at(spec["head_end"] - 1)][2]  # the read that completed the head
        last = read_at(spec["end"] - 1)
        assert rec.body_received == reads[last][2]  # the read with the request's last byte
        assert rec.bounds[TapEvent.REQUEST_BODY_RECEIVED] == (last + 1, 0)
        assert write_of[last] >= 0  # ... whose bytes left in that read's write, which stamps the request forwarded
        assert (rec.forwarded, rec.bounds[TapEvent.REQUEST_FORWARDED]) == (1000 + write_of[last], (0, 7))
        assert rec.overhead_request_ns == max(0, rec.forwarded - rec.body_received)
        if spec["body"].startswith(b'{"model"'):
            doc = json.loads(spec["body"])
            rec.request_capture = d.exchanges[recs.index(rec)].capture
            a = record_attributes(rec, tap.span_constants, None, rec.final_outcome())
            assert (a[Attr.GENAI_REQUEST_MODEL], a[Attr.GENAI_REQUEST_MAX_TOKENS]) == (doc["model"], doc["max_tokens"])


def test_hop_bound_from_the_two_forwarding_writes():
    """``overhead_hop_ns``: the request's and the first token's forwarding writes' bounds, only when both are known."""
    from deltatap.core.sse import StreamObserver

    rec = TapRecord(received=0, head=0, body_received=10, forwarded=20)
    assert rec.overhead_hop_ns is None  # (no stream)
    rec.stream = StreamObserver(path="/v1/chat/completions")
    assert rec.overhead_hop_ns is None  # (no first token forwarded)
    rec.stream.first_token_forwarded_mono_ns, rec.stream.first_token_forwarded_bound_ns = 500, 30
    assert rec.overhead_hop_ns is None  # (no bound on the request's write)
    rec.bounds[TapEvent.REQUEST_FORWARDED] = (0, 12)
    assert rec.overhead_hop_ns == 42
    rec.bounds[TapEvent.REQUEST_FORWARDED] = (0, -1)  # a write that waited, unplaced: unknown
    assert rec.overhead_hop_ns is None


async def test_live_span_attributes_and_hop(upstream, make_tap, span_exporter, telemetry):
    """Through a tap on 127.0.0.1: streamed requests (head and body in one write and in two, on one connection and on
    a new one that takes the pooled upstream connection) get spans whose attributes are those of
    :func:`~deltatap.proxy.record.attributes` for the same record, with the overhead figures and a hop bound that is
    at least 0 and within the exchange."""
    tap = await make_tap(upstream.url, labels={"env": "t"})
    seen: list[tuple] = []
    real_finish = tap.tap.finish

    def finish(span, rec):
        seen.append(rec)
        real_finish(span, rec)

    tap.tap.finish = finish
    body = json.dumps({"model": "m7", "max_tokens": 3, "stream": True, "messages": [{"role": "user", "content": "hi"}]}).encode()
    for _conn in range(2):
        async with aiohttp.ClientSession() as s:
            for _ in range(2):
                async with s.post(tap.url + "/v1/chat/completions?first_ms=5&gap_ms=1&n=3", data=body,
                                  headers={"Content-Type": "application/json"}) as r:
                    assert r.status == 200
                    await r.read()
    spans = await wait_spans(span_exporter, telemetry, 4)
    assert len(spans) == 4 and len(seen) == 4
    assert tap.tap.counters.upstream_connections == 1  # (the second client connection took the pooled one)
    o, t = tap.tap.o, tap.tap
    by_id = {sp.attributes[Attr.REQUEST_ID]: sp for sp in spans}
    for rec in seen:
        a = dict(by_id[rec.request_id].attributes)
        assert a == attributes(rec, link=o.link, downstream=o.downstream, downstream_kind=o.downstream_kind, upstream=o.upstream_name,
                               upstream_kind=o.upstream_kind, upstream_host=t.upstream_host, upstream_port=t.upstream_port,
                               correlation_header=o.correlation_header, clock=t.clock, labels=o.labels, query_keep=o.query_keep,
                               fingerprint_key=t.fp_key)
        assert (a[Attr.GENAI_REQUEST_MODEL], a[Attr.GENAI_REQUEST_MAX_TOKENS], a["deltatap.label.env"]) == ("m7", 3, "t")
        assert rec.forwarded >= rec.body_received >= rec.head >= rec.received
        hop = a[Attr.OVERHEAD_HOP_NS]
        assert 0 <= hop <= rec.end - rec.received
        assert hop == rec.bounds[TapEvent.REQUEST_FORWARDED][1] + rec.stream.first_token_forwarded_bound_ns
        assert a[Attr.OVERHEAD_REQUEST_NS] >= 0 and a[Attr.OVERHEAD_FIRST_TOKEN_NS] >= 0
