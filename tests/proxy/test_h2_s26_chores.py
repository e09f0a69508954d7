"""Session 26 ("chores"): before the upstream's first SETTINGS, which tell its concurrency limit, the tap opens one
stream upstream and the client's others wait for them. h2 takes the limit as unlimited until then: a client whose
preface and twelve requests came in one read (replayed the moment the upstream connection was made, before the
upstream's SETTINGS could be read) had all twelve opened upstream, and an upstream allowing 3 ended the whole
connection (GOAWAY PROTOCOL_ERROR: every stream lost). That depended on the read pattern: with the packet log a
client's writes one by one usually let the SETTINGS come first (test_h2's limit test failed only with
DELTATAP_PACKET_STAMPS=0 or DELTATAP_KERNEL_STAMPS=0). Here the client writes everything in one write, so every
stamping configuration replays it before the upstream's SETTINGS.
Live on 127.0.0.1: the h2 peer of test_h2 upstream, its h2 client."""

from __future__ import annotations

import asyncio

from h2_peer import H2Client, start_h2_peer
from tap_helpers import wait_spans
from test_h2 import req

from deltatap.core.vocab import Attr


async def test_streams_sent_with_the_preface_in_one_write_wait_for_the_upstreams_settings(make_tap, span_exporter, telemetry):
    p = await start_h2_peer(max_streams=3)
    try:
        tap = await make_tap(p.url)
        c = H2Client()
        c._flush = lambda: None  # (held: the preface, SETTINGS and the twelve HEADERS leave in one write below)
        await c.connect("127.0.0.1", tap.port)
        try:
            sids = [c.request(req(tap.port, "/v1/chat/completions?first_ms=5&gap_ms=1&n=2")) for _ in range(12)]
            del c._flush
            c._flush()
            replies = await asyncio.gather(*(c.wait(s) for s in sids))
            goaway = c.goaway
        finally:
            await c.close()
    finally:
        await p.close()
    assert goaway is None
    assert [(dict(r.headers or []).get(b":status"), r.reset) for r in replies] == [(b"200", None)] * 12
    assert all(r.data.endswith(b"data: [DONE]\n\n") for r in replies)
    spans = await wait_spans(span_exporter, telemetry, 12)
    assert sorted(s.attributes[Attr.OUTCOME] for s in spans) == ["ok"] * 12
