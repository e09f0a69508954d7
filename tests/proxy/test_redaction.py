"""What the tap's span may quote from the wire: ``url.query`` values are keyed hashes (an allow-list kept as sent),
and ``deltatap.error.cause`` never carries bytes a peer sent (a malformed status line, an oversized header)."""

from __future__ import annotations

import json

import aiohttp
import pytest
from raw_peer import RawUpstream, raw_exchange, reply
from tap_helpers import wait_spans

from deltatap.app.cli import build_parser
from deltatap.core.config import ConfigError
from deltatap.core.redact import hash_value
from deltatap.core.vocab import Attr
from deltatap.proxy.cli import build_options
from deltatap.proxy.errors import classify, connect_failure
from deltatap.proxy.record import TapRecord, attributes

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
SECRET = "SECRET-7f3a9"


def every_value(span) -> str:
    """All attribute and event-attribute values of a span, as one string to search."""
    vals = [str(v) for v in span.attributes.values()]
    for e in span.events:
        vals += [str(v) for v in (e.attributes or {}).values()]
    return "\n".join(vals)


async def test_query_values_are_hashed_in_the_span(upstream, make_tap, span_exporter, telemetry):
    tap = await make_tap(upstream.url, fingerprint_key="k1")
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{tap.url}/v1/chat/completions?first_ms=1&n=2&key={SECRET}&flag", json=CHAT) as r:
            assert r.status == 200
            await r.read()
    (span,) = await wait_spans(span_exporter, telemetry, 1)
    q = span.attributes[Attr.URL_QUERY]
    assert SECRET not in every_value(span)
    keys = [p.partition("=")[0] for p in q.split("&")]
    assert keys == ["first_ms", "n", "key", "flag"]
    assert q.split("&")[2].partition("=")[2] in (hash_value(SECRET, "k1"), hash_value(SECRET))


async def test_query_keep_and_fingerprint_key_reach_the_span(upstream, make_tap, span_exporter, telemetry):
    tap = await make_tap(upstream.url, fingerprint_key="k1", query_keep=frozenset({"n"}))
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{tap.url}/v1/chat/completions?first_ms=1&n=2&key={SECRET}&flag", json=CHAT) as r:
            assert r.status == 200
            await r.read()
    (span,) = await wait_spans(span_exporter, telemetry, 1)
    assert span.attributes[Attr.URL_QUERY] == f"first_ms={hash_value('1', 'k1')}&n=2&key={hash_value(SECRET, 'k1')}&flag"


def test_attributes_keep_allow_listed_values_and_use_the_fingerprint_key():
    rec = TapRecord(received=0, method="GET", path="/v1/models", query=f"api_key={SECRET}&stream=true&n=2")
    common = dict(link="edge", downstream="client", downstream_kind="client", upstream="gateway", upstream_kind="gateway",
                  upstream_host="127.0.0.1", upstream_port=1, correlation_header="x-request-id", clock=None, labels={})
    a = attributes(rec, **common, query_keep=frozenset({"stream", "n"}), fingerprint_key="k2")
    assert a[Attr.URL_QUERY] == f"api_key={hash_value(SECRET, 'k2')}&stream=true&n=2"
    assert SECRET not in json.dumps(a, default=str)


def opts(*argv: str):
    return build_options(build_parser().parse_args(["tap", "--link", "edge", "--upstream", "http://127.0.0.1:1", *argv]))


def test_query_keep_flag():
    assert opts().query_keep == frozenset()
    assert opts("--query-keep", "stream", "--query-keep", "a,b").query_keep == frozenset({"stream", "a", "b"})
    with pytest.raises(ConfigError, match=r"^--query-keep: 'a=b' is not a query key"):
        opts("--query-keep", "a=b")


@pytest.mark.parametrize(
    "exc",
    [
        ValueError(f"invalid literal for int() with base 10: b'token={SECRET}'"),
        UnicodeDecodeError("utf-8", f"Set-Cookie: token={SECRET}\xff".encode("latin-1"), 25, 26, "invalid start byte"),
        RuntimeError(f"Invalid status line: b'HTTP/1.1 2OO {SECRET}'"),
    ],
)
def test_causes_never_quote_exception_messages(exc):
    for f in (classify(exc), connect_failure(exc)):
        assert SECRET not in f.cause and SECRET.encode() not in f.body("edge", "http://u")
        assert type(exc).__name__ in f.cause


def test_causes_keep_os_and_tls_reasons():
    assert classify(ConnectionRefusedError(111, "Connection refused")).cause == "ConnectionRefusedError: [Errno 111] Connection refused"
    import ssl

    assert "CERTIFICATE_VERIFY_FAILED" in classify(ssl.SSLError(1, "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed")).cause


@pytest.mark.parametrize("end", ["keep", "close"])
@pytest.mark.parametrize(
    "answer, why",
    [
        (f"HTTP/1.1 2OO {SECRET}\r\nContent-Length: 0\r\n\r\n".encode(), "invalid status line"),
        (f"XTTP/1.1 200 OK {SECRET}\r\n\r\n".encode(), "invalid status line"),
        (f"HTTP/1.1 200 OK\r\nSet-Cookie: token={SECRET}{'x' * (1 << 20)}\r\n\r\n".encode(), "the head is larger than the reader's limit"),
        (f"HTTP/1.1 200 OK\r\nSet-Cookie token={SECRET}\r\n\r\n".encode(), "header line without a name and colon"),
    ],
)
async def test_error_cause_names_a_bad_upstream_answer_without_quoting_it(make_tap, span_exporter, telemetry, answer, why, end):
    up = await RawUpstream().start()
    try:
        tap = await make_tap(up.url, admin_port=None)
        up.expect(reply(answer, end=end))
        res = await raw_exchange(tap.port, [b"GET /v1/models HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"], timeout_s=0.5)
        assert SECRET.encode() in res.received  # the client still gets what the upstream sent (passed on as it is)
        (span,) = await wait_spans(span_exporter, telemetry, 1)
    finally:
        await up.close()
    assert SECRET not in every_value(span)
    if end == "keep":  # (closed at once, the relay names the close instead: upstream_closed)
        assert span.attributes[Attr.ERROR_TYPE] == "upstream_bad_response"
        assert span.attributes[Attr.ERROR_CAUSE] == f"the upstream sent a response the tap cannot frame ({why})"
