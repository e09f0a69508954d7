"""One test per transparency defect issue 15 lists: each exchange is made directly against a raw upstream (the
harness's own check: the scripted bytes arrive as scripted) and through a tap to an identical raw upstream; what
the upstream received (less only the tap's ``traceparent``/``tracestate``/correlation lines:
:func:`exchanges.normalise`), what the client received and how its connection ended must match byte for byte.
"""

from __future__ import annotations

import asyncio
import gzip
from dataclasses import dataclass

import pytest
from exchanges import Run, first_difference, normalise
from raw_peer import End, Head, Pause, RawUpstream, Script, Send, raw_exchange, reply
from tap_helpers import wait_spans

from deltatap.core.vocab import Attr

pytestmark = pytest.mark.timeout(60)

OK_EMPTY = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"


def head(start: bytes, *fields: bytes) -> bytes:
    return start + b"\r\n" + b"".join(f + b"\r\n" for f in fields) + b"\r\n"


def chunked(body: bytes, size: int = 7, trailers: tuple[bytes, ...] = ()) -> bytes:
    out = b"".join(b"%x\r\n%s\r\n" % (len(body[i : i + size]), body[i : i + size]) for i in range(0, len(body), size))
    return out + b"0\r\n" + b"".join(t + b"\r\n" for t in trailers) + b"\r\n"


@dataclass
class Rig:
    direct: RawUpstream
    behind: RawUpstream
    port: int  # the tap's
    correlation: str

    async def run(self, upstream: RawUpstream, port: int, pieces: list[bytes], script: Script, *, end: str,
                  response_len: int, shut_wr: bool, settle_s: float) -> Run:
        mark = upstream.expect(script)
        got = await raw_exchange(port, pieces, pause_s=0.005, shut_wr=shut_wr, expect=response_len if end == "open" else None,
                                 settle_s=settle_s, timeout_s=3.0)
        return Run(normalise(upstream.since(mark), self.correlation), got.received, got.end)

    async def check(self, request: bytes | list[bytes], script: Script, *, end: str | None = None, shut_wr: bool = False) -> Run:
        """Run the exchange directly and through the tap; both must deliver exactly what was sent and scripted.
        ``end``: how the client's connection must end (default: from the script's end: ``open`` if it keeps the connection, ``rst`` if it resets it,
        else ``fin``)."""
        pieces = request if isinstance(request, list) else [request]
        sent = b"".join(pieces)
        response = b"".join(s.data for s in script if isinstance(s, Send))
        last = script[-1]
        how = last.how if isinstance(last, End) else "keep"
        end = end or {"keep": "open", "rst": "rst"}.get(how, "fin")
        kw = dict(end=end, response_len=len(response), shut_wr=shut_wr)
        direct = await self.run(self.direct, self.direct.port, pieces, script, settle_s=0.0, **kw)
        assert direct == Run(sent, response, end), "the harness itself: the direct exchange is not as scripted"
        tapped = await self.run(self.behind, self.port, pieces, script, settle_s=0.05, **kw)
        assert tapped.upstream == sent, "upstream received " + first_difference(sent, tapped.upstream)
        assert tapped.client == response, "client received " + first_difference(response, tapped.client)
        assert tapped.end == end, f"client connection ended {tapped.end}, directly {end}"
        return tapped


@pytest.fixture
async def rig(make_tap):
    direct, behind = await RawUpstream().start(), await RawUpstream().start()
    tap = await make_tap(behind.url, link="edge", admin_port=None)
    yield Rig(direct, behind, tap.port, tap.tap.o.correlation_header)
    await direct.close()
    await behind.close()


# ---- Content-Encoding: the request body is bytes to relay, never decoded ------------------------------------
async def test_gzip_request_with_content_length_reaches_upstream_compressed(rig):
    body = gzip.compress(b'{"model": "m", "prompt": "' + b"hello " * 200 + b'"}', mtime=0)
    req = head(b"POST /v1/completions HTTP/1.1", b"Host: t", b"Content-Type: application/json", b"Content-Encoding: gzip",
               b"Content-Length: %d" % len(body)) + body
    await rig.check(req, reply(OK_EMPTY, body=len(body)))


async def test_gzip_request_chunked_reaches_upstream_compressed(rig):
    body = chunked(gzip.compress(b"x" * 5000 + b"tail", mtime=0), size=50)
    req = head(b"POST /v1/completions HTTP/1.1", b"Host: t", b"Content-Encoding: gzip", b"Transfer-Encoding: chunked") + body
    await rig.check(req, reply(OK_EMPTY, body=len(body)))


async def test_invalid_gzip_request_passed_through(rig):
    body = b"this is not gzip \x1f\x8b at all"
    req = head(b"POST /upload HTTP/1.1", b"Host: t", b"Content-Encoding: gzip", b"Content-Length: %d" % len(body)) + body
    await rig.check(req, reply(head(b"HTTP/1.1 415 Unsupported Media Type", b"Content-Length: 3") + b"bad", body=len(body)))


# ---- header fields: names, values, duplicates, sizes --------------------------------------------------------
async def test_duplicate_headers_differing_in_case_kept(rig):
    req = head(b"GET /t HTTP/1.1", b"Host: t", b"X-Tenant: a", b"x-tenant: b", b"X-TENANT: c")
    resp = head(b"HTTP/1.1 200 OK", b"X-Shard: 1", b"x-shard: 2", b"Content-Length: 0")
    await rig.check(req, reply(resp))


async def test_obs_text_in_request_header_kept(rig):
    req = head(b"POST /files HTTP/1.1", b"Host: t", b'Content-Disposition: attachment; filename="r\xe9sum\xe9.pdf"',
               b"X-Raw: \x80\xff\xc3\xa9", b"Content-Length: 0")
    await rig.check(req, reply(OK_EMPTY))


async def test_obs_text_in_response_header_kept(rig):
    resp = head(b"HTTP/1.1 200 OK", b'Content-Disposition: attachment; filename="r\xe9sum\xe9.pdf"', b"X-Raw: \x80\xff",
                b"Content-Length: 2") + b"ok"
    await rig.check(head(b"GET /files/1 HTTP/1.1", b"Host: t"), reply(resp))


@pytest.mark.parametrize("method", [b"FOO", b"X_CUSTOM", b"get"])
async def test_custom_and_lowercase_methods_forwarded(rig, method):
    await rig.check(head(method + b" /m HTTP/1.1", b"Host: t"), reply(head(b"HTTP/1.1 200 OK", b"Content-Length: 3") + b"yes"))


@pytest.mark.parametrize("name", [b"Content-Type", b"User-Agent", b"ETag"])
async def test_duplicate_singleton_request_headers_kept(rig, name):
    req = head(b"POST /d HTTP/1.1", b"Host: t", name + b": one", name + b": two", b"Content-Length: 2") + b"{}"
    await rig.check(req, reply(OK_EMPTY, body=2))


@pytest.mark.parametrize("name", [b"ETag", b"Content-Type"])
async def test_duplicate_singleton_response_headers_kept(rig, name):
    resp = head(b"HTTP/1.1 200 OK", name + b': "a"', name + b': "b"', b"Content-Length: 0")
    await rig.check(head(b"GET /d HTTP/1.1", b"Host: t"), reply(resp))


@pytest.mark.parametrize("side", ["request", "response"])
async def test_header_line_over_8190_bytes(rig, side):
    long = b"X-Long: " + b"v" * 9000
    req = head(b"GET /long HTTP/1.1", b"Host: t", *([long] if side == "request" else []))
    resp = head(b"HTTP/1.1 200 OK", *([long] if side == "response" else []), b"Content-Length: 0")
    await rig.check(req, reply(resp))


@pytest.mark.parametrize("side", ["request", "response"])
async def test_more_than_128_headers(rig, side):
    many = [b"X-H%d: %d" % (i, i) for i in range(150)]
    req = head(b"GET /many HTTP/1.1", b"Host: t", *(many if side == "request" else []))
    resp = head(b"HTTP/1.1 200 OK", *(many if side == "response" else []), b"Content-Length: 0")
    await rig.check(req, reply(resp))


# ---- the request line -------------------------------------------------------------------------------------
async def test_absolute_form_target_kept(rig):
    req = head(b"GET http://engine.internal:8000/v1/models?x=1 HTTP/1.1", b"Host: engine.internal:8000")
    await rig.check(req, reply(head(b"HTTP/1.1 200 OK", b"Content-Length: 2") + b"[]"))


@pytest.mark.parametrize("target", [b"/search?", b"/doc#section-2", b"/a?b=1#frag"])
async def test_empty_query_and_fragment_kept(rig, target):
    await rig.check(head(b"GET " + target + b" HTTP/1.1", b"Host: t"), reply(OK_EMPTY))


# ---- order, case, framing headers ---------------------------------------------------------------------------
async def test_host_header_not_moved(rig):
    req = head(b"GET /h HTTP/1.1", b"Accept: */*", b"X-A: 1", b"Host: t")
    await rig.check(req, reply(OK_EMPTY))


async def test_header_names_not_recased(rig):
    req = head(b"POST /c HTTP/1.1", b"host: t", b"content-type: application/json", b"USER-AGENT: ua", b"accept: */*",
               b"content-length: 2") + b"{}"
    resp = head(b"HTTP/1.1 200 OK", b"content-type: text/plain", b"SERVER: s", b"content-length: 2") + b"ok"
    await rig.check(req, reply(resp, body=2))


@pytest.mark.parametrize("method", [b"POST", b"PUT", b"PATCH"])
async def test_no_content_length_added_to_bodyless_request(rig, method):
    await rig.check(head(method + b" /nobody HTTP/1.1", b"Host: t", b"X-After: 1"), reply(OK_EMPTY))


async def test_transfer_encoding_untouched(rig):
    body = chunked(b"abcdefghij" * 10)
    req = head(b"POST /te HTTP/1.1", b"Host: t", b"transfer-encoding: chunked", b"X-After: 1") + body
    resp = head(b"HTTP/1.1 200 OK", b"X-Before: 1", b"TRANSFER-ENCODING: chunked", b"X-After: 2") + chunked(b"0123456789" * 5)
    await rig.check(req, reply(resp, body=len(body)))


async def test_304_keeps_content_length(rig):
    resp = head(b"HTTP/1.1 304 Not Modified", b'ETag: "v1"', b"Content-Length: 1234")
    await rig.check(head(b"GET /cached HTTP/1.1", b"Host: t", b'If-None-Match: "v1"'), reply(resp))


async def test_head_response_keeps_transfer_encoding(rig):
    resp = head(b"HTTP/1.1 200 OK", b"Content-Type: text/event-stream", b"Transfer-Encoding: chunked")
    await rig.check(head(b"HEAD /stream HTTP/1.1", b"Host: t"), reply(resp))


# ---- interim responses, trailers, connection endings ------------------------------------------------------------
async def test_expect_100_continue_decided_by_upstream(rig):
    """The upstream refuses before the body: the client, which waits for a 100 before sending it, gets the 417 (and
    no 100 from the tap), and the upstream got the head with its Expect."""
    req = head(b"POST /upload HTTP/1.1", b"Host: t", b"Content-Length: 5", b"Expect: 100-continue")
    resp = head(b"HTTP/1.1 417 Expectation Failed", b"Content-Length: 0")
    await rig.check(req, [Head(), Send(resp), End("close")])


async def test_103_early_hints_relayed(rig):
    hints = head(b"HTTP/1.1 103 Early Hints", b"Link: </style.css>; rel=preload; as=style")
    final = head(b"HTTP/1.1 200 OK", b"Content-Length: 5") + b"hello"
    await rig.check(head(b"GET /page HTTP/1.1", b"Host: t"), [Head(), Send(hints), Pause(0.03), Send(final), End()])


async def test_trailers_relayed(rig):
    body = chunked(b"request body " * 20, trailers=(b"X-Request-Checksum: 42",))
    req = head(b"POST /t HTTP/1.1", b"Host: t", b"Transfer-Encoding: chunked", b"Trailer: X-Request-Checksum") + body
    resp = head(b"HTTP/1.1 200 OK", b"Transfer-Encoding: chunked", b"Trailer: Grpc-Status") + chunked(
        b"response body " * 20, trailers=(b"Grpc-Status: 0", b"Server-Timing: total;dur=12"))
    await rig.check(req, reply(resp, body=len(body)))


async def test_close_delimited_body_not_reframed(rig):
    resp_head = head(b"HTTP/1.1 200 OK", b"Content-Type: text/plain")
    await rig.check(head(b"GET /old HTTP/1.1", b"Host: t"),
                    reply(resp_head, b"first part, ", b"second part, ", b"last part", end="close", pause_s=0.02))


async def test_client_half_close_still_gets_full_response(rig):
    """The client sends its request and SHUT_WR: that is the end of its sending, not a cancel."""
    resp = head(b"HTTP/1.1 200 OK", b"Content-Length: 11") + b"hello world"
    await rig.check(head(b"GET /hc HTTP/1.1", b"Host: t"), [Head(), Pause(0.05), Send(resp), End("close")], shut_wr=True)


async def test_upstream_rst_reaches_client_as_rst(rig):
    partial = head(b"HTTP/1.1 200 OK", b"Content-Length: 100") + b"0123456789"
    run = await rig.check(head(b"GET /rst HTTP/1.1", b"Host: t"), [Head(), Send(partial), Pause(0.1), End("rst")])
    assert run.end == "rst"


async def test_websocket_echo_through_the_tap(make_tap):
    """``Upgrade: websocket`` → 101 from the upstream, then frames both ways relayed opaquely."""
    from websockets.asyncio.client import connect
    from websockets.asyncio.server import serve

    async def echo(ws):
        async for message in ws:
            await ws.send(message)

    async with serve(echo, "127.0.0.1", 0) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        tap = await make_tap(f"http://127.0.0.1:{port}", link="edge", admin_port=None)
        async with asyncio.timeout(10):
            async with connect(f"ws://127.0.0.1:{tap.port}/ws", open_timeout=5, close_timeout=2) as ws:
                for message in ["hello", b"\x00\x01binary\xff", "x" * 70000]:
                    await ws.send(message)
                    assert await ws.recv() == message


# ---- spans ----------------------------------------------------------------------------------------------------
async def test_every_exchange_yields_a_span(rig, span_exporter, telemetry):
    body = b'{"model":"m"}'
    cases = [
        (head(b"GET /v1/models HTTP/1.1", b"Host: t"), reply(head(b"HTTP/1.1 200 OK", b"Content-Length: 2") + b"[]"), b"GET", "/v1/models", 200),
        (head(b"POST /v1/chat/completions HTTP/1.1", b"Host: t", b"Content-Length: %d" % len(body)) + body,
         reply(head(b"HTTP/1.1 201 Created", b"Transfer-Encoding: chunked") + chunked(b"data: x\n\n", trailers=(b"X-T: 1",)),
               body=len(body)), b"POST", "/v1/chat/completions", 201),
        (head(b"FOO /custom HTTP/1.1", b"Host: t"), reply(head(b"HTTP/1.1 200 OK"), b"close-delimited", end="close"), b"FOO", "/custom", 200),
        (head(b"get /lower HTTP/1.1", b"Host: t"), reply(head(b"HTTP/1.1 404 Not Found", b"Content-Length: 0")), b"get", "/lower", 404),
        (head(b"HEAD /h HTTP/1.1", b"Host: t"), reply(head(b"HTTP/1.1 200 OK", b"Transfer-Encoding: chunked")), b"HEAD", "/h", 200),
        (head(b"GET /n HTTP/1.1", b"Host: t"), reply(head(b"HTTP/1.1 304 Not Modified", b"Content-Length: 9")), b"GET", "/n", 304),
        (head(b"PATCH /p HTTP/1.1", b"Host: t"), reply(head(b"HTTP/1.1 204 No Content")), b"PATCH", "/p", 204),
        (head(b"GET /hints HTTP/1.1", b"Host: t"),
         [Head(), Send(head(b"HTTP/1.1 103 Early Hints", b"Link: </a>")), Send(OK_EMPTY), End()], b"GET", "/hints", 200),
    ]
    want, failures = [], []
    for req, script, method, path, status in cases:
        want.append((method.decode(), path, status))
        try:
            await rig.check(req, script)
        except AssertionError as exc:  # the span must come whatever the bytes did; those have their own tests
            failures.append(f"{method.decode()} {path}: {str(exc).splitlines()[0]}")
    spans = await wait_spans(span_exporter, telemetry, len(cases))
    got = [(s.attributes.get(Attr.HTTP_METHOD), s.attributes.get(Attr.URL_PATH), s.attributes.get(Attr.HTTP_STATUS)) for s in spans]
    assert sorted(got, key=repr) == sorted(want, key=repr), f"spans differ; exchanges that also differed: {failures}"
