"""Socket-level stamps for aiohttp servers and clients (DESIGN section 7).

A stamp taken in a request handler is late by the request's parsing, the connection's scheduling
and the task switch (0.8-1.3 ms p50 per hop on a loaded 2-core machine). This module takes the
stamps where bytes meet the socket instead, inside the protocol callbacks, and hands them to the
code that needs them. Every stamp is :func:`deltatap.clock.mono_ns`.

Server side (a tap's downstream side, a reference-stack component)::

    runner = make_stamping_runner(app)          # instead of web.AppRunner(app)
    await runner.setup(); await make_stamping_site(runner, host, port).start()

    async def handler(request):
        t_first_byte = request_received_mono_ns(request)   # first byte of this request read
        t_head = request_head_mono_ns(request)             # read that completed the head
        body = await request.read()
        t_body = last_read_mono_ns(request)                 # read that delivered the last byte
        resp = web.StreamResponse(); await resp.prepare(request)
        await resp.write(b"data: ...\\n\\n")
        t_written = last_write_mono_ns(request)             # that write handed to the kernel
        connection_lost_mono_ns(request)                    # when the peer went away, if it did

Client side (a tap's upstream side, a component calling its upstream)::

    session = aiohttp.ClientSession(connector=make_stamping_connector(), auto_decompress=False)
    resp = await session.post(url, data=...)
    up = upstream_stamps(resp)                  # None if the connector does not stamp
    up.request_written_mono_ns                  # last write of the request (headers/body) issued
    up.head_mono_ns                             # read that completed the response head
    async for chunk in resp.content.iter_any():
        consumed += len(chunk)
        for start, end, t in up.slices(consumed - len(chunk), consumed):
            ...                                 # body bytes [start, end) arrived in a read at t

Semantics and limits:

* Where read stamps come from: on Linux, plain-TCP connections of a stamping site or connector
  run on :class:`deltatap.kstamp.KernelStampTransport`, and a read's stamp is the kernel's receive
  stamp of its last packet, which does not move when the process waits for a CPU. Elsewhere (TLS,
  other systems, ``DELTATAP_KERNEL_STAMPS=0``) reads are stamped when ``data_received`` runs.
* "first byte read" is the ``data_received`` call that carried the request's first byte; on a
  keep-alive connection bytes that arrive while a body is still being read belong to that body.
  A pipelined request whose first bytes share a read with the previous request is stamped at the
  read that completes its head.
* "written" is the moment ``transport.write`` was called with the bytes: they
  go to the kernel in that call (or, under back-pressure, to the transport's buffer; aiohttp then
  awaits the drain). Not the moment it returned: on loopback the send wakes the peer, and on a
  busy machine the peer often runs before the writer gets its CPU back (measured: ~0.3 ms p50 on
  a loaded 2-core machine) — time the peer already has the bytes, which a stamp after the call
  would count as the writer's. An empty write is not a write.
* Bounds: every read stamp comes with how much earlier its bytes may have arrived (``last_read_bound_ns``,
  ``request_received_bound_ns``, ``UpstreamStamps.bound_at`` / ``slices(..., bounds=True)``), every write stamp with
  how much later they may have left (``last_write_bound_ns``): 0 where the stamp is exact (see
  :mod:`deltatap.net.kstamp`); with process stamps a read's interval reaches back to the previous read.
* The read log of a client response keeps the last 4096 reads; older entries answer with the
  oldest stamp kept.
* These hook aiohttp's ``RequestHandler``, ``Server`` and ``ResponseHandler`` protocol classes
  (checked against aiohttp 3.11-3.14 by tests/kernel/test_wire.py).
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import functools
from typing import Any

import aiohappyeyeballs
import aiohttp
from aiohttp import web
from aiohttp.client_proto import ResponseHandler
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_server import Server

from deltatap.net import kstamp
from deltatap.core.clock import mono_ns
from deltatap.core.vocab import BOUND_UNKNOWN
from deltatap.net.kstamp import KernelStampTransport
from deltatap.net.pktstamp import tcp_notsent

__all__ = [
    "StampingTransport",
    "UpstreamStamps",
    "connection_lost_mono_ns",
    "last_read_bound_ns",
    "last_read_mono_ns",
    "last_write_bound_ns",
    "last_write_mono_ns",
    "make_stamping_connector",
    "make_stamping_runner",
    "make_stamping_server_runner",
    "make_stamping_site",
    "request_head_mono_ns",
    "request_written_bound",
    "request_received_bound_ns",
    "request_received_mono_ns",
    "upstream_stamps",
]

_KeyType = getattr(web, "RequestKey", None)
_RECEIVED_KEY: Any = _KeyType("deltatap_received_mono_ns", int) if _KeyType else "deltatap_received_mono_ns"
_HEAD_KEY: Any = _KeyType("deltatap_head_mono_ns", int) if _KeyType else "deltatap_head_mono_ns"
_RECEIVED_BOUND_KEY: Any = _KeyType("deltatap_received_bound_ns", int) if _KeyType else "deltatap_received_bound_ns"


def _read_stamp(protocol: Any, rx: KernelStampTransport | None) -> tuple[int, int]:
    """``(stamp, bound)`` of the read being delivered to ``protocol``: the bytes arrived in ``[stamp - bound,
    stamp]``. The kernel's stamp and bound (:attr:`KernelStampTransport.rx_bound_ns`) where the connection has
    them; else the process's own moment, bounded by the previous read on the connection (anything it did not
    take arrived after it)."""
    if rx is not None:
        return rx.rx_mono_ns, rx.rx_bound_ns  # type: ignore[return-value]
    t = mono_ns()
    bound = t - protocol._empty_mono
    protocol._empty_mono = t
    return t, bound


class StampingTransport:
    """Wraps a transport; records when each ``write``/``writelines`` was issued."""

    __slots__ = ("_transport", "last_write_mono_ns", "last_write_bound_ns", "writes", "_sock")

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self.last_write_mono_ns: int | None = None
        self.last_write_bound_ns = 0  # the bytes left at most this much after last_write_mono_ns (the write's duration)
        self.writes = 0
        # its TCP socket (under TLS: the one the records go out on), asked after each write whether TCP holds bytes unsent
        try:
            self._sock = transport.get_extra_info("socket")
        except (AttributeError, TypeError):
            self._sock = None

    def write(self, data: Any) -> None:
        if data:  # an empty write hands nothing to the kernel: not a write to stamp
            self._stamped(self._transport.write, data)
        else:
            self._transport.write(data)

    def writelines(self, lines: Any) -> None:
        if not isinstance(lines, (tuple, list)):
            lines = list(lines)
        if any(lines):
            self._stamped(self._transport.writelines, lines)
        else:
            self._transport.writelines(lines)

    def _stamped(self, call: Any, arg: Any) -> None:
        """Issue one write: stamped when issued; it left within the call unless the transport kept some of it, or
        TCP still holds bytes unsent when it returned (``tcpi_notsent_bytes``; under TLS its records' bytes): then -1,
        unknown, it leaves when the socket drains."""
        t0 = self.last_write_mono_ns = mono_ns()
        self.writes += 1
        call(arg)
        if self._transport.get_write_buffer_size():
            self.last_write_bound_ns = -1
            return
        b = mono_ns() - t0
        sock = self._sock
        self.last_write_bound_ns = -1 if sock is not None and tcp_notsent(sock) else b

    # the calls aiohttp makes often, spelled out to skip __getattr__
    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)

    def close(self) -> None:
        self._transport.close()

    def pause_reading(self) -> None:
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._transport.resume_reading()

    def is_reading(self) -> bool:
        return self._transport.is_reading()

    def abort(self) -> None:
        self._transport.abort()

    @property
    def wrapped(self) -> asyncio.Transport:
        return self._transport

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


_STAMPING = (StampingTransport, KernelStampTransport)


def _wrap_transport(protocol: Any) -> KernelStampTransport | None:
    """In ``connection_made``: make ``protocol.transport`` stamp its writes; return it if its reads
    carry the kernel's receive stamps (a :class:`KernelStampTransport`), else None."""
    tr = protocol.transport
    if isinstance(tr, KernelStampTransport):
        return tr
    if tr is not None and not isinstance(tr, StampingTransport):
        protocol.transport = StampingTransport(tr)
    return None


# --------------------------------------------------------------------------------------------
# Server side
# --------------------------------------------------------------------------------------------


class StampingRequestHandler(RequestHandler):
    """aiohttp's per-connection server protocol, stamping reads and writes at the socket."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._rx: KernelStampTransport | None = None
        self.last_read_mono_ns: int | None = None
        self.last_read_bound_ns = 0
        self._empty_mono = mono_ns()  # (process stamps) the last read: anything read later arrived after it
        self.lost_mono_ns: int | None = None
        self._stamp_pending: tuple[int, int] | None = None
        self._stamp_body: Any = None  # payload of the last request whose body may still be arriving
        self._stamps: collections.deque[tuple[tuple[int, int], tuple[int, int]]] = collections.deque()
        inner = self._request_factory
        if inner is not None:
            self._request_factory = functools.partial(self._stamped_request, inner)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._rx = _wrap_transport(self)

    def connection_lost(self, exc: BaseException | None) -> None:
        self.lost_mono_ns = mono_ns()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        rx = self._rx
        if data:  # aiohttp calls data_received(b"") itself to drain buffered bytes: not a read
            t, bound = _read_stamp(self, rx)
            self.last_read_mono_ns, self.last_read_bound_ns = t, bound
            body = self._stamp_body
            if self._stamp_pending is None and (body is None or body.is_eof()):
                self._stamp_pending = (t, bound)
        else:
            t, bound = mono_ns(), 0
        queued = self._messages
        before = len(queued)
        super().data_received(data)
        new = len(queued) - before
        if new > 0:
            for i in range(new):
                self._stamps.append(((self._stamp_pending if i == 0 and self._stamp_pending is not None else (t, bound)), (t, bound)))
            self._stamp_body = queued[-1][1]
            self._stamp_pending = None

    def _stamped_request(self, inner: Any, message: Any, payload: Any, protocol: Any, writer: Any, task: Any) -> Any:
        request = inner(message, payload, protocol, writer, task)
        if self._stamps:
            (first, first_bound), (head, head_bound) = self._stamps.popleft()
            request[_RECEIVED_KEY] = first
            request[_HEAD_KEY] = head
            if first_bound:
                request[_RECEIVED_BOUND_KEY] = first_bound
        return request


class _StampingServer(Server):
    def __call__(self) -> RequestHandler:
        return StampingRequestHandler(self, loop=self._loop, **self._kwargs)


class _StampingAppRunner(web.AppRunner):
    async def _make_server(self) -> Server:
        plain = await super()._make_server()
        return _StampingServer(
            plain.request_handler,
            request_factory=plain.request_factory,
            handler_cancellation=plain.handler_cancellation,
            loop=plain._loop,
            **plain._kwargs,
        )


def make_stamping_runner(app: web.Application, **kwargs: Any) -> web.AppRunner:
    """A ``web.AppRunner`` whose connections stamp reads and writes (same arguments)."""
    return _StampingAppRunner(app, **kwargs)


def make_stamping_server_runner(
    handler: Any, *, handler_cancellation: bool = False, shutdown_timeout: float = 60.0, **kwargs: Any
) -> web.ServerRunner:
    """A ``web.ServerRunner`` for aiohttp's low-level server (one ``handler(request)`` for every
    request, no router); ``shutdown_timeout`` is how long ``cleanup()`` lets handlers run before
    cancelling them; other ``kwargs`` go to ``web.Server`` (e.g. ``access_log=None``)."""
    server = _StampingServer(handler, handler_cancellation=handler_cancellation, **kwargs)
    return web.ServerRunner(server, shutdown_timeout=shutdown_timeout)


class _StampingSite(web.TCPSite):
    """A ``web.TCPSite`` whose plain-TCP connections run on a :class:`KernelStampTransport`."""

    async def start(self) -> None:
        if self._ssl_context is not None or not kstamp.enabled():
            await super().start()
            return
        self._runner._reg_site(self)
        server = self._runner.server
        assert server is not None
        self._server = await kstamp.start_server(
            server, self._host, self._port, backlog=self._backlog, reuse_address=self._reuse_address, reuse_port=self._reuse_port
        )
        socks = self._server.sockets
        self._bound_port = socks[0].getsockname()[1] if socks else self._port


def make_stamping_site(runner: web.BaseRunner, host: str | None = None, port: int | None = None, **kwargs: Any) -> web.TCPSite:
    """A ``web.TCPSite`` (same arguments) for a stamping runner: on Linux its plain-TCP connections'
    reads carry the kernel's receive stamps (:mod:`deltatap.net.kstamp`) instead of the moment the
    process got to them."""
    return _StampingSite(runner, host, port, **kwargs)


def request_received_mono_ns(request: web.BaseRequest) -> int | None:
    """When the read carrying this request's first byte happened (None without a stamping runner)."""
    return request.get(_RECEIVED_KEY)


def request_head_mono_ns(request: web.BaseRequest) -> int | None:
    """When the read that completed this request's head happened."""
    return request.get(_HEAD_KEY)


def request_received_bound_ns(request: web.BaseRequest) -> int:
    """How much earlier than :func:`request_received_mono_ns` the request's first byte may have arrived (0: exact)."""
    return request.get(_RECEIVED_BOUND_KEY, 0)


def last_read_bound_ns(request: web.BaseRequest) -> int:
    """How much earlier than :func:`last_read_mono_ns` that read's bytes may have arrived (0: exact)."""
    return getattr(request.protocol, "last_read_bound_ns", 0)


def last_write_bound_ns(request: web.BaseRequest) -> int:
    """How much later than :func:`last_write_mono_ns` that write's bytes may have left (0: exact; -1: unknown,
    they waited behind earlier bytes for the socket)."""
    tr = request.transport
    return tr.last_write_bound_ns if isinstance(tr, _STAMPING) else 0


def last_read_mono_ns(request: web.BaseRequest) -> int | None:
    """The latest read on this request's connection; read right after the body's EOF it is
    the arrival of the body's last byte."""
    return getattr(request.protocol, "last_read_mono_ns", None)


def connection_lost_mono_ns(request: web.BaseRequest) -> int | None:
    """When this request's connection was lost (the peer closed or reset it), else None."""
    return getattr(request.protocol, "lost_mono_ns", None)


def last_write_mono_ns(request: web.BaseRequest) -> int | None:
    """When the latest write on this request's connection was issued (e.g. right after
    ``await response.write(chunk)``: when that chunk was handed to the kernel)."""
    tr = request.transport
    return tr.last_write_mono_ns if isinstance(tr, _STAMPING) else None


# --------------------------------------------------------------------------------------------
# Client side
# --------------------------------------------------------------------------------------------


class StampingResponseHandler(ResponseHandler):
    """aiohttp's client connection protocol, stamping reads (with body offsets) and writes."""

    READ_LOG = 4096

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._rx: KernelStampTransport | None = None
        self.last_read_mono_ns: int | None = None
        self.last_read_bound_ns = 0
        self._empty_mono = mono_ns()  # (process stamps) the last read: anything read later arrived after it
        self.head_mono_ns: int | None = None
        self.head_bound_ns = 0
        self.read_totals: collections.deque[int] = collections.deque(maxlen=self.READ_LOG)
        self.read_stamps: collections.deque[int] = collections.deque(maxlen=self.READ_LOG)
        self.read_bounds: collections.deque[int] = collections.deque(maxlen=self.READ_LOG)
        self.responses = 0
        self.lost_mono_ns: int | None = None

    def connection_lost(self, exc: BaseException | None) -> None:
        self.lost_mono_ns = mono_ns()
        super().connection_lost(exc)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._rx = _wrap_transport(self)

    def data_received(self, data: bytes) -> None:
        rx = self._rx
        if data:
            t, bound = _read_stamp(self, rx)
            self.last_read_mono_ns, self.last_read_bound_ns = t, bound
        else:
            t, bound = mono_ns(), 0
        before = self._payload
        super().data_received(data)
        payload = self._payload
        if payload is None:
            return
        if payload is not before:
            self.responses += 1
            self.head_mono_ns, self.head_bound_ns = t, bound
            self.read_totals.clear()
            self.read_stamps.clear()
            self.read_bounds.clear()
        total = getattr(payload, "total_bytes", 0)
        if not self.read_totals or total > self.read_totals[-1]:
            self.read_totals.append(total)
            self.read_stamps.append(t)
            self.read_bounds.append(bound)


class _StampingConnector(aiohttp.TCPConnector):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._factory = functools.partial(StampingResponseHandler, loop=self._loop)
        self._rx_stamps = kstamp.enabled()

    async def _wrap_create_connection(
        self,
        *args: Any,
        addr_infos: list[Any],
        req: Any,
        timeout: aiohttp.ClientTimeout,
        client_error: type[Exception] = aiohttp.ClientConnectorError,
        **kwargs: Any,
    ) -> tuple[asyncio.Transport, Any]:
        """Plain TCP: connect as aiohttp does (happy eyeballs, ``sock_connect`` timeout), then read
        through a :class:`KernelStampTransport`; TLS: aiohttp's own path."""
        if not self._rx_stamps or kwargs.get("ssl"):
            return await super()._wrap_create_connection(
                *args, addr_infos=addr_infos, req=req, timeout=timeout, client_error=client_error, **kwargs
            )
        extra: dict[str, Any] = {}
        if getattr(self, "_socket_factory", None) is not None:
            extra["socket_factory"] = self._socket_factory
        try:
            async with asyncio.timeout(timeout.sock_connect):
                sock = await aiohappyeyeballs.start_connection(
                    addr_infos=addr_infos, local_addr_infos=self._local_addr_infos,
                    happy_eyeballs_delay=self._happy_eyeballs_delay, interleave=self._interleave, loop=self._loop, **extra,
                )
        except OSError as exc:
            if exc.errno is None and isinstance(exc, asyncio.TimeoutError):
                raise
            raise client_error(req.connection_key, exc) from exc
        return kstamp.connect(self._loop, sock, args[0])  # type: ignore[return-value]


def make_stamping_connector(**kwargs: Any) -> aiohttp.TCPConnector:
    """A ``TCPConnector`` (same keyword arguments) whose connections stamp reads and writes."""
    return _StampingConnector(**kwargs)


def request_written_bound(written_mono_ns: int | None, write_bound_ns: int, head_mono_ns: int | None) -> int:
    """How much after ``written_mono_ns`` a request's last byte may have left, given its write's bound (-1: it
    waited behind earlier bytes for the socket, or TCP still held its bytes when the write returned): then it had left
    by the time the response head arrived (``head_mono_ns``: the server answers a request it has read); without a
    head, unknown (:data:`deltatap.core.vocab.BOUND_UNKNOWN`, never 0). Shared by :class:`UpstreamStamps` and the load
    generator's own client."""
    if write_bound_ns >= 0:
        return write_bound_ns
    if head_mono_ns is None or written_mono_ns is None:
        return BOUND_UNKNOWN
    return max(0, head_mono_ns - written_mono_ns)


class UpstreamStamps:
    """Socket stamps of one client response, taken from its connection's protocol."""

    __slots__ = ("_proto", "_transport", "request_written_mono_ns", "request_written_bound_ns", "head_mono_ns", "head_bound_ns", "_response_no")

    def __init__(self, proto: StampingResponseHandler) -> None:
        self._proto = proto
        tr = proto.transport
        self._transport = tr if isinstance(tr, _STAMPING) else None
        self.request_written_mono_ns = self._transport.last_write_mono_ns if self._transport else None
        self.head_mono_ns = proto.head_mono_ns
        self.head_bound_ns = proto.head_bound_ns
        self._response_no = proto.responses
        after = self._transport.last_write_bound_ns if self._transport else 0
        # the request's last byte left at most this much after it was written
        self.request_written_bound_ns = request_written_bound(self.request_written_mono_ns, after, self.head_mono_ns)

    @property
    def kernel_stamps(self) -> bool:
        """Whether this connection's read stamps are the kernel's receive stamps (:mod:`deltatap.net.kstamp`)."""
        return self._proto._rx is not None

    @property
    def connection_lost_mono_ns(self) -> int | None:
        """When the upstream connection was lost, if it was."""
        return self._proto.lost_mono_ns

    def _read_index(self, body_end: int) -> int | None:
        """Index in the read log of the read that delivered body byte ``body_end - 1`` (None: not in the log)."""
        totals = self._proto.read_totals
        if self._proto.responses != self._response_no or not totals:
            return None
        return min(bisect.bisect_left(totals, body_end), len(totals) - 1)

    def arrival_mono_ns(self, body_end: int) -> int | None:
        """When the read that delivered body byte ``body_end - 1`` happened."""
        i = self._read_index(body_end)
        return self._proto.last_read_mono_ns if i is None else self._proto.read_stamps[i]

    def bound_at(self, body_end: int) -> int:
        """How much earlier than :meth:`arrival_mono_ns` (``body_end``) those bytes may have arrived (0: exact)."""
        i = self._read_index(body_end)
        return self._proto.last_read_bound_ns if i is None else self._proto.read_bounds[i]

    def slices(self, start: int, end: int, bounds: bool = False) -> list[tuple[int, ...]]:
        """Split body bytes ``[start, end)`` at read boundaries: ``[(start, end, t_mono_ns), ...]``; with ``bounds``,
        ``[(start, end, t_mono_ns, bound_ns), ...]`` (the bytes arrived in ``[t - bound, t]``)."""
        proto = self._proto
        totals, stamps, rb = proto.read_totals, proto.read_stamps, proto.read_bounds
        if proto.responses != self._response_no or not stamps:
            t = proto.last_read_mono_ns or mono_ns()
            return [(start, end, t, proto.last_read_bound_ns)] if bounds else [(start, end, t)]
        out: list[tuple[int, ...]] = []
        i = bisect.bisect_right(totals, start)
        pos = start
        while pos < end:
            if i >= len(totals):
                out.append((pos, end, stamps[-1], rb[-1]) if bounds else (pos, end, stamps[-1]))
                break
            stop = min(end, totals[i])
            if stop > pos:
                out.append((pos, stop, stamps[i], rb[i]) if bounds else (pos, stop, stamps[i]))
            pos = stop
            i += 1
        return out


def upstream_stamps(resp: aiohttp.ClientResponse) -> UpstreamStamps | None:
    """Stamps for ``resp`` (call right after the response head arrived); None without a stamping connector."""
    conn = resp.connection
    # a response that arrived whole may already have released its connection: the response
    # still knows its protocol (aiohttp sets ``_protocol`` when the head is read)
    proto = conn.protocol if conn is not None else getattr(resp, "_protocol", None)
    if not isinstance(proto, StampingResponseHandler):
        return None
    return UpstreamStamps(proto)
