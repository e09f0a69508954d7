"""The tap's span: events present, ordered, and timed against what a controlled upstream did."""

from __future__ import annotations

import json
import logging

import aiohttp
from opentelemetry.trace import SpanKind
from tap_helpers import event_times, wait_spans

from deltatap.core.clock import to_unix_ns
from deltatap.core.vocab import Attr, TapEvent, tap_span_name

MS = 1_000_000
CHAT = {"model": "m", "messages": [{"role": "user", "content": "a secret prompt"}], "max_tokens": 9, "stream": True}


async def stream_through(tap_url: str, query: str = "", headers: dict | None = None) -> bytes:
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{tap_url}/v1/chat/completions{query}", json=CHAT, headers=headers or {}) as r:
            assert r.status == 200
            return await r.read()


async def test_sse_span_events_ordered_and_timed(upstream, make_tap, span_exporter, telemetry):
    tap = await make_tap(upstream.url)
    body = await stream_through(tap.url, "?first_ms=50&gap_ms=5&n=5")
    assert body.count(b"data: ") == 8
    (span,) = await wait_spans(span_exporter, telemetry, 1)
    assert span.name == tap_span_name("fw-engine") and span.kind == SpanKind.SERVER
    ev = event_times(span)
    order = [
        TapEvent.REQUEST_RECEIVED,
        TapEvent.REQUEST_BODY_RECEIVED,
        TapEvent.REQUEST_FORWARDED,
        TapEvent.RESPONSE_HEADERS,
        TapEvent.RESPONSE_HEADERS_FORWARDED,
        TapEvent.FIRST_TOKEN_RECEIVED,
        TapEvent.FIRST_TOKEN_FORWARDED,
        TapEvent.LAST_TOKEN_RECEIVED,
        TapEvent.LAST_TOKEN_FORWARDED,
        TapEvent.RESPONSE_END,
    ]
    assert sorted(e.name for e in span.events) == sorted(str(e) for e in order)
    stamps = [e.timestamp for e in span.events]
    assert stamps == sorted(stamps)  # events are emitted in time order
    # causal order; (response.end may precede last_token.forwarded: the end can arrive while the
    # last token is still being written downstream)
    causal = order[:8] + [TapEvent.RESPONSE_END]
    assert all(ev[x] <= ev[y] for x, y in zip(causal, causal[1:]))
    assert ev[TapEvent.LAST_TOKEN_RECEIVED] <= ev[TapEvent.LAST_TOKEN_FORWARDED]
    # the upstream wrote its first content token 50 ms after its role-only head event: the tap's
    # "first token received" is within 2 ms of that write, and not before it
    tok = upstream.log.token_written[-1]
    first_written = to_unix_ns(tok[0])
    assert 0 <= ev[TapEvent.FIRST_TOKEN_RECEIVED] - first_written <= 2 * MS
    assert 0 <= ev[TapEvent.LAST_TOKEN_RECEIVED] - to_unix_ns(tok[-1]) <= 2 * MS
    assert 0 <= ev[TapEvent.RESPONSE_HEADERS] - to_unix_ns(upstream.log.head_written[-1]) <= 2 * MS
    assert ev[TapEvent.FIRST_TOKEN_RECEIVED] - ev[TapEvent.RESPONSE_HEADERS] >= 48 * MS
    a = span.attributes
    assert a[Attr.OBSERVER] == "tap" and a[Attr.LINK] == "fw-engine"
    assert (a[Attr.DOWNSTREAM], a[Attr.DOWNSTREAM_KIND], a[Attr.UPSTREAM], a[Attr.UPSTREAM_KIND]) == ("firewall", "firewall", "engine", "engine")
    assert a[Attr.STREAM_FORMAT] == "openai-chat" and a[Attr.STREAMING] is True
    assert a[Attr.EVENTS] == 8 and a[Attr.CONTENT_EVENTS] == 5
    assert a[Attr.GAP_COUNT] == 4 and 4 <= a[Attr.GAP_MEAN_MS] <= 30 and a[Attr.GAP_MAX_MS] >= a[Attr.GAP_MEAN_MS]
    assert a[Attr.GAP_P99_MS] == a[Attr.GAP_MAX_MS] and Attr.GAP_FWD_P99_MS in a
    assert a[Attr.OVERHEAD_FIRST_TOKEN_NS] == ev[TapEvent.FIRST_TOKEN_FORWARDED] - ev[TapEvent.FIRST_TOKEN_RECEIVED]
    assert a[Attr.OVERHEAD_REQUEST_NS] == ev[TapEvent.REQUEST_FORWARDED] - ev[TapEvent.REQUEST_BODY_RECEIVED]
    assert a[Attr.GENAI_REQUEST_MODEL] == "m" and a[Attr.GENAI_RESPONSE_MODEL] == "m"
    assert a[Attr.GENAI_REQUEST_MAX_TOKENS] == 9 and a[Attr.GENAI_OPERATION] == "chat"
    assert a[Attr.GENAI_INPUT_TOKENS] == 7 and a[Attr.GENAI_OUTPUT_TOKENS] == 5
    assert a[Attr.OUTCOME] == "ok" and a[Attr.HTTP_STATUS] == 200
    assert len(a[Attr.BODY_FINGERPRINT]) == 32 and a[Attr.BODY_BYTES_IN] == len(json.dumps(CHAT))
    assert span.end_time >= ev[TapEvent.RESPONSE_END]


async def test_trace_context_and_correlation_header(upstream, make_tap, span_exporter, telemetry):
    tap = await make_tap(upstream.url)
    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    await stream_through(tap.url, "?first_ms=1&n=1", headers={"traceparent": parent, "x-request-id": "req-42"})
    (span,) = await wait_spans(span_exporter, telemetry, 1)
    ctx = span.get_span_context()
    assert format(ctx.trace_id, "032x") == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert format(span.parent.span_id, "016x") == "00f067aa0ba902b7"
    sent = dict((k.lower(), v) for k, v in upstream.log.headers[-1])
    assert sent["traceparent"] == f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-01"  # child of the tap's span
    assert sent["x-request-id"] == "req-42" and span.attributes[Attr.REQUEST_ID] == "req-42"


async def test_unsampled_parent_is_recorded_by_default_and_flag_propagates(upstream, make_tap, span_exporter, telemetry):
    tap = await make_tap(upstream.url)
    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"  # not sampled (as Envoy may send)
    await stream_through(tap.url, "?first_ms=1&n=1", headers={"traceparent": parent})
    (span,) = await wait_spans(span_exporter, telemetry, 1)
    assert format(span.get_span_context().trace_id, "032x") == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert TapEvent.FIRST_TOKEN_RECEIVED in {e.name for e in span.events}
    sent = dict((k.lower(), v) for k, v in upstream.log.headers[-1])
    assert sent["traceparent"].endswith("-00")  # the upstream's sampling decision is left as it was


async def test_respect_sampling_records_no_span_for_unsampled_parent(upstream, make_tap, span_exporter, telemetry):
    tap = await make_tap(upstream.url, respect_sampling=True)
    unsampled = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"
    sampled = "00-5bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    await stream_through(tap.url, "?first_ms=1&n=1", headers={"traceparent": unsampled})
    await stream_through(tap.url, "?first_ms=1&n=1", headers={"traceparent": sampled})
    (span,) = await wait_spans(span_exporter, telemetry, 1)
    assert format(span.get_span_context().trace_id, "032x") == "5bf92f3577b34da6a3ce929d0e0e4736"
    telemetry.processor.force_flush(2000)
    assert len(span_exporter.get_finished_spans()) == 1


async def test_custom_correlation_header_created(upstream, make_tap, span_exporter, telemetry):
    tap = await make_tap(upstream.url, correlation_header="x-corr")
    await stream_through(tap.url, "?first_ms=1&n=1")
    (span,) = await wait_spans(span_exporter, telemetry, 1)
    sent = dict((k.lower(), v) for k, v in upstream.log.headers[-1])
    assert sent["x-corr"] == span.attributes[Attr.REQUEST_ID] and len(sent["x-corr"]) == 32
    assert span.attributes[Attr.CORRELATION_HEADER] == "x-corr"


async def test_privacy_no_prompt_completion_or_secrets_in_spans(upstream, make_tap, span_exporter, telemetry):
    tap = await make_tap(upstream.url)
    await stream_through(tap.url, "?first_ms=1&n=3", headers={"Authorization": "Bearer sk-live-SECRET", "x-api-key": "KEY-SECRET"})
    (span,) = await wait_spans(span_exporter, telemetry, 1)
    dump = json.dumps({"a": dict(span.attributes), "e": [[e.name, dict(e.attributes or {})] for e in span.events]}, default=str)
    for needle in ("secret prompt", "t0", "t1", "SECRET", "Bearer"):
        assert needle not in dump


async def test_non_streaming_json_usage_and_span(upstream, make_tap, span_exporter, telemetry):
    tap = await make_tap(upstream.url)
    async with aiohttp.ClientSession() as s, s.post(tap.url + "/slow?s=0.01", json={"model": "m"}) as r:
        assert (await r.json())["usage"]["completion_tokens"] == 4
    (span,) = await wait_spans(span_exporter, telemetry, 1)
    a = span.attributes
    assert a[Attr.STREAMING] is False and a[Attr.STREAM_FORMAT] == "none"
    assert a[Attr.GENAI_INPUT_TOKENS] == 3 and a[Attr.GENAI_OUTPUT_TOKENS] == 4
    names = [e.name for e in span.events]
    assert TapEvent.FIRST_TOKEN_RECEIVED not in names and TapEvent.RESPONSE_END in names


async def test_metrics_and_healthz(upstream, make_tap, span_exporter, telemetry):
    tap = await make_tap(upstream.url)
    await stream_through(tap.url, "?first_ms=1&n=2")
    await wait_spans(span_exporter, telemetry, 1)
    async with aiohttp.ClientSession() as s:
        async with s.get(tap.admin_url + "/healthz") as r:
            assert r.status == 200 and (await r.json())["status"] == "ok"
        async with s.get(tap.admin_url + "/metrics") as r:
            text = await r.text()
    for name in (
        'deltatap_tap_requests_total{link="fw-engine",outcome="ok"} 1.0',
        'deltatap_tap_in_flight{link="fw-engine"} 0.0',
        'deltatap_tap_overhead_request_seconds_count{link="fw-engine"} 1.0',
        'deltatap_tap_overhead_first_token_seconds_count{link="fw-engine"} 1.0',
        'deltatap_tap_upstream_first_token_seconds_count{link="fw-engine"} 1.0',
        "deltatap_tap_spans_exported_total",
        "deltatap_process_read_lag_seconds_count",
        "deltatap_process_merged_reads_total",
        "deltatap_process_slow_sends_total",
        "deltatap_process_gc_pause_seconds_total",
        'deltatap_tap_spans_dropped_total{link="fw-engine",reason="queue_full"} 0.0',
    ):
        assert name in text, name


async def test_healthz_and_start_log_say_when_the_upstream_is_unreachable(make_tap, caplog):
    import socket

    with socket.socket() as s:  # a port nobody listens on: bound, never listening
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
        with caplog.at_level(logging.WARNING, logger="deltatap.tap"):
            tap = await make_tap(f"http://127.0.0.1:{dead}", admin_port=0)
        warned = [r.getMessage() for r in caplog.records if "not reachable" in r.getMessage()]
        assert len(warned) == 1 and f"127.0.0.1:{dead}" in warned[0] and "refused" in warned[0]
        async with aiohttp.ClientSession() as session:
            async with session.get(tap.admin_url + "/healthz") as r:
                doc = await r.json()
                assert r.status == 503 and doc["status"] == "upstream_unreachable" and "refused" in doc["upstream_problem"]
