"""deltatap.net.kstamp: kernel receive stamps and the transport that carries them, on asyncio's loop and
on uvloop, over real loopback sockets.

The stamp tests block the reading loop after the bytes were sent: a read stamp taken when the
process gets to the bytes is late by the whole block, the kernel's stamp is not (and with
``DELTATAP_KERNEL_STAMPS=0`` the same test shows the late stamp, so it can tell the two apart).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import struct
import threading
import time

import aiohttp
import pytest
import uvloop
from aiohttp import web

from deltatap.net import kstamp, pktstamp
from deltatap.core.clock import mono_ns
from deltatap.net.kstamp import KernelStampTransport
from deltatap.net.wire import (
    StampingTransport,
    last_read_mono_ns,
    make_stamping_connector,
    make_stamping_runner,
    make_stamping_site,
    request_received_mono_ns,
    upstream_stamps,
)

MS = 1_000_000
BLOCK_S = 0.2  # how long the reading loop is kept busy after the bytes arrived
LOOPS = pytest.mark.parametrize("run", [asyncio.run, uvloop.run], ids=["asyncio", "uvloop"])
pytestmark = pytest.mark.skipif(not kstamp.enabled(), reason="kernel receive stamps need Linux (SO_TIMESTAMPING)")


@pytest.fixture(params=["kernel", "off"])
def stamps(request, monkeypatch) -> str:
    if request.param == "off":
        monkeypatch.setenv("DELTATAP_KERNEL_STAMPS", "0")
    else:
        monkeypatch.delenv("DELTATAP_KERNEL_STAMPS", raising=False)
    return request.param


def _wait_kernel_stamping() -> None:
    """Linux turns packet stamping on for the whole stack from a workqueue, shortly after the first
    socket asks for it (a long-lived server's listening socket does so long before traffic): wait,
    boundedly, until a loopback packet comes with a stamp."""
    with socket.create_server(("127.0.0.1", 0)) as lsock:
        with socket.create_connection(lsock.getsockname(), timeout=5) as c:
            conn, _ = lsock.accept()
            with conn:
                conn.setsockopt(socket.SOL_SOCKET, kstamp.SO_TIMESTAMPING, kstamp.RX_FLAGS)
                for _ in range(200):
                    c.sendall(b"x")
                    _data, anc, _flags, _addr = conn.recvmsg(16, socket.CMSG_SPACE(48))
                    if anc:
                        return
                    time.sleep(0.005)
    raise AssertionError("the kernel never stamped a loopback packet")


async def _serve(app: web.Application) -> tuple[web.AppRunner, int]:
    runner = make_stamping_runner(app, access_log=None)
    await runner.setup()
    site = make_stamping_site(runner, "127.0.0.1", 0)
    await site.start()
    if kstamp.enabled():
        _wait_kernel_stamping()
    return runner, runner.addresses[0][1]


@LOOPS
def test_server_read_stamp_is_the_kernel_arrival(run, stamps):
    async def scenario() -> tuple[int, int, dict]:
        async def handler(request: web.Request) -> web.Response:
            rec = {"received": request_received_mono_ns(request), "transport": type(request.transport).__name__}
            await request.read()
            rec["body"] = last_read_mono_ns(request)
            return web.json_response(rec)

        app = web.Application()
        app.router.add_post("/x", handler)
        runner, port = await _serve(app)
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=5)  # the kernel completes the handshake
            t_send = mono_ns()
            s.sendall(b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\nConnection: close\r\n\r\nbody")
            t_sent = mono_ns()
            time.sleep(BLOCK_S)  # the server's loop (this one) cannot read for this long
            s.setblocking(False)
            reader, writer = await asyncio.open_connection(sock=s)
            raw = await asyncio.wait_for(reader.read(), 10)
            writer.close()
            return t_send, t_sent, json.loads(raw.split(b"\r\n\r\n", 1)[1])
        finally:
            await runner.cleanup()

    t_send, t_sent, rec = run(scenario())
    if stamps == "kernel":
        assert rec["transport"] == "KernelStampTransport"
        # stamped when the kernel took the bytes in, inside sendall, not when the loop got to them
        assert t_send - 100_000 <= rec["received"] <= t_sent + 100_000
        assert t_send - 100_000 <= rec["body"] <= t_sent + 100_000
    else:
        assert rec["transport"] == "StampingTransport"
        assert rec["received"] - t_send >= BLOCK_S * 1e9  # late by the block: what kernel stamps remove


class _ThreadServer:
    """A blocking HTTP/1.1 responder in a thread: reads one request, waits ``delay_s``, sends the
    head and a body, and records (in this process's ``mono_ns``) when it called ``sendall``."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.lsock = socket.create_server(("127.0.0.1", 0))
        self.port = self.lsock.getsockname()[1]
        self.sent: list[int] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.lsock.accept()
        with conn:
            conn.settimeout(10)
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            time.sleep(self.delay_s)
            self.sent.append(mono_ns())
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello")
            self.sent.append(mono_ns())
            conn.recv(1)  # until the client closes

    def close(self) -> None:
        self.lsock.close()
        self.thread.join(5)


@LOOPS
def test_client_read_stamp_is_the_kernel_arrival(run, stamps):
    server = _ThreadServer(delay_s=0.05)

    async def scenario() -> tuple[int | None, str, bytes]:
        loop = asyncio.get_running_loop()
        # keep the loop busy from 20 ms to 20 ms + BLOCK_S: the response arrives (at ~50 ms) meanwhile
        # (the connector's socket asks for stamps once connected; the server answers 50 ms later)
        loop.call_later(0.02, time.sleep, BLOCK_S)
        async with aiohttp.ClientSession(connector=make_stamping_connector()) as session:
            async with session.get(f"http://127.0.0.1:{server.port}/") as resp:
                up = upstream_stamps(resp)
                kind = "KernelStampTransport" if up is not None and up.kernel_stamps else "StampingTransport"
                body = await resp.read()
                return (up.head_mono_ns if up else None), kind, body

    try:
        head, kind, body = run(scenario())
    finally:
        server.close()
    assert body == b"hello"
    t_send, t_sent = server.sent
    assert head is not None
    if stamps == "kernel":
        assert kind == "KernelStampTransport"
        assert t_send - 100_000 <= head <= t_sent + 100_000
    else:
        assert kind == "StampingTransport"
        assert head - t_send >= 0.1 * 1e9  # the loop got to it only after its block


class Recorder(asyncio.Protocol):
    """Keeps every delivery with the stamp the transport gave it."""

    def __init__(self) -> None:
        self.got: list[tuple[bytes, int]] = []
        self.bounds: list[int] = []

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.got.append((data, self.transport.rx_mono_ns))
        self.bounds.append(self.transport.rx_bound_ns)


async def _send_while_blocked(c: socket.socket, rec: Recorder, msgs: tuple[bytes, ...], gap_s: float) -> list[int]:
    """Send ``msgs`` ``gap_s`` apart while this loop is blocked (they all wait in the reader's socket), then let the
    loop run until the recorder has them all; returns when each was sent (``mono_ns``)."""
    sent = []
    for msg in msgs:
        sent.append(mono_ns())
        c.send(msg)
        time.sleep(gap_s)  # (blocking on purpose)
    for _ in range(200):
        if sum(len(d) for d, _ in rec.got) >= sum(map(len, msgs)):
            break
        await asyncio.sleep(0.005)
    return sent


@LOOPS
def test_a_late_read_is_split_at_each_arrival(run):
    """Two writes 5 ms apart while the reader's loop is blocked arrive in one read; the transport
    hands them over as two, each with its own kernel stamp (not both with the second's)."""

    async def scenario():
        protos: list[Recorder] = []
        server = await kstamp.start_server(lambda: protos.append(Recorder()) or protos[-1], "127.0.0.1", 0)
        c = socket.create_connection(server.sockets[0].getsockname(), timeout=5)
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(200):
            if protos:
                break
            await asyncio.sleep(0.005)
        # past TCP's quick-ack start (a fresh connection acknowledges at once, which lets the
        # kernel merge queued packets and keep only the later stamp)
        for _ in range(20):
            c.send(b"w")
            await asyncio.sleep(0.001)
        await asyncio.sleep(0.02)
        protos[0].got.clear()
        sent = await _send_while_blocked(c, protos[0], (b"first", b"second"), 0.005)
        c.close()
        server.close()
        return sent, protos[0].got

    sent, got = run(scenario())
    assert b"".join(d for d, _ in got) == b"firstsecond"
    assert got[0][0] == b"first"  # a delivery of its own ...
    assert sent[0] - 100_000 <= got[0][1] <= sent[0] + MS  # ... stamped at its own arrival, 5 ms before the next
    assert sent[1] - 100_000 <= got[-1][1] <= sent[1] + MS


# ---- the transport itself ------------------------------------------------------------------


class Echo(asyncio.Protocol):
    """Echoes what it reads; on the peer's EOF writes ``<eof>`` and half-closes (staying open)."""

    def __init__(self) -> None:
        self.stamps: list[int | None] = []
        self.lost = asyncio.get_running_loop().create_future()
        self.paused = 0
        self.resumed = 0

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        assert isinstance(data, bytes)
        self.stamps.append(self.transport.rx_mono_ns)
        self.transport.write(data)

    def eof_received(self) -> bool:
        self.transport.write(b"<eof>")
        self.transport.write_eof()
        self.transport.close()  # after what is buffered has gone out
        return True

    def pause_writing(self) -> None:
        self.paused += 1

    def resume_writing(self) -> None:
        self.resumed += 1

    def connection_lost(self, exc) -> None:
        if not self.lost.done():
            self.lost.set_result(exc)


async def _echo_server(proto_holder: list) -> kstamp.KernelStampServer:
    def factory() -> Echo:
        p = Echo()
        proto_holder.append(p)
        return p

    return await kstamp.start_server(factory, "127.0.0.1", 0)


@LOOPS
def test_echo_half_close_and_clean_close(run):
    async def scenario():
        protos: list[Echo] = []
        server = await _echo_server(protos)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        payload = os.urandom(300_000)  # more than one read and more than the socket buffers
        writer.write(payload)
        await writer.drain()
        writer.write_eof()
        got = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        exc = await asyncio.wait_for(protos[0].lost, 10)
        server.close()
        await server.wait_closed()
        return payload, got, protos[0], exc

    payload, got, proto, exc = run(scenario())
    assert got == payload + b"<eof>"  # nothing altered or lost, in order, then the half-close
    assert exc is None
    assert proto.stamps and all(isinstance(t, int) for t in proto.stamps)
    assert proto.stamps == sorted(proto.stamps)


@LOOPS
def test_peer_reset_reaches_the_protocol(run):
    async def scenario():
        protos: list[Echo] = []
        server = await _echo_server(protos)
        port = server.sockets[0].getsockname()[1]
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(b"x")
        for _ in range(200):  # bounded: until the server has read it
            if protos and protos[0].stamps:
                break
            await asyncio.sleep(0.01)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()  # RST
        exc = await asyncio.wait_for(protos[0].lost, 10)
        server.close()
        return exc

    exc = run(scenario())
    assert isinstance(exc, ConnectionResetError)


@LOOPS
def test_back_pressure_pauses_and_close_flushes(run):
    """A reader that does not read: the transport buffers, pauses its protocol, and a close() after
    the writes still delivers every byte before the FIN."""
    size = 8 * 1024 * 1024

    class Sender(asyncio.Protocol):
        def __init__(self) -> None:
            self.paused = self.resumed = 0
            self.lost = asyncio.get_running_loop().create_future()

        def connection_made(self, transport) -> None:
            self.transport = transport
            transport.write(bytes(size))
            transport.close()

        def pause_writing(self) -> None:
            self.paused += 1

        def resume_writing(self) -> None:
            self.resumed += 1

        def connection_lost(self, exc) -> None:
            self.lost.set_result(exc)

    async def scenario():
        senders: list[Sender] = []
        server = await kstamp.start_server(lambda: senders.append(Sender()) or senders[-1], "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for _ in range(200):
            if senders:
                break
            await asyncio.sleep(0.01)
        buffered = senders[0].transport.get_write_buffer_size()
        got = 0
        while True:
            chunk = await asyncio.wait_for(reader.read(1 << 20), 10)
            if not chunk:
                break
            got += len(chunk)
        exc = await asyncio.wait_for(senders[0].lost, 10)
        writer.close()
        server.close()
        return buffered, got, senders[0], exc

    buffered, got, sender, exc = run(scenario())
    assert buffered > 0
    assert got == size
    assert sender.paused == 1 and sender.resumed == 1
    assert exc is None


@LOOPS
def test_client_connect_and_server_close(run):
    async def scenario():
        protos: list[Echo] = []
        server = await _echo_server(protos)
        port = server.sockets[0].getsockname()[1]
        loop = asyncio.get_running_loop()
        sock = socket.socket()
        sock.setblocking(False)
        await loop.sock_connect(sock, ("127.0.0.1", port))
        got = bytearray()
        done = loop.create_future()

        class Client(asyncio.Protocol):
            def data_received(self, data: bytes) -> None:
                got.extend(data)
                if got.endswith(b"<eof>") and not done.done():
                    done.set_result(tr.rx_mono_ns)

        tr, _ = kstamp.connect(loop, sock, Client)
        t0 = mono_ns()
        tr.write(b"ping")
        tr.write_eof()
        stamp = await asyncio.wait_for(done, 10)
        tr.close()
        server.close()
        try:
            await asyncio.open_connection("127.0.0.1", port)
            refused = False
        except OSError:
            refused = True
        return bytes(got), stamp, t0, refused

    got, stamp, t0, refused = run(scenario())
    assert got == b"ping<eof>"
    assert stamp >= t0 - 100_000
    assert refused  # a closed server no longer accepts


@LOOPS
def test_large_bodies_through_stamped_server_and_connector(run):
    """8 MiB each way through a stamped aiohttp server and client: aiohttp's flow control
    (pause_reading on a full buffer) on both ends, bytes unchanged."""

    async def echo(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)
        async for chunk in request.content.iter_any():
            await resp.write(chunk)
        await resp.write_eof()
        return resp

    async def scenario():
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/echo", echo)
        runner, port = await _serve(app)
        payload = os.urandom(8 * 1024 * 1024)
        try:
            async with aiohttp.ClientSession(connector=make_stamping_connector()) as session:
                async with session.post(f"http://127.0.0.1:{port}/echo", data=payload) as resp:
                    transport = resp.connection.protocol.transport if resp.connection else None
                    out = bytearray()
                    async for chunk in resp.content.iter_chunked(1 << 16):
                        out += chunk
                        if len(out) < len(payload) // 2:
                            await asyncio.sleep(0)  # read slowly at first: the server side fills up
            return payload, bytes(out), transport
        finally:
            await runner.cleanup()

    payload, out, transport = run(scenario())
    assert out == payload
    assert isinstance(transport, KernelStampTransport)
    assert not isinstance(transport, StampingTransport)


@pytest.fixture(params=["packets", "no-packets"])
def packet_stamps(request, monkeypatch) -> str:
    from deltatap.net import pktstamp

    if request.param == "no-packets":
        monkeypatch.setenv("DELTATAP_PACKET_STAMPS", "0")
    else:
        monkeypatch.delenv("DELTATAP_PACKET_STAMPS", raising=False)
        if pktstamp.packet_log() is None:
            pytest.skip("per-packet stamps need CAP_NET_RAW (a packet socket)")
    return request.param


@LOOPS
def test_writes_the_kernel_merged_keep_their_own_arrivals(run, packet_stamps):
    """A fresh connection (TCP acknowledges at once: the kernel merges a packet into the one waiting unread,
    keeping only the later stamp) and three writes 4 ms apart while the reader's loop is blocked. With the
    packet log each write is handed over with its own arrival; without it the merged ones carry the last
    one's stamp (which this test tells apart: it fails for the first two writes)."""

    async def scenario():
        protos: list[Recorder] = []
        server = await kstamp.start_server(lambda: protos.append(Recorder()) or protos[-1], "127.0.0.1", 0)
        _wait_kernel_stamping()
        c = socket.create_connection(server.sockets[0].getsockname(), timeout=5)
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(200):
            if protos:
                break
            await asyncio.sleep(0.005)
        sent = await _send_while_blocked(c, protos[0], (b"one.", b"two.", b"three."), 0.004)
        c.close()
        server.close()
        return sent, protos[0].got, protos[0].bounds

    placed_before = kstamp.MERGED_READS["packets"]
    sent, got, bounds = run(scenario())
    assert b"".join(d for d, _ in got) == b"one.two.three."
    stamps, earliest = {}, {}
    pos = 0
    for (data, t), bound in zip(got, bounds, strict=True):  # the delivery that holds each write's first byte
        for msg, at in ((b"one.", 0), (b"two.", 4), (b"three.", 8)):
            if pos <= at < pos + len(data):
                stamps[msg], earliest[msg] = t, t - bound
        pos += len(data)
    # the interval [stamp - bound, stamp] holds each write's arrival (it came after the write was sent, before the
    # next one 4 ms later): with the log because each stamp is exact, without it because the bound reaches back
    for m, s in zip((b"one.", b"two.", b"three."), sent, strict=True):
        assert earliest[m] <= s + 1 * MS <= stamps[m] + 1 * MS, (m, (earliest[m] - s) / MS, (stamps[m] - s) / MS)
    late = {m: (stamps[m] - s) / MS for m, s in zip((b"one.", b"two.", b"three."), sent)}
    assert all(-0.1 <= v for v in late.values()), late
    if packet_stamps == "packets":
        assert all(v <= 1.0 for v in late.values()), late  # each at its own arrival (the writes are 4 ms apart)
        assert kstamp.MERGED_READS["packets"] > placed_before  # and counted as placed from the log
        assert all(b == 0 for b in bounds)  # exact: no interval
    else:
        assert late[b"one."] >= 3.0, late  # merged: the first write carries a later write's stamp


@pytest.fixture
def slow_sends_over(monkeypatch):
    """``slow_sends_over(ns)``: a send counts as slow past ``ns`` for this test (the reference's threshold and the C
    twin's copy of it; both put back after)."""
    default = kstamp._SLOW_SEND_NS

    def set_to(ns: int) -> None:
        monkeypatch.setattr(kstamp, "_SLOW_SEND_NS", ns)
        if kstamp._send is not None:
            kstamp._pktacc.write_setup(kstamp.SLOW_SENDS, ns)

    yield set_to
    if kstamp._send is not None:
        kstamp._pktacc.write_setup(kstamp.SLOW_SENDS, default)


@LOOPS
def test_a_slow_send_takes_its_departure_from_the_packet_log(run, packet_stamps, slow_sends_over):
    """A write is stamped just before its ``send``; a send that took long (here: every send, the threshold set to 0)
    left somewhere between the readings before and after it. With the packet log the stamp becomes the departure of
    the segment that carried it, which precedes the peer's kernel arrival stamp, and its bound reaches the send's
    return, by which the peer had it (session 25: a slow send's arrival came up to 57 us after its departure); without
    it the stamp stays the reading before the send and the send's duration is its bound."""
    slow_sends_over(0)

    async def scenario():
        protos: list[Recorder] = []
        server = await kstamp.start_server(lambda: protos.append(Recorder()) or protos[-1], "127.0.0.1", 0)
        _wait_kernel_stamping()
        c = socket.create_connection(server.sockets[0].getsockname(), timeout=5)
        c.setsockopt(socket.SOL_SOCKET, kstamp.SO_TIMESTAMPING, kstamp.RX_FLAGS)
        for _ in range(200):
            if protos:
                break
            await asyncio.sleep(0.005)
        tr = protos[0].transport
        out = []
        for i in range(20):
            before = mono_ns()
            tr.write(b"token %d\n" % i)
            stamp, bound = tr.last_write_mono_ns, tr.last_write_bound_ns
            _n, anc, _f, _a = c.recvmsg(64, socket.CMSG_SPACE(48))
            out.append((before, stamp, bound, kstamp._to_mono(pktstamp.kernel_ns(anc))))
            await asyncio.sleep(0.001)
        c.close()
        server.close()
        return out

    slow_before = dict(kstamp.SLOW_SENDS)
    out = run(scenario())
    assert all(before <= stamp for before, stamp, _b, _k in out)
    if packet_stamps == "packets":
        assert kstamp.SLOW_SENDS["packets"] - slow_before["packets"] == 20  # every write placed from the log
        assert all(bound >= 0 for _a, _s, bound, _k in out)
        # the departure precedes the arrival, and the interval reaches it (up to the two clock conversions' reading
        # error, 20 us at most)
        assert all(stamp <= arrival + 20_000 for _a, stamp, _b, arrival in out)
        assert all(arrival <= stamp + bound + 20_000 for _a, stamp, bound, arrival in out)
    else:
        assert kstamp.SLOW_SENDS["bounded"] - slow_before["bounded"] == 20
        assert all(bound > 0 for _a, _s, bound, _k in out)
