"""Load modes, registered by name: open loop, closed loop, barrier-synchronised batches.

* ``open``   - unit k is planned at ``t_start + offsets[k]`` (an absolute timeline from the arrival
  process); a dispatcher hands each unit to its own task at least ``lead`` before that instant (it
  wakes once per ``dispatch`` window and starts every task of that window, not one timer per unit),
  and the task sleeps precisely until it (the runner's :class:`~deltatap.loadgen.runner.SendClock`). Nothing waits on an earlier response (methodology 4.2.3/4.2.5).
  Requests are spread round-robin over ``workers`` sessions.
* ``closed`` - ``concurrency`` workers, each with its own session, take the next unit as soon as
  their previous one ended: exactly C requests in flight (4.2.4). A session unit (chatbot) keeps
  its worker through its think times.
* ``batch``  - exo-bench style: ``batch`` workers, one session (connection) each, prepare their
  request, wait at a barrier, and all fire at the same instant; the next batch starts when the
  slowest one is done. Every request's planned send is the shared batch start.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from deltatap.core.clock import mono_ns
from deltatap.loadgen.client import make_session
from deltatap.loadgen.h1client import H1Pool
from deltatap.loadgen.runner import Barrier, Runner
from deltatap.net.aio import sleep_coarse_until
from deltatap.loadgen.workloads.base import PlannedRequest

Unit = list[PlannedRequest]


@dataclass
class ModeConfig:
    units: list[Unit]
    offsets_ns: list[int] | None = None  # open loop: planned offset of each unit
    concurrency: int = 1
    batch: int = 1
    workers: int = 4
    duration_s: float | None = None
    drain_s: float = 30.0
    lead_ns: int = 5_000_000  # open loop: a unit's task starts at least this long before its planned send
    dispatch_ns: int = 5_000_000  # open loop: each wake of the dispatcher starts the tasks of this much of the plan
    dispatch_burst: int = 8  # open loop: tasks started between two yields to the loop (a send due meanwhile waits)
    start_delay_ns: int = 20_000_000
    cycle: bool = False  # closed loop / batch with a duration: start the plan again when it runs out
    start_mono_ns: int | None = None  # several hosts (loadgen/coordinate.py): the shared start, on this host's clock


ModeFn = Callable[[Runner, ModeConfig, list[H1Pool]], Awaitable[None]]
MODES: dict[str, ModeFn] = {}


def register(name: str) -> Callable[[ModeFn], ModeFn]:
    def deco(fn: ModeFn) -> ModeFn:
        MODES[name] = fn
        return fn

    return deco


def sessions_needed(mode: str, cfg: ModeConfig) -> int:
    """Sessions (connection pools) a mode uses; a barrier batch or the open loop's rotation that does not cycle the plan
    uses no more than the plan's units (``--batch 100000 --requests 3``: 3 connections opened, not 100000)."""
    n = {"open": cfg.workers, "closed": cfg.concurrency, "batch": cfg.batch}[mode]
    return n if mode == "closed" or cfg.cycle else max(1, min(n, len(cfg.units)))


async def _finish(tasks: set[asyncio.Task], drain_s: float, runner: Runner | None = None) -> None:
    """Let in-flight work (tasks, and the runner's task-free requests) end within ``drain_s``, then cancel the rest
    (recorded as client_cancel)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + drain_s
    pending: set[asyncio.Task] = set()
    if tasks:
        _done, pending = await asyncio.wait(tasks, timeout=drain_s)
    if runner is not None and runner.flights:
        if not await runner.flights_ended(max(0.0, deadline - loop.time())):
            runner.cancel_flights()
            await runner.flights_ended(None)  # (the cancelled ones that had a task file their records from it)
    for t in pending:
        t.cancel()
    if pending:
        await asyncio.gather(*pending, return_exceptions=True)


async def _shared_start(cfg: ModeConfig) -> None:
    if cfg.start_mono_ns is not None:
        await sleep_coarse_until(cfg.start_mono_ns)


@register("open")
async def open_loop(runner: Runner, cfg: ModeConfig, sessions: list[H1Pool]) -> None:
    assert cfg.offsets_ns is not None
    t_start = cfg.start_mono_ns if cfg.start_mono_ns is not None else mono_ns() + cfg.start_delay_ns
    stop = t_start + int(cfg.duration_s * 1e9) if cfg.duration_s else None
    horizon = 0  # every unit planned before horizon + lead is launched
    burst = 0
    tasks: set[asyncio.Task] = set()
    n = len(sessions)
    bodies = runner.bodies
    for s in sessions:  # a send due while the loop handles a backlog of reads goes out before them
        s.before_read = runner.clock_wait.release_due
    try:
        for k, unit in enumerate(cfg.units):
            t_k = t_start + cfg.offsets_ns[k]
            if stop is not None and t_k >= stop:
                break
            if t_k - cfg.lead_ns > horizon:  # wake once per dispatch window and launch every unit planned in it
                await sleep_coarse_until(t_k - cfg.lead_ns)  # yields even when already late: reads keep flowing
                horizon = mono_ns() + cfg.dispatch_ns
                burst = 0
            elif burst >= cfg.dispatch_burst:  # each launch (ids, record, headers) runs before a due send: yield now and then
                await asyncio.sleep(0)
                burst = 0
            burst += 1
            if len(unit) == 1:  # a single request: no task; the send clock's timer sends it, callbacks read it
                req = unit[0]
                runner.launch(sessions[k % n], req, t_k, k % n, bodies.get(req.index))
                continue
            task = asyncio.create_task(runner.unit(sessions[k % n], unit, t_k, k % n, stop))  # a session's turns
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        await _finish(set(tasks), cfg.drain_s, runner)
    finally:
        runner.cancel_flights()  # (interrupted: nothing more is sent)
        for s in sessions:
            s.before_read = None


@register("closed")
async def closed_loop(runner: Runner, cfg: ModeConfig, sessions: list[H1Pool]) -> None:
    """Each worker's next unit starts in the callback that ends its previous one: a single request with no task
    (:meth:`Runner.launch`: written at once, on the connection just freed), a session's turns in a task."""
    it = itertools.cycle(cfg.units) if cfg.cycle else iter(cfg.units)
    await _shared_start(cfg)
    stop = mono_ns() + int(cfg.duration_s * 1e9) if cfg.duration_s else None
    loop = asyncio.get_running_loop()
    all_done = loop.create_future()  # every worker has run out of units (or the chain broke: its exception)
    tasks: set[asyncio.Task] = set()
    halted = False
    active = cfg.concurrency
    bodies = runner.bodies

    def next_unit(w: int, _ended: object = None) -> None:
        nonlocal active, halted
        try:
            for unit in it:
                now = mono_ns()
                if halted or (stop is not None and now >= stop):
                    break
                if len(unit) == 1:
                    req = unit[0]
                    runner.launch(sessions[w], req, now, w, bodies.get(req.index), again[w])
                    return
                task = loop.create_task(runner.unit(sessions[w], unit, now, w, stop))
                tasks.add(task)
                task.add_done_callback(lambda t: unit_done(t, w))
                return
        except BaseException as exc:  # noqa: BLE001 - (in a callback): the mode raises it
            halted = True
            if not all_done.done():
                all_done.set_exception(exc)
            return
        active -= 1
        if active == 0 and not all_done.done():
            all_done.set_result(None)

    again = [functools.partial(next_unit, w) for w in range(cfg.concurrency)]  # on_done: the worker's next unit

    def unit_done(t: asyncio.Task, w: int) -> None:
        nonlocal halted
        tasks.discard(t)
        if t.cancelled():
            return
        if t.exception() is not None:
            halted = True
            if not all_done.done():
                all_done.set_exception(t.exception())  # type: ignore[arg-type]
            return
        next_unit(w)

    try:
        for w in range(cfg.concurrency):
            next_unit(w)
        await asyncio.wait({all_done}, timeout=None if stop is None else max(0.0, (stop - mono_ns()) / 1e9))
        halted = True
        if all_done.done() and all_done.exception() is not None:
            raise all_done.exception()  # type: ignore[misc]
        await _finish(set(tasks), cfg.drain_s if stop is not None else 1e9, runner)
    finally:
        halted = True  # (interrupted or over: no worker starts another unit)
        runner.cancel_flights()
        for t in tasks:
            t.cancel()


@register("batch")
async def batch_mode(runner: Runner, cfg: ModeConfig, sessions: list[H1Pool]) -> None:
    n = cfg.batch
    await _shared_start(cfg)
    stop = mono_ns() + int(cfg.duration_s * 1e9) if cfg.duration_s else None
    it = itertools.cycle(cfg.units) if cfg.cycle else iter(cfg.units)
    while group := list(itertools.islice(it, n)):
        if stop is not None and mono_ns() >= stop:
            break
        barrier = Barrier(len(group))
        now = mono_ns()
        await asyncio.gather(*(runner.unit(sessions[i], unit, now, i, barrier=barrier) for i, unit in enumerate(group)))


async def preconnect(sessions: list[H1Pool], per_session: int = 1) -> None:
    """Open ``per_session`` connections in each session before the first timed send (TCP and TLS handshakes
    only, no request: a tap in front sees no extra request), so neither a barrier batch nor the first open-loop
    arrivals spend their instant in handshakes. A connection that fails here is opened again when needed."""
    await asyncio.gather(*(s.preconnect(per_session) for s in sessions))


def open_sessions(runner: Runner, count: int) -> list[H1Pool]:
    return [make_session(runner.target) for _ in range(max(1, count))]
