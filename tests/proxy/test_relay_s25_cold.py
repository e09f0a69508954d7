"""The span ids a connection's next request gets when its head brings no trace context, made ahead (after the previous
request's forward, or when the connection opens: relay.Downstream.spare) rather than on the request path: each request
still gets its own new trace (ids never reused), an incoming traceparent still makes the tap's span its child, and
what went upstream names each request's own span (session 25, "cold")."""

from __future__ import annotations

import aiohttp
from tap_helpers import wait_spans

from deltatap.core.vocab import Attr

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "stream": True}
PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


async def test_spare_span_ids_one_connection(upstream, make_tap, span_exporter, telemetry):
    tap = await make_tap(upstream.url)
    plan = [None, None, PARENT, None, PARENT, None]  # no context, context, ... on one keep-alive connection
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as s:
        for i, parent in enumerate(plan):
            headers = {"x-request-id": f"r{i}"} | ({"traceparent": parent} if parent else {})
            async with s.post(f"{tap.url}/v1/chat/completions?first_ms=1&n=1", json=CHAT, headers=headers) as r:
                assert r.status == 200
                await r.read()
        assert len(tap.tap.connections) == 1  # (one downstream connection carried them all)
    spans = {sp.attributes[Attr.REQUEST_ID]: sp for sp in await wait_spans(span_exporter, telemetry, len(plan))}
    sent = [dict((k.lower(), v) for k, v in h) for h in upstream.log.headers[-len(plan):]]
    trace_ids, span_ids = set(), set()
    for i, parent in enumerate(plan):
        sp = spans[f"r{i}"]
        ctx = sp.get_span_context()
        assert sent[i]["x-request-id"] == f"r{i}"
        assert sent[i]["traceparent"] == f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-01"  # the request's own span
        if parent:
            assert format(ctx.trace_id, "032x") == PARENT[3:35] and format(sp.parent.span_id, "016x") == PARENT[36:52]
        else:
            assert sp.parent is None
            trace_ids.add(ctx.trace_id)
        span_ids.add(ctx.span_id)
    assert len(trace_ids) == plan.count(None) and len(span_ids) == len(plan)  # (new ids each time, none reused)
