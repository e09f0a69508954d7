"""The request id a head without the correlation header gets, made ahead with the connection's spare span ids
(relay.Downstream.spare_id, session 26 "cold"), and the spare's trace lines encoded ahead (SpanStart.trace_lines): each
created id is new (never reused, also across pipelined heads in one read), it is what went upstream and what the span
says; a head that brings its own id keeps it and leaves the spare for the next; the bytes sent are the definition's."""

from __future__ import annotations

import asyncio
import re

import aiohttp
from tap_helpers import wait_spans

from deltatap.core.vocab import Attr
from deltatap.net.h1 import parse_head
from deltatap.proxy import headers as hdrs
from deltatap.proxy.spans import begin

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "stream": True}
HEX32 = re.compile(r"[0-9a-f]{32}")


async def test_spare_request_ids_one_connection(upstream, make_tap, span_exporter, telemetry):
    tap = await make_tap(upstream.url)
    plan = [None, "own-1", None, None, "own-2", None]  # created, kept, created, ... on one keep-alive connection
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as s:
        for rid in plan:
            async with s.post(f"{tap.url}/v1/chat/completions?first_ms=1&n=1", json=CHAT,
                              headers={"x-request-id": rid} if rid else {}) as r:
                assert r.status == 200
                await r.read()
        assert len(tap.tap.connections) == 1
    spans = await wait_spans(span_exporter, telemetry, len(plan))
    got = [sp.attributes[Attr.REQUEST_ID] for sp in spans]
    sent = [dict((k.lower(), v) for k, v in h)["x-request-id"] for h in upstream.log.headers[-len(plan):]]
    assert sorted(got) == sorted(sent)
    for rid, out in zip(plan, sent):
        if rid:
            assert out == rid
        else:
            assert HEX32.fullmatch(out)
    made = [out for rid, out in zip(plan, sent) if not rid]
    assert len(set(made)) == len(made)  # (new each time, none reused)


async def test_pipelined_heads_get_distinct_ids(upstream, make_tap, span_exporter, telemetry):
    tap = await make_tap(upstream.url)
    host, port = tap.url.split("//")[1].split(":")
    req = b"GET /echo HTTP/1.1\r\nHost: x\r\nX-Length: 1\r\n\r\n"
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(req * 3)  # (one read: the first head takes the spare, the others are made on the path)
        await writer.drain()
        got = b""
        async with asyncio.timeout(5):
            while got.count(b"HTTP/1.1 200") < 3:
                more = await reader.read(65536)
                assert more
                got += more
    finally:
        writer.close()
    spans = await wait_spans(span_exporter, telemetry, 3)
    ids = [sp.attributes[Attr.REQUEST_ID] for sp in spans]
    assert len(set(ids)) == 3 and all(HEX32.fullmatch(i) for i in ids)
    sent = [dict((k.lower(), v) for k, v in h).get("x-request-id") for h in upstream.log.headers[-3:]]
    assert sorted(sent) == sorted(ids)


def test_head_made_ahead_is_the_definitions():
    raw = b"POST /v1/x HTTP/1.1\r\nHost: h\r\nTraceparent: 00-" + b"1" * 32 + b"-" + b"2" * 16 + b"-01\r\nX-A: b\r\n\r\n"
    for have_id in (False, True):
        head = parse_head(raw[:-2] + b"X-Request-Id: mine\r\n\r\n" if have_id else raw, True)
        span = begin({})
        assert span.trace_lines == hdrs.trace_lines(span.trace_headers)
        kw = dict(correlation_header=b"x-request-id", trace_headers=span.trace_headers)
        ahead = hdrs.rewrite_request_head(head, **kw, lines=span.trace_lines, request_id="f" * 32)
        fresh = hdrs.rewrite_request_head(head, **kw)
        assert ahead[2] == fresh[2] == (not have_id)
        if have_id:
            assert ahead == fresh and ahead[1] == "mine"
        else:
            assert ahead[1] == "f" * 32 and ahead[0] == fresh[0].replace(fresh[1].encode(), b"f" * 32)
    assert span.trace_lines == [(b"traceparent", span.trace_headers["traceparent"].encode())]  # (never changed by a use)
