"""Session 25 ("bound2"): a write stamped without kernel stamps (asyncio's own transport: TLS, or
``DELTATAP_KERNEL_STAMPS=0``) whose bytes TCP still holds when it returns (``tcpi_notsent_bytes`` > 0: the peer's
window shut) is stated unknown (-1), never bounded by the call's duration (a write that went out keeps its finite
bound: tests/kernel/test_wire.py, tests/proxy). Both write paths: :meth:`deltatap.net.conn.StampedProtocol.send` (the tap) and
:class:`deltatap.net.wire.StampingTransport` (the load generator's and the engine's aiohttp connections). Live on
127.0.0.1: a peer (plain or TLS) with a 4 KiB receive buffer that reads nothing until told."""

from __future__ import annotations

import asyncio
import socket
import ssl
import threading

import pytest

from deltatap.net import conn, kstamp
from deltatap.net.pktstamp import tcp_notsent
from deltatap.net.wire import StampingTransport

TIMEOUT_S = 10.0
CHUNK = b"x" * 2048
WRITES = 24  # (48 KiB: past a 4 KiB window, within the socket's send buffer at first)


def _peer(listener: socket.socket, tls: ssl.SSLContext | None, go: threading.Event) -> None:
    listener.settimeout(TIMEOUT_S)
    c, _ = listener.accept()
    if tls is not None:
        c = tls.wrap_socket(c, server_side=True)
    with c:
        go.wait(TIMEOUT_S)  # (reads nothing until the writes are done)


@pytest.fixture(params=["plain", "tls"])
def peer(request, self_signed, monkeypatch):
    monkeypatch.setattr(kstamp, "enabled", lambda: False)  # (plain: asyncio's own transport, as DELTATAP_KERNEL_STAMPS=0)
    srv_tls = cli_tls = None
    if request.param == "tls":
        srv_tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        srv_tls.load_cert_chain(*self_signed)
        cli_tls = ssl.create_default_context(cafile=str(self_signed[0]))
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    go = threading.Event()
    th = threading.Thread(target=_peer, args=(listener, srv_tls, go), daemon=True)
    th.start()
    yield listener.getsockname()[1], cli_tls
    go.set()
    th.join(TIMEOUT_S)
    listener.close()


def _check(results: list[tuple[int, int, int]]) -> None:
    """``(bound, the transport's buffer after, notsent after)`` per write, in order."""
    held = [r for r in results if r[1] == 0 and r[2]]
    assert held, results  # (the case was met: TCP held bytes the transport had handed it)
    assert all(b == -1 for b, _size, _n in held), held  # never a finite bound on bytes still held
    assert all(b == -1 for b, size, _n in results if size), results


async def test_stamped_protocol_send_without_kernel_stamps(peer):
    port, tls = peer
    tr, proto = await conn.open_connection(conn.StampedProtocol, "127.0.0.1", port, ssl=tls,
                                           server_hostname="127.0.0.1" if tls else None, connect_timeout=TIMEOUT_S)
    try:
        assert proto.kernel is None
        sock = tr.get_extra_info("socket")
        results = []
        for _ in range(WRITES):
            b, size = proto.send(CHUNK)[1], tr.get_write_buffer_size()
            results.append((b, size, tcp_notsent(sock) or 0))
            await asyncio.sleep(0.002)
        _check(results)
    finally:
        tr.abort()


async def test_stamping_transport_write_without_kernel_stamps(peer):
    port, tls = peer
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(TIMEOUT_S):
        tr, _proto = await loop.create_connection(asyncio.Protocol, "127.0.0.1", port, ssl=tls,
                                                  server_hostname="127.0.0.1" if tls else None)
    try:
        st = StampingTransport(tr)
        sock = tr.get_extra_info("socket")
        results = []
        for _ in range(WRITES):
            st.write(CHUNK)
            results.append((st.last_write_bound_ns, tr.get_write_buffer_size(), tcp_notsent(sock) or 0))
            await asyncio.sleep(0.002)
        _check(results)
    finally:
        tr.abort()
