"""One definition per concept at the tap's exchange end (issue 15): the cheap definitions against their rules.

``TapRecord.overheads`` (the three overhead figures the properties, the span's attributes and ``Tap.finish`` read),
``span_events`` / ``events`` (the span's events), ``format_stamp_bounds(bounds(rec))`` (the stamp-bounds attribute) and
``GapStats.quantile_ns`` with its largest-gap step, each compared on generated records with the rule written out
plainly here (the forms they had before they were made cheap: a list of every event filtered and stably sorted, a
merged dict formatted with a comprehension, nearest rank over the sorted gaps).
"""

from __future__ import annotations

import math
import random

import pytest

from deltatap.core.gap_stats import GapStats
from deltatap.core.sse import StreamObserver, _GapCore
from deltatap.core.vocab import STAMP_EXACT_NS, Attr, Outcome, TapEvent, format_stamp_bounds
from deltatap.proxy.record import TapRecord, bounds, events, record_attributes, span_constants, span_events

_RECORD_TIMES = ("head", "body_received", "forwarded", "response_headers", "response_headers_forwarded", "response_end",
                 "upstream_closed", "upstream_error", "timeout", "downstream_closed")
_STREAM_TIMES = ("first_token_mono_ns", "first_token_forwarded_mono_ns", "last_token_mono_ns", "last_token_forwarded_mono_ns")
_STREAM_BOUNDS = ("first_token_bound_ns", "last_token_bound_ns", "first_token_forwarded_bound_ns", "last_token_forwarded_bound_ns")
_OWN_BOUNDS = (TapEvent.REQUEST_RECEIVED, TapEvent.REQUEST_BODY_RECEIVED, TapEvent.REQUEST_FORWARDED, TapEvent.RESPONSE_HEADERS,
               TapEvent.RESPONSE_HEADERS_FORWARDED, TapEvent.RESPONSE_END, TapEvent.FIRST_TOKEN_RECEIVED)


def _record(r: random.Random) -> TapRecord:
    """A record with each stamp present or not, stamps drawn from a few values (ties are common), some bounds wide."""
    t0 = 1_000_000_000
    rec = TapRecord(received=t0 + r.choice((0, 5, 10)))
    for name in _RECORD_TIMES:
        if r.random() < 0.6:
            setattr(rec, name, t0 + r.choice((0, 5, 10, 20, 30, 40)) * 1_000)
    for ev in r.sample(_OWN_BOUNDS, r.randrange(len(_OWN_BOUNDS) + 1)):
        rec.bounds[ev] = (r.choice((0, 10, STAMP_EXACT_NS, 70_000)), r.choice((-1, 0, 20_000, STAMP_EXACT_NS + 1)))
    if r.random() < 0.75:
        s = rec.stream = StreamObserver(path="/v1/chat/completions")
        for name in _STREAM_TIMES:
            if r.random() < 0.7:
                setattr(s, name, t0 + r.choice((0, 10, 20, 30, 50)) * 1_000)
        for name in _STREAM_BOUNDS:
            setattr(s, name, r.choice((-5, 0, 40_000, 60_000)))
    return rec


def _overheads_rule(rec: TapRecord) -> tuple[int | None, int | None, int | None]:
    begun = rec.body_received if rec.body_received is not None else rec.head
    request = max(0, rec.forwarded - begun) if begun is not None and rec.forwarded is not None else None
    s = rec.stream
    first_token = hop = None
    if s is not None and s.first_token_mono_ns is not None and s.first_token_forwarded_mono_ns is not None:
        first_token = max(0, s.first_token_forwarded_mono_ns - s.first_token_mono_ns)
    if s is not None and s.first_token_forwarded_mono_ns is not None and rec.forwarded is not None:
        req = rec.bounds.get(TapEvent.REQUEST_FORWARDED)
        ft = s.first_token_forwarded_bound_ns
        if req is not None and req[1] >= 0 and ft is not None and ft >= 0:
            hop = req[1] + ft
    return request, first_token, hop


def _events_rule(rec: TapRecord) -> list[tuple[str, int]]:
    s = rec.stream
    pairs = [(TapEvent.REQUEST_RECEIVED, rec.received), (TapEvent.REQUEST_BODY_RECEIVED, rec.body_received),
             (TapEvent.REQUEST_FORWARDED, rec.forwarded), (TapEvent.RESPONSE_HEADERS, rec.response_headers),
             (TapEvent.RESPONSE_HEADERS_FORWARDED, rec.response_headers_forwarded),
             (TapEvent.FIRST_TOKEN_RECEIVED, s.first_token_mono_ns if s else None),
             (TapEvent.FIRST_TOKEN_FORWARDED, s.first_token_forwarded_mono_ns if s else None),
             (TapEvent.LAST_TOKEN_RECEIVED, s.last_token_mono_ns if s else None),
             (TapEvent.LAST_TOKEN_FORWARDED, s.last_token_forwarded_mono_ns if s else None),
             (TapEvent.RESPONSE_END, rec.response_end), (TapEvent.UPSTREAM_CLOSED, rec.upstream_closed),
             (TapEvent.UPSTREAM_ERROR, rec.upstream_error), (TapEvent.TIMEOUT, rec.timeout),
             (TapEvent.DOWNSTREAM_CLOSED, rec.downstream_closed)]
    return sorted([(str(n), t) for n, t in pairs if t is not None], key=lambda p: p[1])


def _stamp_bounds_rule(rec: TapRecord) -> str | None:
    merged = dict(rec.bounds)
    s = rec.stream
    if s is not None:
        if s.first_token_mono_ns is not None:
            merged[TapEvent.FIRST_TOKEN_RECEIVED] = (s.first_token_bound_ns, 0)
            merged[TapEvent.LAST_TOKEN_RECEIVED] = (s.last_token_bound_ns, 0)
        if s.first_token_forwarded_mono_ns is not None:
            merged[TapEvent.FIRST_TOKEN_FORWARDED] = (0, s.first_token_forwarded_bound_ns)
        if s.last_token_forwarded_mono_ns is not None:
            merged[TapEvent.LAST_TOKEN_FORWARDED] = (0, s.last_token_forwarded_bound_ns)
    # (a side -1: unknown, the write's bytes never seen to leave: stated "?", never left out as exact)
    parts = [f"{ev}={'?' if b < 0 else b}/{'?' if a < 0 else a}" for ev, (b, a) in merged.items()
             if b + a > STAMP_EXACT_NS or b < 0 or a < 0]
    return ",".join(parts) or None


def test_record_definitions_match_their_rules() -> None:
    r = random.Random(20)
    consts = span_constants(link="l", downstream="d", downstream_kind="client", upstream="u", upstream_kind="engine",
                            upstream_host="127.0.0.1", upstream_port=9, correlation_header="x-request-id", labels={})
    seen = {"hop": 0, "bounds": 0, "ties": 0}
    for _ in range(400):
        rec = _record(r)
        want = _overheads_rule(rec)
        assert rec.overheads() == want
        assert (rec.overhead_request_ns, rec.overhead_first_token_ns, rec.overhead_hop_ns) == want
        a = record_attributes(rec, consts, None, Outcome.OK)
        for attr, value in zip((Attr.OVERHEAD_REQUEST_NS, Attr.OVERHEAD_FIRST_TOKEN_NS, Attr.OVERHEAD_HOP_NS), want):
            assert a.get(attr) == value
        assert record_attributes(rec, consts, None, Outcome.OK, rec.overheads()) == a
        want_events = _events_rule(rec)
        got = events(rec)
        assert got == want_events and all(type(n) is str for n, _t in got)
        assert span_events(rec, 7) == [(n, t + 7, None) for n, t in want_events]
        stated = _stamp_bounds_rule(rec)
        assert format_stamp_bounds(bounds(rec)) == stated == a.get(Attr.STAMP_BOUNDS)
        seen["hop"] += want[2] is not None
        seen["bounds"] += stated is not None
        seen["ties"] += len({t for _n, t in want_events}) < len(want_events)
    assert min(seen.values()) > 20, seen  # the generated cases reach every branch the rules have


@pytest.mark.parametrize("make", [GapStats, _GapCore] if _GapCore is not None else [GapStats])
def test_quantile_nearest_rank(make) -> None:
    r = random.Random(7)
    for count in (1, 2, 3, 50, 99, 100, 101, 127, 128):
        g = make()
        gaps = [r.choice((0, 0, 1, 1_000, r.randrange(1, 10**7))) for _ in range(count)]
        for x in gaps:
            g.add(x)
        ordered = sorted(gaps)
        for q in (0.0, 0.01, 0.5, 0.9, 0.99, 0.999, 1.0):
            assert g.quantile_ns(q) == float(ordered[max(1, math.ceil(q * count)) - 1]), (count, q)
        assert g.p99_ns() == g.quantile_ns(0.99) and g.mean_ns == sum(ordered) / count


def test_traceparent_text_and_begin() -> None:
    """traceparent() (%-formatted) writes the W3C text as format() writes it; begin() sends upstream the traceparent
    naming its span, under the incoming context or a new trace, as the propagator reads it back."""
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    from deltatap.proxy.spans import begin
    from deltatap.telemetry.spans import traceparent

    r = random.Random(3)
    for _ in range(500):
        t, s, f = r.getrandbits(r.choice((1, 64, 128))) or 1, r.getrandbits(r.choice((1, 64))) or 1, r.choice((0, 1, 255))
        assert traceparent(t, s, f) == f"00-{t:032x}-{s:016x}-{f:02x}"
    w3c = TraceContextTextMapPropagator()
    incoming = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"}
    for headers in ({}, incoming):
        start = begin(headers)
        sent = trace.get_current_span(w3c.extract(start.trace_headers)).get_span_context()
        assert (sent.trace_id, sent.span_id, int(sent.trace_flags)) == (start.trace_id, start.span_id, start.trace_flags)
    assert start.trace_id == 0x0af7651916cd43dd8448eb211c80319c and start.parent_span_id == 0xb7ad6b7169203331 and start.trace_flags == 0
