"""The tap's process side: listening, the upstream pool, lifecycle, health, clock sync and span hand-off.

Bytes pass through :mod:`deltatap.proxy.relay` (asyncio protocols on stamped transports, :mod:`deltatap.net.conn`,
framing by the sans-I/O :mod:`deltatap.net.h1`); first-token decisions, statistics and span building live in
sans-I/O modules (:mod:`deltatap.core.sse`, :mod:`deltatap.proxy.headers`, :mod:`deltatap.proxy.errors`,
:mod:`deltatap.proxy.record`). aiohttp serves only the admin port (/metrics, /healthz).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import ssl
import time
from dataclasses import dataclass

from aiohttp import web

from deltatap.core.clocksync import ClockEstimate, estimate_offset
from deltatap.core.fingerprint import resolve_key
from deltatap.core.vocab import Outcome, tap_span_name
from deltatap.net import conn, kstamp
from deltatap.proxy.errors import Failure
from deltatap.proxy.metrics import TapMetrics, admin_app
from deltatap.proxy.options import TapOptions
from deltatap.proxy.record import TapRecord, record_attributes, span_constants
from deltatap.proxy.relay import POOL_MAX, Downstream, Upstream, settle, ssl_context
from deltatap.proxy.spans import SpanStart, emit
from deltatap.proxy import h2relay
from deltatap.proxy.tls import TlsServer, server_context
from deltatap.telemetry.tracer import Telemetry

log = logging.getLogger("deltatap.tap")
_SHUTDOWN = Failure(Outcome.UPSTREAM_ERROR, 503, "tap_shutdown", "the tap stopped: its grace period ended before the response did")
CLOCK_RETRY_FIRST_S = 0.5  # first retry of a failed clock exchange; doubles up to clock_resync_s


@dataclass
class RunningTap:
    """A started tap. ``url``: where downstream sends requests; ``admin_url``: /metrics and /healthz."""

    tap: Tap
    url: str
    port: int
    admin_url: str | None
    admin_port: int | None

    async def close(self, grace_s: float | None = None) -> None:
        await self.tap.close(grace_s)


class Tap:
    def __init__(self, options: TapOptions, telemetry: Telemetry, *, reuse_port: bool = False) -> None:
        self.o = options
        self.telemetry = telemetry
        self.clock: ClockEstimate | None = None
        self.metrics = TapMetrics(options.link, telemetry.stats, lambda: self.clock)
        self.counters = self.metrics.counters
        self.fp_key = resolve_key(options.fingerprint_key)  # resolved once, not per request
        up = options.upstream_url
        self.upstream_str = str(up)
        self.upstream_host = up.host or ""
        self.upstream_port = up.port or (443 if up.scheme == "https" else 80)
        self.ssl_context = ssl_context(options.verify_tls) if up.scheme == "https" else None
        # TLS toward the downstream (--tls-cert): decrypted above the stamped transport (deltatap.proxy.tls)
        self.tls_context = server_context(options.tls_cert, options.tls_key or "") if options.tls_cert else None
        prefix = up.raw_path.rstrip("/")
        self.target_prefix = prefix.encode("latin-1") if prefix else b""  # joined with each origin-form target
        self.correlation_header = options.correlation_header.lower().encode("latin-1")
        self.host_header = options.host_header.encode("latin-1") if options.host_header else None
        self.span_name = tap_span_name(options.link)
        o = options  # what every span carries the same
        self.span_constants = span_constants(
            link=o.link, downstream=o.downstream, downstream_kind=o.downstream_kind, upstream=o.upstream_name,
            upstream_kind=o.upstream_kind, upstream_host=self.upstream_host, upstream_port=self.upstream_port,
            correlation_header=o.correlation_header, labels=o.labels, query_keep=o.query_keep, fingerprint_key=self.fp_key)
        self.reuse_port = reuse_port
        self.in_flight = 0
        self.draining = False
        self.connections: set[Downstream] = set()
        self._pool: list[Upstream] = []
        self._idle = asyncio.Event()
        self._idle.set()
        self._server: asyncio.AbstractServer | None = None
        self._admin: web.AppRunner | None = None
        self._clock_task: asyncio.Task | None = None
        self._closed = False
        self.flush_s = 0.0  # how long close() spent flushing spans
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop the tap runs in (start)
        self._finished: list[tuple] = []  # exchanges finished whose spans are not built yet (finish, _emit_finished)

    # ---- lifecycle -----------------------------------------------------------------------
    async def start(self) -> RunningTap:
        o = self.o
        self._loop = asyncio.get_running_loop()
        if o.clock_sync:
            await self._sync_clock()
            self._clock_task = asyncio.create_task(self._clock_loop())
        if self.tls_context is not None:  # h2 offered to clients only where the upstream speaks it (proxy/h2relay.py)
            self.tls_context.set_alpn_protocols(list(await h2relay.downstream_alpn(self)))
        try:
            self._server = await conn.start_server(self._accept, o.listen_host, o.listen_port, backlog=1024, reuse_port=self.reuse_port)
        except OSError as exc:
            from deltatap.core.config import ConfigError, listen_error_line

            if self._clock_task is not None:
                self._clock_task.cancel()
            raise ConfigError(listen_error_line("--listen", o.listen_host, o.listen_port, exc)) from None
        port = self._server.sockets[0].getsockname()[1]
        admin_url = admin_port = None
        if o.admin_port is not None:
            self._admin = web.AppRunner(admin_app(self.metrics, self._health), access_log=None)
            await self._admin.setup()
            asite = web.TCPSite(self._admin, o.admin_host, o.admin_port, reuse_address=True, reuse_port=self.reuse_port or None)
            try:
                await asite.start()
            except OSError as exc:
                await self.close(0)
                from deltatap.core.config import ConfigError, listen_error_line

                raise ConfigError(listen_error_line("--admin", o.admin_host, o.admin_port, exc)) from None
            admin_port = asite._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            admin_url = f"http://{_host_for_url(o.admin_host)}:{admin_port}"
        url = f"{'https' if self.tls_context else 'http'}://{_host_for_url(o.listen_host)}:{port}"
        log.info(
            "tap %s listening on %s -> %s (admin %s; reads stamped by %s)", o.link, url, self.upstream_str, admin_url or "off",
            {"packet": "the kernel, per packet where it merged them (packet socket)",
             "kernel": "the kernel (no packet socket: CAP_NET_RAW missing or DELTATAP_PACKET_STAMPS=0; a merged read keeps the later stamp)",
             "process": "the process (DELTATAP_KERNEL_STAMPS=0 or not Linux)"}[kstamp.stamp_source()],
        )
        problem = await self.probe_upstream()
        if problem:
            log.warning("tap %s: upstream %s is not reachable (%s); requests get 502 until it is, and /healthz says so",
                        o.link, self.upstream_str, problem)
        return RunningTap(self, url, port, admin_url, admin_port)

    def _accept(self) -> Downstream | TlsServer:
        self.counters.connections += 1
        if self.tls_context is not None and len(self.connections) < self.o.max_connections:  # (else refused at accept, below)
            return TlsServer(self.tls_context, lambda _alpn: Downstream(self), handshake_timeout_s=self.o.header_timeout_s,
                             on_failure=self._tls_failed)
        return Downstream(self)

    def _tls_failed(self, why: str, peer: str | None) -> None:
        c = self.counters
        c.tls_handshake_failures += 1
        (log.info if c.tls_handshake_failures == 1 or c.tls_handshake_failures % 1000 == 0 else log.debug)(
            "tap %s: a TLS handshake from %s failed (%s); closed (%d so far)", self.o.link, peer, why, c.tls_handshake_failures)

    def connection_refused(self) -> None:
        c = self.counters
        c.connections_refused += 1
        if c.connections_refused == 1 or c.connections_refused % 1000 == 0:
            log.warning("tap %s: %d connections open (--max-connections); closing new ones at accept (%d so far)",
                        self.o.link, len(self.connections), c.connections_refused)

    async def close(self, grace_s: float | None = None) -> None:
        """Stop accepting, let requests in flight finish for up to ``grace_s``, then stop and flush spans."""
        if self._closed:
            return
        self._closed = True
        self.draining = True
        settle()  # (requests whose accounts wait: their exchanges begun; while draining none waits)
        grace = self.o.grace_s if grace_s is None else grace_s
        if self._server is not None:
            self._server.close()
        for d in list(self.connections):  # idle keep-alive connections end now; busy ones after their exchange
            if isinstance(d, h2relay.H2Downstream):
                d.go_away()  # (HTTP/2: a GOAWAY first, so the client opens no new streams; those in flight go on)
            if not d.exchanges and d.current is None and getattr(d, "tunnel", None) is None:
                d.transport.close()
        if self.in_flight:
            log.info("tap %s: waiting up to %.1fs for %d requests in flight", self.o.link, grace, self.in_flight)
            try:
                await asyncio.wait_for(self._idle.wait(), grace)
            except asyncio.TimeoutError:
                log.warning("tap %s: %d requests still in flight after the grace period; closing them", self.o.link, self.in_flight)
        for d in list(self.connections):
            for ex in d.exchanges:  # cut by the tap itself, not by the client or the upstream
                if not ex.done and ex.rec.failure is None:
                    ex.rec.failure = _SHUTDOWN
                    self.count_upstream_error(_SHUTDOWN.error_type)
            if d.up is not None:
                d.up.transport.abort()
            d.transport.abort()
        for up in self._pool:
            up.transport.close()
        self._pool.clear()
        await asyncio.sleep(0)  # (let the transports report their loss: the last spans are finished)
        self._emit_finished()  # (and built, before the flush)
        if self._clock_task is not None:
            self._clock_task.cancel()
        if self._admin is not None:
            await self._admin.cleanup()
        # flushed within the span shutdown deadline (DELTATAP_SPAN_SHUTDOWN_S), not longer: a hanging backend must not
        # hold the tap's exit beyond what the caller's shutdown then allows
        deadline_s = getattr(self.telemetry.processor, "shutdown_deadline_s", 5.0)
        t0 = time.monotonic()
        await asyncio.get_running_loop().run_in_executor(None, self.telemetry.processor.force_flush, int(1000 * deadline_s))
        self.flush_s = time.monotonic() - t0  # (the caller's telemetry shutdown gets what is left of the deadline)
        s = self.telemetry.stats
        log.info("tap %s closed: spans exported %d, dropped %d", self.o.link, s.spans_exported, s.spans_dropped)

    # ---- upstream pool -------------------------------------------------------------------
    def pool_take(self) -> Upstream | None:
        pool = self._pool
        while pool:
            up = pool.pop()
            if up.reusable():
                return up
            up.transport.close()
        return None

    def pool_put(self, up: Upstream) -> None:
        if self._closed or len(self._pool) >= POOL_MAX or not up.reusable():
            up.transport.close()
            return
        self._pool.append(up)

    def pool_discard(self, up: Upstream) -> None:
        try:
            self._pool.remove(up)
        except ValueError:
            pass

    async def probe_upstream(self, timeout_s: float = 1.0) -> str | None:
        """None if a connection to the upstream opens within ``timeout_s`` (for an ``https://`` upstream: with its TLS
        handshake, verified as the relay's), else why not (one phrase)."""
        tls = self.ssl_context
        try:
            _r, w = await asyncio.wait_for(asyncio.open_connection(
                self.upstream_host, self.upstream_port, ssl=tls, server_hostname=self.upstream_host if tls else None), timeout_s)
        except asyncio.TimeoutError:
            return f"no answer to a {'TLS' if tls else 'TCP'} connect within {timeout_s:g} s"
        except ssl.SSLCertVerificationError as exc:
            return f"its TLS certificate is not trusted ({exc.verify_message or exc.reason}; --insecure for a self-signed one)"
        except ssl.SSLError as exc:
            hint = "; plain HTTP? then --upstream http://" if exc.reason == "WRONG_VERSION_NUMBER" else ""
            return f"TLS handshake failed ({exc.reason or exc}{hint})"
        except socket.gaierror as exc:
            return f"cannot resolve {self.upstream_host} ({exc.strerror or exc})"
        except OSError as exc:
            return (os.strerror(exc.errno) if exc.errno else str(exc)).lower()
        w.close()
        return None

    async def _health(self) -> tuple[bool, dict]:
        problem = None if self.draining else await self.probe_upstream()
        status = "draining" if self.draining else "upstream_unreachable" if problem else "ok"
        doc = {
            "status": status,
            "link": self.o.link,
            "upstream": self.upstream_str,
            "in_flight": self.in_flight,
            "spans_dropped": self.telemetry.stats.spans_dropped,
        }
        if problem:
            doc["upstream_problem"] = problem
        return status == "ok", doc

    async def _sync_clock(self) -> None:
        try:
            self.clock = await estimate_offset(self.o.clock_sync or "")
        except ConnectionError as exc:
            first = not getattr(self, "_clock_warned", False)
            self._clock_warned = True
            (log.warning if first else log.debug)("tap %s: %s; spans carry no clock offset until it succeeds (retrying)", self.o.link, exc)

    async def _clock_loop(self) -> None:
        """Re-estimate every ``clock_resync_s``; while no exchange has succeeded yet (a tap started
        before its collector), retry promptly: after 0.5 s, then twice as long each time, up to the
        resync period, so spans carry an offset within a second or two of the collector answering."""
        retry = CLOCK_RETRY_FIRST_S
        while True:
            if self.clock is None:
                await asyncio.sleep(min(retry, self.o.clock_resync_s))
                retry *= 2
            else:
                await asyncio.sleep(self.o.clock_resync_s)
            await self._sync_clock()

    # ---- exchanges ------------------------------------------------------------------------
    def exchange_started(self, n: int = 1) -> None:
        """``n`` requests began (a deferred account's are counted when it is deferred: ``relay.Downstream._process``)."""
        self.in_flight += n
        self.counters.in_flight += n
        if self.in_flight == n:  # (_idle is set only where in_flight reaches 0: clear it once, not per request)
            self._idle.clear()

    def count_upstream_error(self, error_type: str) -> None:
        _bump(self.counters.upstream_errors, error_type)

    def finish(self, span: SpanStart, rec: TapRecord) -> None:
        """Bookkeeping now; the span after the event loop's current round of callbacks (:meth:`_emit_finished`): the
        reads that round holds are forwarded first. Never raises into the relay."""
        self.in_flight -= 1
        c = self.counters
        c.in_flight -= 1
        if self.in_flight == 0:
            self._idle.set()
            if self.draining:  # connections left idle by the last exchange end now
                for d in list(self.connections):
                    if not d.exchanges and d.current is None and getattr(d, "tunnel", None) is None:
                        d.transport.close()
        try:
            outcome = rec.outcome = rec.final_outcome()  # (settled: the record is over)
            _bump(c.requests, outcome._value_)
            overheads = request, first_token, _hop = rec.overheads()
            if request is not None:
                c.overhead_request.observe_ns(request)
            if first_token is not None:
                c.overhead_first_token.observe_ns(first_token)
            s = rec.stream
            if s is not None and s.first_token_mono_ns is not None and rec.forwarded is not None:
                c.upstream_ttft.observe_ns(max(0, s.first_token_mono_ns - rec.forwarded))
            c.request_bytes += rec.request_bytes
            c.response_bytes += rec.response_bytes
        except Exception:  # pragma: no cover - a bug here must not break traffic
            log.exception("tap %s: failed to record a span", self.o.link)
            return
        finished = self._finished
        finished.append((span, rec, outcome, overheads))
        if len(finished) == 1:
            loop = self._loop
            if loop is None or loop.is_closed():
                self._emit_finished()  # (no loop of its own, or it stopped: now)
            else:
                loop.call_soon(self._emit_finished)

    def _emit_finished(self) -> None:
        """The spans of the exchanges :meth:`finish` took since the last call, in that order: attributes built and handed
        to the span processor. (Off the forwarding path: a record is complete when finish takes it, nothing in it
        changes after, and every stamp in it was taken then; building its span later changes no byte of the span.)"""
        finished, self._finished = self._finished, []
        telemetry, name, consts, clock, respect = self.telemetry, self.span_name, self.span_constants, self.clock, self.o.respect_sampling
        for span, rec, outcome, overheads in finished:
            try:
                emit(telemetry, name, span, rec, record_attributes(rec, consts, clock, outcome, overheads), respect)
            except Exception:  # pragma: no cover - a bug here must not break traffic
                log.exception("tap %s: failed to record a span", self.o.link)


def _bump(counts: dict[str, int], key: str) -> None:
    counts[key] = counts.get(key, 0) + 1


def _host_for_url(host: str) -> str:
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


async def start_tap(options: TapOptions, telemetry: Telemetry, *, reuse_port: bool = False) -> RunningTap:
    """Start a tap in the running event loop (see :mod:`proxy`). ``reuse_port``: share the listening port with
    other processes (``deltatap tap --workers N``)."""
    return await Tap(options, telemetry, reuse_port=reuse_port).start()
