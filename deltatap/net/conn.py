"""Stamped connections for the byte relay and the load generator: each read with its arrival, each write with
its departure, on asyncio protocols (no HTTP library in between).

A :class:`StampedProtocol` subclass gets ``on_data(data, t, bound)`` for every read: the bytes arrived in
``[t - bound, t]`` (:mod:`deltatap.net.kstamp`'s kernel stamps and bounds on Linux plain TCP; elsewhere the
moment ``data_received`` ran, bounded by the previous read: anything it did not take arrived after it).
:meth:`StampedProtocol.send` writes and returns ``(t, bound)``: the bytes left in ``[t, t + bound]``
(``bound == -1``: unknown, they wait in the transport's buffer behind earlier bytes, or TCP still holds bytes unsent:
``tcpi_notsent_bytes``, asked after the write without kernel stamps too, e.g. under TLS).

:func:`open_connection` and :func:`start_server` pick the stamped transport where the kernel gives stamps
(plain TCP on Linux, ``DELTATAP_KERNEL_STAMPS`` not off) and asyncio's own otherwise (TLS, other systems).
:func:`reset` closes a connection with a TCP RST, as a peer that aborted would.
"""

from __future__ import annotations

import asyncio
import socket
import ssl as _ssl
import struct
from collections.abc import Callable
from typing import Any

import aiohappyeyeballs

from deltatap.core.clock import mono_ns
from deltatap.net import kstamp
from deltatap.net.pktstamp import tcp_notsent
from deltatap.net.kstamp import KernelStampTransport

__all__ = ["StampedProtocol", "open_connection", "reset", "start_server"]

_LINGER_RST = struct.pack("ii", 1, 0)


class StampedProtocol(asyncio.Protocol):
    """Base protocol; override :meth:`on_data`, :meth:`on_eof`, :meth:`on_lost` (and the write-flow hooks)."""

    transport: Any = None
    kernel: KernelStampTransport | None = None
    # the latest send()'s stamp, and the kernel's record of it when it was a slow write left unplaced
    # (:attr:`deltatap.net.kstamp.KernelStampTransport.unplaced_write`; a user clears it once it placed it)
    last_write_mono: int | None = None
    last_write_bound = 0
    unplaced: tuple[int, int, int] | None = None
    lost_mono_ns: int | None = None
    lost_exc: BaseException | None = None
    _empty_mono = 0
    # without kernel stamps (TLS, DELTATAP_KERNEL_STAMPS=0): the transport's TCP socket, asked after each write whether
    # TCP still holds bytes unsent (for TLS: the records' bytes; the same question: has all that was handed TCP left?)
    _wsock: Any = None

    # ---- asyncio callbacks -------------------------------------------------------------
    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.kernel = transport if isinstance(transport, KernelStampTransport) else None
        if self.kernel is None:
            try:
                self._wsock = transport.get_extra_info("socket")
            except (AttributeError, TypeError):
                self._wsock = None
        self._empty_mono = mono_ns()
        self.on_made()

    def data_received(self, data: bytes) -> None:
        k = self.kernel
        if k is not None:
            t = k.rx_mono_ns  # (read once: where the transport's counters are C, each read makes an int)
            if t is not None:
                self.on_data(data, t, k.rx_bound_ns)
                return
        t = mono_ns()
        bound = t - self._empty_mono
        self._empty_mono = t
        self.on_data(data, t, bound)

    def eof_received(self) -> bool | None:
        return self.on_eof()

    # A subclass may also define ``cuts_received(data, pieces)``: a read the kernel-stamped transport split at packet
    # arrivals, taken at once, ``pieces`` = ``[(start, end, t, bound), ...]`` (without it, each piece is one on_data).

    def connection_lost(self, exc: BaseException | None) -> None:
        self.lost_mono_ns = mono_ns()
        self.lost_exc = exc
        self.on_lost(exc)

    def pause_writing(self) -> None:
        self.on_pause_writing()

    def resume_writing(self) -> None:
        self.on_resume_writing()

    # ---- for subclasses ----------------------------------------------------------------
    def on_made(self) -> None:
        pass

    def on_data(self, data: bytes, t: int, bound: int) -> None:
        """Every subclass handles its reads here: ``data`` arrived in ``[t - bound, t]``."""
        raise NotImplementedError(f"{type(self).__name__} must define on_data()")

    def on_eof(self) -> bool | None:
        return None

    def on_lost(self, exc: BaseException | None) -> None:
        pass

    def on_pause_writing(self) -> None:
        pass

    def on_resume_writing(self) -> None:
        pass

    # ---- writing -----------------------------------------------------------------------
    def send(self, data: bytes | bytearray | memoryview) -> tuple[int, int]:
        """Write ``data``; ``(t, bound)``: its last byte left in ``[t, t + bound]`` (-1: unknown, it waits). Also kept
        as :attr:`last_write_mono` and :attr:`last_write_bound` (and :attr:`unplaced`)."""
        k = self.kernel
        if k is not None:
            fast = k._wfast  # the C twin of the usual write and of what follows here, in one call (kstamp._send)
            if fast is not None:
                got = fast(self, k, data)
                if got is not None:
                    return got
            k._write(data)
            t = k.last_write_mono_ns or mono_ns()
            bound = k.last_write_bound_ns
            self.unplaced = k.unplaced_write
        else:
            tr = self.transport
            waiting = tr.get_write_buffer_size()
            t = mono_ns()
            tr.write(data)
            t1 = mono_ns()
            if waiting or tr.get_write_buffer_size():
                bound = -1
            else:
                bound = t1 - t
                sock = self._wsock
                if sock is not None and tcp_notsent(sock):  # (TCP still holds bytes: they leave after t1, when unknown)
                    bound = -1
        self.last_write_mono = t
        self.last_write_bound = bound
        return t, bound

    @property
    def reset_by_peer(self) -> bool:
        """The connection ended with a TCP RST from the peer."""
        return isinstance(self.lost_exc, ConnectionResetError)


# The C reader callback (kstamp's ``readable``) hands a read to a protocol that takes data_received above unchanged
# as it would: on_data(data, rx_mono_ns, rx_bound_ns), without its Python frame (one less per read; the method stays the
# definition, which every other path calls; tests/kernel/test_conn_s26_rate.py compares the two)
if kstamp._readable is not None and hasattr(kstamp._pktacc, "stamped_protocol"):
    kstamp._pktacc.stamped_protocol(StampedProtocol.data_received)


def reset(transport: Any) -> None:
    """Close with a TCP RST (``SO_LINGER`` 0): how a relay passes on a peer's reset."""
    if transport is None or transport.is_closing():
        if transport is not None:
            transport.abort()
        return
    sock = transport.get_extra_info("socket")
    try:
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RST)
    except (OSError, AttributeError):
        pass
    transport.abort()


async def open_connection(
    factory: Callable[[], asyncio.Protocol],
    host: str,
    port: int,
    *,
    ssl: _ssl.SSLContext | None = None,
    server_hostname: str | None = None,
    connect_timeout: float | None = None,
) -> tuple[Any, Any]:
    """Connect (happy eyeballs over every address of ``host``) and wrap the socket in a stamped transport where
    the kernel gives stamps; TLS goes through asyncio's own transport. Raises ``OSError`` (refused,
    unreachable, name not found), ``TimeoutError`` or ``ssl.SSLError`` as a plain connect would."""
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(connect_timeout):
        if ssl is not None or not kstamp.enabled():
            return await loop.create_connection(factory, host, port, ssl=ssl, server_hostname=server_hostname if ssl else None)
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        sock = await aiohappyeyeballs.start_connection(addr_infos=infos, happy_eyeballs_delay=0.25, loop=loop)
    return kstamp.connect(loop, sock, factory)


async def start_server(
    factory: Callable[[], asyncio.Protocol], host: str | None, port: int, *, backlog: int = 1024, reuse_port: bool = False,
    ssl: _ssl.SSLContext | None = None,
) -> Any:
    """Listen with stamped transports where the kernel gives stamps (plain TCP), asyncio's own otherwise."""
    if ssl is None and kstamp.enabled():
        return await kstamp.start_server(factory, host, port, backlog=backlog, reuse_address=True, reuse_port=reuse_port)
    loop = asyncio.get_running_loop()
    return await loop.create_server(factory, host, port, backlog=backlog, reuse_address=True, reuse_port=reuse_port or None, ssl=ssl)
