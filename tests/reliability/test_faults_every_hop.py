"""Toxiproxy-style faults on both hops of a tap, each compared with the same fault and no tap.

For every fault (tests/reliability/toxic.py) the same streamed chat request is sent three ways:

* ``direct``:      client → toxic → engine
* ``upstream``:    client → tap → toxic → engine      (the fault between the tap and its upstream)
* ``downstream``:  client → toxic → tap → engine      (the fault between the client and the tap)

and the two tapped runs must give the client what the direct run gave it (status, body bytes, how the
connection ended) and the engine what it got directly (request body, whether it finished, whether it saw its
client go away), with no exception: an upstream that resets or closes before any response byte reaches the client
as that reset or close (docs/tap.md "Failures"). The tap's span must name what it saw of the fault
(``deltatap.outcome``, ``error.type``, its failure event).
"""

from __future__ import annotations

import asyncio

import pytest
from rel_support import chat_body, record_figures, settle
from rel_engine import Got, raw_request
from toxic import Toxic, ToxicProxy

from deltatap.core.vocab import Attr, Outcome, TapEvent
from deltatap.proxy import TapOptions, start_tap

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(60)]

PATH = "/v1/chat/completions?n=20&gap_ms=20"  # a 400 ms stream of ~110-byte events
PATIENCE_S = 2.0  # the client's patience for one more byte (a half-open peer ends in 'stalled')

# name -> (toxic, expected span on the upstream placement, on the downstream placement).
# A span expectation is (outcome, error.type or None, failure event or None).
OK = (Outcome.OK, None, None)
CANCEL = (Outcome.CLIENT_CANCEL, None, TapEvent.DOWNSTREAM_CLOSED)
LOST = (TapEvent.UPSTREAM_CLOSED, TapEvent.UPSTREAM_ERROR)  # docs/tap.md: a reset is seen as either event
FAILURE_EVENTS = (TapEvent.UPSTREAM_CLOSED, TapEvent.UPSTREAM_ERROR, TapEvent.TIMEOUT, TapEvent.DOWNSTREAM_CLOSED)
FAULTS = {
    "latency_down": (Toxic("latency", "down", ms=30), OK, OK),
    "latency_up": (Toxic("latency", "up", ms=30), OK, OK),
    "bandwidth_down": (Toxic("bandwidth", "down", rate=8000), OK, OK),
    "slicer_down": (Toxic("slicer", "down", size=7, delay_ms=1), OK, OK),
    "slicer_up": (Toxic("slicer", "up", size=5, delay_ms=1), OK, OK),
    "timeout_mid_stream": (Toxic("timeout", "down", after=600, s=0.2), (Outcome.UPSTREAM_ERROR, "upstream_closed", TapEvent.UPSTREAM_CLOSED), CANCEL),
    "reset_mid_stream": (Toxic("reset", "down", after=600), (Outcome.UPSTREAM_ERROR, "upstream_reset", LOST), CANCEL),
    "reset_before_response": (Toxic("reset", "down", after=0), (Outcome.UPSTREAM_ERROR, "upstream_reset", LOST), CANCEL),
    "close_before_response": (Toxic("timeout", "down", after=0, s=0.05), (Outcome.UPSTREAM_ERROR, "upstream_closed", TapEvent.UPSTREAM_CLOSED), CANCEL),
    "slow_close": (Toxic("slow_close", "down", s=0.5), OK, OK),
    # downstream: the whole response fits the socket buffers of a peer that is gone without a FIN, so the tap (like the
    # engine directly) finished writing it: 'ok' is all it can know
    "half_open_mid_stream": (Toxic("half_open", "down", after=600), CANCEL, OK),
}


async def _tap_spans(telemetry, span_exporter, n: int = 1, timeout_s: float = 5.0):
    async def got():
        telemetry.processor.force_flush(2_000)
        return [s for s in span_exporter.get_finished_spans() if s.name.startswith("deltatap.tap")]

    deadline = asyncio.get_running_loop().time() + timeout_s
    spans = await got()
    while len(spans) < n and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.05)
        spans = await got()
    return spans


async def _run(engine, telemetry, span_exporter, toxic: Toxic, placement: str, body: bytes):
    """One exchange through ``placement``; returns (what the client got, what the engine saw, the tap span)."""
    engine.seen.clear()
    span_exporter.clear()
    closers = []
    try:
        if placement == "direct":
            proxy = await ToxicProxy("127.0.0.1", engine.port, [toxic]).start()
            closers.append(proxy.close)
            port = proxy.port
        elif placement == "upstream":
            proxy = await ToxicProxy("127.0.0.1", engine.port, [toxic]).start()
            closers.append(proxy.close)
            tap = await start_tap(TapOptions(link="fw-engine", upstream=proxy.url, admin_port=None), telemetry)
            closers.insert(0, lambda: tap.close(grace_s=0.5))
            port = tap.port
        else:
            tap = await start_tap(TapOptions(link="fw-engine", upstream=engine.url, admin_port=None), telemetry)
            closers.append(lambda: tap.close(grace_s=0.5))
            proxy = await ToxicProxy("127.0.0.1", tap.port, [toxic]).start()
            closers.insert(0, proxy.close)
            port = proxy.port
        got = await asyncio.wait_for(raw_request(port, PATH, body, patience_s=PATIENCE_S), 15)
        # the engine's handler ends (finished or cut) within a bounded time; a half-open peer leaves it waiting
        await settle(lambda: engine.seen and (engine.seen[0].completed or engine.seen[0].saw_close), 2.0)
        seen = engine.seen[0] if engine.seen else None
        upstream_view = None if seen is None else (seen.path, seen.body, seen.completed, seen.saw_close)
        spans = []
        if placement != "direct":
            if toxic.kind == "half_open":
                if placement == "upstream":
                    # A peer gone without a FIN: the client's close (a FIN: it may be a half-close) is passed on and
                    # the tap waits for the upstream's end, as the direct path's toxic does, until the toxic goes.
                    await asyncio.sleep(0.3)
                    assert not await _tap_spans(telemetry, span_exporter, 1, 0.0)
                await proxy.close()  # the toxic goes first: its sockets close (a FIN each way)
            spans = await _tap_spans(telemetry, span_exporter, 1, 5.0)
        return got, upstream_view, spans
    finally:
        for close in closers:
            await close()


def _summary(got: Got, upstream_view, spans) -> dict:
    """What each side saw, for the figures file."""
    out = {"client": {"status": got.status, "body_bytes": len(got.body), "end": got.end, "tail_s": round(got.tail_s, 3)},
           "engine": None if upstream_view is None else {"completed": upstream_view[2], "saw_close": upstream_view[3]}}
    if spans:
        a = spans[0].attributes
        out["span"] = {"outcome": a.get(Attr.OUTCOME), "error.type": a.get(Attr.ERROR_TYPE),
                       "failure_events": sorted({e.name for e in spans[0].events} & {str(e) for e in FAILURE_EVENTS})}
    return out


def _client_view(got: Got) -> tuple[int, bytes, str]:
    return got.status, got.body, got.end


@pytest.mark.parametrize("name", list(FAULTS))
async def test_fault_behaves_as_without_the_tap(engine, telemetry, span_exporter, name):
    toxic, span_up, span_down = FAULTS[name]
    body = chat_body()
    direct, direct_up, _ = await _run(engine, telemetry, span_exporter, toxic, "direct", body)
    assert direct_up is not None and direct_up[:2] == (PATH, body), f"{name}: the engine did not get the request directly: {direct_up}"
    seen = {"direct": _summary(direct, direct_up, [])}
    for placement, want_span in (("upstream", span_up), ("downstream", span_down)):
        got, upstream_view, spans = await _run(engine, telemetry, span_exporter, toxic, placement, body)
        seen[f"tap_{placement}"] = _summary(got, upstream_view, spans)
        record_figures("faults", {"toxic": {k: v for k, v in vars(toxic).items() if v}, **seen}, key=name)
        assert _client_view(got) == _client_view(direct), (
            f"{name} via the tap's {placement}: client saw {_client_view(got)[0::2]} ({len(got.body)} B), "
            f"directly {_client_view(direct)[0::2]} ({len(direct.body)} B)")
        if toxic.kind == "slow_close":  # the close came late, through the tap as directly
            assert direct.tail_s >= toxic.s * 0.8 and got.tail_s >= toxic.s * 0.8, (direct.tail_s, got.tail_s)
        assert upstream_view == direct_up, f"{name} via the tap's {placement}: engine saw {upstream_view}, directly {direct_up}"
        if want_span is None:
            continue
        assert len(spans) == 1, f"{name} via the tap's {placement}: {len(spans)} tap spans"
        attrs, events = spans[0].attributes, {e.name for e in spans[0].events}
        outcome, error_type, event = want_span
        assert attrs.get(Attr.OUTCOME) == outcome, f"{name} ({placement}): outcome {attrs.get(Attr.OUTCOME)}, error.type {attrs.get(Attr.ERROR_TYPE)}, events {sorted(events)}"
        assert attrs.get(Attr.ERROR_TYPE) == error_type, f"{name} ({placement}): error.type {attrs.get(Attr.ERROR_TYPE)}, events {sorted(events)}"
        if event is not None:
            assert set(event if isinstance(event, tuple) else (event,)) & events, f"{name} ({placement}): no {event} in {sorted(events)}"
