"""The tap's relay: bytes forwarded as they are read, watched on the way, on asyncio protocols.

Each accepted downstream connection (:class:`Downstream`) is paired with one upstream connection
(:class:`Upstream`) for as long as both are open: opened at its first request (or taken from the tap's pool of
idle connections), given back to the pool when the downstream closes between exchanges and both sides meant to
keep it alive. So the pair acts as one hop: pipelining, ``Connection``, ``Expect: 100-continue``, ``Upgrade``
(101 → opaque bytes both ways), ``CONNECT``, trailers, close-delimited bodies, half-close (``SHUT_WR``) and resets
(RST → RST) are the endpoints' business, exactly as over a direct connection.

What the relay changes: each request head gets the tap's trace context and the correlation header when absent
(:func:`deltatap.proxy.headers.rewrite_request_head`). What it adds: a response of its own only when the
upstream cannot be reached, or the tap's own ``--timeout-s`` expires, before any byte of the response came
(502/504, naming deltatap, the link and the cause). Bytes the framing reader (:mod:`deltatap.net.h1`) cannot
frame are passed on unparsed for the rest of the connection (the upstream answers them as it would directly).

Stamps: every read comes with its arrival and bound, every write with its departure and bound
(:mod:`deltatap.net.conn`); the record (:class:`deltatap.proxy.record.TapRecord`) takes them as the bytes pass,
the response payload is fed to the stream observer (:class:`deltatap.core.sse.StreamObserver`) read by read, and
the span is built when the exchange is over.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl as _ssl
import weakref
from collections import deque
from http import HTTPStatus
from typing import TYPE_CHECKING

from deltatap.core import native
from deltatap.core import sse as _sse
from deltatap.core.clock import mono_ns as mono
from deltatap.core.fingerprint import Fingerprinter
from deltatap.core.sse import StreamObserver
from deltatap.core.vocab import Outcome, TapEvent
from deltatap.net import h1
from deltatap.net.conn import StampedProtocol, open_connection, reset
from deltatap.net.pktstamp import tcp_notsent
from deltatap.proxy.errors import TAP_TIMEOUT, Failure, classify, connect_failure
from deltatap.proxy.headers import new_request_id, rewrite_request_head, rewrite_spare, trace_context
from deltatap.proxy.record import TapRecord
from deltatap.proxy.spans import SpanStart, begin
from deltatap.proxy import h2relay
from deltatap.proxy.websocket import WsTunnel, is_websocket_upgrade, negotiated_deflate

if TYPE_CHECKING:
    from deltatap.proxy.server import Tap

log = logging.getLogger("deltatap.tap")

HEAD, BODY, END, ERROR = h1.HEAD, h1.BODY, h1.END, h1.ERROR
# the TapEvent members each exchange's stamps are kept under, bound once (a read of an enum class's member costs ~50 ns)
_EV_REQUEST_RECEIVED, _EV_REQUEST_BODY_RECEIVED, _EV_REQUEST_FORWARDED = (
    TapEvent.REQUEST_RECEIVED, TapEvent.REQUEST_BODY_RECEIVED, TapEvent.REQUEST_FORWARDED)
_EV_RESPONSE_HEADERS, _EV_RESPONSE_HEADERS_FORWARDED, _EV_RESPONSE_END = (
    TapEvent.RESPONSE_HEADERS, TapEvent.RESPONSE_HEADERS_FORWARDED, TapEvent.RESPONSE_END)
POOL_MAX = 256  # idle upstream connections kept for reuse
# None: the upstream connect gets what the kernel gives a direct client (SYN retries, ~2 min), not a timeout of the
# tap's own: a tap must not change a timeout cascade (a 10 s limit failed 22 % of 10,000 streams opened at once, whose
# SYNs the engine's full backlog dropped and the kernel retried; direct, the same connects succeeded). --timeout-s
# bounds the whole exchange when a user wants a bound.
UPSTREAM_CONNECT_TIMEOUT_S: float | None = None
# what is kept of the bytes sent on a pooled upstream connection until it answers, to send again if it turns out
# closed (Downstream.retry_stale); a request larger than this is not sent again (its client gets the close)
REPLAY_MAX_BYTES = 1 << 20


# Deferred watching (issue 19): the usual upstream read (Upstream.data_received's) is forwarded at once and its watch
# (framing, the stream observer, the record) runs after the loop has handled every I/O callback of the poll round, so
# the last read of a burst is not forwarded behind every earlier read's watch. DELTATAP_TAP_DEFER=0 (or `deltatap tap
# --no-defer-watch`) watches each read at once, as before. Read when an Upstream is made.
DEFER_WATCH = os.environ.get("DELTATAP_TAP_DEFER", "1").strip().lower() not in ("0", "off", "false", "no")
# Deferred accounting (issue 15): a request read's accounting (Downstream._account: the exchanges begun, fingerprints,
# captures, timers, counters, the forwarded stamps already taken) waits, after its bytes went upstream, until the next
# event that touches the pair (any read, close, timer or pause of either side: _Watches.run runs it first): the tap goes
# back to sleep right after the forward, so the upstream the write woke does not wait for a CPU the tap keeps. On with
# deferred watching (the same switch). The requests it begins are counted in flight when it is deferred (the gauge does
# not wait for it). A loop timer backs it up only for a tap with --timeout-s (whose timer the account makes, counting
# from the read: Downstream._begin): ACCOUNT_DELAY_S later, or the timeout if shorter (one timer per loop for all of
# them). Without --timeout-s nothing needs the account sooner than the pair's next event (the upstream's answer, a
# close, the tap's close), and a timer made per forwarded request cost the tap ~8 of its ~20 us awake after the
# forward at 1 stream (docs/benchmarks.md, session 23).
ACCOUNT_DELAY_S = 0.02
# Held finishes (issues 15, 19): an exchange that ends while a forwarding write of its is still unknown (bound -1: TCP
# held its bytes when stamped, a slow reader, and nothing has seen them leave: _settle_writes) keeps its record and
# span (Tap.finish: the counters, the histograms, the span; it stays counted in flight) until they have left: rechecked
# by one loop timer per such exchange, HOLD_STEP_S[0] after the end, the step doubling up to HOLD_STEP_S[1], and at the
# client's next read or half-close on the connection; finished once nothing is unknown (each write placed from the
# packet log, or bounded by the check that found the connection drained), else HOLD_FINISH_S after the exchange's end,
# or at once when the connection closes or is lost (the tap's close included: settled with what is known, the rest
# stated unknown). Usual exchanges (every write out when stamped) never wait.
HOLD_FINISH_S = 2.0
HOLD_STEP_S = (0.001, 0.032)


class _Watches:
    """One event loop's deferred watches, in the order their reads came: ``(up, d, data, t, bound, tw, bw)``, each read
    already forwarded by ``d``'s write ``(tw, bw)``. One ``loop.call_soon`` per poll round runs them (after the round's
    I/O callbacks, on uvloop and on asyncio's own loop alike); before any other work touches a pair with one pending
    (``up.deferred``), :meth:`run` runs them all first, so each pair sees its events in exactly the undeferred order.

    And the loop's deferred accounts: ``(d, data, events, n, heads, t, bound, stamp, False, now, True, placing)``, each
    request read's :meth:`Downstream._account`, its bytes already written upstream (``stamp``; ``placing``: that write's
    departure still to be looked up, when it was slow and carried a request's end) and its requests already counted
    in flight, in the order the reads came; ``d.accounting`` while one of the pair's waits. :meth:`run` runs them first
    (:meth:`settle`: a pair's account is older than any watch of it still pending, whose read came after it), and so does
    the one timer (:meth:`_timed`) where a tap has ``--timeout-s``: made when the first such account waits
    (:data:`ACCOUNT_DELAY_S`, or the shorter ``--timeout-s``) and cancelled when none is left."""

    __slots__ = ("loop", "items", "next", "scheduled", "accounts", "acc_next", "timer", "__weakref__")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.items: list[tuple] = []
        self.next = 0  # the first item not run yet (run() may be entered again from a watch: it continues from here)
        self.scheduled = False  # a call_soon of _round is queued: later items of this round go with it
        self.accounts: list[tuple] = []
        self.acc_next = 0  # (as next, for the accounts)
        self.timer: asyncio.TimerHandle | None = None  # runs the accounts ACCOUNT_DELAY_S after the first of them

    def _round(self) -> None:
        self.scheduled = False
        self.run()

    def defer(self, item: tuple, limit_s: float | None) -> None:
        """Keep one request read's account (see the class) for later: until the pair's next event, and with the tap's
        ``--timeout-s`` (``limit_s``) at most that or :data:`ACCOUNT_DELAY_S` later, the shorter."""
        self.accounts.append(item)
        item[0].accounting = True
        if limit_s is None:
            return  # (no timer: nothing needs the account before the pair's next event)
        delay = ACCOUNT_DELAY_S if limit_s > ACCOUNT_DELAY_S else limit_s
        timer = self.timer
        if timer is None:
            self.timer = self.loop.call_later(delay, self._timed)
        elif delay < ACCOUNT_DELAY_S and timer.when() > self.loop.time() + delay:  # (another tap's, on this loop: later)
            timer.cancel()
            self.timer = self.loop.call_later(delay, self._timed)

    def _timed(self) -> None:
        self.timer = None
        self.settle()

    def settle(self) -> None:
        """Run every deferred account, in order (one that raises is what a data_received that raises is to its
        downstream transport; the rest still run)."""
        accounts = self.accounts
        while self.acc_next < len(accounts):
            item = accounts[self.acc_next]
            self.acc_next += 1
            d = item[0]
            d.accounting = False
            try:
                d._account(*item[1:])
            except BaseException as exc:  # noqa: BLE001 - what the transport does with a data_received that raises
                d.kernel._fatal(exc, "protocol.data_received() failed")
        accounts.clear()
        self.acc_next = 0
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def run(self) -> None:
        """Watch every pending read, in order (a watch that raises closes its upstream connection, as the transport
        does for a data_received that raises; the rest still run); the deferred accounts first."""
        if self.accounts:
            self.settle()
        items = self.items
        while self.next < len(items):
            up, d, data, t, bound, tw, bw = items[self.next]
            self.next += 1
            up.deferred = False
            try:
                if _watch_read is None or not _watch_read(up, d, data, t, bound, tw, bw):
                    up._watch(d, data, up.reader.feed(data), t, bound, tw, bw)
            except BaseException as exc:  # noqa: BLE001 - what the transport does with a data_received that raises
                up.kernel._fatal(exc, "protocol.data_received() failed")
        items.clear()
        self.next = 0


_loop_watches: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Watches] = weakref.WeakKeyDictionary()


def _watches() -> _Watches | None:
    """The running loop's deferred watches (None: deferral off, or no loop running)."""
    if not DEFER_WATCH:
        return None
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return None
    w = _loop_watches.get(loop)
    if w is None:
        w = _loop_watches[loop] = _Watches(loop)
    return w


def settle() -> None:
    """Run the running loop's deferred accounts and watches now (:class:`_Watches`): what a tap that stops does before
    it looks at its connections' exchanges (:meth:`deltatap.proxy.server.Tap.close`; while it drains, nothing is
    deferred)."""
    w = _watches()
    if w is not None:
        w.run()


_NO_CONTEXT: dict[str, str] = {}  # trace_context() of a head without traceparent (begin() only reads it)
_TARGETS_MAX = 1024
_targets: dict[bytes, tuple[str, str]] = {}  # the last distinct request targets' (path, query): a client sends the same few


def _path_query(target: bytes) -> tuple[str, str]:
    """The span's ``url.path`` and ``url.query`` of a request target (remembered in ``_targets``)."""
    text = target.decode("latin-1")
    path, _, query = text.partition("?")
    path = path.partition("#")[0]
    if "://" in path:  # absolute-form: the path part
        path = "/" + path.split("://", 1)[1].partition("/")[2]
    if len(_targets) >= _TARGETS_MAX:
        _targets.clear()
    out = _targets[target] = (path, query.partition("#")[0])
    return out


class Exchange:
    """One request/response pair in flight on a connection pair."""

    __slots__ = ("rec", "span", "_fp", "fp_key", "capture", "request_done", "final", "response_started", "capture_out",
                 "timer", "done", "forward_pending", "method", "down_eof", "last_unplaced", "first_unplaced", "held")

    def __init__(self, rec: TapRecord, span: SpanStart, fp: Fingerprinter | None, method: bytes,
                 fp_key: str | bytes | None = None) -> None:
        self.rec = rec
        self.span = span
        # the request body's fingerprint (Fingerprinter(fp_key)), made when first asked for (:attr:`fp`): while the
        # capture holds the whole body so far (None here), the body is hashed from it then, at the exchange's end
        # (_complete) rather than in the request's account right after the first token's forward; once the capture is
        # dropped (larger than --max-capture-bytes) or the fingerprinter was asked for, each body chunk goes to it
        self._fp = fp
        self.fp_key = fp_key
        self.capture: bytearray | None = bytearray()
        self.request_done = False
        self.final = False  # the final (non-1xx) response head came
        self.response_started = False  # any response byte was forwarded downstream
        self.capture_out: bytearray | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.done = False
        self.forward_pending = False  # the request's last byte waits for the upstream connection
        self.method = method
        self.down_eof: int | None = None  # the client half-closed (FIN) while this exchange was in flight
        self.last_unplaced: tuple[int, int, int, bool] | None = None  # the latest token's write, if its departure is not placed yet
        # the first token's write when TCP still held its bytes as it was placed (not out yet): placed at a later read
        self.first_unplaced: tuple[int, int, int, bool] | None = None
        # the request's and the response head's forwarding writes whose bytes TCP (or the transport) still held when
        # stamped, event -> (the side that wrote, its unplaced write or None): settled by _settle_held
        self.held: dict[str, tuple[_Side, tuple[int, int, int, bool] | None]] | None = None

    @property
    def fp(self) -> Fingerprinter:
        """The request body's fingerprinter, fed every body byte so far (made now from the capture if not yet)."""
        fp = self._fp
        if fp is None:
            fp = self._fp = Fingerprinter(self.fp_key)
            if self.capture:
                fp.update(self.capture)
        return fp


class _Side(StampedProtocol):
    """What both sides of a pair share: a slow write's departure placed only when its stamp matters
    (:attr:`deltatap.net.kstamp.KernelStampTransport.lazy_placement`; :meth:`StampedProtocol.send` keeps each write's
    stamp, and in :attr:`~StampedProtocol.unplaced` the last write if slow and its departure not looked up yet).

    The attributes read and written on every read and write (here, and in each side's ``__slots__``) live in slots:
    the C calls on the read and write path (``deltatap.net._pktring.send``, ``deltatap.proxy._relay``) reach them
    without an instance-dict lookup. The sides keep an instance dict (StampedProtocol's other attributes, a test's)."""

    __slots__ = ("transport", "kernel", "last_write_mono", "last_write_bound", "unplaced")

    def __init__(self) -> None:
        # (StampedProtocol's class defaults, which these slots hide)
        self.transport = None
        self.kernel = None
        self.last_write_mono = None
        self.last_write_bound = 0
        self.unplaced = None

    def on_made(self) -> None:
        if self.kernel is not None:
            self.kernel.lazy_placement = True

    def place(self, unplaced: tuple[int, int, int] | None, t: int, bound: int) -> tuple[int, int]:
        """The exact departure of the slow write ``unplaced`` (else ``(t, bound)`` as they are)."""
        if unplaced is None or self.kernel is None:
            return t, bound
        return self.kernel.place_write(unplaced) or (t, bound)


def _drained(side: _Side) -> bool:
    """Every byte written on ``side``'s connection has left: none waits in its transport's buffer, and TCP holds none
    unsent (``tcpi_notsent_bytes`` 0). False when that cannot be told (the connection closing or closed, no TCP_INFO).
    What a write stamped while its bytes were held is bounded by: it left between its stamp and this check."""
    tr = side.transport
    if tr is None or tr.is_closing():
        return False
    try:
        if tr.get_write_buffer_size():
            return False
        sock = tr.get_extra_info("socket")
        return sock is not None and tcp_notsent(sock) == 0
    except (OSError, ValueError, TypeError, AttributeError):  # (a transport that cannot say: not known to be drained)
        return False


def _settle_held(ex: Exchange) -> None:
    """The request's and the response head's forwarding writes whose bytes were still held when stamped
    (``ex.held``): each one's departure from the packet log once it has left (its unplaced write known), else, once its
    connection holds no byte unsent (:func:`_drained`), its stamp with the bound ``now - stamp``; one still held stays
    unknown (bound -1) until a later call (the response head, a later read that takes the Python path, the end)."""
    held = ex.held
    rec = ex.rec
    assert held is not None
    for ev, (side, u) in list(held.items()):
        req = ev == _EV_REQUEST_FORWARDED
        t = rec.forwarded if req else rec.response_headers_forwarded
        if t is None:
            del held[ev]
            continue
        b = -1
        if u is not None and side.transport is not None and not side.transport.is_closing():
            t2, b = side.place(u, t, -1)
            if b >= 0:
                t = t2
        if b < 0 and _drained(side):
            b = mono() - t
        if b >= 0:
            if req:
                rec.forwarded = t
            else:
                rec.response_headers_forwarded = t
            rec.bounds[ev] = (0, b)
            del held[ev]
        elif side.transport is None or side.transport.is_closing():  # (its connection is gone: it stays unknown)
            del held[ev]
    if not held:
        ex.held = None


def _settle_writes(ex: Exchange, d: Downstream) -> bool:
    """At the exchange's end, before its record is handed on, and again while its finish waits (:data:`HOLD_FINISH_S`):
    each forwarding write stamped while its bytes were still held (bound -1) gets its departure or a bound if it can
    (:func:`_settle_held`; the first and the last token's from the packet log, through :meth:`Upstream._place_first`
    and ``ex.last_unplaced``; the tokens' writes, once the downstream holds no byte unsent, ``now - stamp``). One that
    cannot stays -1: its span states the bound unknown (``deltatap.core.vocab.BOUND_UNKNOWN``), never exact.
    True when none is left unknown."""
    if ex.held is not None:
        _settle_held(ex)
    obs = ex.rec.stream
    if not isinstance(obs, StreamObserver):
        return ex.held is None
    alive = None  # (the downstream still open: asked once, only where a write waits to be placed; the usual end asks nothing)
    if ex.first_unplaced is not None:
        alive = d.transport is not None and not d.transport.is_closing()
        if alive:
            Upstream._place_first(d, ex, obs)
    ft, lt = obs.first_token_forwarded_mono_ns, obs.last_token_forwarded_mono_ns
    if ex.last_unplaced is not None and lt is not None and obs.last_token_forwarded_bound_ns < 0 and (
            alive if alive is not None else d.transport is not None and not d.transport.is_closing()):
        lt, lb = d.place(ex.last_unplaced, lt, -1)
        if lb >= 0:  # (its departure, from the packet log)
            obs.last_token_forwarded_mono_ns, obs.last_token_forwarded_bound_ns = lt, lb
            ex.last_unplaced = None
    ft_open = ft is not None and obs.first_token_forwarded_bound_ns < 0
    lt_open = lt is not None and obs.last_token_forwarded_bound_ns < 0
    if ft_open or lt_open:
        if not _drained(d):
            return False
        now = mono()
        if ft_open:
            obs.first_token_forwarded_bound_ns = now - ft
            ex.first_unplaced = None
        if lt_open:
            obs.last_token_forwarded_bound_ns = now - lt
            ex.last_unplaced = None
    return ex.held is None


class Downstream(_Side):
    """One client connection."""

    __slots__ = ("tap", "reader", "up", "connecting", "to_up", "exchanges", "current", "withheld", "head_first", "expect_methods",
                 "opaque", "tunnel", "eof", "closed", "peer", "head_timer", "head_deadline", "loop", "sniff", "replay",
                 "replay_size", "accounting", "holding", "spare", "spare_id", "spare_obs")

    def __init__(self, tap: Tap) -> None:
        super().__init__()
        self.tap = tap
        self.reader = h1.Reader(True)
        self.up: Upstream | None = None
        self.connecting: asyncio.Task | None = None
        self.to_up: list[bytes] = []  # bytes waiting for the upstream connection
        self.exchanges: deque[Exchange] = deque()  # requests whose responses are not complete, in order
        self.current: Exchange | None = None  # the request being read
        self.withheld: list[bytes] = []  # an unfinished request head (rewritten when complete)
        self.head_first: tuple[int, int] | None = None  # read stamp of an unfinished head's first byte
        self.expect_methods: list[bytes] = []  # request methods sent before the upstream connection was there
        self.opaque = False
        self.tunnel: Exchange | None = None  # the exchange that upgraded to WebSocket: its span lasts as the tunnel does
        self.eof = False
        self.closed = False
        self.peer: str | None = None
        self.head_timer: asyncio.TimerHandle | None = None  # closes a connection that sends no whole head in time
        # when (loop time) the head timer closes an idle connection; None while a request is in (the timer, left
        # pending, then does nothing: one TimerHandle per --header-timeout-s, not per request; see _head_timed_out)
        self.head_deadline: float | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.sniff: bytes | None = b""  # the connection's first bytes while they may still be HTTP/2's preface
        # what was sent on an upstream connection taken from the pool, until the first byte of an answer on it: the
        # upstream may have closed that connection while it was idle, and then it is sent again on a fresh one
        self.replay: list[bytes] | None = None
        self.replay_size = 0
        self.accounting = False  # a read's account waits in the loop's _Watches (see there and _process)
        # exchanges over whose finish waits for a held write to leave (HOLD_FINISH_S), in the order they ended, or None
        self.holding: list[Exchange] | None = None
        # the next request's span ids when its head brings no trace context (most do not): begin(_NO_CONTEXT), made
        # ahead, when the connection opens and at the end of each exchange that leaves it idle (_complete): the request
        # path only takes it (a cold tap spent ~15-20 us there making ids and the traceparent; docs/benchmarks.md, s25
        # cold). A head that finds none (pipelined behind another, or the connection's exchanges still open) makes its own
        self.spare: SpanStart | None = None
        # likewise the next request id a head without the correlation header gets (new_request_id), made ahead with the
        # spare span ids and taken once (rewrite_request_head's request_id)
        self.spare_id: str | None = None
        # likewise the stream observer of the connection's next SSE response, made ahead at the end of an exchange
        # whose response had one: (its request's path, StreamObserver(path=path)), taken by a response on that same path
        # (the observer is its path's: the format hint); a fresh one is what StreamObserver(path=path) makes when taken
        self.spare_obs: tuple[str | None, StreamObserver] | None = None

    def _settle(self) -> None:
        """Run the loop's deferred accounts and watches (:class:`_Watches`), this pair's among them."""
        w = self.up.watches if self.up is not None else None
        if w is None:
            w = _watches()
        if w is not None:
            w.run()

    # ---- connection ----------------------------------------------------------------------
    def on_made(self) -> None:
        tap = self.tap
        if len(tap.connections) >= tap.o.max_connections:
            tap.connection_refused()
            self.closed = True
            self.transport.abort()
            return
        super().on_made()
        peer = self.transport.get_extra_info("peername")
        self.peer = peer[0] if isinstance(peer, tuple) else None
        tap.connections.add(self)
        self.loop = asyncio.get_running_loop()
        self._arm_head_timer()
        self.spare = begin(_NO_CONTEXT)
        self.spare_id = new_request_id()

    def _arm_head_timer(self) -> None:
        """The next whole head must come within ``--header-timeout-s`` from now. The timer is made once and moved
        only when it fires (:meth:`_head_timed_out`): a keep-alive connection's requests each set the deadline,
        none makes, cancels or reschedules a timer."""
        if self.closed:
            return
        loop = self.loop or asyncio.get_running_loop()
        self.head_deadline = deadline = loop.time() + self.tap.o.header_timeout_s
        if self.head_timer is None:
            self.head_timer = loop.call_at(deadline, self._head_timed_out)

    def _head_timed_out(self) -> None:
        """No whole request head for ``--header-timeout-s`` (a slow or idle client): close, as servers do."""
        if self.accounting or (self.up is not None and self.up.deferred):  # (the pair's deferred work first: _Watches)
            self._settle()
        self.head_timer = None
        deadline = self.head_deadline
        if deadline is None:  # a head came since the timer was armed (the idle connection's next arm makes a new one)
            return
        loop = self.loop or asyncio.get_running_loop()
        if loop.time() < deadline:  # armed again since: it fires at the new deadline
            self.head_timer = loop.call_at(deadline, self._head_timed_out)
            return
        self.head_deadline = None
        if self.closed or self.current is not None or self.exchanges or self.opaque:
            return
        self.tap.counters.header_timeouts += 1
        log.debug("tap %s: %s sent no whole request head in %.0f s; closing", self.tap.o.link, self.peer, self.tap.o.header_timeout_s)
        self.transport.close()

    def on_lost(self, exc: BaseException | None) -> None:
        if self.accounting or (self.up is not None and self.up.deferred):  # (the pair's deferred work first: _Watches)
            self._settle()
        self.closed = True
        if self.head_timer is not None:
            self.head_timer.cancel()
            self.head_timer = None
        self.tap.connections.discard(self)
        if self.holding is not None:  # (their writes' fate is not learnt now: settled with what is known)
            self._release_held(True)
        t = self.lost_mono_ns
        up = self.up
        if self.connecting is not None:
            self.connecting.cancel()
        live = [ex for ex in self.exchanges if not ex.done]
        for ex in live:
            ex.rec.downstream_closed = t
            self._complete(ex)
        self.exchanges.clear()
        if self.current is not None and not self.current.done:
            self.current.rec.downstream_closed = t
            self._complete(self.current)
            self.current = None
        tun = self.tunnel
        if tun is not None:
            self.tunnel = None
            self._tunnel_ended(tun, "client")
        if up is None:
            return
        self.up = None
        up.down = None
        if live or self.opaque or not up.reusable() or not self.reader.idle:
            if self.reset_by_peer:
                reset(up.transport)
            else:
                up.transport.close()
        else:
            self.tap.pool_put(up)

    def on_eof(self) -> bool:
        """The client half-closed: pass it on after what it sent, keep relaying the response."""
        if self.accounting or (self.up is not None and self.up.deferred):  # (the pair's deferred work first: _Watches)
            self._settle()
        self.eof = True
        if self.holding is not None:  # (the client read what it meant to: the last chance to see the writes drained)
            self._release_held(False)
        if self.tunnel is not None:
            self.tunnel.rec.ws.connection_closed("client")
        if not self.exchanges and self.current is None and self.reader.idle and not self.opaque:
            return False  # a client closing an idle connection: close it; the upstream one goes back to the pool
        t = mono()
        for ex in self.exchanges:
            if ex.down_eof is None:
                ex.down_eof = t
        ex = self.current
        if ex is not None and not ex.done and not ex.request_done:  # the request broke off
            ex.rec.downstream_closed = t
        up = self.up
        if up is not None:
            if up.transport.can_write_eof():
                up.eof_sent = True
                up.transport.write_eof()
            if self.opaque and up.eof:  # a tunnel both ends have half-closed: over (closing this side closes the other)
                return False
        elif not self.exchanges and self.connecting is None:
            return False  # nothing in flight: close
        return True

    def on_pause_writing(self) -> None:
        if self.accounting or (self.up is not None and self.up.deferred):  # (the pair's deferred work first: _Watches)
            self._settle()
        if self.up is not None:
            self.up.transport.pause_reading()

    def on_resume_writing(self) -> None:
        if self.accounting or (self.up is not None and self.up.deferred):  # (the pair's deferred work first: _Watches)
            self._settle()
        if self.up is not None and not self.up.transport.is_closing():
            self.up.transport.resume_reading()

    # ---- request bytes ---------------------------------------------------------------------
    def on_data(self, data: bytes, t: int, bound: int) -> None:
        if self.accounting or (self.up is not None and self.up.deferred):  # (the pair's deferred work first: _Watches)
            self._settle()
        if self.holding is not None:  # (a client's next request: it has read the answers before it, usually)
            self._release_held(False)
        if self.opaque:
            tun, up = self.tunnel, self.up
            if tun is not None and up is not None:  # WebSocket: forwarded first, its frames watched after
                tw, bw = up.send(data)
                tun.rec.ws.client.feed(data, t, bound, tw, bw)
                tun.rec.end = tw
                return
            self._to_upstream(data)
            return
        if self.sniff is not None:  # HTTP/2 (prior knowledge, or ALPN h2 over TLS): the connection goes to the h2 relay
            data, self.sniff = self.sniff + data, None
            if h2relay.PREFACE.startswith(data[:24]) or h2relay.negotiated(self.transport):
                if len(data) < 24 and h2relay.PREFACE.startswith(data):
                    self.sniff = data
                    return
                h2relay.adopt(self, data, t, bound)
                return
            if self.tap.o.protocol == "grpc":  # a gRPC tap speaks HTTP/2 only: say so once, close
                self._not_http2(data)
                return
        self._process(data, self.reader.feed(data), t, bound)

    def _not_http2(self, data: bytes) -> None:
        c = self.tap.counters
        c.not_http2 += 1
        if c.not_http2 == 1 or c.not_http2 % 1000 == 0:
            log.warning("tap %s (--protocol grpc): a connection from %s did not open with HTTP/2's preface (first bytes %r); "
                        "closed (%d so far). gRPC clients speak HTTP/2; run the tap without --protocol grpc for HTTP/1.1",
                        self.tap.o.link, self.peer, bytes(data[:16]), c.not_http2)
        self.transport.close()

    def _process(self, data: bytes, events: list[tuple], t: int, bound: int) -> None:
        """One read's request events: forwarded first, accounted after. Before the upstream write only what the write
        needs (each head rewritten with its trace-context child and correlation header, a pooled connection when the
        pair has none); the records, timers, fingerprints, captures and stamps come after it (:meth:`_account`)."""
        out: list[bytes] = []
        pos = 0
        heads: list[tuple] = []  # per HEAD event, in order: what _begin needs of the forwarding pass
        ended = False  # the read holds a request's end (its forwarded stamp is the write's)
        n = len(events)
        for i, ev in enumerate(events):
            kind = ev[0]
            if kind == HEAD:
                start, end, head = ev[1], ev[2], ev[3]
                if start > pos:
                    out.append(data[pos:start])
                first = self.head_first if start < 0 and self.head_first is not None else (t, bound)
                self.head_first = None
                self.withheld.clear()
                if self.up is None and self.connecting is None and not self.opaque:
                    self._take_pooled()
                tap = self.tap
                span = self.spare
                # a head without trace context (most) takes the spare: one call (C: _h1.rewrite_spare) finds that and
                # the correlation header and makes the bytes; one with a traceparent gets a span begun from it
                got = None if span is None else rewrite_spare(head, tap.correlation_header, tap.host_header, tap.target_prefix,
                                                              span.trace_lines, self.spare_id)
                if got is not None:
                    self.spare = None
                    new_head, rid, created = got
                else:
                    span = begin(trace_context(head))
                    new_head, rid, created = rewrite_request_head(
                        head, correlation_header=tap.correlation_header, trace_headers=span.trace_headers,
                        host_header=tap.host_header, target_prefix=tap.target_prefix, lines=span.trace_lines, request_id=self.spare_id)
                if created:  # (the spare request id, if there was one, is taken)
                    self.spare_id = None
                heads.append((head, first, span, rid, created))
                out.append(new_head)
                pos = end
            elif kind == END:
                ended = True
            elif kind == ERROR:  # not HTTP the reader can frame: pass the rest of the connection on unparsed
                if self.withheld:  # (the unframeable head began in an earlier read: those bytes first)
                    out[:0] = self.withheld
                    self.withheld.clear()
                out.append(data[pos:])
                pos = len(data)
                self.opaque = True
                n = i + 1
                break
        reader = self.reader
        if not self.opaque:
            stop = reader.pending_from
            if stop is None:
                stop = len(data)
            elif not reader.held:
                if self.head_first is None:
                    self.head_first = (t, bound)
                self.withheld.append(data[stop:])
            if stop > pos:
                out.append(data[pos:stop])
        # the write: on the pair's upstream connection now, else queued for the one being opened
        stamp: tuple[int, int] | None = None
        queued = False
        payload = (out[0] if len(out) == 1 else b"".join(out)) if out else b""
        if payload:
            up = self.up
            if up is not None:
                w = up.watches
                tap = self.tap
                if w is not None and self.kernel is not None and not tap.draining:  # the rest after the tap gave its CPU back (_Watches)
                    # (a slow write that carried a request's end is placed there too, from what it left: the search of
                    # the packet log is no part of the forward, and its result is the same while the segment is in reach)
                    stamp = self._send_up(payload, ended, place=False)
                    placing = (up, up.unplaced) if ended and up.unplaced is not None else None
                    limit = tap.o.timeout_s
                    if heads:  # (its requests in flight from now: the gauge does not wait for the account)
                        tap.exchange_started(len(heads))
                    w.defer((self, data, events, n, heads, t, bound, stamp, False,
                             (self.loop or asyncio.get_running_loop()).time() if heads and limit is not None else None, True,
                             placing), limit)
                    return
                stamp = self._send_up(payload, ended)
            else:
                queued = True
                self._queue_up(payload)
        self._account(data, events, n, heads, t, bound, stamp, queued)

    def _account(self, data: bytes, events: list[tuple], n: int, heads: list[tuple], t: int, bound: int,
                 stamp: tuple[int, int] | None, queued: bool, now: float | None = None, counted: bool = False,
                 placing: tuple[Upstream, tuple[int, int, int]] | None = None) -> None:
        """What :meth:`_process` does after a read's bytes went upstream (or were queued for it): the exchanges begun,
        their body bytes fingerprinted and captured, their ends stamped; ``stamp``: the write that carried the read.
        ``now``: the loop's time at that read, when this runs later (deferred, :class:`_Watches`): the ``--timeout-s``
        timers count from it; ``counted``: its requests were counted in flight when it was deferred; ``placing``:
        ``(upstream, its unplaced write)`` when that write was slow and carried a request's end: ``stamp`` is placed at
        its departure here (what :meth:`_send_up` does at once when the account is not deferred)."""
        tap = self.tap
        ended: list[Exchange] = []
        h = 0
        for j in range(n):
            ev = events[j]
            kind = ev[0]
            if kind == BODY:
                ex = self.current
                if ex is not None:
                    chunk = memoryview(data)[ev[1] : ev[2]]
                    ex.rec.request_bytes += len(chunk)
                    fp = ex._fp
                    if fp is not None:  # (else the capture holds the body: hashed from it when asked, Exchange.fp)
                        fp.update(chunk)
                    cap = ex.capture
                    if cap is not None:
                        cap += chunk
                        if len(cap) > tap.o.max_capture_bytes:
                            if fp is None:
                                ex.fp  # noqa: B018 - (made now, from the body so far: the capture is dropped)
                            ex.capture = None
            elif kind == HEAD:
                self.head_deadline = None  # (the head timer, if pending, then does nothing when it fires)
                self._begin(heads[h], (t, bound), now, counted)
                h += 1
            elif kind == END:
                ex = self.current
                self.current = None
                if ex is not None:
                    ex.request_done = True
                    ex.rec.body_received = t
                    ex.rec.bounds[_EV_REQUEST_BODY_RECEIVED] = (bound, 0)
                    ended.append(ex)
            else:  # ERROR (the bytes went on unparsed: the connection is opaque from here)
                tap.metrics.counters.unparsed += 1
                log.info("tap %s: a request from %s is not HTTP/1.1 the tap can frame (%s); passing the connection on unparsed",
                         tap.o.link, self.peer, ev[2])
        if not ended:
            return
        if stamp is not None:
            u = None  # the write's own unplaced record, kept if its bytes were still held (_settle_held)
            if placing is not None:
                stamp = placing[0].place(placing[1], stamp[0], stamp[1])
                u = placing[1]
            elif not counted and self.up is not None:  # (at once: the upstream's latest write is this one)
                u = self.up.unplaced
            for ex in ended:
                self._forwarded(ex, stamp, u)
        elif queued:
            for ex in ended:
                ex.forward_pending = True
        else:
            for ex in ended:  # (nothing to write: the request's end came in bytes already sent)
                self._forwarded(ex, None)

    def _begin(self, begun: tuple, at: tuple[int, int], now: float | None = None, counted: bool = False) -> None:
        """The exchange of a request head already forwarded (``begun``: what the forwarding pass made of it; ``now``:
        the loop's time at its read, when that was earlier; ``counted``: already in flight; see :meth:`_account`)."""
        head, first, span, request_id, created = begun
        tap = self.tap
        o = tap.o
        path_query = _targets.get(head.target) or _path_query(head.target)
        rec = TapRecord(received=first[0], head=at[0], method=head.method.decode("latin-1"), path=path_query[0], query=path_query[1],
                        client_address=self.peer, request_id=request_id, request_id_created=created)
        rec.bounds[_EV_REQUEST_RECEIVED] = (first[1], 0)
        ex = Exchange(rec, span, None, head.method, tap.fp_key)
        self.current = ex
        self.exchanges.append(ex)
        if not counted:
            tap.exchange_started()
        if o.timeout_s is not None:
            loop = self.loop or asyncio.get_running_loop()
            ex.timer = loop.call_later(o.timeout_s, self._timed_out, ex) if now is None else loop.call_at(now + o.timeout_s, self._timed_out, ex)
        if self.up is None and self.connecting is None:
            self.connecting = asyncio.ensure_future(self._connect())
        if self.up is not None:
            self.up.reader.expect(head.method)
        else:
            self.expect_methods.append(head.method)

    # ---- upstream connection ---------------------------------------------------------------
    async def _connect(self, fresh: bool = False) -> None:
        tap = self.tap
        up = None if fresh else tap.pool_take()
        self.replay, self.replay_size = ([] if up is not None else None), 0
        if up is None:
            tap.counters.upstream_connections += 1
            try:
                _tr, up = await open_connection(lambda: Upstream(tap), tap.upstream_host, tap.upstream_port, ssl=tap.ssl_context,
                                                server_hostname=tap.upstream_host if tap.ssl_context else None,
                                                connect_timeout=UPSTREAM_CONNECT_TIMEOUT_S)
            except asyncio.CancelledError:
                raise
            except BaseException as exc:  # noqa: BLE001 - every failure becomes the exchanges' answer
                self.connecting = None
                self._connect_failed(exc)
                return
        self.connecting = None
        if self.closed:
            tap.pool_put(up)  # (it closes one that is not reusable)
            return
        self._attach(up)

    def _take_pooled(self) -> None:
        """Pair with an idle pooled upstream connection now, if the tap has one (a request head arrived on a connection
        without one): its bytes go out in this read's write rather than after a task's turn of the loop."""
        up = self.tap.pool_take()
        if up is not None:
            self.replay, self.replay_size = [], 0
            self._attach(up)

    def _attach(self, up: Upstream) -> None:
        """Pair with ``up`` (opened, or taken from the pool): what waited for it goes out."""
        self.up = up
        up.down = self
        for method in self.expect_methods:
            up.reader.expect(method)
        self.expect_methods.clear()
        pending, self.to_up = self.to_up, []
        waiting = [ex for ex in self.exchanges if ex.forward_pending]
        if pending:
            stamp = self._send_up(b"".join(pending), bool(waiting))
            for ex in waiting:
                ex.forward_pending = False
                self._forwarded(ex, stamp, up.unplaced)
        if self.eof and up.transport.can_write_eof():
            up.eof_sent = True
            up.transport.write_eof()
        if self.transport.is_closing():
            return
        if not self.transport.is_reading():
            self.transport.resume_reading()

    def _connect_failed(self, exc: BaseException) -> None:
        failure = connect_failure(exc)
        if failure.error_type == "upstream_unreachable":
            log.debug("tap %s: %s", self.tap.o.link, failure.cause)
        for ex in list(self.exchanges):
            self._answer(ex, failure)
        self.to_up.clear()

    def _to_upstream(self, payload: bytes) -> None:
        if self.up is not None:
            self._send_up(payload, False)
            return
        self._queue_up(payload)

    def _queue_up(self, payload: bytes) -> None:
        """Hold ``payload`` for the upstream connection being opened (an opaque connection opens its own; a request
        head's exchange opens it in :meth:`_begin`); reading pauses past 1 MiB held."""
        self.to_up.append(payload)
        if self.connecting is None and self.opaque:
            self.connecting = asyncio.ensure_future(self._connect())
        if sum(map(len, self.to_up)) > 1 << 20:
            self.transport.pause_reading()  # (resumed once connected)

    def _send_up(self, payload: bytes, ended: bool, place: bool = True) -> tuple[int, int]:
        """Write ``payload`` upstream; its stamp, placed at its departure when it carried a request's end (``ended``)
        and ``place`` (else the caller places it later from ``self.up.unplaced``: :meth:`_account`'s ``placing``)."""
        up = self.up
        assert up is not None
        replay = self.replay
        if replay is not None:
            self.replay_size += len(payload)
            if self.replay_size > REPLAY_MAX_BYTES:
                self.replay = None
            else:
                replay.append(payload)
        t, bound = up.send(payload)
        if place and ended and up.unplaced is not None:
            t, bound = up.place(up.unplaced, t, bound)
        return t, bound

    def _forwarded(self, ex: Exchange, stamp: tuple[int, int] | None, unplaced: tuple[int, int, int, bool] | None = None) -> None:
        """``ex``'s request went upstream by the write ``stamp`` (None: by the upstream's latest write); ``unplaced``:
        that write's unplaced record (:attr:`~deltatap.net.conn.StampedProtocol.unplaced`), kept with a write whose
        bytes were still held (bound -1) to place it later (:func:`_settle_held`)."""
        if stamp is None:
            up = self.up
            if up is None:
                return
            stamp = (up.last_write_mono or mono(), up.last_write_bound)
            unplaced = up.unplaced
        ex.rec.forwarded = stamp[0]
        ex.rec.bounds[_EV_REQUEST_FORWARDED] = (0, stamp[1])
        if stamp[1] < 0 and self.up is not None:  # (its bytes waited: settled later, _settle_held)
            held = ex.held
            if held is None:
                held = ex.held = {}
            held[_EV_REQUEST_FORWARDED] = (self.up, unplaced)
        elif ex.held is not None:  # (sent again on a fresh connection, retry_stale: the resend's stamp holds)
            ex.held.pop(_EV_REQUEST_FORWARDED, None)

    def retry_stale(self, up: Upstream) -> bool:
        """``up``, taken from the pool, closed or reset before any byte of an answer: the upstream ended that idle
        connection as the tap reused it, which a direct client (on a connection of its own) would never have met.
        Send what went on it again, once, on a fresh connection; the requests' forwarded stamps become the resend's.
        False (nothing done) when that cannot be the same as without the tap."""
        replay, self.replay = self.replay, None
        if replay is None or self.closed or self.opaque or not self.exchanges or any(ex.response_started for ex in self.exchanges):
            return False
        self.tap.counters.stale_retries += 1
        log.debug("tap %s: a pooled upstream connection closed before answering; sending again on a fresh one", self.tap.o.link)
        up.down = None
        self.up = None
        self.expect_methods = [ex.method for ex in self.exchanges]
        self.to_up[:0] = replay
        for ex in self.exchanges:
            if ex.request_done:
                ex.forward_pending = True
        self.connecting = asyncio.ensure_future(self._connect(fresh=True))
        return True

    # ---- tap-made answers ------------------------------------------------------------------
    def _answer(self, ex: Exchange, failure: Failure) -> None:
        """Answer ``ex`` with the tap's own error response (nothing of the upstream's came), then close."""
        rec = ex.rec
        t = mono()
        rec.failure = failure
        if failure.outcome == Outcome.TIMEOUT:
            rec.timeout = t
        else:
            rec.upstream_error = t
        self.tap.count_upstream_error(failure.error_type)
        rec.status = failure.status
        if not self.closed and not self.transport.is_closing():
            body = failure.body(self.tap.o.link, self.tap.upstream_str)
            head = (f"HTTP/1.1 {failure.status} {HTTPStatus(failure.status).phrase}\r\n"
                    f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                    f"{self.tap.o.correlation_header}: {rec.request_id}\r\nConnection: close\r\n\r\n").encode("latin-1")
            rec.end, _b = self.send(head + body)
            self.transport.close()  # (after what is written; the client learns the connection ends with this answer)
        self._complete(ex)

    def _timed_out(self, ex: Exchange) -> None:
        if self.accounting or (self.up is not None and self.up.deferred):  # (the pair's deferred work first: _Watches)
            self._settle()
        ex.timer = None
        if ex.done:
            return
        up = self.up
        if not ex.response_started:
            if up is not None:
                up.down = None
                self.up = None
                up.transport.abort()
            self._answer(ex, TAP_TIMEOUT)
            return
        ex.rec.failure = TAP_TIMEOUT
        ex.rec.timeout = mono()
        self.tap.count_upstream_error(TAP_TIMEOUT.error_type)
        if up is not None:
            up.transport.abort()
        self.transport.close()

    # ---- completion ------------------------------------------------------------------------
    def _tunnel_ended(self, ex: Exchange, by: str) -> None:
        ws = ex.rec.ws
        ws.connection_closed(by)
        for sender, why in ws.malformed():
            self.tap.counters.ws_malformed += 1
            log.info("tap %s: a WebSocket frame from the %s (%s) broke RFC 6455 (%s); its frames were relayed unwatched from there",
                     self.tap.o.link, sender, self.peer if sender == "client" else self.tap.upstream_str, why)
        self._complete(ex)

    def _complete(self, ex: Exchange) -> None:
        if ex.done:
            return
        ex.done = True
        if ex.timer is not None:
            ex.timer.cancel()
            ex.timer = None
        rec = ex.rec
        settled = _settle_writes(ex, self)
        rec.fingerprint = ex.fp.result()
        rec.request_capture = ex.capture
        rec.response_capture = ex.capture_out
        if settled or not self._hold(ex):
            self.tap.finish(ex.span, rec)
        if not self.exchanges and self.current is None and not self.opaque:
            self._arm_head_timer()  # (idle between requests: the next head must come in time too)
            if not self.closed:
                # the span ids and the request id of the connection's next request (see __init__), made at this
                # exchange's end, after its last forward: not in the request's account, which runs right after the
                # response's first read is forwarded (the first token's; session 27 "relay")
                if self.spare is None:
                    self.spare = begin(_NO_CONTEXT)
                if self.spare_id is None:
                    self.spare_id = new_request_id()
                if type(rec.stream) is StreamObserver and (self.spare_obs is None or self.spare_obs[0] != rec.path):
                    self.spare_obs = (rec.path, StreamObserver(path=rec.path))  # (an SSE answer: the next one likely too)

    def _hold(self, ex: Exchange) -> bool:
        """Keep the finish of ``ex``, over with a forwarding write still unknown, until that write has left (see
        :data:`HOLD_FINISH_S`): True when held. Not where nothing can tell (the connection closing or lost, a transport
        without a socket, no loop)."""
        tr = self.transport
        loop = self.loop
        if self.closed or tr is None or loop is None or tr.is_closing() or tr.get_extra_info("socket") is None:
            return False
        step = HOLD_STEP_S[0]
        ex.timer = loop.call_later(step, self._recheck_held, ex, loop.time() + HOLD_FINISH_S, step)
        if self.holding is None:
            self.holding = [ex]
        else:
            self.holding.append(ex)
        return True

    def _recheck_held(self, ex: Exchange, deadline: float, step: float) -> None:
        """``ex``'s timer (:meth:`_hold`): finished once its writes are settled, or at ``deadline``; else checked again
        after a longer step."""
        ex.timer = None
        if self.accounting or (self.up is not None and self.up.deferred):  # (the pair's deferred work first: _Watches)
            self._settle()
        holding = self.holding
        if holding is None or ex not in holding:  # (released meanwhile)
            return
        loop = self.loop or asyncio.get_running_loop()
        tr = self.transport
        if not _settle_writes(ex, self) and loop.time() < deadline and tr is not None and not tr.is_closing():
            step = min(step * 2, HOLD_STEP_S[1])
            ex.timer = loop.call_later(min(step, max(0.0, deadline - loop.time())), self._recheck_held, ex, deadline, step)
            return
        holding.remove(ex)
        if not holding:
            self.holding = None
        self.tap.finish(ex.span, ex.rec)

    def _release_held(self, lost: bool) -> None:
        """The exchanges whose finish waits (:meth:`_hold`) checked now: each settled one finished; every one when
        ``lost`` (the connection is gone: what is not known by now stays unknown)."""
        holding = self.holding
        assert holding is not None
        keep = []
        for ex in holding:
            if _settle_writes(ex, self) or lost:
                if ex.timer is not None:
                    ex.timer.cancel()
                    ex.timer = None
                self.tap.finish(ex.span, ex.rec)
            else:
                keep.append(ex)
        self.holding = keep or None


class Upstream(_Side):
    """The tap's connection to its upstream; paired with one :class:`Downstream` at a time.

    Response reads: :meth:`data_received` / :meth:`on_data` / :meth:`cuts_received` forward each read first, then
    watch it. A read (or a cuts list's piece) of body bytes alone — the response reader in a body state, a placed
    write, a stream observer or nothing to capture — is watched in one C call when ``deltatap.proxy._relay`` is built
    (:data:`_watch_read`, :data:`_watch_cuts`: framing, ``response_bytes``, ``chunks``, ``end``, the observer's feed
    and ``forwarded``); every other read, and every read without it, takes :meth:`_watch`, the definition. With it,
    :meth:`data_received`, :meth:`cuts_received` and :meth:`_Watches.run` themselves are C methods too (no Python
    frame for the usual read); the methods written here stay their definitions (``_py_data_received``, ...)."""

    __slots__ = ("tap", "reader", "down", "eof_sent", "eof", "keep_alive", "last_read_t", "last_read_bound", "plain", "watches",
                 "deferred")

    def __init__(self, tap: Tap) -> None:
        super().__init__()
        self.tap = tap
        self.reader = h1.Reader(False)
        self.down: Downstream | None = None
        self.eof_sent = False
        self.eof = False
        self.keep_alive = True
        self.last_read_t = 0  # the latest read's stamp and bound (a close-delimited body ends with that read)
        self.last_read_bound = 0
        # the response reader frames what comes (not opaque): it changes only in a read that held a head or an
        # unframeable byte, which _watch's general path handles (a read of body bytes alone never changes it)
        self.plain = True
        self.watches = _watches()  # where data_received defers its watch (None: watched at once)
        self.deferred = False  # a read of this pair waits in self.watches to be watched

    def reusable(self) -> bool:
        return (self.keep_alive and not self.eof and not self.eof_sent and self.reader.idle and not self.reader.opaque
                and self.lost_mono_ns is None and not self.transport.is_closing())

    def on_pause_writing(self) -> None:
        d = self.down
        if self.deferred or (d is not None and d.accounting):
            self.watches.run()  # type: ignore[union-attr]
        if d is not None:
            d.transport.pause_reading()

    def on_resume_writing(self) -> None:
        d = self.down
        if self.deferred or (d is not None and d.accounting):
            self.watches.run()  # type: ignore[union-attr]
        if d is not None and not d.transport.is_closing():
            d.transport.resume_reading()

    # ---- response bytes --------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        """:meth:`on_data` for the usual read (kernel-stamped, framed bytes, paired, nothing kept to replay) in one
        step: forwarded first, then framed and watched — after the poll round's other reads are forwarded
        (:class:`_Watches`; at once with deferral off)."""
        w = self.watches
        if self.deferred:
            w.run()  # type: ignore[union-attr]
        k = self.kernel
        d = self.down
        if k is None or d is None or not self.plain or d.replay is not None or k.rx_mono_ns is None:
            StampedProtocol.data_received(self, data)  # (→ on_data)
            return
        tw, bw = d.send(data)
        t = self.last_read_t = k.rx_mono_ns
        bound = self.last_read_bound = k.rx_bound_ns
        if w is not None:
            w.items.append((self, d, data, t, bound, tw, bw))
            self.deferred = True
            if not w.scheduled:
                w.scheduled = True
                w.loop.call_soon(w._round)
            return
        if _watch_read is not None and _watch_read(self, d, data, t, bound, tw, bw):
            return  # (body bytes alone: framed, counted and observed in one C call; see _relay.c)
        self._watch(d, data, self.reader.feed(data), t, bound, tw, bw)

    def on_data(self, data: bytes, t: int, bound: int) -> None:
        if self.deferred:
            self.watches.run()  # type: ignore[union-attr]
        d = self.down
        if d is None:  # idle in the pool: an upstream that talks unasked is not reusable
            self.transport.close()
            return
        tw, bw = d.send(data)  # forwarded first: watching comes after
        if d.accounting:  # (the request's account first: _Watches)
            self.watches.run()  # type: ignore[union-attr]
        self.last_read_t, self.last_read_bound = t, bound
        if d.replay is not None:
            d.replay = None  # (an answer began on this connection: it was not stale)
        if self.reader.opaque:
            if d.tunnel is not None:
                d.tunnel.rec.ws.server.feed(data, t, bound, tw, bw)
                d.tunnel.rec.end = tw
            elif d.exchanges:
                self._opaque_bytes(d, data, t, bound, tw, bw)
            return
        if _watch_read is not None and _watch_read(self, d, data, t, bound, tw, bw):
            return
        events = self.reader.feed(data)
        self._watch(d, data, events, t, bound, tw, bw)

    def cuts_received(self, data: bytes, pieces: list[tuple[int, int, int, int]]) -> None:
        """A late read that held several packets: forwarded in one write, watched packet by packet with each one's
        arrival (see :mod:`deltatap.net.kstamp`)."""
        if self.deferred:
            self.watches.run()  # type: ignore[union-attr]
        d = self.down
        if d is None:
            self.transport.close()
            return
        tw, bw = d.send(data)
        d.replay = None
        if d.accounting:  # (the request's account first: _Watches)
            self.watches.run()  # type: ignore[union-attr]
        watch_cuts = _watch_cuts
        i, n = 0, len(pieces)
        while i < n:
            if watch_cuts is not None and self.plain:  # the pieces of body bytes alone in C, up to the first other one
                i = watch_cuts(self, d, data, pieces, i, tw, bw)
                if i >= n:
                    return
            got = self._watch_piece(d, data, pieces[i], tw, bw)
            i += 1
            if got is None:
                return
            tw, bw = got

    def _watch_piece(self, d: Downstream, data: bytes, cut: tuple[int, int, int, int], tw: int, bw: int) -> tuple[int, int] | None:
        """One piece ``cut = (start, end, t, bound)`` of a cuts list (forwarded by the write ``(tw, bw)``) watched:
        the write's stamp after it (placed if a stamp that matters needed it), or None: the pair came apart."""
        start, end, t, bound = cut
        self.last_read_t, self.last_read_bound = t, bound
        piece = data[start:end]
        if not self.plain:
            if d.tunnel is not None:
                d.tunnel.rec.ws.server.feed(piece, t, bound, tw, bw)
                d.tunnel.rec.end = tw
            elif d.exchanges:
                self._opaque_bytes(d, piece, t, bound, tw, bw)
            return tw, bw
        tw, bw = self._watch(d, piece, self.reader.feed(piece), t, bound, tw, bw)
        return None if self.down is None else (tw, bw)

    def _watch(self, d: Downstream, data: bytes, events: list[tuple], t: int, bound: int, tw: int, bw: int) -> tuple[int, int]:
        """Watch one read's events (its bytes already forwarded by the write ``(tw, bw)``); returns that write's stamp,
        placed at its departure if a stamp that matters needed it. A read of body bytes alone is watched here
        (what :meth:`_watch_events` does with one BODY event), any other in :meth:`_watch_events`."""
        if len(events) == 1:
            ev = events[0]
            if ev[0] == BODY:
                exs = d.exchanges
                if not exs:
                    return tw, bw
                ex = exs[0]
                rec = ex.rec
                n = self._body(ex, data, ev[1], ev[2], t, bound)
                rec.chunks += 1
                rec.end = tw
                if n > 0:  # (a read that completed no content event has nothing to tell the observer: each read's are told)
                    obs = rec.stream
                    if d.unplaced is None:
                        ex.last_unplaced = None
                        obs.forwarded(tw, bw)  # type: ignore[union-attr]
                        if ex.first_unplaced is not None:
                            self._place_first(d, ex, obs)  # type: ignore[arg-type]
                    else:
                        tw, bw = self._forward_tokens(d, ex, obs, tw, bw)  # type: ignore[arg-type]
                return tw, bw
        tw, bw = self._watch_events(d, data, events, t, bound, tw, bw)
        self.plain = not self.reader.opaque
        return tw, bw

    def _body(self, ex: Exchange, data: bytes, start: int, end: int, t: int, bound: int) -> int:
        """One BODY piece ``data[start:end]`` of ``ex``'s response: counted, then fed to its stream observer (returns
        the content events that completed) or captured (returns -1: no observer)."""
        rec = ex.rec
        rec.response_bytes += end - start
        obs = rec.stream
        if obs is not None:
            return obs.feed(data if end - start == len(data) else data[start:end], t, bound)
        if ex.capture_out is not None:
            ex.capture_out += memoryview(data)[start:end]
            if len(ex.capture_out) > self.tap.o.max_capture_bytes:
                ex.capture_out = None
        return -1

    def _watch_events(self, d: Downstream, data: bytes, events: list[tuple], t: int, bound: int, tw: int, bw: int) -> tuple[int, int]:
        """:meth:`_watch` for a read with any events."""
        exs = d.exchanges
        ex = exs[0] if exs else None
        obs = ex.rec.stream if ex is not None else None
        fed = False  # payload of this read went to the observer (it is told where it was forwarded)
        seen = False  # payload of this read belongs to ex
        for ev in events:
            kind = ev[0]
            if kind == BODY:
                if ex is None:
                    continue
                seen = True
                if self._body(ex, data, ev[1], ev[2], t, bound) >= 0:
                    fed = True
            elif kind == HEAD:
                head = ev[3]
                if ex is None:
                    continue
                ex.response_started = True
                if head.status < 200 and head.status != 101:
                    continue  # interim (100, 103): relayed, the final head follows
                ex.final = True
                rec = ex.rec
                rec.status = head.status
                rec.response_headers = t
                rec.bounds[_EV_RESPONSE_HEADERS] = (bound, 0)
                u = d.unplaced
                if u is not None:
                    tw, bw = d.place(u, tw, bw)
                    d.unplaced = None
                rec.response_headers_forwarded = tw
                rec.bounds[_EV_RESPONSE_HEADERS_FORWARDED] = (0, bw)
                rec.end = tw
                if bw < 0:  # (TCP, or the transport, still held its bytes: placed or bounded later, _settle_held)
                    held = ex.held
                    if held is None:
                        held = ex.held = {}
                    held[_EV_RESPONSE_HEADERS_FORWARDED] = (d, u)
                if ex.held is not None:
                    _settle_held(ex)
                self.keep_alive = head.keep_alive and d.reader.head is not None and d.reader.head.keep_alive
                ctype = (head.get(b"content-type") or b"").lower()
                if ctype.startswith(b"text/event-stream"):
                    spare = d.spare_obs  # (made ahead at the connection's previous exchange's end, for the same path)
                    if spare is not None and spare[0] == rec.path:
                        d.spare_obs = None
                        obs = rec.stream = spare[1]
                    else:
                        obs = rec.stream = StreamObserver(path=rec.path)
                elif b"json" in ctype:
                    ex.capture_out = bytearray()
                if head.status == 101 and is_websocket_upgrade(head):
                    rec.ws = WsTunnel(negotiated_deflate(head))
                    d.tunnel = ex
                    if ex.timer is not None:  # (--timeout-s bounds the exchange up to the 101, not the tunnel)
                        ex.timer.cancel()
                        ex.timer = None
                if head.status == 101 or (ex.method == b"CONNECT" and 200 <= head.status < 300):
                    self._switch(d, True)
                elif d.reader.held:
                    self._switch(d, False)
            elif kind == END:
                if ex is None:
                    continue
                rec = ex.rec
                if not ex.final:
                    continue
                rec.response_end = t
                rec.bounds[_EV_RESPONSE_END] = (bound, 0)
                if obs is not None:
                    if fed:
                        tw, bw = self._forward_tokens(d, ex, obs, tw, bw)
                        fed = False
                    if obs.finish(t, bound):
                        tw, bw = self._forward_tokens(d, ex, obs, tw, bw)
                    if ex.first_unplaced is not None:
                        self._place_first(d, ex, obs)
                    if ex.last_unplaced is not None:  # the last token's write: its departure, now that it is the last
                        lt, lb = d.place(ex.last_unplaced, obs.last_token_forwarded_mono_ns or tw, obs.last_token_forwarded_bound_ns)
                        obs.last_token_forwarded_mono_ns, obs.last_token_forwarded_bound_ns = lt, lb
                        if lb >= 0:  # (else still held: kept, placed at the end or while the finish waits: _settle_writes)
                            ex.last_unplaced = None
                rec.end = tw
                if seen:
                    rec.chunks += 1
                    seen = False
                exs.popleft()
                if d.tunnel is ex:  # WebSocket: the span ends with the tunnel; frames after the 101 are its first
                    if ev[1] < len(data):
                        rec.ws.server.feed(memoryview(data)[ev[1]:], t, bound, tw, bw)
                    return tw, bw
                d._complete(ex)
                if self.reader.opaque:  # 101 / CONNECT: what follows is the tunnel, not an exchange
                    return tw, bw
                ex = exs[0] if exs else None
                obs = ex.rec.stream if ex is not None else None
            else:  # ERROR: an upstream response the reader cannot frame: passed on as it is
                self.tap.metrics.counters.unparsed += 1
                if ex is not None:  # (ev[2] is one of the reader's fixed reasons, never bytes from the wire)
                    ex.rec.failure = Failure(Outcome.UPSTREAM_ERROR, 502, "upstream_bad_response", f"the upstream sent a response the tap cannot frame ({ev[2]})")
                    self.tap.count_upstream_error("upstream_bad_response")
                    if not ex.response_started:  # its bytes are the client's already: the tap never answers for it
                        ex.response_started = True
                        ex.rec.response_headers, ex.rec.response_headers_forwarded = t, tw
                    ex.rec.end = tw
                self.keep_alive = False
                return tw, bw
        if ex is not None and seen:
            ex.rec.chunks += 1
            ex.rec.end = tw
            if fed and obs is not None:
                tw, bw = self._forward_tokens(d, ex, obs, tw, bw)
        return tw, bw

    @staticmethod
    def _forward_tokens(d: Downstream, ex: Exchange, obs: StreamObserver, tw: int, bw: int) -> tuple[int, int]:
        """Tell the observer where the bytes it was fed went; a slow write that carried the first token is placed
        at its departure now, one that carried a later token is kept to be placed if it turns out the last."""
        u = d.unplaced
        if u is not None:
            n, first = obs.unforwarded
            if first:
                tw, bw = d.place(u, tw, bw)
                d.unplaced = None
                ex.last_unplaced = None
                if bw < 0 and u[3]:  # (TCP still held its bytes: not out yet, placed at a later read)
                    ex.first_unplaced = u
            elif n:
                ex.last_unplaced = u
        elif obs.unforwarded[0]:
            ex.last_unplaced = None
        obs.forwarded(tw, bw)
        if ex.first_unplaced is not None and ex.first_unplaced is not u:
            Upstream._place_first(d, ex, obs)
        return tw, bw

    @staticmethod
    def _place_first(d: Downstream, ex: Exchange, obs: StreamObserver) -> None:
        """The first token's write, which TCP still held when it was placed: its departure from the packet log once
        its bytes left (tried at each later read of the exchange and at its end; until then its stamp is the write's
        with an unknown bound)."""
        t, b = d.place(ex.first_unplaced, obs.first_token_forwarded_mono_ns or 0, obs.first_token_forwarded_bound_ns)
        if b < 0 and _drained(d):  # (gone, though the packet log does not have it: it left by now)
            b = mono() - t
        if b >= 0:
            obs.first_token_forwarded_mono_ns, obs.first_token_forwarded_bound_ns = t, b
            ex.first_unplaced = None
        if ex.held is not None:
            _settle_held(ex)

    def _opaque_bytes(self, d: Downstream, data: bytes, t: int, bound: int, tw: int, bw: int) -> None:
        ex = d.exchanges[0]
        if not ex.response_started:  # an unframeable response: count its bytes on the exchange that waits
            ex.response_started = True
            ex.rec.response_headers = t
            ex.rec.response_headers_forwarded = tw
        ex.rec.response_bytes += len(data)
        ex.rec.end = tw

    def _switch(self, d: Downstream, switched: bool) -> None:
        held, events = d.reader.switch(switched)
        if switched:
            d.opaque = True
            self.keep_alive = False
            if held:
                d._to_upstream(held)
                tun = d.tunnel
                if tun is not None:  # client frames sent before the 101 came: they arrived after the request head
                    now = mono()
                    tun.rec.ws.client.feed(held, now, now - (tun.rec.head or tun.rec.received), self.last_write_mono or now,
                                           self.last_write_bound)
        elif held:
            d._process(held, events, mono(), 0)

    # ---- end of the connection -------------------------------------------------------------
    def on_eof(self) -> bool:
        if self.deferred or (self.down is not None and self.down.accounting):
            self.watches.run()  # type: ignore[union-attr]
        d = self.down
        if d is not None and d.replay is not None and d.retry_stale(self):
            return False
        self.eof = True
        if d is not None and d.tunnel is not None:
            d.tunnel.rec.ws.connection_closed("server")
        events = self.reader.feed_eof()
        if d is not None:
            if events and events[0][0] == END and d.exchanges:  # a close-delimited body ended with its last read
                t, bound = self.last_read_t, self.last_read_bound
                self._watch(d, b"", events, t, bound, d.last_write_mono or mono(), d.last_write_bound)
            self._upstream_ended(d)
            if d.transport.can_write_eof() and not d.transport.is_closing():
                d.transport.write_eof()
            if d.eof:
                d.transport.close()
        return not (d is None or d.eof)

    def on_lost(self, exc: BaseException | None) -> None:
        if self.deferred or (self.down is not None and self.down.accounting):
            self.watches.run()  # type: ignore[union-attr]
        self.tap.pool_discard(self)
        d = self.down
        if d is None or (d.replay is not None and d.retry_stale(self)):
            return
        self.down = None
        d.up = None
        if d.tunnel is not None:
            d.tunnel.rec.ws.connection_closed("server")
        self._upstream_ended(d)
        if self.reset_by_peer:
            reset(d.transport)
        elif not d.transport.is_closing():
            if not d.exchanges or any(ex.response_started for ex in d.exchanges) or d.opaque:
                d.transport.close()

    def _upstream_ended(self, d: Downstream) -> None:
        """The upstream closed (or reset) with exchanges unanswered or unfinished."""
        for ex in list(d.exchanges):
            if ex.done:
                continue
            if ex.down_eof is not None:  # the client closed first: the upstream's close answers that, it is no failure
                ex.rec.downstream_closed = ex.down_eof
                d.exchanges.remove(ex)
                d._complete(ex)
                continue
            # before or after the response began, the client meets the close (or the reset) as it would without the tap
            rec = ex.rec
            if rec.failure is None and not d.opaque:
                rec.failure = _RESET if self.reset_by_peer else _BROKE if ex.response_started else _CLOSED
                self.tap.count_upstream_error(rec.failure.error_type)
            rec.upstream_closed = self.lost_mono_ns or mono()
            d.exchanges.remove(ex)
            d._complete(ex)


# the response side's accelerator (proxy/_relay.c): a read of body bytes alone is framed (h1's C body step), counted,
# observed (the C stream observer) and told forwarded in one C call; any other read takes Upstream._watch (the definition)
_watch_read = _watch_cuts = None
_relay_acc = native.load("deltatap.proxy._relay", __name__)
if _relay_acc is not None and h1._body is not None:
    _native_observer = StreamObserver._native and _sse._ObservingParser is not None
    _relay_acc.setup(h1._body, h1._BODY_STATES, StreamObserver if _native_observer else None,
                     _sse._ObservingParser, _sse._gaps_observe, h1.Reader, Exchange, TapRecord)
    _watch_read, _watch_cuts = _relay_acc.watch, _relay_acc.watch_cuts
    # the usual read itself in C as well: Upstream.data_received, Upstream.cuts_received, _Watches.run and _round
    # become C methods (method descriptors: the reader callback calls them without a Python frame); the definitions
    # stay here as _py_data_received / _py_run / _py_cuts_received / _py_round, and the C calls the first three for
    # every read it does not handle (see _relay.c; a cuts list's pieces that are not body bytes alone go to
    # Upstream._watch or _watch_piece)
    _py_data_received, _py_run, _py_cuts_received, _py_round = (
        Upstream.data_received, _Watches.run, Upstream.cuts_received, _Watches._round)
    Upstream.data_received, _Watches.run, Upstream.cuts_received, _Watches._round = (  # type: ignore[method-assign]
        _relay_acc.reads_setup(Upstream, _Watches, _py_data_received, _py_run, _py_cuts_received,
                               StampedProtocol.data_received, StampedProtocol.send, globals()))


_CLOSED = Failure(Outcome.UPSTREAM_ERROR, 502, "upstream_closed", "the upstream closed the connection before the response began")
_BROKE = Failure(Outcome.UPSTREAM_ERROR, 502, "upstream_closed", "the upstream closed the connection before the response ended")
_RESET = classify(ConnectionResetError())


def ssl_context(verify: bool) -> _ssl.SSLContext:
    ctx = _ssl.create_default_context()
    if not verify:
        ctx.check_hostname = False
        ctx.verify_mode = _ssl.CERT_NONE
    return ctx
