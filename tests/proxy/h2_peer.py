"""A real HTTP/2 server for the tap's h2 tests (h2c prior knowledge, or TLS with ALPN h2), built on the ``h2``
library over :mod:`deltatap.net.conn`'s stamped connections: each write's departure is the server's own truth.

Routes (by ``:path``):

* ``/v1/chat/completions?first_ms=F&gap_ms=G&n=N[&hang=1]``: SSE, a role-only event at once, the first content token
  ``F`` ms later, then ``N - 1`` more every ``G`` ms, usage, ``[DONE]`` (``hang=1``: nothing after the tokens).
* ``/echo``: the request body back, in the DATA frames it came in; request trailers come back as response trailers;
  a 103 first when the request has ``x-early-hints: 1``.
* ``/hang``: response headers, then nothing (until the client resets the stream).
* ``/reset?code=C``: response headers and one event, then RST_STREAM with error code ``C``.
* ``/goaway?...``: a GOAWAY naming this stream as the last (a graceful shutdown, as nghttp2 and Go servers do it),
  then the SSE stream as above to its end; the connection closes once its streams are over.
* ``/silent``: no answer at all.
* ``/close``: the server closes the whole connection (every stream on it breaks).

``max_streams``: the server's SETTINGS_MAX_CONCURRENT_STREAMS; ``window``: its connection-level receive window.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
import hyperframe.frame

from deltatap.core.clock import mono_ns
from deltatap.net.conn import StampedProtocol, start_server

ROLE = b'data: {"object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":null}}]}\n\n'


@dataclass
class PeerLog:
    """What the server saw and when (its own stamps, the process's monotonic clock)."""

    requests: list[list[tuple[bytes, bytes]]] = field(default_factory=list)  # header lists as received, in order
    trailers: list[list[tuple[bytes, bytes]]] = field(default_factory=list)
    head_written: list[int] = field(default_factory=list)
    token_written: list[list[int]] = field(default_factory=list)
    resets: list[tuple[int, int]] = field(default_factory=list)  # (error code, mono) of RST_STREAM received
    connections: int = 0  # connections that carried a request (the tap's start-up TCP probe carries none)
    echo_sent: list[int] = field(default_factory=list)  # body bytes each /echo stream handed to the connection so far
    send_window: list[int] = field(default_factory=list)  # at each request: what the connection lets the server send


class _Conn(StampedProtocol):
    def __init__(self, log: PeerLog, max_streams: int, window: int) -> None:
        self.window = window
        self.log = log
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding=None,
                                                                          normalize_inbound_headers=False))
        self.conn.local_settings = h2.settings.Settings(client=False, initial_values={
            h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: max_streams})
        self.going_away = False
        self.bodies: dict[int, list[bytes]] = {}
        self.tasks: dict[int, asyncio.Task] = {}
        self.windows: dict[int, asyncio.Event] = {}
        self.pending: dict[int, list[tuple[bytes, bytes]]] = {}  # request headers of streams whose body is coming
        self.trailers: dict[int, list[tuple[bytes, bytes]]] = {}
        self.counted = False

    def on_made(self) -> None:
        self.conn.initiate_connection()
        if self.window > 65_535:
            self.conn.increment_flow_control_window(self.window - 65_535)
        self.flush()

    def flush(self) -> tuple[int, int]:
        out = self.conn.data_to_send()
        if out and not self.transport.is_closing():
            return self.send(out)
        return mono_ns(), 0

    def on_data(self, data: bytes, t: int, bound: int) -> None:
        try:
            events = self.conn.receive_data(data)
        except h2.exceptions.ProtocolError:
            self.flush()
            self.transport.close()
            return
        for ev in events:
            if isinstance(ev, h2.events.RequestReceived):
                if not self.counted:
                    self.counted = True
                    self.log.connections += 1
                self.log.requests.append(list(ev.headers))
                self.log.send_window.append(self.conn.outbound_flow_control_window)
                self.bodies[ev.stream_id] = []
                if ev.stream_ended:
                    self._respond(ev.stream_id, list(ev.headers), None)
                else:
                    self.pending[ev.stream_id] = list(ev.headers)
            elif isinstance(ev, h2.events.DataReceived):
                self.bodies.setdefault(ev.stream_id, []).append(ev.data)
                self.conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
            elif isinstance(ev, h2.events.TrailersReceived):
                self.log.trailers.append(list(ev.headers))
                self.trailers[ev.stream_id] = list(ev.headers)
            elif isinstance(ev, h2.events.StreamEnded):
                headers = self.pending.pop(ev.stream_id, None)
                if headers is not None:
                    self._respond(ev.stream_id, headers, self.trailers.pop(ev.stream_id, None))
            elif isinstance(ev, h2.events.StreamReset):
                self.log.resets.append((ev.error_code, t))
                task = self.tasks.pop(ev.stream_id, None)
                if task is not None:
                    task.cancel()
            elif isinstance(ev, h2.events.WindowUpdated):
                for w in self.windows.values():
                    w.set()
        self.flush()

    def _respond(self, sid: int, headers: list[tuple[bytes, bytes]], trailers: list[tuple[bytes, bytes]] | None) -> None:
        path = dict(headers)[b":path"].decode()
        route, _, query = path.partition("?")
        q = dict(p.split("=", 1) for p in query.split("&") if "=" in p)
        c = self.conn
        if route == "/v1/chat/completions":
            self.tasks[sid] = asyncio.ensure_future(self._sse(sid, q))
        elif route == "/goaway":
            self.flush()
            self.send(hyperframe.frame.GoAwayFrame(0, last_stream_id=sid, error_code=0).serialize())
            self.going_away = True
            self.tasks[sid] = asyncio.ensure_future(self._sse(sid, q))
        elif route == "/silent":
            self.tasks[sid] = asyncio.ensure_future(asyncio.sleep(3600))
        elif route == "/close":
            self.transport.close()
        elif route == "/echo":
            if dict(headers).get(b"x-early-hints") == b"1":
                c.send_headers(sid, [(b":status", b"103"), (b"link", b"</a.css>; rel=preload")])
            c.send_headers(sid, [(b":status", b"200"), (b"content-type", b"application/octet-stream"), (b"x-echo", b"1")])
            chunks = self.bodies.pop(sid, [])
            self.tasks[sid] = asyncio.ensure_future(self._send_body(sid, chunks, trailers))
        elif route == "/hang":
            c.send_headers(sid, [(b":status", b"200"), (b"content-type", b"text/event-stream")])
            self.tasks[sid] = asyncio.ensure_future(asyncio.sleep(3600))
        elif route == "/reset":
            c.send_headers(sid, [(b":status", b"200"), (b"content-type", b"text/event-stream")])
            c.send_data(sid, b'data: {"choices":[{"delta":{"content":"x"}}]}\n\n')
            self.tasks[sid] = asyncio.ensure_future(self._reset_later(sid, int(q.get("code", "2"))))
        else:
            c.send_headers(sid, [(b":status", b"404")], end_stream=True)

    async def _send_body(self, sid: int, chunks: list[bytes], trailers: list[tuple[bytes, bytes]] | None) -> None:
        k = len(self.log.echo_sent)
        self.log.echo_sent.append(0)
        for chunk in chunks:
            view = memoryview(chunk)
            while view:
                room = min(self.conn.local_flow_control_window(sid), self.conn.max_outbound_frame_size)
                if room <= 0:
                    ev = self.windows.setdefault(sid, asyncio.Event())
                    ev.clear()
                    await ev.wait()
                    continue
                self.conn.send_data(sid, bytes(view[:room]))
                self.log.echo_sent[k] += room if room < len(view) else len(view)
                view = view[room:]
                self.flush()
        if trailers is not None:
            self.conn.send_headers(sid, trailers, end_stream=True)
        else:
            self.conn.end_stream(sid)
        self.windows.pop(sid, None)
        self.flush()

    async def _reset_later(self, sid: int, code: int) -> None:
        await asyncio.sleep(0.02)
        self.conn.reset_stream(sid, code)
        self.flush()

    async def _sse(self, sid: int, q: dict[str, str]) -> None:
        first_ms, gap_ms, n = float(q.get("first_ms", 50)), float(q.get("gap_ms", 5)), int(q.get("n", 5))
        c = self.conn
        c.send_headers(sid, [(b":status", b"200"), (b"content-type", b"text/event-stream"), (b"x-upstream", b"h2-peer")])
        self.log.head_written.append(self.flush()[0])
        c.send_data(sid, ROLE)
        self.flush()
        written: list[int] = []
        self.log.token_written.append(written)
        await asyncio.sleep(first_ms / 1000)
        for i in range(n):
            if i:
                await asyncio.sleep(gap_ms / 1000)
            chunk = {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": f"t{i}"}}]}
            c.send_data(sid, f"data: {json.dumps(chunk)}\n\n".encode())
            written.append(self.flush()[0])
        if q.get("hang") == "1":
            await asyncio.sleep(3600)
        c.send_data(sid, b'data: {"object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":7,"completion_tokens":%d}}\n\n' % n)
        c.send_data(sid, b"data: [DONE]\n\n", end_stream=True)
        self.flush()
        self.tasks.pop(sid, None)
        if self.going_away and not self.tasks:
            self.transport.close()

    def on_lost(self, exc: BaseException | None) -> None:
        for task in self.tasks.values():
            task.cancel()


@dataclass
class H2Peer:
    url: str
    port: int
    log: PeerLog
    server: asyncio.AbstractServer

    async def close(self) -> None:
        self.server.close()


async def start_h2_peer(ssl_context=None, max_streams: int = 100, port: int = 0, window: int = 65_535) -> H2Peer:
    """The server on 127.0.0.1 (``port`` 0: a free one); with ``ssl_context`` (ALPN h2 set on it here), over TLS.
    (benchmarks/h2_overhead.py runs it as its upstream too.)"""
    log = PeerLog()
    if ssl_context is not None:
        ssl_context.set_alpn_protocols(["h2"])
    server = await start_server(lambda: _Conn(log, max_streams, window), "127.0.0.1", port, ssl=ssl_context)
    port = server.sockets[0].getsockname()[1]
    return H2Peer(f"{'https' if ssl_context else 'http'}://127.0.0.1:{port}", port, log, server)


@dataclass
class Reply:
    """One stream as the client saw it."""

    informational: list[list[tuple[bytes, bytes]]] = field(default_factory=list)
    headers: list[tuple[bytes, bytes]] | None = None
    data: bytearray = field(default_factory=bytearray)
    frames: list[int] = field(default_factory=list)  # arrival (mono) of each DATA frame
    trailers: list[tuple[bytes, bytes]] | None = None
    reset: int | None = None  # RST_STREAM error code received
    done: asyncio.Event = field(default_factory=asyncio.Event)
    pending_ack: int = 0  # flow-controlled bytes not acknowledged yet (auto_ack off)

    @property
    def status(self) -> int:
        return int(dict(self.headers or [])[b":status"])


class H2Client:
    """A real HTTP/2 client (h2c prior knowledge, or TLS with ALPN h2) on asyncio streams. With ``auto_ack`` off,
    received DATA is not credited back until :meth:`ack` (the client stops reading, as a slow consumer does)."""

    def __init__(self, auto_ack: bool = True) -> None:
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None,
                                                                          normalize_inbound_headers=False))
        self.auto_ack = auto_ack
        self.replies: dict[int, Reply] = {}
        self.goaway: int | None = None  # the error code of a GOAWAY received
        self.goaway_last: int | None = None
        self.closed = asyncio.Event()
        self.window = asyncio.Event()  # set at each WINDOW_UPDATE

    async def connect(self, host: str, port: int, ssl_context=None, window: int = 65_535) -> H2Client:
        """Connect; ``window``: the connection-level receive window to allow the server (enlarged at once, as curl does)."""
        if ssl_context is not None:
            ssl_context.set_alpn_protocols(["h2"])
        self.reader, self.writer = await asyncio.wait_for(asyncio.open_connection(host, port, ssl=ssl_context), 5)
        self.conn.initiate_connection()
        if window > 65_535:
            self.conn.increment_flow_control_window(window - 65_535)
        self._flush()
        self.task = asyncio.ensure_future(self._read())
        return self

    def _flush(self) -> None:
        out = self.conn.data_to_send()
        if out:
            self.writer.write(out)

    async def _read(self) -> None:
        try:
            while True:
                data = await self.reader.read(65536)
                if not data:
                    break
                t = mono_ns()
                for ev in self.conn.receive_data(data):
                    r = self.replies.get(getattr(ev, "stream_id", 0))
                    if isinstance(ev, h2.events.ResponseReceived):
                        r.headers = list(ev.headers)
                    elif isinstance(ev, h2.events.InformationalResponseReceived):
                        r.informational.append(list(ev.headers))
                    elif isinstance(ev, h2.events.DataReceived):
                        r.data += ev.data
                        r.frames.append(t)
                        if self.auto_ack:
                            self.conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                        else:
                            r.pending_ack += ev.flow_controlled_length
                    elif isinstance(ev, h2.events.TrailersReceived):
                        r.trailers = list(ev.headers)
                    elif isinstance(ev, h2.events.StreamEnded):
                        r.done.set()
                    elif isinstance(ev, h2.events.StreamReset):
                        r.reset = ev.error_code
                        r.done.set()
                    elif isinstance(ev, h2.events.ConnectionTerminated):
                        self.goaway = ev.error_code
                        self.goaway_last = ev.last_stream_id
                        # (h2 closes its state machine here; like nghttp2, this client lets the streams up to the
                        # GOAWAY's last stream id finish)
                        self.conn.state_machine.state = h2.connection.ConnectionState.CLIENT_OPEN
                    elif isinstance(ev, h2.events.WindowUpdated):
                        self.window.set()
                self._flush()
        except (ConnectionError, h2.exceptions.ProtocolError):
            pass
        finally:
            self.closed.set()
            for r in self.replies.values():
                r.done.set()

    def request(self, headers: list[tuple[bytes, bytes]], body: bytes | None = None, trailers: list[tuple[bytes, bytes]] | None = None) -> int:
        """Start a request (the whole body at once, flow control permitting: use :meth:`send_body` for more); its id."""
        sid = self.conn.get_next_available_stream_id()
        self.replies[sid] = Reply()
        end = body is None and trailers is None
        self.conn.send_headers(sid, headers, end_stream=end)
        if body:
            self.conn.send_data(sid, body, end_stream=trailers is None)
        elif body is not None and trailers is None:
            self.conn.end_stream(sid)
        if trailers is not None:
            self.conn.send_headers(sid, trailers, end_stream=True)
        self._flush()
        return sid

    async def send_body(self, sid: int, body: bytes, trailers: list[tuple[bytes, bytes]] | None = None, timeout_s: float = 10.0) -> None:
        """Send ``body`` (then the trailers, or the end) on a stream begun with :meth:`open`, as the windows allow."""
        view = memoryview(body)
        async with asyncio.timeout(timeout_s):
            while view:
                room = min(self.conn.local_flow_control_window(sid), self.conn.max_outbound_frame_size)
                if room <= 0:
                    self.window.clear()
                    await self.window.wait()
                    continue
                self.conn.send_data(sid, bytes(view[:room]))
                view = view[room:]
                self._flush()
        if trailers is not None:
            self.conn.send_headers(sid, trailers, end_stream=True)
        else:
            self.conn.end_stream(sid)
        self._flush()

    def open(self, headers: list[tuple[bytes, bytes]]) -> int:
        """Start a request whose body follows (:meth:`send_body`); its id."""
        sid = self.conn.get_next_available_stream_id()
        self.replies[sid] = Reply()
        self.conn.send_headers(sid, headers)
        self._flush()
        return sid

    def reset(self, sid: int, code: int) -> None:
        self.conn.reset_stream(sid, code)
        self._flush()

    def ack(self, sid: int) -> None:
        r = self.replies[sid]
        if r.pending_ack:
            self.conn.acknowledge_received_data(r.pending_ack, sid)
            r.pending_ack = 0
            self._flush()

    async def wait(self, sid: int, timeout_s: float = 10.0) -> Reply:
        r = self.replies[sid]
        await asyncio.wait_for(r.done.wait(), timeout_s)
        return r

    async def close(self) -> None:
        self.writer.close()
        self.task.cancel()
        try:
            await self.task
        except asyncio.CancelledError:
            pass
