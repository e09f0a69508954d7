"""HTTP/2 on the HTTP tap: one downstream h2 connection relayed over one upstream h2 connection, stream by stream.

A downstream connection whose first bytes are HTTP/2's connection preface (h2c prior knowledge), or a TLS one that
negotiated ALPN ``h2``, is handed over here by :mod:`deltatap.proxy.relay` (:func:`adopt`). The tap then opens one
upstream connection for it: h2c prior knowledge, or TLS with ALPN ``h2`` when the upstream URL is ``https``.
Framing is the ``h2`` library's (a server connection downstream, a client connection upstream); the relay passes
on, per stream and in order:

* HEADERS: the header list as received, in order (HPACK's never-indexed marks kept); the only change is the one
  :func:`deltatap.proxy.headers.rewrite_request_headers` makes (the tap's ``traceparent``/``tracestate``, the
  correlation header when absent, ``--host-header``, the upstream URL's path prefix). 1xx responses and trailers
  both ways.
* DATA as it arrives; each side's flow-control window is credited only once the bytes were handed to the other
  side, so backpressure propagates end to end (bytes the other side's window cannot take yet wait here).
* RST_STREAM both ways with its error code (a client's cancel reaches the upstream, an upstream's reset the
  client); GOAWAY both ways (the last stream id translated); the peers' SETTINGS that bound what the other side
  may do (concurrent streams, initial window, header list size) mirrored as the tap's own toward the other peer;
  the client's streams go upstream as far as that concurrency limit allows (before the upstream's SETTINGS came,
  one: the limit is not known yet).
  PING is answered by each hop, as any HTTP/2 intermediary does. Server push is turned off upstream.

Stream ids differ between the two sides (each side numbers its own); :class:`Stream` maps them. What is not
byte-identical to a direct connection: HPACK re-encodes the header block (the header list is the same), frame
boundaries of DATA may differ (the bytes are the same), and PING/SETTINGS are per hop.

An upstream connection that does not speak HTTP/2 (h2c toward an HTTP/1.1-only server): nothing of the tap's own goes
to the client until the upstream's first bytes are HTTP/2's SETTINGS (:func:`answers_h2`); other bytes, or a close
without answering, reach the client as they came, its close kind included (FIN as FIN, RST as RST), and from then on
the pair passes bytes as they are, both ways (:meth:`H2Downstream._pass_through`).

``--header-timeout-s`` holds for the connection: its preface and SETTINGS must come within it, and a connection with no
stream open that long gets GOAWAY NO_ERROR and is closed (:meth:`H2Downstream._idle_check`).

Each stream is one exchange: a :class:`deltatap.proxy.record.TapRecord` and a span exactly like an HTTP/1.1
exchange's, with its stamps from the reads (``(t, bound)`` of the read that carried the frame) and writes
(:meth:`deltatap.net.conn.StampedProtocol.send`) of the two connections; the response's content is watched by
the observer :func:`observer_for` picks (the SSE :class:`deltatap.core.sse.StreamObserver` for
``text/event-stream``), fed DATA frame by DATA frame. A gRPC request's messages are watched on the way up as well
(:class:`deltatap.proxy.grpc.GrpcRequestObserver`).
"""

from __future__ import annotations

import asyncio
import logging
import ssl as _ssl
import weakref
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
import hyperframe.frame

from deltatap.core.clock import mono_ns as mono
from deltatap.core.fingerprint import Fingerprinter
from deltatap.core.sse import StreamObserver
from deltatap.core.vocab import Outcome, TapEvent
from deltatap.net.conn import StampedProtocol, open_connection, reset
from deltatap.net.h1 import Head
from deltatap.proxy.errors import TAP_TIMEOUT, Failure, classify, connect_failure
from deltatap.proxy.headers import rewrite_request_headers, trace_context
from deltatap.proxy.grpc import GrpcObserver, GrpcRequestObserver, grpc_timeout_ns, is_grpc
from deltatap.proxy.record import TapRecord
from deltatap.proxy.spans import SpanStart, begin

if TYPE_CHECKING:
    from deltatap.proxy.relay import Downstream
    from deltatap.proxy.server import Tap

log = logging.getLogger("deltatap.tap")

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
ALPN_H2 = "h2"

# The peers' settings the tap mirrors toward the other side, as its own (what bounds the other peer's sending)
_MIRRORED = (h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS, h2.settings.SettingCodes.INITIAL_WINDOW_SIZE,
             h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE)

_CLOSED = Failure(Outcome.UPSTREAM_ERROR, 502, "upstream_closed", "the upstream closed the connection before the response began")
_BROKE = Failure(Outcome.UPSTREAM_ERROR, 502, "upstream_closed", "the upstream closed the connection before the response ended")
_RESET = classify(ConnectionResetError())
_REFUSED = Failure(Outcome.UPSTREAM_ERROR, 502, "upstream_refused",
                   "the upstream refused the stream (RST_STREAM REFUSED_STREAM or GOAWAY before it)")
_NOT_H2 = Failure(Outcome.UPSTREAM_ERROR, 502, "upstream_not_h2", "the upstream did not negotiate HTTP/2 (ALPN h2)")
_NOT_H2_ANSWER = Failure(Outcome.UPSTREAM_ERROR, 502, "upstream_not_h2",
                         "the upstream answered HTTP/2's preface with bytes that are not HTTP/2; they went to the client as they came")


def answers_h2(head: bytes) -> bool | None:
    """Whether an upstream's first bytes ``head`` begin HTTP/2's answer to its preface, a SETTINGS frame on stream 0
    (RFC 9113 section 3.4): True or False once they tell (at most 9 bytes needed), None while too few have come."""
    if len(head) > 3 and head[3] != 0x4:
        return False
    if len(head) > 5 and any(head[5:9]):
        return False
    return True if len(head) >= 9 else None


def count_not_h2(tap: Tap, peer: str | None, how: str) -> None:
    """One HTTP/2 client connection whose upstream connection does not speak HTTP/2: counted
    (``deltatap_tap_upstream_not_http2_total``); a warning the first time, then every 1000th."""
    c = tap.counters
    c.upstream_not_http2 += 1
    if c.upstream_not_http2 == 1 or c.upstream_not_http2 % 1000 == 0:
        log.warning("tap %s: the upstream %s: it does not speak HTTP/2 (h2c prior knowledge); the HTTP/2 client (%s) gets what "
                    "it sent, and its close, as they came (%d so far)", tap.o.link, how, peer, c.upstream_not_http2)


def observer_for(request_headers: list[tuple[bytes, bytes]], response_headers: list[tuple[bytes, bytes]]) -> StreamObserver | None:
    """The content observer for one stream's response, or None (the one place that picks it): the SSE observer for
    ``text/event-stream``; the gRPC observer (:class:`deltatap.proxy.grpc.GrpcObserver`) for ``application/grpc*``."""
    ctype = (_get(response_headers, b"content-type") or b"").lower()
    if is_grpc(response_headers):
        path = (_get(request_headers, b":path") or b"").decode("latin-1")
        enc = _get(response_headers, b"grpc-encoding")
        obs = GrpcObserver(path, enc.decode("latin-1") if enc else None)
        if _get(response_headers, b"grpc-status") is not None:  # a trailers-only response (its stamp: response.headers)
            obs.trailers(response_headers, None, trailers_only=True)
        return obs
    if ctype.startswith(b"text/event-stream"):
        path = (_get(request_headers, b":path") or b"").decode("latin-1").partition("?")[0]
        return StreamObserver(path=path)
    return None


def _get(headers: list[tuple[bytes, bytes]], lname: bytes) -> bytes | None:
    return next((v for n, v in headers if n == lname), None)


def _config(client_side: bool) -> h2.config.H2Configuration:
    # the header list passes as received: no cookie joining or splitting, no re-casing or trimming by the library
    return h2.config.H2Configuration(client_side=client_side, header_encoding=None, normalize_inbound_headers=False,
                                     normalize_outbound_headers=False, split_outbound_cookies=False)


async def downstream_alpn(tap: Tap, timeout_s: float = 1.0) -> tuple[str, ...]:
    """The ALPN protocols a TLS tap offers its clients (``--tls-cert``): :data:`deltatap.proxy.tls.ALPN_PROTOCOLS` (h2
    first) when the upstream speaks HTTP/2 (ALPN h2 over TLS; for ``http://``, an answer in HTTP/2 to HTTP/2's
    preface) or the tap is a gRPC tap; else ``http/1.1`` only. The relay does not translate between HTTP versions, so
    a client that speaks h2 to a tap in front of an HTTP/1.1-only upstream would fail where it succeeds directly."""
    from deltatap.proxy.tls import ALPN_PROTOCOLS

    if tap.o.protocol == "grpc":
        return ALPN_PROTOCOLS
    h1_only = tuple(p for p in ALPN_PROTOCOLS if p != ALPN_H2)
    ctx = None
    if tap.ssl_context is not None:
        from deltatap.proxy.relay import ssl_context  # (relay imports this module)

        ctx = ssl_context(tap.o.verify_tls)
        ctx.set_alpn_protocols([ALPN_H2, "http/1.1"])  # (an HTTP/1.1 server still completes the handshake)
    writer = None
    try:
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_connection(tap.upstream_host, tap.upstream_port, ssl=ctx,
                                                           server_hostname=tap.upstream_host if ctx else None)
            if ctx is not None:
                speaks = writer.get_extra_info("ssl_object").selected_alpn_protocol() == ALPN_H2
            else:
                writer.write(PREFACE + hyperframe.frame.SettingsFrame(0).serialize())
                speaks = answers_h2(await reader.readexactly(9)) is True
    except (OSError, TimeoutError, asyncio.IncompleteReadError, _ssl.SSLError):
        speaks = False
    finally:
        if writer is not None:
            writer.close()
    log.info("tap %s: TLS toward clients offers ALPN %s (the upstream %s HTTP/2)", tap.o.link, ", ".join(ALPN_PROTOCOLS if speaks else h1_only),
             "speaks" if speaks else "does not speak (or did not answer)")
    return ALPN_PROTOCOLS if speaks else h1_only


def negotiated(transport: Any) -> bool:
    """Whether the connection negotiated HTTP/2 with ALPN (TLS toward the client, :mod:`deltatap.proxy.tls`)."""
    ssl_object = transport.get_extra_info("ssl_object")
    return ssl_object is not None and ssl_object.selected_alpn_protocol() == ALPN_H2


def adopt(down: Downstream, data: bytes, t: int, bound: int) -> None:
    """Take over the downstream connection ``down`` (its first bytes ``data``, read at ``t`` within ``bound``, begin
    with the HTTP/2 preface, or it negotiated ALPN h2 over TLS): from now on its transport talks to an
    :class:`H2Downstream`, and the tap counts it as that."""
    tap = down.tap
    if down.head_timer is not None:
        down.head_timer.cancel()
        down.head_timer = None
    tr = down.transport
    h = H2Downstream(tap, down.peer)
    h.transport, h.kernel = tr, down.kernel
    h._empty_mono, h._wsock = down._empty_mono, down._wsock  # (StampedProtocol.connection_made's, not called again)
    if h.kernel is not None:
        h.kernel.lazy_placement = False  # (each write's departure placed at once: the h2 relay keeps no unplaced writes)
    tr.set_protocol(h)
    tap.connections.discard(down)
    tap.connections.add(h)  # type: ignore[arg-type]
    down.closed = True
    h.start(data, t, bound)


class Pipe:
    """One direction of one stream: bytes waiting for the receiving side's flow-control window, then its end."""

    __slots__ = ("buf", "end", "trailers", "closed", "on_drained")

    def __init__(self) -> None:
        self.buf: deque[list[Any]] = deque()  # [bytes, flow-controlled length to credit once sent]
        self.end = False  # END_STREAM to send after the bytes
        self.trailers: list[tuple[bytes, bytes]] | None = None  # to send (with END_STREAM) after the bytes
        self.closed = False  # END_STREAM sent
        self.on_drained: list[Callable[[int, int], None]] = []  # called with the write stamp of the bytes' last frame


class Stream:
    """One request/response pair: the downstream and upstream stream ids, the record, and both pipes."""

    __slots__ = ("down_id", "up_id", "rec", "span", "fp", "capture", "capture_out", "request_headers", "to_up", "to_down",
                 "response_started", "final", "done", "timer", "opened", "reset")

    def __init__(self, down_id: int, rec: TapRecord, span: SpanStart, fp: Fingerprinter, headers: list[tuple[bytes, bytes]]) -> None:
        self.down_id = down_id
        self.up_id: int | None = None
        self.rec = rec
        self.span = span
        self.fp = fp
        self.capture: bytearray | None = bytearray()
        self.capture_out: bytearray | None = None
        self.request_headers = headers  # as sent upstream
        self.to_up = Pipe()
        self.to_down = Pipe()
        self.response_started = False  # a response HEADERS frame (1xx included) was passed on
        self.final = False
        self.done = False
        self.timer: asyncio.TimerHandle | None = None
        self.opened = False  # its HEADERS went upstream
        self.reset = False  # reset on either side


_ssl_h2: weakref.WeakKeyDictionary[Any, _ssl.SSLContext] = weakref.WeakKeyDictionary()


def _upstream_ssl(tap: Tap) -> _ssl.SSLContext | None:
    """The tap's upstream TLS context with ALPN h2 (one per tap: the HTTP/1.1 pool's context stays as it is)."""
    if tap.ssl_context is None:
        return None
    ctx = _ssl_h2.get(tap)
    if ctx is None:
        from deltatap.proxy.relay import ssl_context  # (relay imports this module)

        ctx = _ssl_h2[tap] = ssl_context(tap.o.verify_tls)
        ctx.set_alpn_protocols([ALPN_H2])
    return ctx


def _settle_writes(d: H2Downstream, rec: TapRecord) -> bool:
    """At a stream's end, before its record is handed on, and again while its finish waits (:meth:`H2Downstream._hold`,
    as the HTTP/1.1 relay's: ``relay.HOLD_FINISH_S``): each forwarding write of it stamped while its bytes were still
    held (bound -1: behind earlier bytes, or TCP held them; :meth:`deltatap.net.conn.StampedProtocol.send`) gets the
    bound ``now - stamp`` where its connection holds no byte unsent now (:func:`deltatap.proxy.relay._drained`: they
    left by now); one that cannot stays -1, stated unknown (``deltatap.core.vocab.BOUND_UNKNOWN``), never exact. The
    request's and its messages' writes went to the upstream, the response head's and the tokens' to the client.
    True when none is left that a later check could settle (each known, or its connection gone)."""
    from deltatap.proxy.relay import _drained  # (relay imports this module)

    bounds = rec.bounds
    obs = rec.stream if isinstance(rec.stream, StreamObserver) else None
    gq = rec.grpc_request
    up_open = (rec.forwarded is not None and bounds.get(TapEvent.REQUEST_FORWARDED, (0, 0))[1] < 0) or (
        gq is not None and ((gq.first_forwarded is not None and gq.first_forwarded[1] < 0)
                            or (gq.last_forwarded is not None and gq.last_forwarded[1] < 0)))
    down_open = (rec.response_headers_forwarded is not None and bounds.get(TapEvent.RESPONSE_HEADERS_FORWARDED, (0, 0))[1] < 0) or (
        obs is not None and ((obs.first_token_forwarded_mono_ns is not None and obs.first_token_forwarded_bound_ns < 0)
                             or (obs.last_token_forwarded_mono_ns is not None and obs.last_token_forwarded_bound_ns < 0)))
    up = d.up
    if up_open:
        if up is not None and _drained(up):
            up_open = False
            now = mono()
            if rec.forwarded is not None and bounds.get(TapEvent.REQUEST_FORWARDED, (0, 0))[1] < 0:
                bounds[TapEvent.REQUEST_FORWARDED] = (0, now - rec.forwarded)
            if gq is not None:
                if gq.first_forwarded is not None and gq.first_forwarded[1] < 0:
                    gq.first_forwarded = (gq.first_forwarded[0], now - gq.first_forwarded[0])
                if gq.last_forwarded is not None and gq.last_forwarded[1] < 0:
                    gq.last_forwarded = (gq.last_forwarded[0], now - gq.last_forwarded[0])
        elif up is None or up.transport is None or up.transport.is_closing():
            up_open = False  # (gone: stays unknown)
    if down_open:
        if _drained(d):
            down_open = False
            now = mono()
            if rec.response_headers_forwarded is not None and bounds.get(TapEvent.RESPONSE_HEADERS_FORWARDED, (0, 0))[1] < 0:
                bounds[TapEvent.RESPONSE_HEADERS_FORWARDED] = (0, now - rec.response_headers_forwarded)
            if obs is not None:
                if obs.first_token_forwarded_mono_ns is not None and obs.first_token_forwarded_bound_ns < 0:
                    obs.first_token_forwarded_bound_ns = now - obs.first_token_forwarded_mono_ns
                if obs.last_token_forwarded_mono_ns is not None and obs.last_token_forwarded_bound_ns < 0:
                    obs.last_token_forwarded_bound_ns = now - obs.last_token_forwarded_mono_ns
        elif d.closed or d.transport is None or d.transport.is_closing():
            down_open = False
    return not (up_open or down_open)


class _H2Side(StampedProtocol):
    """What both h2 connections of a pair share: writing what their h2 state has to send, and giving that write's
    stamp to the stamps that wait for it (:attr:`marks`)."""

    conn: h2.connection.H2Connection
    marks: list[Callable[[int, int], None]]

    def flush(self) -> None:
        """Write what this side's h2 connection has to send; the stamps that wait for this write get it."""
        out = self.conn.data_to_send()
        if not out:
            return
        if self.transport is None or self.transport.is_closing():  # (the connection's loss completes its streams)
            self.marks.clear()
            return
        tw, bw = self.send(out)
        marks, self.marks = self.marks, []
        for m in marks:
            m(tw, bw)


class H2Downstream(_H2Side):
    """One HTTP/2 client connection (adopted from :class:`deltatap.proxy.relay.Downstream`) and its upstream."""

    def __init__(self, tap: Tap, peer: str | None) -> None:
        self.tap = tap
        self.peer = peer
        self.conn = _Connection(_config(False))
        self.up: H2Upstream | None = None
        self.connecting: asyncio.Task | None = None
        self.held: list[tuple[bytes, int, int]] = []  # reads waiting for the upstream connection
        self.streams: dict[int, Stream] = {}  # by downstream id
        self.by_up: dict[int, Stream] = {}  # by upstream id
        self.waiting_open: deque[Stream] = deque()  # streams over the upstream's concurrency limit (before its SETTINGS: 1)
        self.failure: Failure | None = None  # the upstream cannot be had: every stream gets this answer
        self.going_away = False  # the upstream sent GOAWAY: new streams are refused
        self.closed = False
        self.marks: list[Callable[[int, int], None]] = []  # stamps to set from the next downstream write
        self.held_streams: list[Stream] = []  # streams over whose finish waits for a held write to leave (_hold)
        # --header-timeout-s on HTTP/2: the client's preface and SETTINGS must come within it, and a connection with
        # no stream open that long gets GOAWAY NO_ERROR and is closed (see _idle_check)
        self.settled = False  # the client's SETTINGS (after its preface) was read
        self.idle_since: float | None = None  # loop time since when no stream is open (None: one is)
        self.idle_timer: asyncio.TimerHandle | None = None
        # Until the upstream's first bytes show it speaks HTTP/2 (a SETTINGS frame: answers_h2), nothing of the tap's
        # own goes to the client (its SETTINGS wait in the h2 state): an upstream connection that answers otherwise, or
        # closes without answering, reaches the client as it would directly (H2Upstream.on_data, _pass_through)
        self.holding = True
        self.passing = False  # the upstream did not answer in HTTP/2: bytes pass as they are, both ways
        self.up_eof = False  # (passing) the upstream's FIN went on to the client
        self.down_eof = False  # the client half-closed (while holding or passing: kept open, see on_eof)
        self.eof_mono: int | None = None  # (holding) when the client's FIN came

    def flush(self) -> None:
        if self.holding or self.passing:
            return
        super().flush()

    # (what the tap's shutdown reads of a connection: see deltatap.proxy.server.Tap.close)
    @property
    def exchanges(self) -> list[Stream]:
        return [s for s in self.streams.values() if not s.done]

    current = None

    # ---- start ------------------------------------------------------------------------------
    def start(self, data: bytes, t: int, bound: int) -> None:
        loop = asyncio.get_running_loop()
        self.idle_since = loop.time()
        self.idle_timer = loop.call_later(self.tap.o.header_timeout_s, self._idle_check)
        self.conn.initiate_connection()
        self.flush()
        self.held.append((data, t, bound))
        self.transport.pause_reading()
        self.connecting = asyncio.ensure_future(self._connect())

    async def _connect(self) -> None:
        tap = self.tap
        tap.counters.upstream_connections += 1
        ctx = _upstream_ssl(tap)
        try:
            _tr, up = await open_connection(lambda: H2Upstream(self), tap.upstream_host, tap.upstream_port, ssl=ctx,
                                            server_hostname=tap.upstream_host if ctx else None)
            if ctx is not None and _tr.get_extra_info("ssl_object").selected_alpn_protocol() != ALPN_H2:
                _tr.close()
                raise _NotH2()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - every failure becomes the streams' answer
            self.connecting = None
            self.holding = False  # (the tap answers each stream itself)
            self.failure = _NOT_H2 if isinstance(exc, _NotH2) else connect_failure(exc)
            if self.failure.error_type == "upstream_unreachable":
                log.debug("tap %s: %s", tap.o.link, self.failure.cause)
            self._replay()
            return
        self.connecting = None
        if self.closed:
            up.transport.close()
            return
        self.up = up
        self._replay()
        self._flush_up()  # (its preface, if the replay wrote nothing: see H2Upstream.on_made)

    def _replay(self) -> None:
        held, self.held = self.held, []
        for data, t, bound in held:
            if self.closed:
                return
            self.on_data(data, t, bound)
        if not self.closed and not self.transport.is_closing():
            self.transport.resume_reading()

    # ---- reads ------------------------------------------------------------------------------
    def on_data(self, data: bytes, t: int, bound: int) -> None:
        if self.held_streams:  # (the client's frames: it read what came before them, usually; _hold)
            self._release_held(False)
        if self.passing:
            self._pass_up(data)
            return
        if self.held or self.connecting is not None:
            self.held.append((data, t, bound))
            return
        if self._feed(data, t, bound):
            self._flush_up()
            self.flush()

    def cuts_received(self, data: bytes, pieces: list[tuple[int, int, int, int]]) -> None:
        """A late read the kernel-stamped transport split at packet arrivals: each packet's frames watched with its own
        arrival, what they make the tap send written once (as the HTTP/1.1 relay forwards such a read in one write)."""
        if self.passing:
            self._pass_up(data)
            return
        if self.held or self.connecting is not None:
            self.held += [(data[a:b], t, bound) for a, b, t, bound in pieces]
            return
        for a, b, t, bound in pieces:
            if not self._feed(data[a:b], t, bound):
                return
        self._flush_up()
        self.flush()

    def _feed(self, data: bytes, t: int, bound: int) -> bool:
        try:
            events = self.conn.receive_data(data)
        except h2.exceptions.ProtocolError as exc:
            log.info("tap %s: an HTTP/2 client (%s) broke the protocol (%s); closing its connection", self.tap.o.link, self.peer,
                     type(exc).__name__)
            self.holding = False  # (the tap ends it for its own reason: its SETTINGS and GOAWAY go out)
            self.flush()
            self.transport.close()
            return False
        for ev in events:
            try:
                self._event(ev, t, bound)
            except h2.exceptions.H2Error as exc:  # (a stream the other side's state no longer allows: that stream ends)
                self._stream_failed(self.streams.get(getattr(ev, "stream_id", 0) or 0), exc)
        return True

    def _stream_failed(self, s: Stream | None, exc: Exception) -> None:
        log.info("tap %s: HTTP/2 stream could not be relayed (%s); it is reset", self.tap.o.link, type(exc).__name__)
        if s is None or s.done:
            return
        s.rec.failure = Failure(Outcome.UPSTREAM_ERROR, 502, "tap_internal_error",
                                f"the HTTP/2 stream could not be relayed ({type(exc).__name__})")
        self.tap.count_upstream_error("tap_internal_error")
        if self.up is not None and s.up_id is not None:
            self.up.reset_stream(s, h2.errors.ErrorCodes.INTERNAL_ERROR)
        self.reset_stream(s, h2.errors.ErrorCodes.INTERNAL_ERROR)

    def _event(self, ev: Any, t: int, bound: int) -> None:
        E = h2.events
        if isinstance(ev, E.DataReceived):
            s = self.streams.get(ev.stream_id)
            if s is None or s.reset:
                self.conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                return
            data = ev.data
            rec = s.rec
            rec.request_bytes += len(data)
            s.fp.update(data)
            cap = s.capture
            if cap is not None:
                cap += data
                if len(cap) > self.tap.o.max_capture_bytes:
                    s.capture = None
            gq = rec.grpc_request
            done = gq.feed(data, t, bound) if gq is not None else 0
            if self.failure is not None:  # (answered by the tap: the body goes nowhere)
                self.conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                return
            s.to_up.buf.append([data, ev.flow_controlled_length])
            if done:  # (the write that carries this frame's last byte upstream forwarded the messages it completed)
                s.to_up.on_drained.append(lambda tw, bw, gq=gq, n=gq.messages, r=(t, bound): gq.forwarded(n, r, tw, bw))
            self._drain_up(s)
        elif isinstance(ev, E.RequestReceived):
            self._request(ev, t, bound)
        elif isinstance(ev, E.StreamEnded):
            s = self.streams.get(ev.stream_id)
            if s is None or s.reset:
                return
            if s.rec.grpc_request is None or s.rec.grpc_request.answered is None:  # (else: see H2Upstream._answered)
                s.rec.body_received = t
                s.rec.bounds[TapEvent.REQUEST_BODY_RECEIVED] = (bound, 0)
            if self.failure is not None:
                return
            s.to_up.end = True
            self._drain_up(s)
        elif isinstance(ev, E.TrailersReceived):
            s = self.streams.get(ev.stream_id)
            if s is None or s.reset or self.failure is not None:
                return
            s.to_up.trailers = list(ev.headers)
            s.to_up.end = True
        elif isinstance(ev, E.StreamReset):
            s = self.streams.get(ev.stream_id)
            if s is None or s.reset:
                return
            s.reset = True
            if not s.done:
                s.rec.downstream_closed = t
            if s.up_id is not None and self.up is not None:
                self.up.reset_stream(s, ev.error_code)
            self._complete(s)
            self._forget(s)
        elif isinstance(ev, E.WindowUpdated):
            if ev.stream_id == 0:
                if self.up is not None:
                    _mirror_window(self.conn, self.up.conn)
                for s in list(self.streams.values()):
                    if s.to_down.buf or s.to_down.end:
                        self._drain_down(s)
            else:
                s = self.streams.get(ev.stream_id)
                if s is not None:
                    self._drain_down(s)
        elif isinstance(ev, E.RemoteSettingsChanged):
            self.settled = True
            if self.up is not None:
                self.up.mirror(ev.changed_settings)
        elif isinstance(ev, E.ConnectionTerminated):
            self._goaway_from_client(ev)

    def _request(self, ev: Any, t: int, bound: int) -> None:
        tap = self.tap
        headers = list(ev.headers)
        path_b = _get(headers, b":path") or b""
        path, _, query = path_b.decode("latin-1").partition("?")
        rec = TapRecord(received=t, head=t, method=(_get(headers, b":method") or b"").decode("latin-1"), path=path.partition("#")[0],
                        query=query.partition("#")[0], client_address=self.peer)
        rec.bounds[TapEvent.REQUEST_RECEIVED] = (bound, 0)
        rec.deadline_ns = grpc_timeout_ns(_get(headers, b"grpc-timeout"))
        if is_grpc(headers):
            rec.grpc_request = GrpcRequestObserver()
        span = begin(trace_context(Head(b"", b"", b"", b"HTTP/2", 0, b"", headers)))
        out, rec.request_id, rec.request_id_created = rewrite_request_headers(
            headers, correlation_header=tap.correlation_header, trace_headers=span.trace_headers, host_header=tap.host_header,
            target_prefix=tap.target_prefix)
        s = Stream(ev.stream_id, rec, span, Fingerprinter(tap.fp_key), out)
        self.streams[ev.stream_id] = s
        self.idle_since = None
        tap.exchange_started()
        if tap.o.timeout_s is not None:
            s.timer = asyncio.get_running_loop().call_later(tap.o.timeout_s, self._timed_out, s)
        if self.failure is not None:
            self._answer(s, self.failure)
            return
        if self.going_away:
            self._refuse(s)
            return
        if ev.stream_ended:
            rec.body_received = t
            rec.bounds[TapEvent.REQUEST_BODY_RECEIVED] = (bound, 0)
            s.to_up.end = True
        self._open(s)

    def _open(self, s: Stream) -> None:
        up = self.up
        assert up is not None
        c = up.conn
        if self.waiting_open or c.open_outbound_streams >= (c.remote_settings.max_concurrent_streams if up.settled else 1):
            self.waiting_open.append(s)
            return
        self._start(s, up)

    def _start(self, s: Stream, up: H2Upstream) -> None:
        c = up.conn
        s.up_id = c.get_next_available_stream_id()
        self.by_up[s.up_id] = s
        end = s.to_up.end and not s.to_up.buf and s.to_up.trailers is None
        c.send_headers(s.up_id, s.request_headers, end_stream=end)
        s.opened = True
        if end:
            s.to_up.closed = True
            up.marks.append(lambda tw, bw, s=s: self._forwarded(s, tw, bw))
        else:
            self._drain_up(s)

    def open_waiting(self) -> None:
        """Streams that waited for the upstream's concurrency limit (or for its SETTINGS, which tell the limit), as far
        as it allows now."""
        up = self.up
        if up is None or not up.settled:  # (before them, the one stream _open lets go is open, or was)
            return
        c = up.conn
        while self.waiting_open and c.open_outbound_streams < c.remote_settings.max_concurrent_streams:
            s = self.waiting_open.popleft()
            if not s.reset and not s.done:
                self._start(s, up)

    @staticmethod
    def _forwarded(s: Stream, tw: int, bw: int) -> None:
        if s.rec.grpc_request is not None and s.rec.grpc_request.answered is not None:
            return  # (the request point is the one the first answer responded to: H2Upstream._answered)
        s.rec.forwarded = tw
        s.rec.bounds[TapEvent.REQUEST_FORWARDED] = (0, bw)  # (-1: it waited behind earlier bytes; bounded at the response)

    # ---- flow: client -> upstream -----------------------------------------------------------
    def _drain_up(self, s: Stream) -> None:
        up = self.up
        if up is None or not s.opened or s.reset or s.up_id is None:
            return
        was = s.to_up.closed
        p = s.to_up
        if _drain(up.conn, s.up_id, p, self.conn, s.down_id):
            if p.on_drained:
                cbs, p.on_drained = p.on_drained, []
                up.marks.extend(cbs)
            if s.to_up.closed and not was:
                up.marks.append(lambda tw, bw, s=s: self._forwarded(s, tw, bw))
                self._forget(s)

    # ---- flow: upstream -> client -----------------------------------------------------------
    def _drain_down(self, s: Stream) -> None:
        if s.reset or s.done or self.closed:
            return
        up = self.up
        p = s.to_down
        was = p.closed
        if _drain(self.conn, s.down_id, p, up.conn if up is not None else None, s.up_id):
            if p.on_drained:
                cbs, p.on_drained = p.on_drained, []
                self.marks.extend(cbs)
            if p.closed and not was:
                self.marks.append(lambda tw, bw, s=s: self._response_done(s, tw, bw))

    def _response_done(self, s: Stream, tw: int, bw: int) -> None:
        s.rec.end = tw
        self._complete(s)

    # ---- writes -----------------------------------------------------------------------------
    def _flush_up(self) -> None:
        if self.up is not None and not self.passing:  # (passing: nothing of the tap's own goes upstream either)
            self.up.flush()

    def on_pause_writing(self) -> None:
        if self.up is not None:
            self.up.transport.pause_reading()

    def on_resume_writing(self) -> None:
        if self.up is not None and not self.up.transport.is_closing():
            self.up.transport.resume_reading()

    # ---- tap-made answers, timeouts ---------------------------------------------------------
    def _answer(self, s: Stream, failure: Failure) -> None:
        """Answer stream ``s`` with the tap's own error response (nothing of the upstream's came)."""
        self.holding = False  # (the tap speaks for itself: its SETTINGS go first)
        rec = s.rec
        rec.failure = failure
        if failure.outcome == Outcome.TIMEOUT:
            rec.timeout = mono()
        else:
            rec.upstream_error = mono()
        self.tap.count_upstream_error(failure.error_type)
        rec.status = failure.status
        body = failure.body(self.tap.o.link, self.tap.upstream_str)
        headers = [(b":status", str(failure.status).encode()), (b"content-type", b"application/json"),
                   (b"content-length", str(len(body)).encode()), (self.tap.correlation_header, rec.request_id.encode())]
        s.final = s.response_started = True
        try:
            self.conn.send_headers(s.down_id, headers)
            s.to_down.buf.append([body, 0])
            s.to_down.end = True
            self._drain_down(s)
        except h2.exceptions.H2Error:  # (the client's stream is gone)
            self._complete(s)

    def _timed_out(self, s: Stream) -> None:
        s.timer = None
        if s.done:
            return
        self.holding = False  # (the tap's own answer or reset: its SETTINGS go first)
        if self.up is not None and s.up_id is not None:
            self.up.reset_stream(s, h2.errors.ErrorCodes.CANCEL)
            self.up.flush()
        if not s.response_started:
            self._answer(s, TAP_TIMEOUT)
        else:
            s.rec.failure = TAP_TIMEOUT
            s.rec.timeout = mono()
            self.tap.count_upstream_error(TAP_TIMEOUT.error_type)
            self.reset_stream(s, h2.errors.ErrorCodes.CANCEL)
        self.flush()

    def reset_stream(self, s: Stream, code: int) -> None:
        s.reset = True
        try:
            self.conn.reset_stream(s.down_id, code)
        except h2.exceptions.H2Error:
            pass
        self._complete(s)

    # ---- GOAWAY -----------------------------------------------------------------------------
    def _goaway_from_client(self, ev: Any) -> None:
        """The client opens no more streams: the upstream gets the GOAWAY (its last stream id counts pushed streams,
        none here); streams in flight go on."""
        _reopen(self.conn)
        up = self.up
        if up is not None:
            up.goaway_out(0, ev.error_code, ev.additional_data)

    def goaway_from_upstream(self, ev: Any) -> None:
        """The upstream takes no new streams: those it did not take (ids above its last one, or not opened yet) are
        refused (RST_STREAM REFUSED_STREAM: a client may retry them), the client gets the GOAWAY with the last of its
        own stream ids that the upstream took, and the streams up to it go on to their end."""
        up = self.up
        if up is not None:
            up.going_away = True
            _reopen(up.conn)
        # (the upstream's ids follow the client's in order: the refused streams are the client's last ones)
        refused = [s for s in list(self.streams.values()) if not s.done and (s.up_id is None or s.up_id > ev.last_stream_id)]
        last_down = min((s.down_id for s in refused), default=self.conn.highest_inbound_stream_id + 2) - 2
        for s in refused:
            self._refuse(s)
        self.waiting_open.clear()
        self.going_away = True
        self.flush()
        if not self.transport.is_closing():
            self.send(_goaway_frame(max(0, last_down), ev.error_code, ev.additional_data))

    def go_away(self) -> None:
        """The tap is stopping: GOAWAY (NO_ERROR) naming the last stream the client opened; streams in flight go on,
        new ones are refused."""
        if self.closed or self.going_away or self.passing or self.transport.is_closing():
            return
        self.going_away = True
        self.holding = False  # (the tap speaks for itself as it stops: its SETTINGS, then the GOAWAY)
        self.flush()
        self.send(_goaway_frame(self.conn.highest_inbound_stream_id, h2.errors.ErrorCodes.NO_ERROR, b""))

    def _idle_check(self) -> None:
        """``--header-timeout-s`` passed since the connection began or since its last stream ended: a client that has
        not sent its preface and SETTINGS by now is closed; one with no stream open since then gets GOAWAY NO_ERROR
        (naming the last stream it opened) and is closed. Both are counted as header timeouts, as on HTTP/1.1."""
        self.idle_timer = None
        if self.closed or self.passing or self.transport is None or self.transport.is_closing():
            return
        timeout = self.tap.o.header_timeout_s
        loop = asyncio.get_running_loop()
        if not self.settled and (self.connecting is not None or self.held):
            self.idle_timer = loop.call_later(timeout, self._idle_check)  # (what it sent waits for the upstream connection)
            return
        if self.settled:
            if self.streams or self.waiting_open or self.idle_since is None:
                self.idle_timer = loop.call_later(timeout, self._idle_check)  # (busy: look again a timeout later)
                return
            left = self.idle_since + timeout - loop.time()
            if left > 0:
                self.idle_timer = loop.call_later(left, self._idle_check)
                return
        self.tap.counters.header_timeouts += 1
        log.debug("tap %s: HTTP/2 connection from %s %s for %.0f s; closing", self.tap.o.link, self.peer,
                  "idle" if self.settled else "sent no preface and SETTINGS", timeout)
        if self.settled:
            self.go_away()
        self.transport.close()

    def _refuse(self, s: Stream) -> None:
        s.rec.failure = _REFUSED
        self.tap.count_upstream_error(_REFUSED.error_type)
        self.reset_stream(s, h2.errors.ErrorCodes.REFUSED_STREAM)

    # ---- end of the connections -------------------------------------------------------------
    def on_eof(self) -> bool:
        if self.held_streams:  # (the last chance to see the held writes drained: _hold)
            self._release_held(False)
        up = self.up
        if self.passing:  # (bytes passing as they are: the client's half-close passes on too, unless the upstream's came)
            self.down_eof = True
            if up is None or self.up_eof or up.transport.is_closing() or not up.transport.can_write_eof():
                return False  # (then the close: both directions are over)
            up.transport.write_eof()
            return True
        if self.holding and up is not None:  # (what to do with it waits for the upstream's answer: _pass_through, H2Upstream)
            self.down_eof = True
            self.eof_mono = mono()
            return True
        return False  # (HTTP/2 has no half-close of the connection: the client is gone)

    def on_lost(self, exc: BaseException | None) -> None:
        self.closed = True
        if self.idle_timer is not None:
            self.idle_timer.cancel()
            self.idle_timer = None
        self.tap.connections.discard(self)  # type: ignore[arg-type]
        if self.held_streams:  # (their writes' fate is not learnt now: settled with what is known)
            self._release_held()
        if self.connecting is not None:
            self.connecting.cancel()
        t = self.eof_mono or self.lost_mono_ns  # (a FIN held while the upstream had not answered: when it came)
        for s in list(self.streams.values()):
            if not s.done:
                s.rec.downstream_closed = t
                self._complete(s)
        up, self.up = self.up, None
        if up is not None:
            up.down = None
            if self.reset_by_peer:
                reset(up.transport)
            else:
                up.transport.close()

    def upstream_lost(self, up: H2Upstream) -> None:
        """The upstream connection closed (or reset): the client's connection ends the same way, as it would directly
        (the tap answers for no stream); each stream that was not over is recorded as broken by the upstream."""
        self.up = None
        t = up.lost_mono_ns or mono()
        if self.holding or self.passing:  # (it never answered in HTTP/2: the client gets its close as it came)
            if not self.passing:
                self._pass_through(up, t, up.first)
            if up.reset_by_peer:
                reset(self.transport)
            elif not self.transport.is_closing():
                self.transport.close()
            return
        for s in list(self.streams.values()):
            if s.done:
                continue
            rec = s.rec
            rec.failure = _RESET if up.reset_by_peer else _BROKE if s.response_started else _CLOSED
            rec.upstream_closed = t
            self.tap.count_upstream_error(rec.failure.error_type)
            s.reset = True
            self._complete(s)
        self.failure = _RESET if up.reset_by_peer else _CLOSED  # (streams still read before the close: answered)
        self.flush()
        if up.reset_by_peer:
            reset(self.transport)
        elif not self.transport.is_closing():
            self.transport.close()

    def _pass_through(self, up: H2Upstream, t: int, data: bytes) -> None:
        """The upstream connection's first bytes are not HTTP/2's answer to its preface (``data``: all it sent so far,
        read at ``t``; empty: it closed without answering): from now on the pair passes bytes as they are, both ways,
        and each side's close reaches the other as it came (FIN as FIN, RST as RST); the client never got anything of
        the tap's own (:attr:`holding`). Its streams end here: ``upstream_not_h2`` (a close without answering:
        ``upstream_closed``, a reset ``upstream_reset``), their spans as any others."""
        self.holding = False
        self.passing = True
        tap = self.tap
        reset_ = up.reset_by_peer and not data
        count_not_h2(tap, self.peer, f"answered HTTP/2's preface with bytes that are not HTTP/2 (first bytes {bytes(data[:16])!r})"
                     if data else "reset the connection without answering HTTP/2's preface" if reset_ else
                     "closed the connection without answering HTTP/2's preface")
        failure = _NOT_H2_ANSWER if data else _RESET if reset_ else _CLOSED
        for s in list(self.streams.values()):
            if s.done:
                continue
            rec = s.rec
            rec.failure = failure
            if data:
                rec.upstream_error = t
            else:
                rec.upstream_closed = t
            tap.count_upstream_error(failure.error_type)
            s.reset = True
            self._complete(s)
        self.failure = failure
        self.waiting_open.clear()
        self.conn.data_to_send()  # (the tap's own frames that waited: the client never gets them)
        self.marks.clear()
        if self.idle_timer is not None:
            self.idle_timer.cancel()
            self.idle_timer = None
        if data and not self.transport.is_closing():
            self.send(data)
        if self.down_eof and up.transport is not None and not up.transport.is_closing():
            if up.transport.can_write_eof():
                up.transport.write_eof()  # (the client's FIN, held until now: on to the upstream as it came)
            else:
                up.transport.close()

    def _pass_up(self, data: bytes) -> None:
        """A client's bytes after its upstream turned out not to speak HTTP/2: on to it as they are (where the upstream
        connection is gone, dropped, as a closed connection's kernel would)."""
        up = self.up
        if up is not None and not up.transport.is_closing():
            up.send(data)

    def _complete(self, s: Stream) -> None:
        if s.done:
            return
        s.done = True
        if s.timer is not None:
            s.timer.cancel()
            s.timer = None
        rec = s.rec
        settled = _settle_writes(self, rec)
        rec.fingerprint = s.fp.result()
        rec.request_capture = s.capture
        rec.response_capture = s.capture_out
        self._forget(s)
        if settled or not self._hold(s):
            self.tap.finish(s.span, rec)
        if self.waiting_open:
            self.open_waiting()

    def _hold(self, s: Stream) -> bool:
        """Keep the finish of ``s``, over with a forwarding write still unknown, until that write has left: the HTTP/1.1
        relay's rule and limits (:data:`deltatap.proxy.relay.HOLD_FINISH_S`, ``HOLD_STEP_S``). True when held."""
        from deltatap.proxy import relay  # (relay imports this module)

        tr = self.transport
        if self.closed or tr is None or tr.is_closing() or tr.get_extra_info("socket") is None:
            return False
        loop = asyncio.get_running_loop()
        step = relay.HOLD_STEP_S[0]
        s.timer = loop.call_later(step, self._recheck_held, s, loop.time() + relay.HOLD_FINISH_S, step)
        self.held_streams.append(s)
        return True

    def _recheck_held(self, s: Stream, deadline: float, step: float) -> None:
        """``s``'s timer (:meth:`_hold`): finished once its writes are settled (or can no longer be), or at ``deadline``."""
        from deltatap.proxy import relay  # (relay imports this module)

        s.timer = None
        if s not in self.held_streams:
            return
        loop = asyncio.get_running_loop()
        if not _settle_writes(self, s.rec) and loop.time() < deadline:
            step = min(step * 2, relay.HOLD_STEP_S[1])
            s.timer = loop.call_later(min(step, max(0.0, deadline - loop.time())), self._recheck_held, s, deadline, step)
            return
        self.held_streams.remove(s)
        self.tap.finish(s.span, s.rec)

    def _release_held(self, lost: bool = True) -> None:
        """The streams whose finish waits (:meth:`_hold`) checked now: each settled one finished; every one when
        ``lost`` (the connection is gone: what is not known by now stays unknown)."""
        held, keep = self.held_streams, []
        self.held_streams = keep
        for s in held:
            if _settle_writes(self, s.rec) or lost:
                if s.timer is not None:
                    s.timer.cancel()
                    s.timer = None
                self.tap.finish(s.span, s.rec)
            else:
                keep.append(s)

    def _forget(self, s: Stream) -> None:
        """Drop the stream from the maps once it is over both ways (a response may end before its request does: the
        rest of the request still goes upstream)."""
        if s.done and (s.reset or s.to_up.closed or self.failure is not None or self.up is None):
            self.streams.pop(s.down_id, None)
            if s.up_id is not None:
                self.by_up.pop(s.up_id, None)
            if not self.streams and self.idle_since is None:
                self.idle_since = asyncio.get_running_loop().time()


class _NotH2(Exception):
    pass


_WINDOW_SEEN: weakref.WeakKeyDictionary[h2.connection.H2Connection, int] = weakref.WeakKeyDictionary()


def _mirror_window(sender: h2.connection.H2Connection, other: h2.connection.H2Connection) -> None:
    """A peer enlarged its connection-level receive window (a WINDOW_UPDATE on stream 0 beyond what it ever allowed,
    as clients such as curl do at the start): the tap's own receive window toward the other peer grows by as much,
    so the two hops together allow what the direct connection would. Credit given back as bytes are forwarded is not
    mirrored (the relay gives that back itself)."""
    seen = _WINDOW_SEEN.get(sender, 65_535)  # (every connection's window starts at 65,535: RFC 9113 section 6.9.2)
    now = sender.outbound_flow_control_window
    if now > seen:
        _WINDOW_SEEN[sender] = now
        try:
            other.increment_flow_control_window(now - seen)
        except h2.exceptions.H2Error:  # (past HTTP/2's 2^31 - 1)
            pass


def _reopen(conn: h2.connection.H2Connection) -> None:
    """h2 closes its connection state machine at a GOAWAY, sent or received, and then refuses every frame; HTTP/2
    lets the streams up to the GOAWAY's last stream id run to their end (RFC 9113 section 6.8), so the relay puts
    the state back to open (it opens no new streams on that connection itself)."""
    if conn.state_machine.state == h2.connection.ConnectionState.CLOSED:
        conn.state_machine.state = (h2.connection.ConnectionState.CLIENT_OPEN if conn.config.client_side
                                    else h2.connection.ConnectionState.SERVER_OPEN)


class _Connection(h2.connection.H2Connection):
    """h2's connection, put back to open as soon as it receives a GOAWAY (:func:`_reopen`): the frames that follow
    the GOAWAY in the same read (the HEADERS and DATA of the streams it lets finish) are taken, not refused as frames
    on a closed connection, which ended the whole connection (a read merges them wherever the transport reads what
    waits at once: TLS, ``DELTATAP_KERNEL_STAMPS=0``, or one write of the peer's)."""

    def _receive_goaway_frame(self, frame: hyperframe.frame.GoAwayFrame) -> tuple[list, list]:
        frames, events = super()._receive_goaway_frame(frame)
        _reopen(self)
        return frames, events


def _goaway_frame(last_stream_id: int, error_code: int, additional_data: bytes | None) -> bytes:
    """A GOAWAY frame written by the relay itself (h2's own would close its state machine: see :func:`_reopen`)."""
    return hyperframe.frame.GoAwayFrame(0, last_stream_id=last_stream_id, error_code=int(error_code),
                                        additional_data=additional_data or b"").serialize()


class H2Upstream(_H2Side):
    """The tap's h2 client connection to its upstream, for one :class:`H2Downstream`."""

    def __init__(self, down: H2Downstream) -> None:
        self.down: H2Downstream | None = down
        self.conn = _Connection(_config(True))
        self.marks: list[Callable[[int, int], None]] = []  # stamps to set from the next upstream write
        self.going_away = False  # the upstream sent GOAWAY: no new streams on this connection
        self.first = b""  # the upstream's first bytes while fewer than tell whether it answers in HTTP/2 (answers_h2)
        self.first_at = (0, 0)  # (t, bound) of the read that brought them
        # its first SETTINGS was read: until then its concurrency limit is unknown (h2 takes it as unlimited) and one
        # stream goes upstream, the client's others wait for it (H2Downstream._open): a stream beyond the limit can make
        # the upstream end the whole connection (GOAWAY PROTOCOL_ERROR); every limit but 0 allows one
        self.settled = False

    def on_made(self) -> None:
        codes = h2.settings.SettingCodes
        self.conn.local_settings = h2.settings.Settings(client=True, initial_values={
            codes.MAX_CONCURRENT_STREAMS: 100, codes.MAX_HEADER_LIST_SIZE: self.conn.DEFAULT_MAX_HEADER_LIST_SIZE, codes.ENABLE_PUSH: 0})
        self.conn.initiate_connection()
        # (the preface leaves with the client's first stream, if it sent one meanwhile, in one write: H2Downstream._connect
        # replays what it sent at once; its other streams wait for the upstream's SETTINGS (settled). An HTTP/1.1-only
        # upstream then reads it all before it answers and closes: its close is a FIN, as directly, not the reset of a
        # close with bytes unread)

    def mirror(self, changed: dict) -> None:
        """The client's SETTINGS that bound what the upstream may send, as the tap's own toward it."""
        new = {code: c.new_value for code, c in changed.items() if code in _MIRRORED}
        if new:
            self.conn.update_settings(new)

    def goaway_out(self, last_stream_id: int, error_code: int, additional_data: bytes | None) -> None:
        """Pass a client's GOAWAY on (after what waits to be written)."""
        self.flush()
        if not self.transport.is_closing():
            self.send(_goaway_frame(last_stream_id, error_code, additional_data))

    def reset_stream(self, s: Stream, code: int) -> None:
        """RST_STREAM toward the upstream (the caller decides what the client gets)."""
        try:
            self.conn.reset_stream(s.up_id, code)
        except h2.exceptions.H2Error:
            pass

    def on_pause_writing(self) -> None:
        d = self.down
        if d is not None:
            d.transport.pause_reading()

    def on_resume_writing(self) -> None:
        d = self.down
        if d is not None and not d.transport.is_closing():
            d.transport.resume_reading()

    # ---- reads ------------------------------------------------------------------------------
    def on_data(self, data: bytes, t: int, bound: int) -> None:
        d = self.down
        if d is None:
            self.transport.close()
            return
        if (d.holding or d.passing) and not self._answer_h2(d, data, t, bound):
            return
        if self._feed(d, data, t, bound):
            d.flush()
            self.flush()

    def _answer_h2(self, d: H2Downstream, data: bytes, t: int, bound: int) -> bool:
        """The upstream's bytes while the client waits for its first ones (:attr:`H2Downstream.holding`), or once it
        turned out not to speak HTTP/2 (:attr:`H2Downstream.passing`: they go on to the client as they are). True
        when they begin with HTTP/2's SETTINGS: the h2 state takes them (bytes of earlier reads fed first) and the
        tap's own frames go to the client from now on; False when they are taken here."""
        if d.passing:
            if not d.transport.is_closing():
                d.send(data)
            return False
        head = self.first + data if self.first else data
        speaks = answers_h2(head)
        if speaks is None:
            if not self.first:
                self.first_at = (t, bound)
            self.first = head
            return False
        if not speaks:
            self.first = b""
            d._pass_through(self, t, head)
            return False
        d.holding = False
        first, self.first = self.first, b""
        if d.down_eof:  # (the client half-closed meanwhile: gone, as HTTP/2 has no half-close)
            d.transport.close()
            return False
        return not first or self._feed(d, first, *self.first_at)

    def cuts_received(self, data: bytes, pieces: list[tuple[int, int, int, int]]) -> None:
        """A late read split at packet arrivals (see :meth:`H2Downstream.cuts_received`): watched packet by packet,
        written on in one write."""
        d = self.down
        if d is None:
            self.transport.close()
            return
        if d.holding or d.passing:  # (piece by piece until the h2 state takes them: see _answer_h2)
            for i, (a, b, t, bound) in enumerate(pieces):
                if not (d.holding or d.passing):
                    pieces = pieces[i:]
                    break
                if self._answer_h2(d, data[a:b], t, bound):
                    if not self._feed(d, data[a:b], t, bound):
                        return
                    pieces = pieces[i + 1:]
                    break
            else:
                return
        for a, b, t, bound in pieces:
            if not self._feed(d, data[a:b], t, bound):
                return
        d.flush()
        self.flush()

    def _feed(self, d: H2Downstream, data: bytes, t: int, bound: int) -> bool:
        try:
            events = self.conn.receive_data(data)
        except h2.exceptions.ProtocolError as exc:
            log.info("tap %s: the upstream broke the HTTP/2 protocol (%s); closing", d.tap.o.link, type(exc).__name__)
            self.flush()
            self.transport.close()
            return False
        for ev in events:
            try:
                self._event(d, ev, t, bound)
            except h2.exceptions.H2Error as exc:
                d._stream_failed(d.by_up.get(getattr(ev, "stream_id", 0) or 0), exc)
        return True

    def _event(self, d: H2Downstream, ev: Any, t: int, bound: int) -> None:
        E = h2.events
        if isinstance(ev, E.DataReceived):
            s = d.by_up.get(ev.stream_id)
            if s is None or s.reset or s.done:
                self.conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                return
            data = ev.data
            rec = s.rec
            rec.response_bytes += len(data)
            rec.chunks += 1
            obs = rec.stream
            if obs is not None:
                obs.feed(data, t, bound)
                if rec.forwarded is None and rec.grpc_request is not None and isinstance(obs, GrpcObserver) \
                        and obs.first_message_mono_ns is not None and rec.grpc_request.answered is None:
                    self._answered(rec)
            elif s.capture_out is not None:
                s.capture_out += data
                if len(s.capture_out) > d.tap.o.max_capture_bytes:
                    s.capture_out = None
            p = s.to_down
            p.buf.append([data, ev.flow_controlled_length])
            if obs is not None and obs.unforwarded[0]:
                p.on_drained.append(lambda tw, bw, obs=obs: obs.forwarded(tw, bw))
            d._drain_down(s)
        elif isinstance(ev, (E.ResponseReceived, E.InformationalResponseReceived)):
            s = d.by_up.get(ev.stream_id)
            if s is None or s.reset or s.done:
                return
            self._response(d, s, ev, t, bound)
        elif isinstance(ev, E.StreamEnded):
            s = d.by_up.get(ev.stream_id)
            if s is None or s.reset or s.done:
                return
            rec = s.rec
            rec.response_end = t
            rec.bounds[TapEvent.RESPONSE_END] = (bound, 0)
            obs = rec.stream
            if obs is not None and obs.finish(t, bound):
                s.to_down.on_drained.append(lambda tw, bw, obs=obs: obs.forwarded(tw, bw))
            s.to_down.end = True
            d._drain_down(s)
        elif isinstance(ev, E.TrailersReceived):
            s = d.by_up.get(ev.stream_id)
            if s is None or s.reset or s.done:
                return
            s.to_down.trailers = list(ev.headers)
            if isinstance(s.rec.stream, GrpcObserver):  # grpc-status / grpc-message
                s.rec.stream.trailers(s.to_down.trailers, t)
        elif isinstance(ev, E.StreamReset):
            s = d.by_up.get(ev.stream_id)
            if s is None or s.done:
                return
            rec = s.rec
            if ev.error_code == h2.errors.ErrorCodes.REFUSED_STREAM and not s.response_started:
                rec.failure = _REFUSED
            else:
                rec.failure = Failure(Outcome.UPSTREAM_ERROR, 502, "upstream_reset",
                                      f"the upstream reset the stream ({_code_name(ev.error_code)})")
            rec.upstream_closed = t
            d.tap.count_upstream_error(rec.failure.error_type)
            d.reset_stream(s, ev.error_code)
            d.open_waiting()
        elif isinstance(ev, E.WindowUpdated):
            if ev.stream_id == 0:
                _mirror_window(self.conn, d.conn)
                for s in list(d.by_up.values()):
                    if s.to_up.buf or (s.to_up.end and not s.to_up.closed):
                        d._drain_up(s)
            else:
                s = d.by_up.get(ev.stream_id)
                if s is not None:
                    d._drain_up(s)
        elif isinstance(ev, E.RemoteSettingsChanged):
            self.settled = True
            new = {code: c.new_value for code, c in ev.changed_settings.items() if code in _MIRRORED}
            if new:
                d.conn.update_settings(new)
            d.open_waiting()
        elif isinstance(ev, E.ConnectionTerminated):
            d.goaway_from_upstream(ev)

    def _response(self, d: H2Downstream, s: Stream, ev: Any, t: int, bound: int) -> None:
        headers = list(ev.headers)
        informational = isinstance(ev, h2.events.InformationalResponseReceived)
        s.response_started = True
        rec = s.rec
        if not informational:
            s.final = True
            try:
                rec.status = int(_get(headers, b":status") or 0)
            except ValueError:
                rec.status = None
            rec.response_headers = t
            rec.bounds[TapEvent.RESPONSE_HEADERS] = (bound, 0)
            if rec.forwarded is not None and rec.bounds.get(TapEvent.REQUEST_FORWARDED, (0, 0))[1] < 0:
                # (the request waited behind earlier bytes: it had left when the response began to arrive)
                rec.bounds[TapEvent.REQUEST_FORWARDED] = (0, max(0, t - rec.forwarded))
            obs = rec.stream = observer_for(s.request_headers, headers)
            if obs is None and b"json" in (_get(headers, b"content-type") or b"").lower():
                s.capture_out = bytearray()
        end = ev.stream_ended if not informational else False
        try:
            d.conn.send_headers(s.down_id, headers, end_stream=bool(end))
        except h2.exceptions.H2Error:
            return
        if not informational:
            d.marks.append(lambda tw, bw, s=s: self._headers_forwarded(s, tw, bw))
        if end:
            s.to_down.closed = True
            rec.response_end = t
            rec.bounds[TapEvent.RESPONSE_END] = (bound, 0)
            d.marks.append(lambda tw, bw, s=s: d._response_done(s, tw, bw))

    @staticmethod
    def _answered(rec: TapRecord) -> None:
        """The first response message of a gRPC stream whose request is still open (bidi): the request it answers
        is what went upstream so far, so the span's request points are that (the end of the client's stream stays on
        ``last_request_message.*``); a request point after the first token would make the engine's TTFT negative."""
        got = rec.grpc_request.answer() if rec.grpc_request is not None else None
        if got is None:
            return
        (tr, br), (tw, bw) = got
        rec.body_received, rec.forwarded = tr, tw
        rec.bounds[TapEvent.REQUEST_BODY_RECEIVED] = (br, 0)
        rec.bounds[TapEvent.REQUEST_FORWARDED] = (0, bw)  # (-1: TCP still held it; settled at the end, _settle_writes)

    @staticmethod
    def _headers_forwarded(s: Stream, tw: int, bw: int) -> None:
        rec = s.rec
        rec.response_headers_forwarded = tw
        rec.bounds[TapEvent.RESPONSE_HEADERS_FORWARDED] = (0, bw)  # (-1: as above)
        rec.end = tw

    # ---- end --------------------------------------------------------------------------------
    def on_eof(self) -> bool:
        d = self.down
        if d is None or d.closed or not (d.holding or d.passing):
            return False
        if not d.passing:  # (closed without answering in HTTP/2: what it sent, if anything, then its FIN)
            first, self.first = self.first, b""
            d._pass_through(self, mono(), first)
        d.up_eof = True
        if d.down_eof or d.transport.is_closing() or not d.transport.can_write_eof():
            d.transport.close()  # (both directions over, or a client connection with no half-close: the close)
            return False
        d.transport.write_eof()  # (the client's bytes still pass on: an upstream that closed resets them, as directly)
        return True

    def on_lost(self, exc: BaseException | None) -> None:
        d, self.down = self.down, None
        if d is not None and not d.closed:
            d.upstream_lost(self)


def _drain(conn: h2.connection.H2Connection, sid: int, p: Pipe, credit: h2.connection.H2Connection | None, credit_sid: int | None) -> bool:
    """Send what ``p`` holds on stream ``sid`` of ``conn`` as far as its flow-control windows allow, crediting each
    piece's flow-controlled length to stream ``credit_sid`` of ``credit`` (the side it came from) once it is all
    sent; then the trailers or END_STREAM. True when nothing is left waiting."""
    buf = p.buf
    try:
        while buf:
            item = buf[0]
            data = item[0]
            if data:
                room = min(conn.local_flow_control_window(sid), conn.max_outbound_frame_size)
                if room <= 0:
                    return False
                if len(data) > room:
                    conn.send_data(sid, data[:room])
                    item[0] = data[room:]
                    continue
                conn.send_data(sid, data)
            buf.popleft()
            if item[1] and credit is not None and credit_sid is not None:
                try:
                    credit.acknowledge_received_data(item[1], credit_sid)
                except h2.exceptions.H2Error:
                    pass
        if p.closed:
            return True
        if p.trailers is not None:
            conn.send_headers(sid, p.trailers, end_stream=True)
            p.trailers = None
            p.closed = True
        elif p.end:
            conn.end_stream(sid)
            p.closed = True
    except h2.exceptions.H2Error:  # (the stream was closed or reset meanwhile)
        buf.clear()
        p.closed = True
    return True


def _code_name(code: int) -> str:
    try:
        return h2.errors.ErrorCodes(code).name
    except ValueError:
        return f"error code {code}"
