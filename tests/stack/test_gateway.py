"""The gateway over real loopback sockets: auth, rate limit, validation, routing, retries,
timeouts (also the draft's timeout cascade, scaled down) and its span against the client."""

from __future__ import annotations

import asyncio
import json
import statistics

import aiohttp
import pytest
from aiohttp import web

from deltatap.core.vocab import Attr, Outcome, Role, TapEvent, component_span_name

from deltatap.stack.engine.app import start_engine
from deltatap.stack.firewall.app import start_firewall
from deltatap.stack.gateway.app import start_gateway
from stack_helpers import MS, ScriptedUpstream, dead_url, chat, engine_cfg, events, firewall_cfg, flushed, gateway_cfg, post, spans_named, sse_answer, unix, wait_for

GW_SPAN = component_span_name("gateway")
URL = "/v1/chat/completions"


async def _ok(request, n):
    return await sse_answer(request, ["hi", " there"])


@pytest.fixture
async def upstream():
    up = await ScriptedUpstream(_ok).start()
    yield up
    await up.close()


async def _span(telemetry, exporter, rid=None, name=GW_SPAN):
    await flushed(telemetry)
    spans = [s for s in spans_named(exporter, name) if rid is None or s.attributes.get(Attr.REQUEST_ID) == rid]
    assert spans, f"no {name} span"
    return spans[-1]


async def test_auth(telemetry, span_exporter, session, upstream) -> None:
    gw = await start_gateway(gateway_cfg([upstream.url], auth={"enabled": True, "api_keys": ["k1", "k2"]}), telemetry, "127.0.0.1:0")
    try:
        none = await post(session, gw.url + URL, chat())
        wrong = await post(session, gw.url + URL, chat(), {"Authorization": "Bearer nope"})
        assert len(upstream.requests) == 0
        bearer = await post(session, gw.url + URL, chat(), {"Authorization": "Bearer k1"})
        header = await post(session, gw.url + URL, chat(), {"x-api-key": "k2"})
    finally:
        await gw.close()
    assert none.status == wrong.status == 401
    assert json.loads(none.body)["error"]["code"] == "invalid_api_key"
    assert bearer.status == header.status == 200 and len(upstream.requests) == 2
    # the key never travels into spans
    await flushed(telemetry)
    for s in spans_named(span_exporter, GW_SPAN):
        assert "k1" not in json.dumps(dict(s.attributes))


async def test_rate_limit_per_key(session, telemetry, upstream) -> None:
    cfg = gateway_cfg([upstream.url], rate_limit={"enabled": True, "requests_per_s": 1, "burst": 3, "per": "key"})
    gw = await start_gateway(cfg, telemetry, "127.0.0.1:0")
    try:
        a = [await post(session, gw.url + URL, chat(), {"x-api-key": "a"}) for _ in range(4)]
        b = await post(session, gw.url + URL, chat(), {"x-api-key": "b"})
    finally:
        await gw.close()
    assert [s.status for s in a] == [200, 200, 200, 429]
    assert a[3].headers["Retry-After"] == "1" and json.loads(a[3].body)["error"]["code"] == "rate_limit_exceeded"
    assert b.status == 200


async def test_validation(session, telemetry, upstream) -> None:
    cfg = gateway_cfg([upstream.url], validation={"max_body_bytes": 2000, "max_tokens_limit": 100})
    cfg.routes[0].model = "deltatap-*"
    gw = await start_gateway(cfg, telemetry, "127.0.0.1:0")
    try:
        cases = {
            "json": await post(session, gw.url + URL, b"{"),
            "messages": await post(session, gw.url + URL, {"model": "deltatap-ref"}),
            "max_tokens": await post(session, gw.url + URL, chat(max_tokens=101)),
            "route": await post(session, gw.url + URL, {**chat(), "model": "other"}),
            "size": await post(session, gw.url + URL, chat("x " * 2000)),
        }
    finally:
        await gw.close()
    assert {k: v.status for k, v in cases.items()} == {"json": 400, "messages": 400, "max_tokens": 400, "route": 404, "size": 413}
    assert b"messages" in cases["messages"].body and b"exceeds the limit 100" in cases["max_tokens"].body
    assert upstream.requests == []


async def test_round_robin_and_least_outstanding(session, telemetry) -> None:
    async def slow(request, n):
        return await sse_answer(request, ["slow"], before_s=0.4)

    ups = [await ScriptedUpstream(_ok).start(), await ScriptedUpstream(_ok).start()]
    gw = await start_gateway(gateway_cfg([u.url for u in ups]), telemetry, "127.0.0.1:0")
    try:
        for _ in range(4):
            assert (await post(session, gw.url + URL, chat())).status == 200
        assert [len(u.requests) for u in ups] == [2, 2]
    finally:
        await gw.close()
        for u in ups:
            await u.close()
    a, b = await ScriptedUpstream(slow).start(), await ScriptedUpstream(_ok).start()
    cfg = gateway_cfg([a.url, b.url])
    cfg.routes[0].policy = "least_outstanding"
    gw = await start_gateway(cfg, telemetry, "127.0.0.1:0")
    try:
        held = asyncio.create_task(post(session, gw.url + URL, chat()))
        await wait_for(lambda: len(a.requests) == 1, 3, "the slow upstream to hold a request")
        for _ in range(3):
            assert (await post(session, gw.url + URL, chat())).status == 200
        assert (await held).status == 200
        assert (len(a.requests), len(b.requests)) == (1, 3)
    finally:
        await gw.close()
        await a.close()
        await b.close()


async def test_retry_on_503_and_on_connect_error(telemetry, span_exporter, session) -> None:
    async def flaky(request, n):
        if n == 1:
            return web.json_response({"error": "busy"}, status=503)
        return await sse_answer(request, ["ok"])

    up = await ScriptedUpstream(flaky).start()
    gw = await start_gateway(gateway_cfg([up.url], retry={"max_retries": 1, "backoff_ms": 20}), telemetry, "127.0.0.1:0")
    try:
        seen = await post(session, gw.url + URL, chat(), {"x-request-id": "retry-1"})
    finally:
        await gw.close()
    assert seen.status == 200 and len(up.requests) == 2
    span = await _span(telemetry, span_exporter, "retry-1")
    assert span.attributes[Attr.ATTEMPT] == 2 and span.attributes[Attr.RETRIES] == 1
    # in.exit is the answering attempt's; the first attempt and the 20 ms backoff count as gateway time
    assert events(span)[Role.IN_EXIT] - events(span)[Role.IN_ARRIVE] >= 20 * MS
    no_retry = await start_gateway(gateway_cfg([up.url]), telemetry, "127.0.0.1:0")
    try:
        up.requests.clear()
        assert (await post(session, no_retry.url + URL, chat())).status == 503  # n == 1 again: passed through
    finally:
        await no_retry.close()
    dead = dead_url()
    gw = await start_gateway(gateway_cfg([dead, up.url], retry={"max_retries": 1, "backoff_ms": 1}), telemetry, "127.0.0.1:0")
    try:
        assert (await post(session, gw.url + URL, chat())).status == 200
        gw_once = await start_gateway(gateway_cfg([dead]), telemetry, "127.0.0.1:0")
        try:
            failed = await post(session, gw_once.url + URL, chat())
            assert failed.status == 502 and json.loads(failed.body)["error"]["code"] == "bad_gateway"
        finally:
            await gw_once.close()
    finally:
        await gw.close()
        await up.close()


async def test_timeout_retries_then_504_and_hangs_up(telemetry, span_exporter, session) -> None:
    async def stuck(request, n):
        return await sse_answer(request, ["late"], before_s=3.0)

    up = await ScriptedUpstream(stuck).start()
    cfg = gateway_cfg([up.url], upstream_policy={"timeout_s": 0.1}, retry={"max_retries": 1, "backoff_ms": 10})
    gw = await start_gateway(cfg, telemetry, "127.0.0.1:0")
    try:
        seen = await post(session, gw.url + URL, chat(), {"x-request-id": "to-1"})
        await wait_for(lambda: up.disconnects == 2, 3, "both attempts to be hung up")
    finally:
        await gw.close()
        await up.close()
    assert seen.status == 504 and len(up.requests) == 2
    assert 0.2 <= (seen.headers_mono - seen.sent_mono) / 1e9 < 1.0
    span = await _span(telemetry, span_exporter, "to-1")
    assert span.attributes[Attr.OUTCOME] == Outcome.TIMEOUT and span.attributes[Attr.TIMEOUT_S] == 0.1
    assert TapEvent.TIMEOUT in events(span)


async def test_timeout_mid_stream_cuts_the_stream(telemetry, span_exporter) -> None:
    async def partial(request, n):
        from deltatap.stack.openai import ChatRenderer

        r = ChatRenderer("x", "deltatap-ref")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(r.start() + r.token("first"))
        await asyncio.sleep(3)
        return resp

    up = await ScriptedUpstream(partial).start()
    gw = await start_gateway(gateway_cfg([up.url], upstream_policy={"timeout_s": 0.15}), telemetry, "127.0.0.1:0")
    got = b""
    try:
        async with aiohttp.ClientSession() as s:
            with pytest.raises(aiohttp.ClientPayloadError):
                async with s.post(gw.url + URL, json=chat(), headers={"x-request-id": "cut"}) as resp:
                    assert resp.status == 200
                    async for chunk in resp.content.iter_any():
                        got += chunk
        await wait_for(lambda: up.disconnects == 1, 3, "upstream hang-up")
    finally:
        await gw.close()
        await up.close()
    assert b'"content":"first"' in got and b"[DONE]" not in got
    span = await _span(telemetry, span_exporter, "cut")
    assert span.attributes[Attr.OUTCOME] == Outcome.TIMEOUT
    assert Role.OUT_FIRST_OUT in events(span)


@pytest.mark.parametrize("firewall_cancels", [False, True])
async def test_timeout_cascade(telemetry, span_exporter, session, firewall_cancels) -> None:
    """The draft's 10 s / 15 s / 30 s cascade scaled down: the gateway gives up at 0.3 s, the
    engine (cancel_on_disconnect: false) generates to the end anyway."""
    engine = await start_engine(engine_cfg(cancel_on_disconnect=False, scheduler={"decode_base_ms": 10.0}), telemetry, "127.0.0.1:0")
    fw = await start_firewall(
        firewall_cfg(engine.url, upstream_policy={"timeout_s": 0.45, "cancel_on_disconnect": firewall_cancels}, outbound={"enabled": False}),
        telemetry,
        "127.0.0.1:0",
    )
    gw = await start_gateway(gateway_cfg([fw.url], upstream_policy={"timeout_s": 0.3}), telemetry, "127.0.0.1:0")
    try:
        seen = await post(session, gw.url + URL, chat("long answer please", 60, stream=False), {"x-request-id": "cascade"})
        state = engine.extra["state"]
        await wait_for(lambda: state.scheduler.stats.finished == 1, 5, "the engine to finish")
    finally:
        await gw.close()
        await fw.close()
        await engine.close()
    assert seen.status == 504 and 0.3 <= (seen.headers_mono - seen.sent_mono) / 1e9 < 1.0
    gw_span = await _span(telemetry, span_exporter, "cascade")
    eng = await _span(telemetry, span_exporter, "cascade", component_span_name("engine"))
    fw_span = await _span(telemetry, span_exporter, "cascade", component_span_name("firewall"))
    gave_up = events(gw_span)[TapEvent.TIMEOUT]
    assert eng.attributes[Attr.GENAI_OUTPUT_TOKENS] == 60
    assert eng.end_time - gave_up >= 0.2e9  # ~0.3 s of generation nobody will read
    assert TapEvent.DOWNSTREAM_CLOSED in events(fw_span)
    if firewall_cancels:
        assert eng.attributes[Attr.OUTCOME] == Outcome.CLIENT_CANCEL and eng.attributes[Attr.ENGINE_TOKENS_AFTER_DISCONNECT] > 10
    else:  # the firewall kept waiting (the draft's "still waiting"), then timed out itself at 0.45 s
        assert fw_span.attributes[Attr.OUTCOME] in (Outcome.TIMEOUT, Outcome.CLIENT_CANCEL)
        assert TapEvent.TIMEOUT in events(fw_span)


async def test_span_points_against_client_and_upstream(telemetry, span_exporter, session) -> None:
    async def respond(request, n):
        return await sse_answer(request, ["a", " b", " c"], gap_s=0.01)

    up = await ScriptedUpstream(respond).start()
    gw = await start_gateway(gateway_cfg([up.url], delays={"inbound": {"fixed_ms": 20}}), telemetry, "127.0.0.1:0")
    gaps = []
    try:
        for i in range(5):
            seen = await post(session, gw.url + URL, chat(), {"x-request-id": f"g{i}"} if i else {})
            rid = seen.headers["X-Request-ID"]
            span = await _span(telemetry, span_exporter, rid)
            ev = events(span)
            assert unix(seen.sent_mono) <= ev[Role.IN_ARRIVE] and ev[Role.IN_EXIT] <= unix(up.arrivals[i])
            assert 20 * MS <= ev[Role.IN_EXIT] - ev[Role.IN_ARRIVE] < 120 * MS  # the configured inbound delay
            assert ev[Role.OUT_FIRST_IN] <= ev[Role.OUT_FIRST_OUT] <= unix(seen.first_content_mono)
            assert ev[Role.OUT_LAST_OUT] <= unix(seen.obs.last_token_mono_ns)
            gaps.append(unix(seen.first_content_mono) - ev[Role.OUT_FIRST_OUT])
            hdrs = {k.lower(): v for k, v in up.requests[i][0].items()}
            assert hdrs["x-request-id"] == rid and hdrs["traceparent"].split("-")[2] == f"{span.context.span_id:016x}"
    finally:
        await gw.close()
        await up.close()
    assert statistics.median(gaps) < 2 * MS, gaps
