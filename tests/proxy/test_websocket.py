"""WebSocket through the tap after a 101: bytes relayed unchanged both ways, frames watched (RFC 6455), the upgraded
exchange's span carrying per-direction messages, stamps, gaps and the close; a malformed frame stops the watching,
never the relay. Against a real ``websockets`` echo server and against raw peers that write exact frames."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import random

import pytest
from tap_helpers import wait_spans
from websockets.asyncio.client import connect
from websockets.asyncio.server import serve
from websockets.exceptions import ConnectionClosed

from deltatap.collector.pipeline import Pipeline
from deltatap.collector.spans import decode_protobuf
from deltatap.core.clock import mono_ns, to_unix_ns
from deltatap.core.vocab import Attr
from deltatap.proxy.websocket import BINARY, CLOSE, CONTINUATION, PING, PONG, TEXT, WsDirection
from deltatap.telemetry.otlp_encode import encode_export_request

pytestmark = pytest.mark.timeout(60)
C, S = Attr.WS_CLIENT, Attr.WS_SERVER
MASK = b"\x11\x22\x33\x44"
_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


def frame(op: int, payload: bytes = b"", *, fin: bool = True, mask: bytes | None = None, rsv1: bool = False) -> bytes:
    b0 = (0x80 if fin else 0) | (0x40 if rsv1 else 0) | op
    m = 0x80 if mask else 0
    n = len(payload)
    if n < 126:
        head = bytes([b0, m | n])
    elif n < 1 << 16:
        head = bytes([b0, m | 126]) + n.to_bytes(2, "big")
    else:
        head = bytes([b0, m | 127]) + n.to_bytes(8, "big")
    if mask:
        head += mask
        payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    return head + payload


# what the raw client sends: 7-, 16- and 64-bit lengths, a fragmented message with a ping between its fragments, close
CLIENT_FRAMES = [
    frame(TEXT, b"hello", mask=MASK),
    frame(BINARY, random.Random(1).randbytes(70_000), mask=MASK),
    frame(TEXT, b"x" * 300, mask=MASK),
    frame(TEXT, b"ab", fin=False, mask=MASK),
    frame(PING, b"p", mask=MASK),
    frame(CONTINUATION, b"cd", fin=False, mask=MASK),
    frame(CONTINUATION, b"ef", mask=MASK),
    frame(CLOSE, (4001).to_bytes(2, "big") + b"bye", mask=MASK),
]
SERVER_FRAMES = [frame(TEXT, b"hi"), frame(BINARY, bytes(200)), frame(PONG, b"p"), frame(CLOSE, (1000).to_bytes(2, "big"))]


# ---- the frame watcher alone (no network) --------------------------------------------------------------------
def test_frames_split_anywhere_give_the_same_counts():
    wire = b"".join(CLIENT_FRAMES)
    rnd = random.Random(7)
    for _ in range(30):
        d = WsDirection("client")
        cuts = sorted(rnd.sample(range(1, len(wire)), 12))
        for i, (a, b) in enumerate(zip([0, *cuts], [*cuts, len(wire)])):
            d.feed(wire[a:b], 1000 + i, 0, 2000 + i, 0)
        assert (d.messages, d.frames, d.pings, d.close_code, d.malformed) == (4, 8, 1, 4001, None)
        assert d.wire_bytes == len(wire) and d.payload_bytes == 5 + 70_000 + 300 + 6 + 1 + 5
        assert len(d.arrivals_ns) == 4 and d.arrivals_ns == sorted(d.arrivals_ns)


@pytest.mark.parametrize(("frames", "why"), [
    ([frame(3, b"x", mask=MASK)], "reserved opcode 0x3"),
    ([frame(TEXT, b"x")], "a client frame without a mask"),
    ([frame(CONTINUATION, b"x", mask=MASK)], "a continuation frame with no message to continue"),
    ([frame(PING, b"x" * 126, mask=MASK)], "a control frame of 126 bytes (at most 125)"),
    ([frame(PING, b"x", fin=False, mask=MASK)], "a fragmented control frame"),
    ([frame(TEXT, b"a", fin=False, mask=MASK), frame(TEXT, b"b", mask=MASK)], "a new data frame before the fragmented message ended"),
    ([frame(TEXT, b"a", mask=MASK, rsv1=True)], "RSV1 without permessage-deflate negotiated"),
    ([b"\x82\xff\x80" + bytes(7) + MASK], "a 64-bit length with its most significant bit set"),
])
def test_rfc6455_violations_stop_the_watching_with_the_reason(frames, why):
    d = WsDirection("client")
    good = frame(TEXT, b"ok", mask=MASK)
    d.feed(good + b"".join(frames) + good, 1, 0, 2, 0)
    assert d.malformed == why
    assert d.messages == 1  # the one before; nothing after is parsed
    assert d.wire_bytes == 2 * len(good) + sum(map(len, frames))  # ... but every byte is counted as relayed


def test_server_frame_with_a_mask_is_malformed_and_deflate_is_counted_opaque():
    s = WsDirection("server")
    s.feed(frame(TEXT, b"x", mask=MASK), 1, 0, 2, 0)
    assert s.malformed == "a server frame with a mask"
    z = WsDirection("server", deflate=True)
    z.feed(frame(TEXT, b"\x02\x00", rsv1=True) + frame(TEXT, b"plain"), 1, 0, 2, 0)
    assert (z.messages, z.compressed, z.malformed) == (2, 1, None)


# ---- through a tap, a real WebSocket implementation on both ends -----------------------------------------------
@pytest.fixture
async def echo_server():
    """``websockets`` echo server; ``burst N GAP_MS`` makes it send N messages GAP_MS apart, stamping each send."""
    sent: list[int] = []

    async def handler(ws):
        with contextlib.suppress(ConnectionClosed):
            await _serve(ws)

    async def _serve(ws):
        async for msg in ws:
            if isinstance(msg, str) and msg.startswith("burst "):
                _, n, gap = msg.split()
                for i in range(int(n)):
                    await asyncio.sleep(int(gap) / 1000)
                    sent.append(mono_ns())
                    await ws.send(f"m{i}")
            else:
                await ws.send(msg)

    async with serve(handler, "127.0.0.1", 0, compression=None) as server:
        port = server.sockets[0].getsockname()[1]
        yield f"http://127.0.0.1:{port}", sent


async def test_echo_through_the_tap_text_binary_fragmented_ping_close(echo_server, make_tap, span_exporter, telemetry):
    url, _ = echo_server
    tap = await make_tap(url, link="edge")
    async with connect(tap.url.replace("http", "ws") + "/v1/realtime", compression=None, open_timeout=10) as ws:
        await ws.send("hello")
        assert await ws.recv() == "hello"
        blob = random.Random(2).randbytes(100_000)
        await ws.send(blob)
        assert await ws.recv() == blob
        await ws.send(["frag-", "men-", "ted"])  # one message in three frames
        assert await ws.recv() == "frag-men-ted"
        await asyncio.wait_for(await ws.ping(b"hb"), 10)
        await ws.close(4001, "done")
    (span,) = await wait_spans(span_exporter, telemetry, 1, timeout_s=10)
    a = span.attributes
    assert a[Attr.HTTP_STATUS] == 101 and a[Attr.WS] is True and a[Attr.OUTCOME] == "ok"
    assert (a[C.MESSAGES], a[C.FRAMES], a[C.PINGS], a[C.CLOSE_CODE]) == (3, 1 + 1 + 4 + 1 + 1, 1, 4001)  # (websockets ends a fragmented send with an empty final frame)
    assert (a[S.MESSAGES], a[S.PONGS], a[S.CLOSE_CODE]) == (3, 1, 4001)
    assert a[Attr.WS_CLOSED_BY] == "client" and C.MALFORMED not in a and S.MALFORMED not in a
    assert a[C.PAYLOAD_BYTES] >= 5 + 100_000 + 12 and a[S.PAYLOAD_BYTES] >= 5 + 100_000 + 12
    assert len(a[C.ARRIVALS_MS]) == 3 and a[C.ARRIVALS_MS][0] == 0.0
    # the span lasts as long as the tunnel: it ends after the last message was forwarded
    assert span.end_time >= a[S.FIRST_FORWARDED_UNIX_NS] >= a[S.FIRST_RECEIVED_UNIX_NS] >= span.start_time
    # the collector takes it as any tap span (OTLP bytes as exported, decoded, joined into a row)
    pipe = Pipeline()
    pipe.ingest(decode_protobuf(encode_export_request([span])), 0.0)
    (row,) = pipe.flush()
    assert row.request_id == a[Attr.REQUEST_ID]


async def test_message_stamps_lie_between_the_servers_send_and_the_clients_receive(echo_server, make_tap, span_exporter,
                                                                                  telemetry):
    url, sent = echo_server
    tap = await make_tap(url, link="edge")
    got: list[int] = []
    async with connect(tap.url.replace("http", "ws") + "/", compression=None, open_timeout=10) as ws:
        await ws.send("burst 6 15")
        for _ in range(6):
            await asyncio.wait_for(ws.recv(), 10)
            got.append(mono_ns())
    (span,) = await wait_spans(span_exporter, telemetry, 1, timeout_s=10)
    a = span.attributes
    assert a[S.MESSAGES] == 6 and len(sent) == 6
    first_unix, bound = a[S.FIRST_RECEIVED_UNIX_NS], a[S.FIRST_RECEIVED_BOUND_NS]
    arrivals = [first_unix + round(ms * 1e6) for ms in a[S.ARRIVALS_MS]]
    slack = 200_000  # the mono -> unix conversion and the kernel stamp's placement on the mono scale
    for i, (s, t, r) in enumerate(zip(sent, arrivals, got)):
        # causality, whatever the machine's load: received after the server's send began, before the client got it
        assert to_unix_ns(s) - slack <= t <= to_unix_ns(r) + slack, i
    assert bound >= 0 and a[S.FIRST_FORWARDED_UNIX_NS] <= to_unix_ns(got[0]) + slack
    assert a[S.GAP_MAX_MS] >= a[S.GAP_MEAN_MS] > 0


async def test_permessage_deflate_is_counted_as_opaque_payload(make_tap, span_exporter, telemetry):
    async with serve(_echo_once, "127.0.0.1", 0) as server:  # compression on (the library's default)
        port = server.sockets[0].getsockname()[1]
        tap = await make_tap(f"http://127.0.0.1:{port}", link="edge")
        async with connect(tap.url.replace("http", "ws") + "/", open_timeout=10) as ws:
            await ws.send("compress me " * 50)
            assert await ws.recv() == "compress me " * 50
    spans = await wait_spans(span_exporter, telemetry, 1, timeout_s=10)
    a = spans[-1].attributes
    assert a[Attr.WS_DEFLATE] is True and a[C.COMPRESSED] == 1 and a[S.COMPRESSED] == 1
    assert a[C.PAYLOAD_BYTES] < len("compress me " * 50)  # the wire payload, compressed


async def _echo_once(ws):
    await ws.send(await ws.recv())


# ---- raw peers: exact frames, byte for byte ----------------------------------------------------------------------
async def _raw_upstream(server_bytes: bytes):
    """Answers the upgrade with a 101 and ``server_bytes`` in the same write, then keeps what it reads until EOF."""
    got = bytearray()
    done = asyncio.get_running_loop().create_future()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        key = next(line.split(b":", 1)[1].strip() for line in head.split(b"\r\n") if line.lower().startswith(b"sec-websocket-key:"))
        accept = base64.b64encode(hashlib.sha1(key + _GUID).digest())
        writer.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                     b"Sec-WebSocket-Accept: " + accept + b"\r\n\r\n" + server_bytes)
        while chunk := await reader.read(65536):
            got.extend(chunk)
        writer.close()
        done.set_result(None)

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, got, done


async def _raw_client(tap_url: str, client_bytes: bytes, expect_back: int, pieces: int = 20) -> bytes:
    host, port = tap_url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                 b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
    back = bytearray()
    while len(back) < expect_back:
        chunk = await asyncio.wait_for(reader.read(65536), 10)
        assert chunk, "the tap closed early"
        back.extend(chunk)
    step = len(client_bytes) // pieces + 1
    for i in range(0, len(client_bytes), step):  # split anywhere: headers and masks cut across writes
        writer.write(client_bytes[i : i + step])
        await writer.drain()
        await asyncio.sleep(0.002)
    writer.close()
    return bytes(back)


async def test_raw_frames_are_byte_identical_at_both_ends_and_counted(make_tap, span_exporter, telemetry):
    server_bytes = b"".join(SERVER_FRAMES)
    server, got, done = await _raw_upstream(server_bytes)
    async with server:
        port = server.sockets[0].getsockname()[1]
        tap = await make_tap(f"http://127.0.0.1:{port}", link="edge")
        client_bytes = b"".join(CLIENT_FRAMES)
        back = await _raw_client(tap.url, client_bytes, expect_back=len(server_bytes) + 100)
        await asyncio.wait_for(done, 10)
    assert back.endswith(b"\r\n\r\n" + server_bytes) and back.startswith(b"HTTP/1.1 101 Switching Protocols\r\n")
    assert bytes(got) == client_bytes
    (span,) = await wait_spans(span_exporter, telemetry, 1, timeout_s=10)
    a = span.attributes
    assert (a[C.MESSAGES], a[C.PINGS], a[C.CLOSE_CODE], a[C.BYTES]) == (4, 1, 4001, len(client_bytes))
    assert (a[S.MESSAGES], a[S.PONGS], a[S.CLOSE_CODE], a[S.BYTES]) == (2, 1, 1000, len(server_bytes))
    assert a[Attr.WS_CLOSED_BY] == "server"  # its close frame came first (with the 101)


async def test_a_malformed_frame_stops_the_watching_not_the_relay(make_tap, span_exporter, telemetry):
    server, got, done = await _raw_upstream(frame(TEXT, b"hi"))
    async with server:
        port = server.sockets[0].getsockname()[1]
        tap = await make_tap(f"http://127.0.0.1:{port}", link="edge")
        client_bytes = frame(TEXT, b"one", mask=MASK) + frame(0x3, b"??", mask=MASK) + random.Random(3).randbytes(5000)
        await _raw_client(tap.url, client_bytes, expect_back=120, pieces=3)
        await asyncio.wait_for(done, 10)
    assert bytes(got) == client_bytes  # every byte relayed, the garbage after the bad frame included
    (span,) = await wait_spans(span_exporter, telemetry, 1, timeout_s=10)
    a = span.attributes
    assert a[C.MALFORMED] == "reserved opcode 0x3" and a[C.MESSAGES] == 1 and a[C.BYTES] == len(client_bytes)
    assert a[S.MESSAGES] == 1 and S.MALFORMED not in a
    assert tap.tap.counters.ws_malformed == 1
