"""OTLP/HTTP span export on the process's own asyncio (uvloop) event loop: no export thread.

:class:`LoopSpanProcessor` keeps :class:`deltatap.telemetry.tracer.QueuedSpanProcessor`'s bounded queue and exact
accounting (``ended == exported + dropped + queued``) and exports its batches from the event loop that stamps the
traffic, instead of from a daemon thread. A thread competes with the loop for the GIL: the loop could wait up to the
switch interval for it at any read, and every batch cost futex wake-ups; here a batch is encoded in one C call
(:func:`deltatap.telemetry.otlp_encode.encode_export_request`, ~0.12 ms for 64 tap-sized spans; 64 calls of one
span each, at ``on_end``, cost the same) between two of the loop's
callbacks and written without blocking, and the answer is read by a :class:`asyncio.Protocol`.

What an export does is :class:`deltatap.telemetry.otlp_export.OtlpHttpExporter`'s, read from that exporter: its
body (the encoded batch, :meth:`~OtlpHttpExporter.compress`-ed as configured: gzip / deflate run in the loop's
executor, ~0.5 ms of zlib per batch that needs no interpreter lock), its request line and headers
(:meth:`~OtlpHttpExporter.request_head`, the bytes ``http.client`` writes), TLS with its ``ssl.SSLContext``, its
timeout (every export bounded by it, connection and retries included: ``export_timeout``), its retries
(connection errors, 429 / 502 / 503 / 504, :meth:`~OtlpHttpExporter.retry_delay`'s backoff, waited on the loop's
timer) and its error texts. One connection, kept alive, reopened when the collector closed it. The same exporter
exports synchronously in the calling thread when :meth:`LoopSpanProcessor.shutdown` (or ``force_flush``) finds
the loop gone or is called on the loop's own thread.

Used by ``deltatap tap`` for ``--otlp http(s)://...`` (``setup_telemetry(..., on_loop=True)``); gRPC and file
exports keep the export thread.
"""

from __future__ import annotations

import asyncio
import http.client
import logging
import threading
import time

from opentelemetry.sdk.trace import ReadableSpan

from deltatap.net import h1
from deltatap.telemetry.otlp_encode import encode_export_request
from deltatap.telemetry.otlp_export import OtlpHttpExporter
from deltatap.telemetry.tracer import QueuedSpanProcessor

log = logging.getLogger("deltatap.telemetry.tracer")

_WAIT_SLICE_S = 0.05  # a thread waiting for the loop checks this often that the loop still runs


class _ExportAborted(Exception):
    """The export was ended by shutdown."""


class _Response:
    __slots__ = ("status", "reason", "content_type", "body", "close")

    def __init__(self, status: int, reason: str, content_type: str | None, body: bytes, close: bool) -> None:
        self.status, self.reason, self.content_type, self.body, self.close = status, reason, content_type, body, close


class _HttpConnection(asyncio.Protocol):
    """One HTTP/1.1 client connection: :meth:`request` writes a request and returns a future of its
    :class:`_Response`. The answer is framed by :class:`deltatap.net.h1.Reader`, the project's one HTTP/1.1 framing
    (Content-Length, chunked, read-until-close bodies; 1xx answers skipped)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.used = False  # a request was answered on it before
        self._fut: asyncio.Future | None = None
        self._reader = h1.Reader(False)
        self._head: h1.Head | None = None  # the answer's final head
        self._body = bytearray()
        self._got_bytes = False

    # ---- asyncio.Protocol ----
    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if self._fut is None or self._fut.done():  # nothing asked: a collector talking out of turn
            self.transport.close()
            return
        self._got_bytes = True
        self._framed(data, self._reader.feed(data))

    def eof_received(self) -> bool:
        return False  # close

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        fut = self._fut
        if fut is None or fut.done():
            return
        if self._got_bytes:
            self._framed(b"", self._reader.feed_eof())
            if not fut.done():
                fut.set_exception(http.client.IncompleteRead(bytes(self._body)))
        else:
            # http.client's exception for a connection closed before an answer (a stale keep-alive connection)
            err = http.client.RemoteDisconnected("Remote end closed connection without response")
            fut.set_exception(exc if isinstance(exc, OSError) and not isinstance(exc, ConnectionResetError) else err)

    def _framed(self, data: bytes, events: list[tuple]) -> None:
        """Take the reader's events for ``data``: the final head, its body, its end (the answer) or an error."""
        fut = self._fut
        for ev in events:
            kind = ev[0]
            if kind == h1.HEAD:
                head = ev[3]
                if head.status >= 200 or head.status == 101:  # (1xx: an interim answer, the real one follows)
                    self._head = head
            elif kind == h1.BODY:
                if self._head is not None:
                    self._body += data[ev[1] : ev[2]]
            elif kind == h1.END:
                head = self._head
                if head is None:
                    continue
                ctype = head.get(b"content-type")
                fut.set_result(_Response(head.status, head.reason.decode("latin-1"), ctype.decode("latin-1") if ctype is not None else None,
                                         bytes(self._body), not head.keep_alive or self._reader.opaque))
                if not head.keep_alive and self.transport is not None:
                    self.transport.close()
                return
            else:  # h1.ERROR: not an HTTP answer the reader can frame (ev[2] is one of its fixed reasons)
                fut.set_exception(http.client.BadStatusLine(f"the collector's answer cannot be framed ({ev[2]})"))
                if self.transport is not None:
                    self.transport.close()
                return

    def _fail(self, exc: BaseException) -> None:
        if self._fut is not None and not self._fut.done():
            self._fut.set_exception(exc)

    # ---- requests ----
    def request(self, data: bytes) -> asyncio.Future:
        self._head = None
        self._body = bytearray()
        self._got_bytes = False
        self._reader.expect(b"POST")
        self._fut = fut = self.loop.create_future()
        if self.closed or self.transport is None or self.transport.is_closing():
            fut.set_exception(http.client.RemoteDisconnected("Remote end closed connection without response"))
            return fut
        self.transport.write(data)
        return fut

    def close(self) -> None:
        if self.transport is not None:
            self.transport.abort()


class LoopSpanProcessor(QueuedSpanProcessor):
    """Bounded span queue exported over OTLP/HTTP from the running event loop ``loop`` (see the module docstring).

    ``on_end`` may be called from any thread (the loop's, normally). Batches of ``max_batch`` go out as soon as
    they are full, a partial one ``schedule_delay_s`` after its first span; one export at a time.
    :meth:`force_flush` and :meth:`shutdown` may be called from another thread while the loop runs (they ask the
    loop and wait), or once the loop has stopped (they export in the calling thread).
    """

    def __init__(self, exporter: OtlpHttpExporter, loop: asyncio.AbstractEventLoop, **kwargs) -> None:
        if not isinstance(exporter, OtlpHttpExporter):
            raise TypeError(f"LoopSpanProcessor exports over OTLP/HTTP only, not with {type(exporter).__name__}")
        super().__init__(exporter, **kwargs)
        self.loop = loop
        # the loop's thread (set again by every _poke): this one when the processor is made on the running loop
        self._loop_thread = threading.get_ident() if _running_loop() is loop else None
        self._task: asyncio.Task | None = None  # the export in flight (of self._batch)
        self._timer: asyncio.TimerHandle | None = None  # a partial batch's export
        self._poke_due = False  # a _poke is scheduled
        self._conn: _HttpConnection | None = None
        self._waiters: list[threading.Event] = []  # force_flush / shutdown: set when nothing is queued or in flight
        self._detached = False  # the loop side is given up (shutdown ended it, or it runs on in another thread)

    # ---- waking the loop ----
    def _queued(self, n: int) -> None:
        if (n == 1 or n == self.max_batch) and not self._poke_due:
            self._call(self._poke)

    def _call(self, fn) -> None:
        """Run ``fn`` on the loop soon (from any thread; under the lock or not)."""
        self._poke_due = True
        try:
            if threading.get_ident() == self._loop_thread:
                self.loop.call_soon(fn)
            else:
                self.loop.call_soon_threadsafe(fn)
        except RuntimeError:  # the loop is closed: shutdown exports what is left
            self._poke_due = False

    def _on_loop(self) -> bool:
        return threading.get_ident() == self._loop_thread or (self._loop_thread is None and _running_loop() is self.loop)

    def _poke(self) -> None:
        """(On the loop.) Start the next export, arm the partial batch's timer, or answer the waiters."""
        self._poke_due = False
        self._advance(False)

    def _on_timer(self) -> None:
        """(On the loop.) A partial batch's delay is up: export what is queued."""
        self._timer = None
        self._advance(True)

    def _advance(self, partial: bool) -> None:
        """Start the next export (a full batch; ``partial``, a shutdown or a waiter: whatever is queued), else arm the
        partial batch's timer, or answer the waiters when nothing is queued or in flight."""
        self._loop_thread = threading.get_ident()
        if self._task is not None or self._detached:
            return
        with self._cond:
            n = len(self._queue)
            now = n >= self.max_batch or (n > 0 and (partial or self._shutdown or bool(self._waiters)))
            batch = self._take_batch() if now else None
            if batch:
                self._batch = batch
            waiters = self._waiters if n == 0 else []
            if waiters:
                self._waiters = []
        if batch:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self._task = self.loop.create_task(self._export(batch))
            self._task.add_done_callback(self._exported)
        elif n:
            if self._timer is None:
                self._timer = self.loop.call_later(self.schedule_delay_s, self._on_timer)
        else:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            for ev in waiters:
                ev.set()

    def _exported(self, task: asyncio.Task) -> None:
        if self._task is task:
            self._task = None
        if not self._detached:
            self._poke()

    # ---- one export ----
    async def _export(self, batch: list[ReadableSpan]) -> None:
        try:
            outcome = await self._post(batch)
        except asyncio.CancelledError:
            return  # shutdown took the batch over
        except Exception as exc:  # an exporter bug must not stop the exports
            outcome = (False, "export_failed", f"{type(exc).__name__}: {exc}")
        self._settle(batch, *outcome)

    async def _post(self, batch: list[ReadableSpan]) -> tuple[bool, str, str]:
        """Export ``batch`` as :meth:`OtlpHttpExporter.export` does, on the loop: ``(ok, drop reason, error)``."""
        exp: OtlpHttpExporter = self.exporter
        if exp._stop.is_set():
            return self._outcome(exp._failed("exporter is shut down"))
        # one C call per batch: no dearer than one per span at on_end, while each span's objects are still in cache (a tap at
        # the maximum rate, session 27: 2.1 us per span in batches of 64, 2.8 per span at on_end, timer calls included)
        body = encode_export_request(batch)
        if exp.compressed:  # ~0.5 ms for 64 tap spans: in the loop's executor, where zlib runs without the GIL
            body = await self.loop.run_in_executor(None, exp.compress, body)
        data = exp.request_head(len(body)) + body
        deadline = time.monotonic() + exp.timeout_s
        attempt = 0
        while True:
            reused = False
            try:
                conn = self._conn
                if conn is None or conn.closed:
                    conn = await asyncio.wait_for(self._connect(), max(deadline - time.monotonic(), 0.001))
                else:
                    reused = conn.used
                resp = await asyncio.wait_for(conn.request(data), max(deadline - time.monotonic(), 0.001))
                conn.used = True
            except (OSError, http.client.HTTPException) as exc:  # TimeoutError (the deadline) included
                self._drop_connection()
                if exp._stop.is_set():
                    return self._outcome(exp._failed(f"OTLP/HTTP export to {exp.url}: ended by shutdown, attempt {attempt + 1}"))
                exp.last_error = exp.connection_error(exc, attempt)
                stale = reused and isinstance(exc, (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError))
                if stale and attempt < exp.retries:  # the collector closed the idle keep-alive connection
                    attempt += 1
                    continue  # reconnect at once
                delay = None if isinstance(exc, TimeoutError) else exp.retry_delay(attempt, deadline)
                if delay is None:
                    return self._outcome(exp._failed(exp.last_error, timeout=isinstance(exc, TimeoutError)))
                await asyncio.sleep(delay)
                attempt += 1
                continue
            if 200 <= resp.status < 300:
                return True, "", ""
            exp.last_error = exp.answer_error(resp.status, resp.reason, resp.content_type, resp.body, attempt)
            delay = exp.retry_delay(attempt, deadline) if exp.retry_status(resp.status) else None
            if delay is None:
                return self._outcome(exp._failed(exp.last_error))
            await asyncio.sleep(delay)
            attempt += 1

    async def _connect(self) -> _HttpConnection:
        exp: OtlpHttpExporter = self.exporter
        ssl = exp._context if exp._https else None
        _transport, conn = await self.loop.create_connection(
            lambda: _HttpConnection(self.loop), exp._host, exp._port, ssl=ssl, server_hostname=exp._host if ssl else None
        )
        self._conn = conn
        return conn

    def _drop_connection(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    # ---- flush and shutdown ----
    def _idle(self) -> bool:
        with self._cond:
            return not self._queue and self._batch is None

    def _wait_for_loop(self, timeout_s: float) -> bool:
        """(Another thread, the loop running.) Ask the loop to export everything queued; wait until it has, at most
        ``timeout_s``. False when the time is up or the loop stopped meanwhile."""
        ev = threading.Event()
        with self._cond:
            self._waiters.append(ev)
        self._call(self._poke)
        end = time.monotonic() + timeout_s
        while not ev.wait(min(_WAIT_SLICE_S, max(end - time.monotonic(), 0))):
            if time.monotonic() >= end or not self.loop.is_running():
                return ev.is_set()
        return True

    def _detach(self) -> None:
        """Give up the loop side: an export in flight is cancelled (its batch goes back to the queue's front, to be
        exported again: the collector may then receive it twice), the connection dropped. Thread-safe."""
        self._detached = True
        with self._cond:
            batch, self._batch = self._batch, None
            if batch:
                self._queue.extendleft(reversed(batch))
        task, self._task = self._task, None
        timer, self._timer = self._timer, None
        conn, self._conn = self._conn, None

        def cancel() -> None:
            for end in (task and task.cancel, timer and timer.cancel, conn and conn.close):
                if end:
                    try:
                        end()
                    except Exception:  # noqa: BLE001 - (a closed loop's task, handle or transport)
                        log.debug("span export: ending the loop's export", exc_info=True)

        if self._on_loop() or not self.loop.is_running():
            cancel()
        else:
            try:
                self.loop.call_soon_threadsafe(cancel)
            except RuntimeError:
                pass

    def _export_here(self, end: float) -> bool:
        """Export the queue in this thread with the exporter (synchronously) until ``end``; True when it is empty."""
        exp: OtlpHttpExporter = self.exporter
        while True:
            with self._cond:
                batch = self._take_batch()
                self._batch = batch or None
            if not batch:
                return True
            left = end - time.monotonic()
            if left <= 0:
                return False  # (the batch stays counted as being exported)
            try:
                outcome = self._outcome(exp.export_within(batch, min(exp.timeout_s, left)))
            except Exception as exc:  # noqa: BLE001
                outcome = self._outcome(None, exc)
            if not outcome[0] and time.monotonic() >= end:
                return False  # cut short by the deadline: counted as shutdown_deadline
            self._settle(batch, *outcome)

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        timeout_s = timeout_millis / 1000
        if self._closed or self._shutdown:
            return self._idle()
        if self._on_loop():  # the loop cannot be waited for from its own thread: start the export, do not wait
            self._call(self._poke)
            return self._idle()
        if self.loop.is_running() and not self._detached:
            if self._wait_for_loop(timeout_s):
                return True
            if self.loop.is_running():
                return False
        self._detach()  # the loop stopped: export here
        with self._shutdown_lock:
            return self._export_here(time.monotonic() + timeout_s)

    def shutdown(self, deadline_s: float | None = None) -> None:
        """Export what is queued for at most ``deadline_s`` (default: :attr:`shutdown_deadline_s`), count what is
        left as dropped (``shutdown_deadline``), close the connection. On another thread while the loop runs, the loop
        exports and this waits; on the loop's thread, or once the loop has stopped, this thread exports. Later calls
        return at once."""
        with self._shutdown_lock:
            if self._closed:
                return
            deadline_s = self.shutdown_deadline_s if deadline_s is None else deadline_s
            end = time.monotonic() + max(deadline_s, 0.0)
            with self._cond:
                self._shutdown = True
            if self._on_loop():  # this thread is the loop's (the loop waits meanwhile): export here
                self._detach()
                self._export_here(end)
            elif self.loop.is_running() and not self._detached:
                if not self._wait_for_loop(max(deadline_s, 0.0)) and not self.loop.is_running():
                    self._detach()  # the loop stopped meanwhile: export the rest here
                    self._export_here(end)
            else:  # the loop is gone (or never ran)
                self._detach()
                self._export_here(end)
            self._detach()  # (a late result of an export still in flight is ignored: counted below)
            if not self._idle():
                self._drop_left(deadline_s)
            try:
                self.exporter.shutdown()
            except Exception:  # pragma: no cover - best effort
                log.debug("exporter shutdown failed", exc_info=True)
            self._closed = True


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
