"""The load generator's HTTP/1.1 client: a keep-alive connection pool on stamped asyncio protocols.

No HTTP library sits between the socket and the record. A connection is a
:class:`deltatap.net.conn.StampedProtocol` (every read arrives with its kernel stamp and bound, every write
returns its departure and bound) framed by :class:`deltatap.net.h1.Reader`; one request runs at a time on it:

* the request is serialised once into bytes (:meth:`H1Pool.serialise`: request line, ``Host``, the caller's
  headers in their order, ``Content-Length``, the body) and written with one ``send``: its ``(t, bound)`` is
  the request's written point (a write that had to wait is resolved by
  :func:`deltatap.net.wire.request_written_bound`: it had left when the response head arrived);
* the read that completes the final response head is its stamp (``1xx`` interim heads are skipped); body
  payload slices (chunked framing removed by the reader) go, as read and with that read's ``(t, bound)``,
  straight into the exchange's sink — the caller's :class:`~deltatap.loadgen.stream.ClientStream` for an
  event stream, read up to :data:`STREAM_LIMIT` bytes (past it the request fails and the connection closes: a server
  streaming without end cannot fill the client's memory) — or, for any other answer, are kept up to
  :data:`BODY_LIMIT` bytes (an error's message);
* the exchange ends at the response's end (Content-Length, chunked, or the server's close for a
  close-delimited body); the connection goes back to the pool when both sides mean to keep it.

Failures are one line each: connect errors raise :class:`ConnectFailed` (``cannot connect to HOST:PORT
(connection refused | host name not found | connect timed out | certificate verify failed: ...)``); a
connection that ends before the response did sets :attr:`Exchange.error`. A server that closed an idle
keep-alive connection is met by one transparent retry on a new connection, only when nothing of the response
came (the request may not have been seen). Timeouts: the connect's (``connect_timeout``) here; the whole
exchange's is the caller's (``asyncio.timeout``); a cancelled exchange closes its connection. ``https``
verifies the server's certificate against the system's trust store (``SSL_CERT_FILE`` / ``SSL_CERT_DIR``).
"""

from __future__ import annotations

import asyncio
import errno as _errno
import os
import socket
import ssl as _ssl
from collections.abc import Callable
from typing import Protocol
from urllib.parse import urlsplit

from deltatap import __version__
from deltatap.net.conn import StampedProtocol, open_connection
from deltatap.net.h1 import BODY, END, HEAD, Head, Reader

__all__ = ["BODY_LIMIT", "ConnectFailed", "Exchange", "H1Pool", "cannot_connect", "connect_reason"]

BODY_LIMIT = 64 * 1024  # bytes of a non-stream answer kept (an error's message); a longer one ends the connection
STREAM_LIMIT = 32 << 20  # bytes of one event stream read (~150k tokens of OpenAI chunks); past it the request fails
USER_AGENT = f"deltatap-loadgen/{__version__}"


class Sink(Protocol):
    def feed(self, data: bytes, t_mono_ns: int, bound_ns: int = 0) -> None: ...


class ConnectFailed(Exception):
    """The connection could not be made; the message is one line (``cannot connect to HOST:PORT (why)``)."""


def cannot_connect(host: str, port: int, why: str) -> str:
    host = f"[{host}]" if ":" in host else host
    return f"cannot connect to {host}:{port} ({why})"


def connect_reason(exc: BaseException) -> str:
    """A connect failure in a few plain words: connection refused, host name not found, certificate verify failed..."""
    if isinstance(exc, _ssl.SSLCertVerificationError):
        return f"certificate verify failed: {exc.verify_message or exc.reason}"
    if isinstance(exc, _ssl.SSLError):
        return f"TLS handshake failed: {exc.reason or exc}"
    code = getattr(exc, "errno", None)
    if isinstance(exc, socket.gaierror) or code in (-2, -3, -5, -8):
        return "host name not found"
    if code == _errno.ECONNREFUSED:
        return "connection refused"
    if isinstance(code, int) and code > 0:
        return os.strerror(code).lower()
    if isinstance(exc, (TimeoutError, asyncio.TimeoutError)):
        return "connect timed out"
    return str(exc) or type(exc).__name__


class Exchange:
    """One request and its response, as the connection saw them (mono_ns stamps of this process)."""

    __slots__ = (
        "new_sink", "fut", "head", "head_mono_ns", "head_bound_ns", "sink", "kept", "kept_bytes", "body_bytes",
        "last_mono_ns", "last_bound_ns", "written_mono_ns", "written_bound_ns", "error", "got_bytes", "retry", "on_end",
    )

    def __init__(self, new_sink: Callable[[Head], Sink | None] | None = None, on_end: Callable[[], None] | None = None) -> None:
        self.new_sink = new_sink  # called with the final head: a sink for the body, or None to keep it
        # called (in the connection's callback) when the exchange ends, for an exchange nobody awaits (no ``fut``):
        # the load generator's callback-driven requests (loadgen/runner.py Flight)
        self.on_end = on_end
        self.reset()

    def reset(self) -> None:
        self.fut: asyncio.Future[None] | None = None
        self.head: Head | None = None
        self.head_mono_ns: int | None = None
        self.head_bound_ns = 0
        self.sink: Sink | None = None
        self.kept: list[bytes] = []
        self.kept_bytes = 0
        self.body_bytes = 0
        self.last_mono_ns: int | None = None  # the read that delivered the latest body byte
        self.last_bound_ns = 0
        self.written_mono_ns: int | None = None
        self.written_bound_ns = 0  # -1: the write waited for the socket (see the module doc)
        self.error: str | None = None  # the connection ended (or broke framing) before the response did
        self.got_bytes = False
        self.retry = False

    @property
    def status(self) -> int | None:
        return self.head.status if self.head is not None else None

    @property
    def body(self) -> bytes:
        """What was kept of a body that went to no sink."""
        return b"".join(self.kept)

    def header(self, lname: bytes) -> str:
        v = self.head.get(lname) if self.head is not None else None
        return v.decode("latin-1") if v is not None else ""

    def _done(self) -> None:
        fut = self.fut
        if fut is not None:
            if not fut.done():
                fut.set_result(None)
        elif self.on_end is not None:
            self.on_end()


class _Conn(StampedProtocol):
    __slots__ = ("pool", "reader", "ex", "dead", "exchanges", "_keep")

    def __init__(self, pool: H1Pool) -> None:
        self.pool = pool
        self.reader = Reader(False)
        self.ex: Exchange | None = None
        self.dead = False
        self.exchanges = 0
        self._keep = True

    # ---- one exchange ---------------------------------------------------------------------
    def start(self, ex: Exchange, method: bytes, data: bytes) -> None:
        self.ex = ex
        self.exchanges += 1
        self.reader.expect(method)
        ex.written_mono_ns, ex.written_bound_ns = self.send(data)

    def on_data(self, data: bytes, t: int, bound: int) -> None:
        pre = self.pool.before_read
        if pre is not None:
            pre()
        ex = self.ex
        if ex is None or self.dead:  # bytes nobody asked for: the connection is not usable any more
            self._drop()
            return
        ex.got_bytes = True
        for ev in self.reader.feed(data):
            kind = ev[0]
            if kind == BODY:
                if ex is None:
                    continue
                s, e = ev[1], ev[2]
                chunk = data[s:e]  # (all of a bytes read: the read itself, not a copy)
                ex.body_bytes += e - s
                ex.last_mono_ns, ex.last_bound_ns = t, bound
                sink = ex.sink
                if sink is not None:
                    sink.feed(chunk, t, bound)
                    if ex.body_bytes > STREAM_LIMIT:  # a stream without end (or a server sending gigabytes): stop here
                        ex.error = (f"the answer passed {STREAM_LIMIT >> 20} MiB; the client stopped reading it and closed "
                                    f"the connection (a stream without end?)")
                        self._keep = False
                        self._finish(ex)
                        self._drop()
                        return
                elif ex.kept_bytes <= BODY_LIMIT:
                    ex.kept.append(chunk)
                    ex.kept_bytes += e - s
                    if ex.kept_bytes > BODY_LIMIT:  # enough of it: the rest is not read
                        self._keep = False
                        self._finish(ex)
                        ex = None
            elif kind == HEAD:
                head: Head = ev[3]
                if ex is None:
                    self._drop()
                    return
                if head.status < 200:
                    if head.status == 101:
                        ex.error = "the server switched protocols (HTTP 101) instead of answering"
                        self._keep = False
                        self._finish(ex)
                        ex = None
                    continue  # interim (100, 103): the final head follows
                ex.head, ex.head_mono_ns, ex.head_bound_ns = head, t, bound
                self._keep = head.keep_alive
                if ex.new_sink is not None:
                    ex.sink = ex.new_sink(head)
            elif kind == END:
                if ex is not None:
                    self._finish(ex)
                    ex = None
            else:  # ERROR
                if ex is not None:
                    ex.error = f"not an HTTP/1.1 response the client can read ({ev[2]})"
                self._keep = False
                if ex is not None:
                    self._finish(ex)
                self._drop()
                return

    def cuts_received(self, data: bytes, pieces: list[tuple[int, int, int, int]]) -> None:
        """A late read that held several packets (:mod:`deltatap.net.kstamp`, its C path): each piece read as if it had
        come alone, with its own arrival, as the transport would hand them over one by one."""
        for s, e, t, bound in pieces:
            self.on_data(data[s:e], t, bound)  # (a bytes slice of all of it is the read itself)
            if self.dead:
                return

    def on_eof(self) -> bool | None:
        ex = self.ex
        self.dead = True
        if ex is not None:
            for ev in self.reader.feed_eof():
                if ev[0] == END:  # a close-delimited body ends here
                    self._keep = False
                    self._finish(ex)
                    return None
            self._fail_closed(ex, None)
        return None  # (the transport closes)

    def on_lost(self, exc: BaseException | None) -> None:
        self.dead = True
        ex = self.ex
        if ex is not None:
            self._fail_closed(ex, exc)
        self.pool._forget(self)

    def _fail_closed(self, ex: Exchange, exc: BaseException | None) -> None:
        self.ex = None
        if not ex.got_bytes and self.exchanges > 1:
            ex.retry = True  # a reused connection the server had closed: nothing of this response came
        elif exc is not None and not isinstance(exc, (EOFError,)):
            ex.error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        elif ex.head is None:
            ex.error = ("the server closed the connection in the middle of the response head" if ex.got_bytes else
                        "the server closed the connection before the response head")
        else:
            ex.error = f"the server closed the connection before the response ended ({ex.body_bytes} body bytes read)"
        ex._done()

    def _finish(self, ex: Exchange) -> None:
        self.ex = None
        self.pool._release(self, self._keep and self.reader.idle)  # (first: whoever the end wakes may take it at once)
        ex._done()

    def _drop(self) -> None:
        self.dead = True
        tr = self.transport
        if tr is not None and not tr.is_closing():
            tr.close()

    def abandon(self) -> None:
        """The exchange on this connection will not be read (its task was cancelled): close the connection."""
        self.ex = None
        self._drop()

    @property
    def usable(self) -> bool:
        tr = self.transport
        return not self.dead and tr is not None and not tr.is_closing()


class H1Pool:
    """Keep-alive connections to one origin (one pool per worker; unlimited connections, no cookies)."""

    def __init__(self, url: str, connect_timeout: float = 10.0, header_names: tuple[str, ...] = (), method: str = "POST") -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{url!r}: expected an http:// or https:// URL")
        self.url = url
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.tls = parts.scheme == "https"
        self.ssl: _ssl.SSLContext | None = _ssl.create_default_context() if self.tls else None
        self.connect_timeout = connect_timeout
        self.method = method.encode("ascii")
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        given = {n.lower() for n in header_names}
        default_port = self.port == (443 if self.tls else 80)
        netloc = f"[{self.host}]" if ":" in self.host else self.host
        lines = [f"{method} {target} HTTP/1.1"]
        if "host" not in given:
            lines.append(f"Host: {netloc}" + ("" if default_port else f":{self.port}"))
        if "user-agent" not in given:
            lines.append(f"User-Agent: {USER_AGENT}")
        self._prefix = "\r\n".join(lines) + "\r\n"
        self._idle: list[_Conn] = []
        # called before each read is handled (a read's stamp is the socket's, not taken here): the open loop's sends
        # that are due go out first (loadgen/runner.py SendClock.release_due)
        self.before_read: Callable[[], None] | None = None
        self._all: set[_Conn] = set()
        self.closed = False
        self.opened = 0  # connections made so far

    def serialise(self, headers: dict[str, str], body: bytes) -> bytes:
        """The whole request as bytes: head (the pool's request line and Host, then ``headers`` in order,
        ``Content-Length``) and body."""
        try:  # (": ".join of each (name, value) pair: no Python step per header)
            lines = "\r\n".join(map(": ".join, headers.items()))
        except TypeError:  # a value that is not a string: formatted
            lines = "\r\n".join([f"{k}: {v}" for k, v in headers.items()])
        head = self._prefix + lines + ("\r\n" if lines else "") + f"Content-Length: {len(body)}\r\n\r\n"
        return head.encode() + body

    async def _open(self) -> _Conn:
        try:
            _tr, proto = await open_connection(
                lambda: _Conn(self), self.host, self.port, ssl=self.ssl, server_hostname=self.host if self.tls else None,
                connect_timeout=self.connect_timeout,
            )
        except (TimeoutError, asyncio.TimeoutError):
            raise ConnectFailed(cannot_connect(self.host, self.port, "connect timed out")) from None
        except (OSError, _ssl.SSLError) as exc:
            raise ConnectFailed(cannot_connect(self.host, self.port, connect_reason(exc))) from None
        self.opened += 1
        if self.closed:
            proto.transport.close()
            raise ConnectFailed(cannot_connect(self.host, self.port, "the client is closing"))
        self._all.add(proto)
        return proto

    async def acquire(self) -> tuple[_Conn, bool]:
        """An idle connection (the most recently used) or a new one; ``(conn, reused)``."""
        idle = self._idle
        while idle:
            c = idle.pop()
            if c.usable:
                return c, True
        return await self._open(), False

    def _release(self, c: _Conn, keep: bool) -> None:
        if keep and c.usable and not self.closed:
            self._idle.append(c)
        else:
            c._drop()

    def _forget(self, c: _Conn) -> None:
        self._all.discard(c)

    def start_now(self, ex: Exchange, data: bytes, method: bytes | None = None) -> _Conn | None:
        """Write ``data`` now, without yielding, on an idle connection (the most recently used); None when there is
        none (then :meth:`exchange` opens one). Pass the connection to :meth:`exchange` as ``started``."""
        idle = self._idle
        while idle:
            c = idle.pop()
            if c.usable:
                if ex.on_end is None:
                    ex.fut = asyncio.get_running_loop().create_future()
                c.start(ex, method or self.method, data)
                return c
        return None

    async def exchange(self, ex: Exchange, data: bytes, method: bytes | None = None, started: _Conn | None = None,
                       retried: bool = False) -> Exchange:
        """Send ``data`` (one serialised request) and wait for the whole response, filling ``ex``. Raises
        :class:`ConnectFailed`; a broken response is ``ex.error``. Cancelling closes the connection. ``started``:
        the connection :meth:`start_now` already wrote ``data`` on (a reused one). ``retried``: the first attempt was
        made elsewhere (a reused connection the server had closed, ``ex.retry``): this is the one retry, on a new
        connection or another idle one."""
        loop = asyncio.get_running_loop()
        for attempt in ((1,) if retried else (0, 1)):
            if attempt == 0 and started is not None:
                conn, reused = started, True
            else:
                conn, reused = await self.acquire()
                if attempt:
                    ex.reset()
                ex.fut = loop.create_future()
                conn.start(ex, method or self.method, data)
            try:
                await ex.fut
            except BaseException:
                conn.ex = None
                conn._drop()
                raise
            if ex.retry and reused and attempt == 0:
                continue
            if ex.retry:  # (a new connection closed without a byte: no second retry)
                ex.retry = False
                ex.error = "the server closed the connection before the response head"
            break
        return ex

    async def preconnect(self, count: int) -> int:
        """Open ``count`` connections now (no request on them), idle in the pool; returns how many opened."""
        results = await asyncio.gather(*(self._open() for _ in range(max(1, count))), return_exceptions=True)
        ok = [c for c in results if isinstance(c, _Conn)]
        self._idle.extend(ok)
        return len(ok)

    async def close(self) -> None:
        self.closed = True
        self._idle.clear()
        for c in list(self._all):
            c._drop()
        self._all.clear()
        await asyncio.sleep(0)  # (the transports' connection_lost callbacks run)
