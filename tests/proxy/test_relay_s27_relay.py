"""What a connection's next exchange needs, made at the end of the exchange before it (relay.Downstream.spare,
spare_id, spare_obs; session 27 "relay"), not in the request's account that runs right after the response's first
read is forwarded: the next request still gets new ids, and its SSE response an observer of its own path (the format
hint), whatever path the exchange before it had."""

from __future__ import annotations

import asyncio
import re

from tap_helpers import wait_spans

from deltatap.core.fingerprint import fingerprint
from deltatap.core.sse import StreamObserver
from deltatap.core.vocab import Attr

# one event both openai formats accept: the path's hint decides which (chat: "b", completions: "a")
EVENT = b'data: {"choices":[{"index":0,"text":"a","delta":{"content":"b"}}]}\n\ndata: [DONE]\n\n'
RESP = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n%s" % (len(EVENT), EVENT)
HEX32 = re.compile(r"[0-9a-f]{32}")


async def _answer_each(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            n = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1)) if b"ontent-" in head else 0
            await reader.readexactly(n)
            writer.write(RESP)
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def test_spares_made_at_the_exchanges_end_and_the_observer_is_its_paths(make_tap, span_exporter, telemetry):
    server = await asyncio.start_server(_answer_each, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    tap = await make_tap(f"http://127.0.0.1:{port}")
    host, tport = tap.url.split("//")[1].split(":")
    paths = ["/v1/chat/completions", "/v1/chat/completions", "/v1/completions", "/v1/chat/completions",
             "/v1/completions", "/v1/completions"]
    reader, writer = await asyncio.open_connection(host, int(tport))
    made = []  # (the connection's spare observer after each exchange)
    try:
        for i, path in enumerate(paths):
            writer.write(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}" % path.encode())
            async with asyncio.timeout(5):
                got = b""
                while not got.endswith(EVENT):
                    more = await reader.read(65536)
                    assert more
                    got += more
                (d,) = tap.tap.connections
                while d.exchanges:  # (the exchange's end runs after the client may have read its answer)
                    await asyncio.sleep(0.005)
            assert d.spare is not None and HEX32.fullmatch(d.spare_id)
            assert d.spare_obs is not None and d.spare_obs[0] == path and type(d.spare_obs[1]) is StreamObserver
            assert d.spare_obs[1].events == 0 and d.spare_obs[1].format is None  # (untouched until a response takes it)
            made.append(d.spare_obs[1])
    finally:
        writer.close()
        server.close()
    # taken by the next response on the same path (a new spare made at its end), kept aside for another path
    assert [made[i] is made[i - 1] for i in range(1, len(paths))] == [False] * (len(paths) - 1)
    spans = await wait_spans(span_exporter, telemetry, len(paths))
    assert len(spans) == len(paths)
    by_id = sorted(spans, key=lambda sp: sp.start_time)
    want = ["openai-chat" if "chat" in p else "openai-completions" for p in paths]
    assert [sp.attributes[Attr.STREAM_FORMAT] for sp in by_id] == want
    assert all(any(e.name == "first_token.received" for e in sp.events) for sp in by_id)  # (its content token seen)
    ids = [sp.attributes[Attr.REQUEST_ID] for sp in by_id]
    assert len(set(ids)) == len(ids) and all(HEX32.fullmatch(x) for x in ids)


async def test_body_fingerprint_from_the_capture_or_as_it_comes(upstream, make_tap, span_exporter, telemetry):
    """The request body's fingerprint (relay.Exchange.fp), hashed from the capture at the exchange's end while the capture
    holds the whole body, and chunk by chunk once a body outgrows --max-capture-bytes (the bytes before that point from
    the capture): the same keyed hash of the whole body either way, bodies sent in several writes."""
    tap = await make_tap(upstream.url, max_capture_bytes=100)
    host, port = tap.url.split("//")[1].split(":")
    bodies = [b"", b"x" * 7, bytes(range(256)) * 2, b"y" * 100, b"z" * 101, bytes(range(251)) * 40]
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        for i, body in enumerate(bodies):
            writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nX-Length: 1\r\nX-Request-Id: fp-%d\r\nContent-Length: %d\r\n\r\n" % (i, len(body)))
            for k in range(0, len(body), 90):  # (several reads where the tap reads them apart)
                await writer.drain()
                await asyncio.sleep(0.002)
                writer.write(body[k : k + 90])
            await writer.drain()
            async with asyncio.timeout(5):
                head = await reader.readuntil(b"\r\n\r\n")
                n = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))
                await reader.readexactly(n)
    finally:
        writer.close()
    spans = {sp.attributes[Attr.REQUEST_ID]: sp for sp in await wait_spans(span_exporter, telemetry, len(bodies))}
    for i, body in enumerate(bodies):
        a = spans[f"fp-{i}"].attributes
        assert a.get(Attr.BODY_FINGERPRINT) == fingerprint(body, tap.tap.fp_key), i
        assert a[Attr.BODY_BYTES_IN] == len(body)
