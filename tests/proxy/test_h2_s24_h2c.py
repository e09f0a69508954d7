"""An HTTP/2 prior-knowledge client in front of an upstream that does not speak HTTP/2 (issue 15's transparency).

Raw upstreams on 127.0.0.1 answer HTTP/2's preface as an HTTP/1.1-only server would: a ``400`` then a close (FIN), a
close without answering, a reset (SO_LINGER 0), an answer in two writes; and the reference engine (aiohttp). The same
client goes to each directly and through the tap: it must get the same bytes and the same kind of close both ways
(FIN as FIN, RST as RST), nothing of the tap's own, and both of the tap's connections must end. Every wait is bounded
(a regression fails in seconds instead of hanging). Each runs on asyncio's loop and on uvloop (the CLI's).
"""

from __future__ import annotations

import ast
import asyncio
import logging
import re
import shutil
import socket
import struct

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import hyperframe.frame
import pytest
import uvloop
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from tap_helpers import wait_spans

from deltatap.core.vocab import Attr
from deltatap.net.pktstamp import tcp_counters
from deltatap.proxy import TapOptions, start_tap
from deltatap.telemetry.tracer import setup_telemetry

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
ANSWER_400 = b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\nContent-Length: 11\r\nConnection: close\r\n\r\nBad Request"
WAIT_S = 3.0  # the bound on every wait


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request):
    """Each case on asyncio's loop and on uvloop, the deltatap CLI's (deltatap.net.aio.run): the stamped transport's
    reads come from the loop's reader callbacks, and the loops differ in what they report of a close."""
    return uvloop.run if request.param == "uvloop" else asyncio.run


async def start(upstream_url: str, telemetry):
    return await start_tap(TapOptions(upstream=upstream_url, link="fw-engine"), telemetry)


class Http1Only:
    """An upstream that reads a request head (HTTP/2's preface begins with one: ``PRI * HTTP/2.0``), then ``mode``:
    ``answer`` (a 400, then FIN), ``silent`` (FIN without answering), ``reset`` (RST without answering). After a FIN
    it reads on to the peer's close, as a graceful server does. The tap's start-up probe connects and sends nothing:
    its connection ends at its close."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.got: list[bytes] = []
        self.segments: list[int] = []  # data segments each connection had brought when its request head was read
        self.server: asyncio.AbstractServer | None = None
        self.port = 0
        self.open = 0  # connections being served

    async def start(self) -> Http1Only:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.open += 1
        buf = b""
        try:
            while b"\r\n\r\n" not in buf:
                chunk = await asyncio.wait_for(reader.read(65536), WAIT_S)
                if not chunk:
                    return
                buf += chunk
            self.got.append(buf)
            self.segments.append(tcp_counters(writer.get_extra_info("socket"))[0])
            if self.mode == "reset":
                writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                writer.transport.abort()
                return
            if self.mode == "answer":
                writer.write(ANSWER_400)
            writer.write_eof()
            while await asyncio.wait_for(reader.read(65536), WAIT_S):
                pass
        except (OSError, TimeoutError):
            pass
        finally:
            self.open -= 1
            writer.close()

    async def close(self) -> None:
        self.server.close()
        await self.server.wait_closed()


def h2_client_bytes() -> bytes:
    """What an h2c prior-knowledge client sends at once: the preface, its SETTINGS, a request's HEADERS and DATA."""
    c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    c.initiate_connection()
    c.send_headers(1, [(":method", "POST"), (":path", "/v1/chat/completions"), (":scheme", "http"), (":authority", "engine"),
                       ("content-type", "application/json")])
    c.send_data(1, b'{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}', end_stream=True)
    return c.data_to_send()


async def exchange(port: int, half_close: bool = False) -> tuple[bytes, str]:
    """Send :func:`h2_client_bytes` (then a FIN with ``half_close``), read to the end: the bytes received and how the
    connection ended (fin, rst)."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), WAIT_S)
    got = b""
    try:
        writer.write(h2_client_bytes())
        if half_close:
            writer.write_eof()
        while True:
            try:
                chunk = await asyncio.wait_for(reader.read(65536), WAIT_S)
            except ConnectionResetError:
                return got, "rst"
            if not chunk:
                return got, "fin"
            got += chunk
    finally:
        writer.close()


async def settled(tap, up: Http1Only | None = None) -> None:
    """Both of the tap's connections of each pair ended (and the upstream's handlers with them), bounded."""
    deadline = asyncio.get_running_loop().time() + WAIT_S
    while tap.tap.connections or (up is not None and up.open):
        assert asyncio.get_running_loop().time() < deadline, (tap.tap.connections, up and up.open)
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("mode, half_close, expect", [
    ("answer", False, (ANSWER_400, "fin")),
    ("answer", True, (ANSWER_400, "fin")),  # (the client half-closes after its bytes: its FIN reaches the upstream)
    ("silent", False, (b"", "fin")),
    ("reset", False, (b"", "rst")),
])
def test_an_upstream_that_does_not_speak_http2_reaches_an_h2_client_as_directly(run, mode, half_close, expect, span_exporter,
                                                                                 telemetry, caplog):
    async def scenario():
        up = await Http1Only(mode).start()
        tap = None
        try:
            direct = await exchange(up.port, half_close)
            tap = await start(f"http://127.0.0.1:{up.port}", telemetry)
            with caplog.at_level(logging.WARNING, logger="deltatap.tap"):
                through = await exchange(tap.port, half_close)
                again = await exchange(tap.port, half_close)
            await settled(tap, up)
            return up, tap, direct, through, again, await wait_spans(span_exporter, telemetry, 2)
        finally:
            if tap is not None:
                await tap.close(grace_s=1)
            await up.close()

    up, tap, direct, through, again, spans = run(scenario())
    assert direct == through == again == expect  # the bytes, and FIN as FIN, RST as RST; nothing of the tap's own
    assert len(up.got) == 3 and all(g.startswith(PREFACE) for g in up.got)  # (each connection began with HTTP/2's preface)
    assert up.got[1] != up.got[0]  # (through the tap the upstream read the tap's own HTTP/2 frames: no shortcut)
    # the tap's preface left in one write with the client's request (as the client's own bytes, directly): a server
    # that answers what its first read holds and closes leaves nothing unread, and its close is a FIN, not a reset
    assert up.segments == [1, 1, 1]
    assert tap.tap.counters.upstream_not_http2 == 2
    warned = [r for r in caplog.records if "does not speak HTTP/2" in r.getMessage()]
    assert len(warned) == 1 and "127.0.0.1" in warned[0].getMessage()  # once (then every 1000th)
    cause = {"answer": "upstream_not_h2", "silent": "upstream_closed", "reset": "upstream_reset"}[mode]
    assert len(spans) == 2 and all(s.attributes[Attr.ERROR_TYPE] == cause and s.attributes[Attr.OUTCOME] == "upstream_error"
                                   for s in spans)
    assert tap.tap.counters.upstream_errors == {cause: 2}


def test_an_answer_split_before_it_tells_and_the_clients_bytes_after_it_pass_as_they_are(run, telemetry):
    """An upstream whose first write holds fewer bytes than tell HTTP/2's SETTINGS from anything else (3 bytes, then 6
    more that still could be one), then the rest: what it sent, all of it, in order; the client's bytes sent after the
    answer reach the upstream as they are (the upstream then answers once more and closes)."""
    seen: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            buf = b""
            while b"\r\n\r\n" not in buf:
                chunk = await asyncio.wait_for(reader.read(65536), WAIT_S)
                if not chunk:  # (the tap's start-up probe)
                    return
                buf += chunk
            writer.write(b"\0\0\x0c")  # (a SETTINGS frame's length, so far)
            await writer.drain()
            await asyncio.sleep(0.02)
            writer.write(b"\x04\0\0\0\0")  # (its type, flags and the first bytes of stream 0, still)
            await writer.drain()
            await asyncio.sleep(0.02)
            writer.write(b"\1-not-http/2")  # (stream 1: not HTTP/2's answer)
            rest = b""
            while not rest.endswith(b"after the answer"):
                chunk = await asyncio.wait_for(reader.read(65536), WAIT_S)
                if not chunk:
                    break
                rest += chunk
            seen.append(rest)
            writer.write(b"bye")
        except (OSError, TimeoutError):
            pass
        finally:
            writer.close()

    async def client(p: int) -> tuple[bytes, str]:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", p), WAIT_S)
        try:
            writer.write(PREFACE)
            got = await asyncio.wait_for(reader.readexactly(20), WAIT_S)  # (all the answer: 3 + 5 + 12 bytes)
            writer.write(b"after the answer")
            got += await asyncio.wait_for(reader.read(), WAIT_S)
            return got, "fin" if reader.at_eof() else "open"
        finally:
            writer.close()

    async def scenario():
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        tap = None
        try:
            direct = await client(port)
            tap = await start(f"http://127.0.0.1:{port}", telemetry)
            through = await client(tap.port)
            await settled(tap)
            return tap, direct, through
        finally:
            if tap is not None:
                await tap.close(grace_s=1)
            server.close()
            await server.wait_closed()

    tap, direct, through = run(scenario())
    assert direct == through == (b"\0\0\x0c\x04\0\0\0\0\1-not-http/2bye", "fin")
    assert seen == [b"after the answer"] * 2  # (through the tap, after its own frames: read with its preface)
    assert tap.tap.counters.upstream_not_http2 == 1


_ECHO = re.compile(rb"""(b'(?:[^'\\]|\\.)*'|b"(?:[^"\\]|\\.)*")""")  # (repr quotes with " where the bytes hold a ')


def engine_answer(got: bytes) -> tuple[bytes, bytes]:
    """The reference engine's answer to HTTP/2's preface, ``(answer, echoed)``: aiohttp's ``400`` quotes the bytes it
    read after the preface (``Pause on PRI/Upgrade: b'...'``); ``answer`` is the rest, with the quoted bytes, the
    Date and the Content-Length (which follows the quote's length) left out."""
    head, _, body = got.partition(b"\r\n\r\n")
    m = _ECHO.search(body)
    assert m is not None, got
    echoed = ast.literal_eval(m.group(1).decode("ascii"))
    head = re.sub(rb"\r\n(Date|Content-Length): [^\r]*", rb"\r\n\1: -", head)
    return head + b"\r\n\r\n" + body[: m.start()] + b"b'...'" + body[m.end():], echoed


def test_the_reference_engine_answers_an_h2_client_through_the_tap_as_directly(run, telemetry):
    """The reference engine speaks HTTP/1.1 only: an h2c prior-knowledge client gets its ``400`` and its FIN through the
    tap as directly (curl --http2-prior-knowledge: exit 52 both ways, not 56). What the engine quotes of what it read
    after the preface differs, and only that: directly the client's HTTP/2 frames, through the tap the tap's own (its
    SETTINGS first; any HTTP/2 intermediary's would show), read whole in one read both ways: the engine closes with
    nothing unread, so its close is a FIN, not a reset."""
    from deltatap.stack.config import EngineConfig
    from deltatap.stack.engine.app import start_engine

    async def scenario():
        tel = setup_telemetry("deltatap-test-engine", exporter=InMemorySpanExporter())
        engine = await start_engine(EngineConfig.model_validate({"models": ["m"]}), tel, "127.0.0.1:0")
        tap = None
        try:
            direct = await exchange(engine.port)
            tap = await start(engine.url, telemetry)
            through = [await exchange(tap.port) for _ in range(2)]
            await settled(tap)
            return tap, direct, through
        finally:
            if tap is not None:
                await tap.close(grace_s=1)
            await engine.close()
            tel.shutdown()

    tap, direct, through = run(scenario())
    assert direct[1] == through[0][1] == through[1][1] == "fin"
    answer, echoed = engine_answer(direct[0])
    assert answer.startswith(b"HTTP/1.0 400 Bad Request\r\n") and b"Pause on PRI/Upgrade" in answer
    assert echoed == h2_client_bytes()[len(PREFACE):]  # (directly: all the client sent after the preface)
    for got, _ in through:
        t_answer, t_echoed = engine_answer(got)
        assert t_answer == answer  # the engine's answer as it wrote it, nothing of the tap's own before or after it
        assert t_echoed[3] == 0x4 and t_echoed != echoed  # (the tap's own SETTINGS, then its frames)
        assert int(re.search(rb"Content-Length: (\d+)", got).group(1)) == len(got.partition(b"\r\n\r\n")[2])
    assert tap.tap.counters.upstream_not_http2 == 2


async def _curl(url: str) -> tuple[int, bytes]:
    proc = await asyncio.create_subprocess_exec("curl", "-sS", "--http2-prior-knowledge", "--max-time", str(WAIT_S), url,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
    out, _ = await asyncio.wait_for(proc.communicate(), WAIT_S + 2)
    return proc.returncode, out


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_an_upstream_goaway_and_the_response_after_it_in_one_read_reach_the_client(run, telemetry):
    """An HTTP/2 upstream that answers with a GOAWAY naming the stream and the stream's response in one write (one read
    at the tap): the response reaches the client as directly. (h2 refuses every frame after a GOAWAY it read until the
    relay put its state back to open, which it did only after the read: the tap closed the connection. The tap's
    upstream preface leaving with the client's request, this session, made such merged reads likelier.)"""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
        c.initiate_connection()
        writer.write(c.data_to_send())
        try:
            while data := await asyncio.wait_for(reader.read(65536), WAIT_S):
                for ev in c.receive_data(data):
                    if isinstance(ev, h2.events.RequestReceived):
                        writer.write(c.data_to_send())
                        c.send_headers(ev.stream_id, [(":status", "200"), ("content-type", "text/plain")])
                        c.send_data(ev.stream_id, b"after the goaway", end_stream=True)
                        goaway = hyperframe.frame.GoAwayFrame(0, last_stream_id=ev.stream_id, error_code=0).serialize()
                        writer.write(goaway + c.data_to_send())  # (one write)
                writer.write(c.data_to_send())
        except (OSError, TimeoutError, h2.exceptions.ProtocolError):
            pass
        finally:
            writer.close()

    async def scenario():
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        tap = None
        try:
            direct = await _curl(f"http://127.0.0.1:{port}/x")
            tap = await start(f"http://127.0.0.1:{port}", telemetry)
            through = await _curl(f"{tap.url}/x")
            return direct, through
        finally:
            if tap is not None:
                await tap.close(grace_s=1)
            server.close()
            await server.wait_closed()

    direct, through = run(scenario())
    assert through == direct == (0, b"after the goaway")
