"""An HTTP/2 prior-knowledge client in front of an upstream that does not speak HTTP/2 (issue 15's transparency).

Raw upstreams on 127.0.0.1 answer HTTP/2's preface as an HTTP/1.1-only server would: a ``400`` then a close (FIN),
a close without answering, a reset. The same client bytes go to each directly and through the tap; the client must
get the same bytes and the same kind of close both ways (FIN as FIN, RST as RST), and nothing of the tap's own.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct

import h2.config
import h2.connection
import pytest
from h2_peer import H2Client, start_h2_peer
from tap_helpers import wait_spans

from deltatap.core.vocab import Attr

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
ANSWER_400 = b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\nContent-Length: 11\r\nConnection: close\r\n\r\nBad Request"


class Http1Only:
    """An upstream that reads a request head (HTTP/2's preface begins with one: ``PRI * HTTP/2.0``), then ``mode``:
    ``answer`` (a 400, then FIN), ``silent`` (FIN without answering), ``reset`` (RST without answering). After a FIN
    it reads on to the peer's close, as a graceful server does (its close is then a FIN, whatever the peer sent)."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.got: list[bytes] = []
        self.server: asyncio.AbstractServer | None = None
        self.port = 0

    async def start(self) -> Http1Only:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        buf = b""
        try:
            while b"\r\n\r\n" not in buf:
                chunk = await asyncio.wait_for(reader.read(65536), 5)
                if not chunk:
                    break
                buf += chunk
            self.got.append(buf)
            if self.mode == "reset":
                writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                writer.transport.abort()
                return
            if self.mode == "answer":
                writer.write(ANSWER_400)
            writer.write_eof()
            while await asyncio.wait_for(reader.read(65536), 5):
                pass
        except (OSError, TimeoutError):
            pass
        writer.close()

    async def close(self) -> None:
        self.server.close()
        await self.server.wait_closed()


def h2_client_bytes() -> bytes:
    """What an h2c prior-knowledge client sends at once: the preface, its SETTINGS, a request's HEADERS."""
    c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    c.initiate_connection()
    c.send_headers(1, [(":method", "GET"), (":path", "/v1/models"), (":scheme", "http"), (":authority", "engine")],
                   end_stream=True)
    return c.data_to_send()


async def exchange(port: int) -> tuple[bytes, str]:
    """Send :func:`h2_client_bytes`, read to the end: the bytes received and how the connection ended (fin, rst)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    got = b""
    try:
        writer.write(h2_client_bytes())
        while True:
            try:
                chunk = await asyncio.wait_for(reader.read(65536), 5)
            except ConnectionResetError:
                return got, "rst"
            if not chunk:
                return got, "fin"
            got += chunk
    finally:
        writer.close()


@pytest.mark.parametrize("mode, expect", [("answer", (ANSWER_400, "fin")), ("silent", (b"", "fin")), ("reset", (b"", "rst"))])
async def test_an_upstream_that_does_not_speak_http2_reaches_an_h2_client_as_directly(mode, expect, make_tap, span_exporter,
                                                                                       telemetry, caplog):
    up = await Http1Only(mode).start()
    try:
        direct = await exchange(up.port)
        tap = await make_tap(f"http://127.0.0.1:{up.port}")
        with caplog.at_level(logging.WARNING, logger="deltatap.tap"):
            through = await exchange(tap.port)
            again = await exchange(tap.port)
    finally:
        await up.close()
    assert direct == through == again == expect  # the bytes, and FIN as FIN, RST as RST; nothing of the tap's own
    sent = [g for g in up.got if g]  # (the tap's start-up reachability probe connects and sends nothing)
    assert len(sent) == 3 and all(g.startswith(PREFACE) for g in sent)  # (each connection began with HTTP/2's preface)
    assert tap.tap.counters.upstream_not_http2 == 2
    warned = [r for r in caplog.records if "does not speak HTTP/2" in r.getMessage()]
    assert len(warned) == 1 and "127.0.0.1" in warned[0].getMessage()  # once (then every 1000th)
    # the first connection through the tap went over HTTP/2 (the upstream read the tap's own frames); once the
    # upstream answered in something else, the next one passes unparsed from its first byte: the client's own bytes
    relayed = 1 if mode == "answer" else 2
    assert (sent[2] == sent[0]) == (mode == "answer") and sent[1] != sent[0]
    spans = await wait_spans(span_exporter, telemetry, relayed)
    cause = {"answer": "upstream_not_h2", "silent": "upstream_closed", "reset": "upstream_reset"}[mode]
    assert len(spans) == relayed and all(s.attributes[Attr.ERROR_TYPE] == cause and s.attributes[Attr.OUTCOME] == "upstream_error"
                                         for s in spans)
    assert tap.tap.counters.upstream_errors == {cause: relayed}


async def test_an_answer_split_before_it_tells_and_the_clients_bytes_after_it_pass_as_they_are(make_tap):
    """An upstream whose first read holds fewer bytes than tell HTTP/2's SETTINGS from anything else (3 bytes), then
    the rest: what it sent, all of it, in order; the client's bytes sent after the answer reach the upstream as they
    are (the upstream then answers once more and closes)."""
    seen: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        buf = b""
        while b"\r\n\r\n" not in buf:
            buf += await asyncio.wait_for(reader.read(65536), 5)
        writer.write(b"\0\0\x0c")  # (a SETTINGS frame's length, so far)
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(b"\x04\0\0\0\0\1-not-http/2")
        rest = b""
        while not rest.endswith(b"after the answer"):
            chunk = await asyncio.wait_for(reader.read(65536), 5)
            if not chunk:
                break
            rest += chunk
        seen.append(rest)
        writer.write(b"bye")
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]

    async def scenario(p: int) -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", p)
        try:
            writer.write(PREFACE)
            got = await asyncio.wait_for(reader.readexactly(20), 5)  # (all the answer: 3 + 17 bytes)
            writer.write(b"after the answer")
            return got + await asyncio.wait_for(reader.read(), 5)
        finally:
            writer.close()

    try:
        direct = await scenario(port)
        tap = await make_tap(f"http://127.0.0.1:{port}")
        through = await scenario(tap.port)
    finally:
        server.close()
        await server.wait_closed()
    assert direct == through == b"\0\0\x0c\x04\0\0\0\0\1-not-http/2bye"
    assert seen[0] == b"after the answer"
    assert seen[1].endswith(b"after the answer")  # (after the tap's own HTTP/2 bytes, which the upstream read past)
    assert tap.tap.counters.upstream_not_http2 == 1


async def test_an_http2_upstream_is_still_relayed_and_its_settings_reach_the_client(make_tap):
    """The tap's own SETTINGS wait for the upstream's answer: an HTTP/2 upstream's connection still works, stream and
    all, and the client sees the tap's SETTINGS (the upstream's limits mirrored) before its response."""
    peer = await start_h2_peer(max_streams=7)
    try:
        tap = await make_tap(peer.url)
        c = await H2Client().connect("127.0.0.1", tap.port)
        try:
            r = await c.wait(c.request([(b":method", b"GET"), (b":path", b"/v1/chat/completions?first_ms=1&gap_ms=1&n=2"),
                                        (b":scheme", b"http"), (b":authority", b"x")]))
            assert r.status == 200 and r.data.endswith(b"data: [DONE]\n\n")
            assert c.conn.remote_settings.max_concurrent_streams == 7
        finally:
            await c.close()
        assert tap.tap.counters.upstream_not_http2 == 0
    finally:
        await peer.close()
