"""Load from several hosts with one shared start instant (``deltatap load --coordinate`` / ``--coordinator``).

One ``deltatap load`` is the coordinator (``--coordinate HOST:PORT --hosts N``): it serves

* ``GET /v1/clock`` - the NTP-style exchange of :mod:`deltatap.core.clocksync`, so every other host
  estimates its clock offset to the coordinator (lowest-delay samples), and
* ``POST /v1/join`` - a host joins with the key of its plan; when all ``N`` hosts (the coordinator
  included) have joined, each is answered with its index and the start instant, ``--start-in`` seconds
  (default 2) after the last join, on the coordinator's clock.

The others run the same command with ``--coordinator http://HOST:PORT`` instead. Every host builds the
same plan (same workload, seed, request count, rate, arrival process: the join refuses a host whose plan
differs) and sends its share of it: host ``i`` of ``N`` takes units ``i, i+N, i+2N, ...`` with their
planned offsets, so in open loop the hosts together send exactly the single-host schedule; in closed loop
and batch mode each host keeps its own ``--concurrency`` / ``--batch`` going on its share. Each host turns
the start instant into its own clock with its offset estimate, and its records carry its planned and
actual send times (``planned_send_unix_ns``, ``schedule_lag_ns``) as usual; ``deltatap report --from``
takes all the hosts' output directories together.

On one host, ``--processes N`` splits the run the same way over N processes (:class:`ProcessGroup`, at the
end of this module): request ``i`` goes to process ``i mod N``, all start at one instant, and the records
are merged into the one output the run writes.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from deltatap.core import clock
from deltatap.core.clock import mono_ns, now_unix_ns
from deltatap.core.clocksync import CLOCK_PATH, clock_answer, estimate_offset
from deltatap.core.config import ConfigError
from deltatap.core.topology import parse_hostport

JOIN_PATH = "/v1/join"


@dataclass(frozen=True)
class Assignment:
    """This host's share: index ``index`` of ``hosts``, starting at ``start_unix_ns`` (coordinator clock)."""

    index: int
    hosts: int
    start_unix_ns: int
    offset_ns: int = 0  # this host's clock minus the coordinator's
    uncertainty_ns: int = 0

    def start_mono_ns(self) -> int:
        """The shared start on this host's monotonic clock."""
        local_unix = self.start_unix_ns + self.offset_ns
        return mono_ns() + (local_unix - now_unix_ns())

    def share(self, items: list) -> list:
        return items[self.index :: self.hosts]

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "hosts": self.hosts, "start_unix_ns": self.start_unix_ns,
                "clock_offset_ns": self.offset_ns, "clock_uncertainty_ns": self.uncertainty_ns}


def plan_key(fields: dict[str, Any]) -> str:
    """A short hash of what makes the plan: hosts with different keys would not split one schedule."""
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[:16]


class Coordinator:
    def __init__(self, hosts: int, key: str, start_in_s: float = 2.0, join_timeout_s: float = 120.0) -> None:
        if hosts < 2:
            raise ConfigError("--hosts must be >= 2 with --coordinate (the coordinator is one of them)")
        if start_in_s <= 0:
            raise ConfigError("--start-in must be > 0")
        self.hosts, self.key, self.start_in_s, self.join_timeout_s = hosts, key, start_in_s, join_timeout_s
        self.joined: list[str] = []  # host names, the coordinator first
        self._all = asyncio.Event()
        self._start_unix_ns: int | None = None
        self._runner: web.AppRunner | None = None
        self.url = ""

    def _admit(self, name: str) -> int:
        index = len(self.joined)
        self.joined.append(name)
        if len(self.joined) == self.hosts:
            self._start_unix_ns = now_unix_ns() + int(self.start_in_s * 1e9)
            self._all.set()
        return index

    async def _clock(self, request: web.Request) -> web.Response:
        received = now_unix_ns()
        return web.Response(body=clock_answer(received), content_type="application/json")

    async def _join(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except (ValueError, UnicodeDecodeError):
            return web.json_response({"error": "the body must be JSON: {\"plan\": KEY, \"host\": NAME}"}, status=400)
        if body.get("plan") != self.key:
            return web.json_response({"error": f"this host's plan ({body.get('plan')}) is not the coordinator's ({self.key}): "
                                      "run every host with the same --workload, --seed, --requests/--duration and load shape"}, status=409)
        if self._all.is_set():
            return web.json_response({"error": f"all {self.hosts} hosts have joined already"}, status=409)
        index = self._admit(str(body.get("host") or request.remote))
        await self._all.wait()
        return web.json_response({"index": index, "hosts": self.hosts, "start_unix_ns": self._start_unix_ns})

    async def start(self, listen: str) -> None:
        try:
            host, port = parse_hostport(listen, "--coordinate")
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        app = web.Application()
        app.router.add_get(CLOCK_PATH, self._clock)
        app.router.add_post(JOIN_PATH, self._join)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        try:
            await site.start()
        except OSError as exc:
            await self._runner.cleanup()
            raise ConfigError(f"--coordinate {host}:{port}: cannot listen ({exc.strerror or exc})") from None
        self.url = f"http://{host}:{site._server.sockets[0].getsockname()[1]}"

    async def assign_self(self) -> Assignment:
        """The coordinator's own share (index 0), once every other host has joined."""
        self._admit(socket.gethostname())
        try:
            await asyncio.wait_for(self._all.wait(), self.join_timeout_s)
        except asyncio.TimeoutError:
            raise ConfigError(f"--coordinate: only {len(self.joined)} of --hosts {self.hosts} hosts joined within "
                              f"{self.join_timeout_s:.0f} s; start the others with --coordinator {self.url}") from None
        assert self._start_unix_ns is not None
        return Assignment(0, self.hosts, self._start_unix_ns)

    async def close(self, linger_s: float = 0.0) -> None:
        if self._runner is not None:
            await asyncio.sleep(linger_s)
            await self._runner.cleanup()
            self._runner = None


async def join(url: str, key: str, timeout_s: float = 120.0) -> Assignment:
    """Join the coordinator at ``url``: estimate this host's clock offset to it, then wait for the start."""
    url = url.rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"--coordinator {url!r}: use http://HOST:PORT (the coordinator's --coordinate address)")
    try:
        clock = await estimate_offset(url)
    except ConnectionError as exc:
        raise ConfigError(f"--coordinator {url}: {exc}") from None
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as s:
            async with s.post(url + JOIN_PATH, json={"plan": key, "host": socket.gethostname()}) as r:
                body = await r.json(content_type=None)
                if r.status != 200:
                    raise ConfigError(f"--coordinator {url}: {body.get('error') if isinstance(body, dict) else body}")
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as exc:
        raise ConfigError(f"--coordinator {url}: no start instant within {timeout_s:.0f} s ({exc or type(exc).__name__})") from None
    return Assignment(int(body["index"]), int(body["hosts"]), int(body["start_unix_ns"]), clock.offset_ns, clock.uncertainty_ns)


# --------------------------------------------------------------------------------------------
# Several processes on this host (``deltatap load --processes N``)
# --------------------------------------------------------------------------------------------
# Process 0 is the command itself; processes 1..N-1 are spawned (a fresh interpreter each: the parent has an
# event loop and an export thread, which a fork would copy half-way). Each takes the same share as a host would
# (units p, p+N, ... with their planned offsets: Assignment.share), numbers its requests with a stride of N so
# the ids are those one process would give, and starts at one shared instant on CLOCK_MONOTONIC (the clock of
# deltatap.core.clock.mono_ns, common to every process of the host). Their records come back whole (mono_ns
# stamps, output text for the reference token count) and are merged by the parent; each exports its own spans.

PROGRESS_SLOTS = 4  # per process, in a shared array: sent, done, in flight, errors (the live progress line)
STOP_GRACE_S = 30.0  # after a stop (Ctrl-C, SIGTERM): how long every process has to end its requests and hand its records back


def split_concurrency(concurrency: int, processes: int, index: int) -> int:
    """Process ``index``'s part of ``concurrency`` requests in flight (the first ones take the remainder)."""
    return concurrency // processes + (1 if index < concurrency % processes else 0)


def _ended_how(exitcode: int | None) -> str:
    """How a process ended, in words (``multiprocessing``'s exit code: negative for a signal)."""
    if exitcode is None:
        return "is still running"
    if exitcode < 0:
        try:
            return f"was killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"was killed by signal {-exitcode}"
    return f"exited with status {exitcode}"


def _has_data(pipe: Any) -> bool:
    """Whether a bytes wait in ``pipe`` (a socket pair's end) to be read: a peek, nothing taken (False at its end)."""
    try:
        sock = socket.socket(fileno=os.dup(pipe.fileno()))
    except OSError:
        return False
    try:
        return bool(sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
    except OSError:
        return False
    finally:
        sock.close()


class ProcessGroup:
    """The spawned processes 1..N-1 of a ``--processes N`` run, driven over pipes from the parent's loop.

    The parent alone decides when the run stops: :meth:`stop` (its Ctrl-C or SIGTERM) tells every process to end its
    send phase as one process ends it (``run.SendStop``), and :meth:`results` then waits at most
    :data:`STOP_GRACE_S` for their records. A process that dies (SIGKILL, a crash) or does not answer in time loses
    its records only: :meth:`results` returns the others', and :attr:`lost` has one line for each one lost."""

    def __init__(self, processes: int, otlp: str | None) -> None:
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        self.n = processes
        self.progress = ctx.Array("q", PROGRESS_SLOTS * processes, lock=False)
        self._pipes: list[Any] = []
        self._procs: list[Any] = []
        self._planned: list[int] = []  # requests each spawned process was given (prepare)
        self.finished = False  # every process sent its records (else closing stops them at once)
        self.stopped: str | None = None  # the stop's name (SIGINT, SIGTERM) once :meth:`stop` was called
        self._deadline: float | None = None  # (loop time) after a stop: when the records still missing are given up
        self.lost: list[str] = []  # one line per process whose records did not come back
        self.notes: list[str] = []  # one line per process stopped by a signal of its own (its records came back)
        self._watched: list[int] = []  # sentinels watched in the loop (start's on_death)
        self._gone: set[int] = set()  # processes whose records are lost: closing kills them at once
        self._receiving: set[int] = set()  # processes whose hand-back has begun to arrive
        self._grace_cut = False  # a second signal ended the wait for the records (hurry)
        for p in range(1, processes):
            ours, theirs = ctx.Pipe()
            proc = ctx.Process(target=child_main, args=(theirs, p, otlp, self.progress, clock.ANCHOR), name=f"deltatap-load-{p}", daemon=True)
            proc.start()
            theirs.close()
            self._pipes.append(ours)
            self._procs.append(proc)

    def _name(self, i: int) -> str:
        return f"process {i + 2} of {self.n}"

    async def _exit_words(self, i: int) -> str:
        proc = self._procs[i]
        await asyncio.get_running_loop().run_in_executor(None, proc.join, 1.0)  # (an EOF comes just before the exit)
        return f"{_ended_how(proc.exitcode)} (pid {proc.pid})"

    async def _recv(self, i: int, timeout_s: float | None) -> Any:
        loop = asyncio.get_running_loop()
        pipe = self._pipes[i]

        def recv() -> Any:
            if timeout_s is not None and not pipe.poll(timeout_s):
                raise TimeoutError
            return pipe.recv()

        try:
            msg = await loop.run_in_executor(None, recv)
        except (EOFError, OSError):
            raise ConfigError(f"--processes: {self._name(i)} ended unexpectedly: it {await self._exit_words(i)}") from None
        except TimeoutError:
            raise ConfigError(f"--processes: {self._name(i)} did not answer within {timeout_s:.0f} s") from None
        if isinstance(msg, tuple) and msg and msg[0] == "error":
            raise ConfigError(f"--processes: {self._name(i)}: {msg[1]}")
        return msg

    async def _send_all(self, messages: list[Any]) -> None:
        loop = asyncio.get_running_loop()

        async def send(i: int, m: Any) -> None:
            try:
                await loop.run_in_executor(None, self._pipes[i].send, m)
            except (OSError, ValueError):  # (before: 'deltatap load: Broken pipe', naming nothing)
                raise ConfigError(f"--processes: {self._name(i)} ended unexpectedly: it {await self._exit_words(i)}") from None

        await asyncio.gather(*(send(i, m) for i, m in enumerate(messages)))

    async def prepare(self, plans: list[dict[str, Any]], timeout_s: float = 120.0) -> None:
        """Hand each process its share (``plans[i]`` for process i + 1) and wait until all are ready to send."""
        self._planned = [len(p["cfg"].units) for p in plans]
        await self._send_all(plans)
        await asyncio.gather(*(self._recv(i, timeout_s) for i in range(len(self._pipes))))

    async def start(self, start_mono_ns: int, on_death: Callable[[str], None] | None = None) -> None:
        """Send the shared start; from now on a process that fails (exits with a status, its line sent) or dies (killed,
        crashed) before it handed back its records calls ``on_death(line)`` at once (the parent stops the run: its plan
        no longer holds)."""
        await self._send_all([("start", start_mono_ns)] * len(self._pipes))
        if on_death is not None:
            loop = asyncio.get_running_loop()
            for i, proc in enumerate(self._procs):  # (its sentinel becomes readable when it exits: no thread, no poll)
                loop.add_reader(proc.sentinel, self._ended, i, on_death, 0)
                self._watched.append(proc.sentinel)

    def _ended(self, i: int, on_death: Callable[[str], None], tries: int) -> None:
        loop = asyncio.get_running_loop()
        proc = self._procs[i]
        if tries == 0:
            loop.remove_reader(proc.sentinel)
            self._watched.remove(proc.sentinel)
        code = proc.exitcode  # (None for a moment after the sentinel: the exit is not reaped yet)
        if code is None and tries < 100:
            loop.call_later(0.01, self._ended, i, on_death, tries + 1)
        elif self.finished or i in self._receiving or code is None or code == 0:  # (its hand-back under way or done:
            return  # results() reads it, or names the loss)
        elif code > 0 or not _has_data(self._pipes[i]):  # its failure (its line waits in the pipe), or a death before
            on_death(f"{self._name(i)} {_ended_how(code)}")  # its records (a crash after them, at exit, loses nothing)

    def _unwatch(self) -> None:
        loop = asyncio.get_running_loop()
        for fd in self._watched:
            loop.remove_reader(fd)
        self._watched.clear()

    def stop(self, name: str) -> None:
        """End the run (``name``: the signal that asked it): every process stops sending, ends what it has in flight and
        hands back its records; :meth:`results` waits for them at most :data:`STOP_GRACE_S` from now."""
        if self.stopped is not None:
            return
        self.stopped = name
        self._deadline = asyncio.get_running_loop().time() + STOP_GRACE_S
        for pipe in self._pipes:
            try:
                pipe.send(("stop", name))  # (a few bytes: never blocks on a live process; a dead one is named by results)
            except (OSError, ValueError):
                pass

    def hurry(self) -> None:
        """After a stop, a second Ctrl-C: stop waiting for the records still missing (:meth:`results` names them lost)."""
        if self._deadline is not None:
            self._deadline = asyncio.get_running_loop().time()
            self._grace_cut = True

    async def _result(self, i: int) -> Any:
        """Process ``i + 1``'s results (waiting on its pipe in the loop, then read in a thread), or a line saying why not."""
        loop = asyncio.get_running_loop()
        pipe = self._pipes[i]
        ready = loop.create_future()
        loop.add_reader(pipe.fileno(), lambda: ready.done() or ready.set_result(None))
        try:
            await ready
            self._receiving.add(i)
        finally:
            loop.remove_reader(pipe.fileno())
            os.set_blocking(pipe.fileno(), True)  # (uvloop's reader left it non-blocking: a long message's read would fail)
        try:
            msg = await loop.run_in_executor(None, pipe.recv)
        except (EOFError, OSError):
            return f"{await self._exit_words(i)} before it handed back its records"
        except Exception as exc:  # noqa: BLE001 - (a message cut or garbled: unpickling fails) the others' records stand
            return f"handed back records that could not be read ({type(exc).__name__}: {exc})"
        if isinstance(msg, tuple) and msg and msg[0] == "error":
            return f"failed ({msg[1]})"
        if not isinstance(msg, dict) or "records" not in msg:  # (nothing else is ever sent at this point)
            return f"answered {type(msg).__name__} instead of its records"
        return msg

    async def results(self) -> list[dict[str, Any] | None]:
        """Each process's ``{"records": [...], "max_in_flight": n, "spans": {...}, ...}`` once it has finished, in
        process order; None for a process whose records are lost (it died, failed, or did not hand them back within
        :data:`STOP_GRACE_S` of a stop), with its line in :attr:`lost`."""
        loop = asyncio.get_running_loop()
        tasks = [loop.create_task(self._result(i)) for i in range(len(self._pipes))]
        pending = set(tasks)
        try:
            while pending:  # (no bound before a stop: a run takes as long as it takes)
                _done, pending = await asyncio.wait(pending, timeout=0.5)
                if pending and self._deadline is not None and loop.time() >= self._deadline:
                    break
        finally:
            for t in pending:
                t.cancel()
        out: list[dict[str, Any] | None] = []
        for i, t in enumerate(tasks):
            got = t.result() if t.done() and not t.cancelled() else (
                f"had not handed back its records at a second signal after the stop ({self.stopped})" if self._grace_cut
                else f"did not hand back its records within {STOP_GRACE_S:g} s of the stop ({self.stopped})")
            if isinstance(got, str):
                self._gone.add(i)
                first = i + 2  # (its share: the plan's requests first, first + N, ...: their ids RUN-m<k>)
                share = f"requests {first}, {first + self.n}, {first + 2 * self.n}, ... of the plan"
                planned = f", {self._planned[i]} planned" if i < len(self._planned) else ""
                self.lost.append(f"{self._name(i)} {got}: its records are lost ({share}{planned})")
                out.append(None)
            else:
                if got.get("interrupted") and self.stopped is None:  # (a SIGTERM of its own: the run was not stopped)
                    self.notes.append(f"{self._name(i)} was stopped by {got['interrupted']} (pid {self._procs[i].pid}): "
                                      f"the rest of its share was not sent; its records are in")
                out.append(got)
        self.finished = True
        self._unwatch()
        return out

    def progress_of(self, index: int) -> tuple[int, ...]:
        base = index * PROGRESS_SLOTS
        return tuple(self.progress[base : base + PROGRESS_SLOTS])

    async def close(self) -> None:
        """End the processes: those that finished exit by themselves; any other is stopped (SIGTERM, then SIGKILL: one
        that was handing back its records ignores SIGTERM). Bounded: at most a few seconds per process."""
        loop = asyncio.get_running_loop()
        self._unwatch()
        for i, proc in enumerate(self._procs):
            if i in self._gone and proc.is_alive():  # (it had its time: STOP_GRACE_S)
                proc.kill()
            elif not self.finished and proc.is_alive():  # the run ended early (an error, Ctrl-C before the send phase)
                self._pipes[i].close()  # (nobody reads its records: their send fails at once instead of blocking)
                proc.terminate()
            await loop.run_in_executor(None, proc.join, 15 if self.finished else 5)
            if proc.is_alive():
                proc.kill()
                await loop.run_in_executor(None, proc.join, 5)
        for pipe in self._pipes:
            try:
                pipe.close()
            except OSError:
                pass


def child_main(pipe: Any, index: int, otlp: str | None, progress: Any, anchor: clock.Anchor) -> None:
    """Entry point of spawned process ``index`` (runs its share, sends its records back). It takes the parent's
    clock anchor: the monotonic clock is the host's, so with one anchor every process's Unix stamps (records and
    spans alike) are the parent's to the nanosecond.

    The parent decides when the run stops: Ctrl-C (SIGINT to the whole process group) is ignored here, and the parent's
    word ("stop") ends this send phase; so does SIGTERM sent to this process, and the parent's end (its pipe closes: no
    process sends load for a run nobody collects). Once the send phase is over SIGTERM is ignored too, until the records
    are handed back."""
    clock.ANCHOR = anchor

    from deltatap.net import aio

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the parent, which ends the run for everyone
    handed_back: list[bool] = []
    try:
        aio.run(_child(pipe, index, otlp, progress, handed_back))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent as one line
        if handed_back:  # (its records are with the parent: a failure after that, e.g. the exporter's shutdown, loses nothing)
            print(f"deltatap load: process {index + 1}: after its records were handed back: {type(exc).__name__}: {exc}",
                  file=sys.stderr)
            return
        try:
            pipe.send(("error", f"{type(exc).__name__}: {exc}"))
        except (OSError, ValueError):
            pass
        raise SystemExit(1) from None  # (a non-zero exit: the parent stops the run at once, then reads the line)


async def _child(pipe: Any, index: int, otlp: str | None, progress: Any, handed_back: list[bool]) -> None:
    from deltatap.loadgen.modes import MODES, ModeConfig, open_sessions, preconnect
    from deltatap.loadgen.run import SendStop, loop_wait_s, process_cpu_s
    from deltatap.loadgen.runner import Runner, load_telemetry, send_phase_gc, send_phase_slice

    loop = asyncio.get_running_loop()
    telemetry = load_telemetry(otlp)
    try:
        plan = await loop.run_in_executor(None, pipe.recv)
        runner = Runner(plan["target"], None, telemetry, plan["run_id"], plan["clock"], spin_ns=plan["spin_ns"])  # type: ignore[arg-type]
        runner.phase = "measure"
        runner._seq, runner.seq_step = plan["seq_start"], plan["seq_step"]
        cfg: ModeConfig = plan["cfg"]
        runner.prebuild([r for u in cfg.units for r in u])
        sessions = open_sessions(runner, plan["sessions"])
        stopped: str | None = None
        try:
            if plan["preconnect"]:
                await preconnect(sessions, plan["preconnect"])
            with send_phase_gc(), send_phase_slice():  # (its collection before "ready": not between the start's news and the start)
                pipe.send(("ready", index))
                tag, arg = await loop.run_in_executor(None, pipe.recv)  # ("start", instant), or ("stop", name) first
                ticker = asyncio.create_task(_publish_progress(runner, progress, index))
                try:
                    cpu0, wait0 = process_cpu_s(), loop_wait_s()
                    with SendStop(runner, (signal.SIGTERM,), stop_pipe=pipe) as stop:
                        if tag == "stop":
                            stop.stop(arg)
                        else:
                            cfg.start_mono_ns = arg
                        await stop.run(MODES[plan["mode"]](runner, cfg, sessions))
                    stopped = stop.name
                    cpu_s, wait1 = process_cpu_s() - cpu0, loop_wait_s()
                    wait_s = wait1 - wait0 if wait0 is not None and wait1 is not None else None
                finally:
                    ticker.cancel()
        finally:
            for s in sessions:
                await s.close()
            runner.clock_wait.close()
        c = runner.counters
        base = index * PROGRESS_SLOTS
        progress[base : base + PROGRESS_SLOTS] = [c.sent, c.done, c.in_flight, c.errors]
        telemetry.processor.force_flush(10_000)
        st = telemetry.stats
        await loop.run_in_executor(None, pipe.send, {
            "records": runner.records, "max_in_flight": c.max_in_flight, "cpu_s": cpu_s, "wait_s": wait_s,
            "spans": {"ended": st.spans_ended, "exported": st.spans_exported, "dropped": st.spans_dropped},
            "interrupted": stopped,
        })
        handed_back.append(True)
    finally:
        telemetry.shutdown()


async def _publish_progress(runner: Any, progress: Any, index: int) -> None:
    base = index * PROGRESS_SLOTS
    while True:
        c = runner.counters
        progress[base : base + PROGRESS_SLOTS] = [c.sent, c.done, c.in_flight, c.errors]
        await asyncio.sleep(0.25)
