"""Runs planned requests: ids and client spans, chat history, the precise send, the record.

A :class:`Runner` is shared by every load mode. Per request it: draws the client span's ids (before the
send wait), injects ``traceparent`` and the correlation header, serialises the request, and at the planned instant
stamps and writes it in the send clock's own callback (on an idle connection; else :func:`deltatap.loadgen.client.execute`
opens one), then reads the answer (:func:`~deltatap.loadgen.client.execute`) and builds the finished span once — start = the planned
send, timeline events (t0 = request written, t12 = first content token, ...) with their exact times — and
hands it to the telemetry's processor as a plain :class:`deltatap.telemetry.spans.SpanRecord` (no SDK span, context
or event object per request: the export thread encodes the record to OTLP directly). Sessions (chatbot) run their turns in order, think time after each answer, history
in a sliding window of reference tokens.

Request ids are ``RUN-<phase letter><n>``, ``n`` counting requests in the order they are sent; a runner that
sends one share of a plan split over processes counts with a stride (:attr:`Runner.seq_step`), so the ids
match those of one process sending the whole plan.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import heapq
import os
import secrets
import sys
import threading
from collections import deque
from dataclasses import dataclass, field
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

from deltatap.core.clock import mono_ns, to_unix_ns
from deltatap.core.clocksync import ClockEstimate
from deltatap.core.config import ConfigError
from deltatap.core.vocab import SPAN_CLIENT, Attr, ClientEvent, Observer, Outcome, format_stamp_bounds
from deltatap.loadgen.client import Target, execute, fail_unfinished, prepare, settle
from deltatap.loadgen.h1client import Exchange, H1Pool
from deltatap.loadgen.records import ErrorKind, RequestRecord
from deltatap.telemetry.spans import KIND_CLIENT, SAMPLED, STATUS_UNSET, SpanRecord, new_span_id, new_trace_id, traceparent
from deltatap.telemetry.tracer import Telemetry, setup_telemetry
from deltatap.net.aio import sleep_until
from deltatap.loadgen.tokens import Tokenizer
from deltatap.loadgen.workloads.base import PlannedRequest


_new_record = tuple.__new__
_SAMPLED = int(SAMPLED)
# the span's event names, read once (an enum member's .value is a descriptor call per use)
_EV_SEND, _EV_FIRST, _EV_LAST = ClientEvent.SEND.value, ClientEvent.FIRST_TOKEN.value, ClientEvent.LAST_TOKEN.value
_EV_CANCEL, _EV_ERROR, _EV_END = ClientEvent.CANCEL.value, ClientEvent.ERROR.value, ClientEvent.END.value

def load_telemetry(otlp: str | None) -> Telemetry:
    """The load generator's telemetry (``deltatap load`` and each ``--processes`` child): OTLP export of the
    client spans, in batches of ``deltatap.telemetry.tracer.EXPORT_BATCH`` (every exporter's bound on how long one
    encode holds the GIL)."""
    return setup_telemetry("deltatap-loadgen", otlp=otlp)


@contextlib.contextmanager
def send_phase_gc() -> Iterator[None]:
    """No garbage-collector pause while requests are sent: everything alive is frozen (out of every scan) and
    the automatic collector is off until the block ends, then restored; the run's cyclic garbage is collected
    afterwards, by the collector's next full collection. A gen-2 collection of the records piling up took 50-85 ms
    mid-run (every send planned in it late by that much) and the young collections ~0.1 ms each, 40 a second; the
    run itself leaves ~0.1 cyclic objects per request (1,018 after 10,000 requests), so memory does not grow with
    the collector off. At the end what the run made is frozen too before the collector is back, so that it joins the
    oldest generation with the rest instead of being scanned as young objects by the first collection after the
    block (a scan of every record: 0.33-0.38 s of CPU after 16,000 requests)."""
    global _gc_phases, _gc_was
    if _gc_phases == 0:  # (runs sharing a process overlap in any order: the first turns the collector off, the last on)
        gc.collect()
        _gc_was = gc.isenabled()
        gc.disable()
    gc.freeze()
    _gc_phases += 1
    try:
        yield
    finally:
        _gc_phases -= 1
        gc.freeze()
        if _gc_phases == 0:
            if _gc_was:
                gc.enable()
            gc.unfreeze()


_gc_phases = 0  # send phases open in this process
_gc_was = True  # whether the collector was on before the first of them


# the event loop thread's scheduler slice while sending (Linux >= 6.12, EEVDF: ``sched_setattr``'s ``sched_runtime`` of a
# normal task; 0: left as it is). A shorter slice than the default (~1.4 ms here) gives the thread an earlier deadline
# when its timer wakes it, so it preempts the task running on a busy CPU instead of waiting behind it. (0.2 ms cut the
# late sends too but chopped the loop's longer turns: the tail was no better; docs/benchmarks.md, session 20.)
SEND_SLICE_NS = 500_000


class _SchedAttr(ctypes.Structure):
    _fields_ = [("size", ctypes.c_uint32), ("sched_policy", ctypes.c_uint32), ("sched_flags", ctypes.c_uint64),
                ("sched_nice", ctypes.c_int32), ("sched_priority", ctypes.c_uint32), ("sched_runtime", ctypes.c_uint64),
                ("sched_deadline", ctypes.c_uint64), ("sched_period", ctypes.c_uint64), ("sched_util_min", ctypes.c_uint32),
                ("sched_util_max", ctypes.c_uint32)]


_SYS_SCHED_SETATTR, _SYS_SCHED_GETATTR = 314, 315  # (x86-64)


def _thread_slice(slice_ns: int) -> int | None:
    """Set the calling thread's slice (a normal task's ``sched_runtime``); returns the one it had, or None where the
    system does not take it (another architecture, an older kernel, a policy other than normal)."""
    if not sys.platform.startswith("linux") or os.uname().machine != "x86_64":
        return None
    try:
        libc = SendClock._libc or ctypes.CDLL(None, use_errno=True)
        SendClock._libc = libc
        attr = _SchedAttr()
        if libc.syscall(_SYS_SCHED_GETATTR, 0, ctypes.byref(attr), ctypes.sizeof(attr), 0) != 0:
            return None
        if attr.sched_policy != 0:  # (only SCHED_OTHER: a batch, idle or real-time thread is left as it is)
            return None
        old = attr.sched_runtime
        attr.size = ctypes.sizeof(attr)
        attr.sched_runtime = slice_ns
        if libc.syscall(_SYS_SCHED_SETATTR, 0, ctypes.byref(attr), 0) != 0:
            return None
        return old
    except (OSError, AttributeError):
        return None


class _SliceHeld(threading.local):
    depth = 0  # send phases open on this thread (several runs in one loop: `run_load` called concurrently, as the tests' demos do)
    old: int | None = None  # the thread's slice before the first of them


_slice_held = _SliceHeld()


@contextlib.contextmanager
def send_phase_slice(slice_ns: int | None = None) -> Iterator[None]:
    """While requests are sent, the calling thread (the event loop's) asks the scheduler for a short slice
    (:data:`SEND_SLICE_NS`), then gets its own back. On a host whose CPUs are busy, a thread woken by the send clock's
    timer otherwise waits until the running task's slice ends or its lag lets it in; with the short slice its
    virtual deadline comes first and it runs at once. Where the system does not offer it, nothing changes. (A thread
    started inside the block inherits the slice; the span export's, started before, keeps the system's.) Runs that
    share one loop overlap in any order: the first send phase on a thread sets the slice, the last to end gives the
    thread's own back."""
    slice_ns = SEND_SLICE_NS if slice_ns is None else slice_ns
    held = _slice_held
    if held.depth == 0:
        held.old = _thread_slice(slice_ns) if slice_ns > 0 else None
    held.depth += 1
    try:
        yield
    finally:
        held.depth -= 1
        if held.depth == 0 and held.old is not None:
            _thread_slice(held.old)
            held.old = None


class SendClock:
    """Wakes the tasks waiting for their planned send at the nanosecond, with one ``timerfd`` on the loop (Linux).

    The loop's own timers have millisecond granularity; without this, each send would spend its last
    ``--spin-us`` yielding in a loop (:func:`deltatap.net.aio.sleep_until`), a cost every request pays in CPU.
    Here one timer descriptor, armed for the earliest waiting instant on ``CLOCK_MONOTONIC`` (the clock of
    :func:`deltatap.core.clock.mono_ns`), makes the loop's poll return then; every send due is released in
    that callback. Where there is no ``timerfd`` (other systems), :meth:`wait` falls back to ``sleep_until``.
    """

    _libc: Any = None

    def __init__(self, spin_ns: int) -> None:
        self.spin_ns = spin_ns
        self.fd = -1
        self._spec = (ctypes.c_long * 4)()  # itimerspec (interval, value), reused by every arming
        self._armed = 0  # the instant the timer is set for (0: none)
        self._heap: list[tuple[int, int, asyncio.Future[None] | None, Callable[[], None] | None]] = []
        self._n = 0
        self._loop: asyncio.AbstractEventLoop | None = None

    def _open(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        if not sys.platform.startswith("linux"):
            return
        try:
            libc = SendClock._libc or ctypes.CDLL(None, use_errno=True)
            SendClock._libc = libc
            fd = libc.timerfd_create(1, 0o4000 | 0o2000000)  # CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC
        except (OSError, AttributeError):
            return
        if fd < 0:
            return
        self.fd = fd
        loop.add_reader(fd, self._fire)

    def close(self) -> None:
        if self.fd >= 0:
            if self._loop is not None and not self._loop.is_closed():
                self._loop.remove_reader(self.fd)
            os.close(self.fd)
            self.fd = -1
        self._loop = None

    def _arm(self, t_ns: int) -> None:
        if t_ns == self._armed:
            return
        self._armed = t_ns
        spec = self._spec
        spec[2], spec[3] = divmod(t_ns, 1_000_000_000)
        self._libc.timerfd_settime(self.fd, 1, spec, None)  # TFD_TIMER_ABSTIME

    async def wait(self, t_ns: int, on_due: Callable[[], None] | None = None) -> None:
        """Return at the ``mono_ns`` instant ``t_ns`` (at once, without yielding, if it has passed). ``on_due`` is
        called at that instant in the timer's own callback, before the waiting task resumes (which happens only
        after the loop has handled the rest of that turn's reads): the request's write goes there."""
        if self._loop is None:
            self._open(asyncio.get_running_loop())
        if self.fd < 0:
            await sleep_until(t_ns, self.spin_ns)
            if on_due is not None:
                on_due()
            return
        if t_ns <= mono_ns():
            if on_due is not None:
                on_due()
            return
        fut = self._loop.create_future()  # type: ignore[union-attr]
        self._n += 1
        heapq.heappush(self._heap, (t_ns, self._n, fut, on_due))
        if self._heap[0][2] is fut:
            self._arm(t_ns)
        await fut

    def at(self, t_ns: int, on_due: Callable[[], None]) -> None:
        """Call ``on_due`` at the ``mono_ns`` instant ``t_ns``, in the timer's callback (at once if it has passed):
        a send with no task waiting for it (:class:`Flight`). It must not raise."""
        if self._loop is None:
            self._open(asyncio.get_running_loop())
        if t_ns <= mono_ns():
            on_due()
            return
        if self.fd < 0:  # (no timerfd: the loop's own timer, to its millisecond)
            self._loop.call_later((t_ns - mono_ns()) / 1e9, on_due)  # type: ignore[union-attr]
            return
        self._n += 1
        heapq.heappush(self._heap, (t_ns, self._n, None, on_due))
        if self._heap[0][3] is on_due:
            self._arm(t_ns)

    def release_due(self) -> None:
        """Call every ``at()`` callback whose instant has come, now: the open loop's connections call this before they
        handle a read (:attr:`deltatap.loadgen.h1client.H1Pool.before_read`), so that a send due while the loop works
        through a backlog of reads (after its thread waited for a CPU, the reads that came before the timer's expiry
        are handed over first) is written before them instead of after. The timer stays armed: its wake finds what is
        left."""
        heap = self._heap
        if heap:
            now = mono_ns()
            while heap and heap[0][0] <= now and heap[0][2] is None:
                heapq.heappop(heap)[3]()  # type: ignore[misc]

    def _fire(self) -> None:
        # The expiry is consumed by re-arming (timerfd_settime clears the count: the descriptor is not readable until
        # the new instant), so a read is needed only when nothing is left to wait for: one system call less per wake.
        self._armed = 0
        heap = self._heap
        now = mono_ns()
        while heap and heap[0][0] <= now:
            _t, _n, fut, on_due = heapq.heappop(heap)
            if fut is None:  # a callback's instant (at())
                on_due()  # type: ignore[misc]
            elif not fut.done():  # (a cancelled wait: neither sent nor woken)
                if on_due is not None:
                    on_due()
                fut.set_result(None)
        if heap:
            self._arm(heap[0][0])  # (or already armed for it, after the expiry, by a callback above)
        else:
            try:
                os.read(self.fd, 8)
            except (BlockingIOError, InterruptedError):
                pass


def _fail_record(rec: RequestRecord, message: str) -> None:
    rec.status = Outcome.UPSTREAM_ERROR
    rec.error_kind = ErrorKind.DISCONNECTED
    rec.error = message[:300]


class LoadAborted(ConfigError):
    """The run stopped before measuring (e.g. every warm-up request failed); the message is one line."""


class Barrier:
    """exo-bench's barrier: every member prepares its request, then waits here; the last to arrive
    stamps the shared start and releases all of them in the same event-loop turn."""

    def __init__(self, parties: int) -> None:
        self.parties = parties
        self.arrived = 0
        self.start_mono_ns = 0
        self._event = asyncio.Event()

    async def wait(self) -> None:
        self.arrived += 1
        if self.arrived >= self.parties:
            self.start_mono_ns = mono_ns()
            self._event.set()
            return
        await self._event.wait()


@dataclass
class Counters:
    """Cheap live counters for the progress display."""

    sent: int = 0
    done: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    errors: int = 0
    recent_ttft_ns: deque[int] = field(default_factory=lambda: deque(maxlen=256))


class Flight:
    """One single-turn request driven by callbacks, no task (:meth:`Runner.launch`): prepared when launched; at its
    instant the send clock's callback stamps and writes it on an idle keep-alive connection (:meth:`fire`); the
    connection's read callbacks parse the answer; its end (:meth:`_ended`, from the connection's callback) fills the
    record as :func:`~deltatap.loadgen.client.execute` does (:func:`~deltatap.loadgen.client.settle`), files it and hands
    the span over. The same outcomes as the task path: the request timeout is the runner's one deadline timer (:meth:`_expire`), the run's
    end cancels it (:meth:`cancel`); what needs an ``await`` — no idle connection (a connect), the one retry after a
    reused connection the server had closed — goes on in a task running :func:`~deltatap.loadgen.client.execute`."""

    __slots__ = ("runner", "session", "rec", "tid", "sid", "body", "headers", "ex", "data", "conn", "deadline", "task",
                 "on_done", "state")

    def __init__(self, runner: Runner, session: H1Pool, req: PlannedRequest, planned_mono_ns: int, worker: int,
                 body: bytes | None, on_done: Callable[[RequestRecord], None] | None) -> None:
        self.runner = runner
        self.session = session
        self.rec, self.tid, self.sid, self.body, self.headers, self.ex, self.data = runner._begin(
            session, req, planned_mono_ns, worker, None, 0, body)
        self.ex.on_end = self._ended
        self.conn: Any = None
        self.deadline = 0  # mono_ns when --request-timeout ends it (sent on a kept-alive connection: Runner._timed)
        self.task: asyncio.Task[None] | None = None
        self.on_done = on_done
        self.state = 0  # 0 waiting for its instant, 1 sent, 2 ended, 3 cancelled before it was sent

    def fire(self) -> None:
        """At the planned instant (the send clock's callback): stamp and write on an idle connection."""
        if self.state:
            return
        self.state = 1
        rec, ex = self.rec, self.ex
        rec.send_mono_ns = mono_ns()
        r = self.runner
        try:
            conn = self.session.start_now(ex, self.data)  # (None: no idle connection)
        except Exception:  # noqa: BLE001 - never out of the clock's callback: the task path sends on another connection
            conn = None
            ex.reset()
        r._sent()
        if conn is None:
            self._go_async(False)
            return
        self.conn = conn
        self.deadline = rec.send_mono_ns + r.timeout_ns
        r._time(self)

    def _go_async(self, retried: bool) -> None:
        self.runner._timed.pop(self, None)  # (the task's execute has its own deadline)
        self.conn = None
        self.task = asyncio.get_running_loop().create_task(self._run_async(retried))
        self.task.add_done_callback(self._task_done)

    async def _run_async(self, retried: bool) -> None:
        await execute(self.session, self.runner.target, self.rec, self.body, self.headers, (self.ex, self.data), None, retried)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        rec = self.rec
        if task.cancelled():
            if rec.status != Outcome.CLIENT_CANCEL:  # (cancelled before execute began: nothing was written)
                fail_unfinished(rec, self.ex, self.runner.target, False)
        elif (exc := task.exception()) is not None:  # a bug: the record says so, the mode's wait raises it
            if rec.end_mono_ns is None:
                rec.end_mono_ns = mono_ns()
            _fail_record(rec, f"{type(exc).__name__}: {exc}")
            self.runner._flight_error = exc
        self._file()

    def _ended(self) -> None:
        """The exchange ended (the connection's callback): its record, or the one retry in a task."""
        if self.state != 1 or self.task is not None:
            return
        if self.ex.retry:  # a reused connection the server had closed before any byte of the answer: one retry
            self.ex.retry = False
            self._go_async(True)
            return
        self.runner._timed.pop(self, None)
        self.conn = None
        settle(self.rec, self.ex, self.runner.target)
        self._file()

    def _expire(self) -> None:
        """``--request-timeout`` passed: the connection is closed, the record says timeout."""
        if self.state == 1 and self.task is None:
            self._unfinished(True)

    def cancel(self) -> None:
        """The run ended: a request in flight is recorded as cancelled; one not sent yet is not sent."""
        if self.state == 0:
            self.state = 3
            self.runner._flight_ended(self, None)
        elif self.state == 1:
            if self.task is not None:
                self.task.cancel()  # (its execute records the cancel, then it files the record)
            else:
                self._unfinished(False)

    def _unfinished(self, timed_out: bool) -> None:
        self.runner._timed.pop(self, None)
        conn, self.conn = self.conn, None
        if conn is not None:
            conn.abandon()
        fail_unfinished(self.rec, self.ex, self.runner.target, timed_out)
        self._file()

    def _file(self) -> None:
        if self.state == 2:
            return
        self.state = 2
        r = self.runner
        r._end(self.tid, self.sid, self.rec)
        r._flight_ended(self, self.rec)


class Runner:
    def __init__(
        self,
        target: Target,
        tokenizer: Tokenizer,
        telemetry: Telemetry,
        run_id: str,
        clock: ClockEstimate | None = None,
        spin_ns: int = 1_500_000,
    ) -> None:
        self.target = target
        self.tok = tokenizer
        self.telemetry = telemetry
        self.run_id = run_id
        self.clock = clock
        self.spin_ns = spin_ns
        self.clock_wait = SendClock(spin_ns)  # the precise wait for each planned send
        self.records: list[RequestRecord] = []
        self.counters = Counters()
        self.phase = "measure"
        parts = urlsplit(target.url)
        self._static_attrs: dict[str, Any] = {
            Attr.OBSERVER: Observer.CLIENT.value,
            Attr.RUN_ID: run_id,
            Attr.CORRELATION_HEADER: target.correlation_header,
            Attr.HTTP_METHOD: "POST",
            Attr.URL_PATH: parts.path,
            Attr.SERVER_ADDRESS: parts.hostname or "",
            Attr.SERVER_PORT: parts.port or (443 if parts.scheme == "https" else 80),
            Attr.GENAI_OPERATION: "chat" if target.endpoint.name == "chat" else "text_completion",
            Attr.GENAI_REQUEST_MODEL: target.model,
            Attr.STREAMING: True,
        }
        if clock is not None:
            self._static_attrs[Attr.CLOCK_OFFSET_NS] = clock.offset_ns
            self._static_attrs[Attr.CLOCK_UNCERTAINTY_NS] = clock.uncertainty_ns
        self._seq = 0  # the latest request's number; the next is _seq + seq_step
        self.seq_step = 1
        self.bodies: dict[int, bytes] = {}  # prebuilt request bodies of single-turn requests, by plan index
        self.flights: set[Flight] = set()  # requests launched without a task (launch()) and not ended yet
        # those sent on a kept-alive connection, in the order sent: their deadlines come in that order, so one loop timer
        # armed for the oldest one's serves them all (not one timer per request)
        self._timed: dict[Flight, None] = {}
        self._timer: asyncio.TimerHandle | None = None
        self.timeout_ns = int(target.timeout_s * 1e9)
        self._flights_waiter: asyncio.Future[None] | None = None
        self._flight_error: BaseException | None = None

    # ------------------------------------------------------------------ one request

    def _begin(self, session: H1Pool, req: PlannedRequest, planned_mono_ns: int, worker: int,
               history: list[dict[str, str]] | None, history_tokens: int, body: bytes | None,
               ) -> tuple[RequestRecord, int, int, bytes, dict[str, str], Exchange, bytes]:
        """A request's number, ids, record, headers and serialised bytes (before its send instant)."""
        self._seq += self.seq_step
        tid, sid = new_trace_id(), new_span_id()
        rec = RequestRecord(
            index=req.index, request_id=f"{self.run_id}-{self.phase[0]}{self._seq}", trace_id=f"{tid:032x}", span_id=f"{sid:016x}",
            phase=self.phase, worker=worker, session=req.session, turn=req.turn, labels=req.labels,
            max_tokens=req.max_tokens, planned_mono_ns=planned_mono_ns, input_tokens=req.input_tokens + history_tokens,
        )
        if body is None:
            body = self.target.body(req.system, history or [], req.prompt, req.max_tokens)
        headers = self.target.request_headers(rec, traceparent(tid, sid))
        ex, data = prepare(session, self.target, body, headers)
        return rec, tid, sid, body, headers, ex, data

    def _sent(self) -> None:
        c = self.counters
        c.sent += 1
        c.in_flight += 1
        if c.in_flight > c.max_in_flight:
            c.max_in_flight = c.in_flight

    def _end(self, tid: int, sid: int, rec: RequestRecord) -> None:
        """A request ended (any outcome): counted, its record filed, its span handed to the exporter."""
        c = self.counters
        c.in_flight -= 1
        c.done += 1
        submit = rec.submit_mono_ns
        if rec.status != Outcome.OK:
            c.errors += 1
        elif rec.first_token_mono_ns is not None and submit is not None:
            c.recent_ttft_ns.append(rec.first_token_mono_ns - submit)
        self.records.append(rec)
        self._emit_span(tid, sid, rec)

    async def request(
        self,
        session: H1Pool,
        req: PlannedRequest,
        planned_mono_ns: int,
        worker: int,
        history: list[dict[str, str]] | None = None,
        history_tokens: int = 0,
        body: bytes | None = None,
        barrier: Barrier | None = None,
    ) -> RequestRecord:
        """One request in its own task (a session's turn, a barrier batch, the warm-up's probes; :meth:`launch` is the
        task-free form of a single request)."""
        rec, tid, sid, body, headers, ex, data = self._begin(session, req, planned_mono_ns, worker, history, history_tokens, body)
        started = None
        if barrier is not None:
            await barrier.wait()
            rec.planned_mono_ns = barrier.start_mono_ns
        else:
            def send_now() -> None:  # in the send clock's callback, at the planned instant: stamp and write
                nonlocal started
                rec.send_mono_ns = mono_ns()
                try:
                    started = session.start_now(ex, data)  # (None: no idle connection, execute opens one)
                except Exception:  # noqa: BLE001 - never out of the clock's callback: execute sends on another connection
                    started = None
                    ex.reset()

            try:
                await self.clock_wait.wait(planned_mono_ns, send_now)
            except asyncio.CancelledError:
                if started is not None:  # written, then cancelled before the task resumed: nobody reads the answer
                    started.abandon()
                raise
        self._sent()
        try:
            await execute(session, self.target, rec, body, headers, (ex, data), started)
        finally:
            self._end(tid, sid, rec)
        return rec

    def launch(self, session: H1Pool, req: PlannedRequest, planned_mono_ns: int, worker: int, body: bytes | None = None,
               on_done: Callable[[RequestRecord], None] | None = None) -> Flight:
        """Send one single-turn request at ``planned_mono_ns`` with no task of its own (:class:`Flight`): the send clock's
        callback stamps and writes it, the connection's callbacks read the answer, the record is filed and the span
        handed over when it ends; then ``on_done(record)`` is called (in that callback). :meth:`flights_ended` waits for
        every launched request, :meth:`cancel_flights` ends those still running."""
        f = Flight(self, session, req, planned_mono_ns, worker, body, on_done)
        self.flights.add(f)
        self.clock_wait.at(planned_mono_ns, f.fire)
        return f

    async def flights_ended(self, timeout_s: float | None = None) -> bool:
        """Wait until every launched request has ended (True), or ``timeout_s`` has passed (False). Raises what an
        ``on_done`` callback raised."""
        loop = asyncio.get_running_loop()
        while self.flights and self._flight_error is None:
            fut = self._flights_waiter = loop.create_future()
            try:
                await asyncio.wait_for(asyncio.shield(fut), timeout_s)
            except (TimeoutError, asyncio.TimeoutError):
                return False
            finally:
                self._flights_waiter = None
        if self._flight_error is not None:
            err, self._flight_error = self._flight_error, None
            raise err
        return True

    def cancel_flights(self) -> None:
        """End every launched request still running as ``client_cancel`` (the run is over); those not sent yet are not
        sent (and have no record, as a cancelled task's wait)."""
        for f in list(self.flights):
            f.cancel()

    def _time(self, f: Flight) -> None:
        self._timed[f] = None
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(max(0, f.deadline - mono_ns()) / 1e9, self._deadlines)

    def _deadlines(self) -> None:
        """The loop timer of the oldest sent flight's deadline: expire every flight whose time is up, then wait for the
        next one's."""
        self._timer = None
        timed = self._timed
        now = mono_ns()
        while timed:
            f = next(iter(timed))
            if f.deadline > now:  # (a timer armed meanwhile, by a send in an expiry's callback, is for a later one)
                if self._timer is not None:
                    self._timer.cancel()
                self._timer = asyncio.get_running_loop().call_later((f.deadline - now) / 1e9, self._deadlines)
                return
            del timed[f]
            f._expire()

    def _flight_ended(self, f: Flight, rec: RequestRecord | None) -> None:
        self.flights.discard(f)
        if not self.flights and self._timer is not None:  # (nothing in flight: no deadline to keep)
            self._timer.cancel()
            self._timer = None
        if rec is not None and f.on_done is not None:
            try:
                f.on_done(rec)
            except BaseException as exc:  # noqa: BLE001 - (in a protocol's callback): the mode's wait raises it
                self._flight_error = exc
        w = self._flights_waiter
        if w is not None and not w.done() and (not self.flights or self._flight_error is not None):
            w.set_result(None)

    def _span_attributes(self, rec: RequestRecord) -> dict[str, Any]:
        """The client span's attributes for ``rec``."""
        attrs = {**self._static_attrs, Attr.REQUEST_ID: rec.request_id, Attr.OUTCOME: str(rec.status),
                 Attr.GENAI_REQUEST_MAX_TOKENS: rec.max_tokens, Attr.CHUNKS: rec.transport_chunks,
                 Attr.EVENTS: rec.sse_events, Attr.CONTENT_EVENTS: rec.content_events}
        if rec.http_status is not None:
            attrs[Attr.HTTP_STATUS] = rec.http_status
        if rec.stream_format:
            attrs[Attr.STREAM_FORMAT] = rec.stream_format
        if rec.usage_input_tokens is not None:
            attrs[Attr.GENAI_INPUT_TOKENS] = rec.usage_input_tokens
        if rec.usage_output_tokens is not None:
            attrs[Attr.GENAI_OUTPUT_TOKENS] = rec.usage_output_tokens
        if rec.finish_reason:
            attrs[Attr.GENAI_FINISH_REASONS] = tuple(rec.finish_reason.split(","))
        if rec.error_kind:
            attrs[Attr.ERROR_CAUSE] = rec.error_kind
        if rec.status != Outcome.OK:
            attrs[Attr.ERROR_TYPE] = rec.error_kind or str(rec.status)
        for k, v in rec.labels.items():
            attrs[Attr.LABEL_PREFIX + k] = v
        attrs[Attr.LABEL_PREFIX + "phase"] = rec.phase
        stamp_bounds = format_stamp_bounds(rec.stamp_bounds)
        if stamp_bounds:
            attrs[Attr.STAMP_BOUNDS] = stamp_bounds
        return attrs

    def _emit_span(self, trace_id: int, span_id: int, rec: RequestRecord) -> None:
        submit = rec.submit_mono_ns
        attrs = self._span_attributes(rec)
        off = to_unix_ns(0)  # to_unix_ns(t) == t + off
        events: list[tuple[str, int, dict[str, Any] | None]] = []
        if submit is not None:
            events.append((_EV_SEND, submit + off, None))
        if rec.first_token_mono_ns is not None:
            events.append((_EV_FIRST, rec.first_token_mono_ns + off, None))
        if rec.last_token_mono_ns is not None:
            events.append((_EV_LAST, rec.last_token_mono_ns + off, None))
        end = (rec.end_mono_ns if rec.end_mono_ns is not None else mono_ns()) + off
        if rec.status == Outcome.CLIENT_CANCEL:
            events.append((_EV_CANCEL, end, None))
        elif rec.status != Outcome.OK:
            events.append((_EV_ERROR, end, {Attr.ERROR_CAUSE: rec.error_kind or ""}))
        events.append((_EV_END, end, None))
        start = rec.planned_mono_ns + off if rec.planned_mono_ns is not None else end
        tel = self.telemetry
        tel.processor.on_end(_new_record(SpanRecord, (
            tel.origin, SPAN_CLIENT, KIND_CLIENT, trace_id, span_id, "", None, False, _SAMPLED, attrs, events, start, end, STATUS_UNSET, None,
        )))

    # ------------------------------------------------------------------ a unit: one request or one session

    async def unit(self, session: H1Pool, unit: list[PlannedRequest], planned_mono_ns: int, worker: int,
                   stop_mono_ns: int | None = None, barrier: Barrier | None = None) -> None:
        """Run a session's turns in order (a single request is a one-turn unit)."""
        history: list[tuple[dict[str, str], int]] = []
        planned = planned_mono_ns
        for k, req in enumerate(unit):
            if k > 0:
                planned = mono_ns() + int(req.think_s * 1e9)
                if stop_mono_ns is not None and planned >= stop_mono_ns:
                    return
            msgs, extra = self._window(history, req.history_tokens)
            body = self.bodies.get(req.index) if req.session is None else None
            rec = await self.request(session, req, planned, worker, msgs, extra, body, barrier if k == 0 else None)
            if req.history_tokens > 0:
                history.append(({"role": "user", "content": req.prompt}, self.tok.count(req.prompt)))
                if rec.output_text:
                    history.append(({"role": "assistant", "content": rec.output_text}, self.tok.count(rec.output_text)))

    def prebuild(self, plan: list[PlannedRequest], limit_bytes: int = 256 << 20) -> None:
        """Serialise single-turn request bodies before the run, so the send path only stamps and writes."""
        size = 0
        for req in plan:
            if req.session is None:
                body = self.target.body(req.system, [], req.prompt, req.max_tokens)
                size += len(body)
                if size > limit_bytes:
                    self.bodies.clear()
                    return
                self.bodies[req.index] = body

    def _window(self, history: list[tuple[dict[str, str], int]], budget: int) -> tuple[list[dict[str, str]], int]:
        """The newest messages that fit in ``budget`` tokens (oldest dropped; an oversize newest one is cut)."""
        if not history or budget <= 0:
            return [], 0
        out: list[dict[str, str]] = []
        used = 0
        for msg, n in reversed(history):
            if used + n > budget:
                if not out:
                    text = self.tok.tail(msg["content"], budget)
                    out.append({"role": msg["role"], "content": text})
                    used = self.tok.count(text)
                break
            out.append(msg)
            used += n
        out.reverse()
        return out, used


def new_run_id() -> str:
    return secrets.token_hex(4)
