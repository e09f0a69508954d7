"""The one module of the tap that owns sockets: aiohttp server downstream, aiohttp client upstream.

It forwards bytes and takes stamps (:mod:`deltatap.net.wire`, one ``mono_ns`` per event, at the
socket); framing, first-token decisions, statistics and span building live in sans-I/O modules
(:mod:`deltatap.core.sse`, :mod:`deltatap.proxy.headers`, :mod:`deltatap.proxy.errors`, :mod:`deltatap.proxy.record`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
from dataclasses import dataclass

import aiohttp
from aiohttp import web
from yarl import URL

from deltatap.net import kstamp
from deltatap.core.clock import mono_ns
from deltatap.core.clocksync import ClockEstimate, estimate_offset
from deltatap.core.fingerprint import Fingerprinter, fingerprint, resolve_key
from deltatap.core.sse import StreamObserver
from deltatap.telemetry.tracer import Telemetry
from deltatap.core.vocab import Outcome, TapEvent, tap_span_name
from deltatap.net.wire import (
    connection_lost_mono_ns,
    last_read_bound_ns,
    last_read_mono_ns,
    last_write_bound_ns,
    last_write_mono_ns,
    make_stamping_connector,
    make_stamping_server_runner,
    make_stamping_site,
    request_head_mono_ns,
    request_received_bound_ns,
    request_received_mono_ns,
    upstream_stamps,
)
from deltatap.proxy.errors import Failure, classify
from deltatap.proxy.headers import downstream_response_headers, upstream_request_headers
from deltatap.proxy.metrics import TapMetrics, admin_app
from deltatap.proxy.options import TapOptions
from deltatap.proxy.record import TapRecord, attributes
from deltatap.proxy.response import RelayedResponse
from deltatap.proxy.spans import SpanStart, begin, emit

log = logging.getLogger("deltatap.tap")
CLOCK_RETRY_FIRST_S = 0.5  # first retry of a failed clock exchange; doubles up to clock_resync_s

_SKIP_AUTO = frozenset({"Accept", "Accept-Encoding", "User-Agent", "Content-Type"})
_READ_WHOLE = 64 * 1024  # request bodies up to this size with a Content-Length are read at once
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


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
    def __init__(self, options: TapOptions, telemetry: Telemetry) -> None:
        self.o = options
        self.telemetry = telemetry
        self.clock: ClockEstimate | None = None
        self.metrics = TapMetrics(options.link, telemetry.stats, lambda: self.clock)
        self.counters = self.metrics.counters
        self._fp_key = resolve_key(options.fingerprint_key)  # resolved once, not per request
        up = options.upstream_url
        self.upstream_str = str(up)
        self.upstream_base = str(up.with_path(up.path.rstrip("/")))  # prefix joined with each raw path
        self.upstream_host = up.host or ""
        self.upstream_port = up.port or (443 if up.scheme == "https" else 80)
        self.span_name = tap_span_name(options.link)
        self.in_flight = 0
        self.draining = False
        self._idle = asyncio.Event()
        self._idle.set()
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.ServerRunner | None = None
        self._site: web.TCPSite | None = None
        self._admin: web.AppRunner | None = None
        self._clock_task: asyncio.Task | None = None
        self._closed = False

    # ---- lifecycle -----------------------------------------------------------------------
    async def start(self) -> RunningTap:
        o = self.o
        ssl_arg: ssl.SSLContext | bool = True if o.verify_tls else False
        connector = make_stamping_connector(limit=0, ssl=ssl_arg, enable_cleanup_closed=False)
        timeout = aiohttp.ClientTimeout(total=o.timeout_s, sock_connect=None, sock_read=None, connect=None)
        self._session = aiohttp.ClientSession(
            connector=connector, timeout=timeout, auto_decompress=False, cookie_jar=aiohttp.DummyCookieJar(),
            skip_auto_headers=_SKIP_AUTO, trust_env=False,
        )
        if o.clock_sync:
            await self._sync_clock()
            self._clock_task = asyncio.create_task(self._clock_loop())
        # close() waits out the grace period itself; what is left after it is cancelled at once
        self._runner = make_stamping_server_runner(self._handle, handler_cancellation=True, shutdown_timeout=0.05, access_log=None)
        await self._runner.setup()
        self._site = make_stamping_site(self._runner, o.listen_host, o.listen_port, backlog=1024, reuse_address=True)
        try:
            await self._site.start()
        except OSError as exc:
            await self._session.close()
            await self._runner.cleanup()
            from deltatap.core.config import ConfigError

            raise ConfigError(f"--listen {o.listen_host}:{o.listen_port}: cannot listen ({exc.strerror or exc})") from None
        port = self._site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        admin_url = admin_port = None
        if o.admin_port is not None:
            self._admin = web.AppRunner(admin_app(self.metrics, self._health), access_log=None)
            await self._admin.setup()
            asite = web.TCPSite(self._admin, o.admin_host, o.admin_port, reuse_address=True)
            try:
                await asite.start()
            except OSError as exc:
                await self.close(0)
                from deltatap.core.config import ConfigError

                raise ConfigError(f"--admin {o.admin_host}:{o.admin_port}: cannot listen ({exc.strerror or exc})") from None
            admin_port = asite._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            admin_url = f"http://{_host_for_url(o.admin_host)}:{admin_port}"
        url = f"http://{_host_for_url(o.listen_host)}:{port}"
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

    async def close(self, grace_s: float | None = None) -> None:
        """Stop accepting, let requests in flight finish for up to ``grace_s``, then stop and flush spans."""
        if self._closed:
            return
        self._closed = True
        self.draining = True
        grace = self.o.grace_s if grace_s is None else grace_s
        if self._site is not None:
            await self._site.stop()
        if self.in_flight:
            log.info("tap %s: waiting up to %.1fs for %d requests in flight", self.o.link, grace, self.in_flight)
            try:
                await asyncio.wait_for(self._idle.wait(), grace)
            except asyncio.TimeoutError:
                log.warning("tap %s: %d requests still in flight after the grace period; closing them", self.o.link, self.in_flight)
        if self._runner is not None:
            await self._runner.cleanup()
        if self._clock_task is not None:
            self._clock_task.cancel()
        if self._session is not None:
            await self._session.close()
        if self._admin is not None:
            await self._admin.cleanup()
        await asyncio.get_running_loop().run_in_executor(None, self.telemetry.processor.force_flush, 5_000)
        s = self.telemetry.stats
        log.info("tap %s closed: spans exported %d, dropped %d", self.o.link, s.spans_exported, s.spans_dropped)

    async def probe_upstream(self, timeout_s: float = 1.0) -> str | None:
        """None if a TCP connection to the upstream opens within ``timeout_s``, else why not (one phrase)."""
        try:
            _r, w = await asyncio.wait_for(asyncio.open_connection(self.upstream_host, self.upstream_port), timeout_s)
        except asyncio.TimeoutError:
            return f"no answer to a TCP connect within {timeout_s:g} s"
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

    # ---- one request ---------------------------------------------------------------------
    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        now = mono_ns()
        received = request_received_mono_ns(request) or now
        rec = TapRecord(
            received=received,
            head=request_head_mono_ns(request) or now,
            method=request.method,
            path=request.path,
            query=request.query_string,
            client_address=request.remote,
        )
        rec.bounds[TapEvent.REQUEST_RECEIVED] = (request_received_bound_ns(request), 0)
        self.in_flight += 1
        self._idle.clear()
        self.counters.in_flight += 1
        span = begin(request.headers)
        resp: aiohttp.ClientResponse | None = None
        try:
            headers, rec.request_id = upstream_request_headers(
                request.headers, correlation_header=self.o.correlation_header, host_header=self.o.host_header, trace_headers=span.trace_headers
            )
            if request.headers.get("Expect", "").lower() == "100-continue":
                await request.writer.write(_CONTINUE)
            data = await self._request_body(request, rec)
            url = URL(self.upstream_base + request.raw_path, encoded=True)
            try:
                resp = await self._session.request(  # type: ignore[union-attr]
                    request.method, url, headers=headers, data=data, allow_redirects=False, compress=None
                )
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                return await self._fail_before_head(request, rec, exc)
            return await self._relay(request, rec, resp)
        except asyncio.CancelledError:
            rec.downstream_closed = connection_lost_mono_ns(request) or mono_ns()
            raise
        finally:
            if resp is not None and rec.response_end is None:
                resp.close()  # the downstream went away or the stream broke: close the upstream at once
            self._finish(span, rec)

    async def _request_body(self, request: web.BaseRequest, rec: TapRecord):
        """Bytes (small bodies, already read) or an async generator streaming the body upstream."""
        length = request.content_length
        if not request.body_exists:
            rec.body_received = rec.head
            return None
        if length is not None and length <= _READ_WHOLE:
            body = await request.read()
            rec.body_received = last_read_mono_ns(request) or mono_ns()
            rec.bounds[TapEvent.REQUEST_BODY_RECEIVED] = (last_read_bound_ns(request), 0)
            rec.request_bytes = len(body)
            rec.request_body = body  # hashed (and parsed) in _finish, off the request path
            return body
        capture_limit = self.o.max_capture_bytes
        fp = Fingerprinter(self._fp_key)

        async def stream():
            content = request.content
            capture = bytearray()
            while True:
                chunk = await content.readany()
                if not chunk:
                    break
                fp.update(chunk)
                rec.request_bytes += len(chunk)
                if capture is not None:
                    capture += chunk
                    if len(capture) > capture_limit:
                        capture = None
                yield chunk
            rec.body_received = last_read_mono_ns(request) or mono_ns()
            rec.bounds[TapEvent.REQUEST_BODY_RECEIVED] = (last_read_bound_ns(request), 0)
            rec.fingerprint = fp.result()
            rec.request_capture = capture

        return stream()

    async def _fail_before_head(self, request: web.BaseRequest, rec: TapRecord, exc: BaseException) -> web.StreamResponse:
        t = mono_ns()  # reported by aiohttp only when our task resumes: as close as a connect failure gets
        failure = classify(exc)
        rec.failure = failure
        if failure.outcome == Outcome.TIMEOUT:
            rec.timeout = t
        else:
            rec.upstream_error = t
        _bump(self.counters.upstream_errors, failure.error_type)
        rec.status = failure.status
        out = web.StreamResponse(status=failure.status)
        out.content_type = "application/json"
        out.headers[self.o.correlation_header] = rec.request_id
        body = failure.body(self.o.link, self.upstream_str)
        out.content_length = len(body)
        try:
            await out.prepare(request)
            await out.write(body)
            rec.end = last_write_mono_ns(request) or mono_ns()
            await out.write_eof()
        except ConnectionError:
            rec.downstream_closed = connection_lost_mono_ns(request) or mono_ns()
        return out

    async def _relay(self, request: web.BaseRequest, rec: TapRecord, resp: aiohttp.ClientResponse) -> web.StreamResponse:
        up = upstream_stamps(resp)
        now = mono_ns()
        rec.forwarded = (up.request_written_mono_ns if up else None) or now
        rec.response_headers = (up.head_mono_ns if up else None) or now
        if up is not None:
            rec.bounds[TapEvent.REQUEST_FORWARDED] = (0, up.request_written_bound_ns)
            rec.bounds[TapEvent.RESPONSE_HEADERS] = (up.head_bound_ns, 0)
        rec.status = resp.status
        out = RelayedResponse(status=resp.status, reason=resp.reason)
        out.headers.extend(downstream_response_headers(resp.headers))
        content = resp.content
        if content.total_bytes or content.is_eof():
            # body bytes already arrived with the head: send the head with them, in one write
            # (the client sees the same bytes at the same moment, with one syscall fewer)
            out._send_headers_immediately = False
        try:
            await out.prepare(request)
        except ConnectionError:
            rec.downstream_closed = connection_lost_mono_ns(request) or mono_ns()
            return out
        rec.response_headers_forwarded = last_write_mono_ns(request) or mono_ns()
        rec.end = rec.response_headers_forwarded
        ctype = resp.headers.get("Content-Type", "")
        obs = StreamObserver(path=request.path) if ctype.startswith("text/event-stream") else None
        rec.stream = obs
        capture = bytearray() if obs is None and "json" in ctype and (resp.content_length or 0) <= self.o.max_capture_bytes else None
        consumed = 0
        while True:
            try:
                chunk = await content.readany()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._broken_upstream(request, rec, up, exc)
                return out
            if not chunk:
                break
            last = content.at_eof()  # the upstream body is complete: end ours in the same write
            try:
                if last:
                    await out.write_eof(chunk)
                else:
                    await out.write(chunk)
            except ConnectionError:  # the downstream went away; the caller closes the upstream
                rec.downstream_closed = connection_lost_mono_ns(request) or mono_ns()
                return out
            t_out = last_write_mono_ns(request) or mono_ns()
            start = consumed
            consumed += len(chunk)
            rec.chunks += 1
            if obs is not None:
                view = memoryview(chunk)
                if up is None:
                    obs.feed(view, t_out)
                else:
                    for a, b, t, bound in up.slices(start, consumed, bounds=True):
                        obs.feed(view[a - start : b - start], t, bound)
                obs.forwarded(t_out, last_write_bound_ns(request))
            elif capture is not None:
                capture += chunk
                if len(capture) > self.o.max_capture_bytes:
                    capture = None
            if last:
                break
        rec.response_bytes = consumed
        rec.response_end = (up.arrival_mono_ns(consumed) if up and consumed else None) or rec.response_headers
        if obs is not None:
            if obs.finish(rec.response_end, up.bound_at(consumed) if up and consumed else 0):
                obs.forwarded(last_write_mono_ns(request) or mono_ns(), last_write_bound_ns(request))
        rec.response_capture = capture
        try:
            await out.write_eof()  # a no-op when the last chunk already ended the response
        except ConnectionError:
            rec.downstream_closed = connection_lost_mono_ns(request) or mono_ns()
            return out
        rec.end = last_write_mono_ns(request) or mono_ns()
        return out

    def _broken_upstream(self, request: web.BaseRequest, rec: TapRecord, up, exc: BaseException) -> None:
        """The upstream failed after the head was forwarded: pass the break on by closing downstream."""
        failure = classify(exc)
        rec.failure = failure
        lost = up.connection_lost_mono_ns if up is not None else None
        t = lost or mono_ns()
        if failure.outcome == Outcome.TIMEOUT:
            rec.timeout = t
        elif failure.error_type in ("upstream_closed", "upstream_broken_stream"):
            rec.upstream_closed = t
        else:
            rec.upstream_error = t
        _bump(self.counters.upstream_errors, failure.error_type)
        rec.end = last_write_mono_ns(request) or t
        if request.transport is not None:
            request.transport.close()

    def _finish(self, span: SpanStart, rec: TapRecord) -> None:
        """Bookkeeping and span export; synchronous, never raises into the request path."""
        self.in_flight -= 1
        c = self.counters
        c.in_flight -= 1
        if self.in_flight == 0:
            self._idle.set()
        try:
            o = self.o
            body = rec.request_body
            if body is not None:
                rec.fingerprint = fingerprint(body, self._fp_key)
                if len(body) <= o.max_capture_bytes:
                    rec.request_capture = body
            _bump(c.requests, rec.final_outcome().value)
            over = rec.overhead_request_ns
            if over is not None:
                c.overhead_request.observe_ns(over)
            over = rec.overhead_first_token_ns
            if over is not None:
                c.overhead_first_token.observe_ns(over)
            s = rec.stream
            if s is not None and s.first_token_mono_ns is not None and rec.forwarded is not None:
                c.upstream_ttft.observe_ns(max(0, s.first_token_mono_ns - rec.forwarded))
            c.request_bytes += rec.request_bytes
            c.response_bytes += rec.response_bytes
            attrs = attributes(
                rec, link=o.link, downstream=o.downstream, downstream_kind=o.downstream_kind, upstream=o.upstream_name,
                upstream_kind=o.upstream_kind, upstream_host=self.upstream_host, upstream_port=self.upstream_port,
                correlation_header=o.correlation_header, clock=self.clock, labels=o.labels,
            )
            emit(self.telemetry, self.span_name, span, rec, attrs, o.respect_sampling)
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


async def start_tap(options: TapOptions, telemetry: Telemetry) -> RunningTap:
    """Start a tap in the running event loop (see :mod:`proxy`)."""
    return await Tap(options, telemetry).start()
