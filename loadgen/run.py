"""``run_load``: plan, warm up, drive, post-process and write one load-generator run."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import platform
import resource
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from deltatap import __version__
from deltatap.core.clock import ANCHOR, mono_ns
from deltatap.core.clocksync import ClockEstimate, estimate_offset
from deltatap.core.config import ConfigError
from deltatap.telemetry.tracer import Telemetry
from deltatap.core.vocab import Outcome
from deltatap.loadgen.arrivals import schedule_offsets_ns
from deltatap.loadgen.client import ModelListError, Target, list_models, resolve_url
from deltatap.loadgen.gpu import GpuSampler
from deltatap.loadgen.coordinate import Assignment, Coordinator, ProcessGroup, join, plan_key, split_concurrency
from deltatap.loadgen.modes import MODES, ModeConfig, open_sessions, preconnect, sessions_needed
from deltatap.loadgen.options import DEFAULT_MODEL, LoadOptions
from deltatap.loadgen.records import RecordWriter, RequestRecord
from deltatap.loadgen.runner import Counters, LoadAborted, Runner, new_run_id, send_phase_gc, send_phase_slice
from deltatap.loadgen.summary import summarize
from deltatap.loadgen.tokens import reference_tokenizer
from deltatap.loadgen.workloads.base import PlannedRequest, WorkloadSpec, load_workload, spec_from_mapping, write_requests
from deltatap.loadgen.warmup import warm_up

log = logging.getLogger("deltatap.loadgen")

__all__ = ["LoadAborted", "LoadResult", "group_units", "pick_model", "resolve_workload", "run_load"]


@dataclass
class LoadResult:
    """What a run produced. ``records`` are the documented JSON-lines dicts (docs/records.md)."""

    summary: dict[str, Any] = field(repr=False)
    records: list[dict[str, Any]] = field(repr=False)  # repr of a whole run would take seconds
    warmup_records: list[dict[str, Any]] = field(default_factory=list, repr=False)
    plan: list[PlannedRequest] = field(default_factory=list, repr=False)
    out_dir: Path | None = None
    interrupted: str | None = None  # SIGINT / SIGTERM ended the send phase early (the records are what it got)
    lost: list[str] = field(default_factory=list)  # --processes N: one line per process whose records are lost
    stopped: list[str] = field(default_factory=list)  # --processes N: one line per process stopped by a SIGTERM of its own


def group_units(plan: list[PlannedRequest]) -> list[list[PlannedRequest]]:
    """Single requests are units of one; a session's turns form one unit, in turn order, placed at
    its first turn's position in the plan."""
    units: list[list[PlannedRequest]] = []
    by_session: dict[int, list[PlannedRequest]] = {}
    for r in plan:
        if r.session is None:
            units.append([r])
        elif r.session in by_session:
            by_session[r.session].append(r)
        else:
            by_session[r.session] = [r]
            units.append(by_session[r.session])
    return units


def resolve_workload(options: LoadOptions) -> WorkloadSpec:
    if isinstance(options.workload, dict):
        return spec_from_mapping(options.workload, "workload")
    return load_workload(options.workload)


async def pick_model(url: str, headers: dict[str, str], timeout_s: float) -> tuple[str, str, str]:
    """The model to send when none was given: the first one the target lists at ``GET /v1/models``,
    else :data:`DEFAULT_MODEL`. Returns ``(model, source, one line for the user saying which and why)``."""
    try:
        ids = await list_models(url, headers, timeout_s)
    except ModelListError as exc:
        return (DEFAULT_MODEL, "default",
                f"no --model given and the target lists none ({exc}); falling back to model {DEFAULT_MODEL!r}")
    more = f" (of {len(ids)}: {', '.join(ids[:5])}{', ...' if len(ids) > 5 else ''})" if len(ids) > 1 else ""
    return ids[0], "listed", f"no --model given: using model {ids[0]!r}, the first the target lists at /v1/models{more}"


async def run_load(options: LoadOptions, telemetry: Telemetry, say: Callable[[str], None] | None = None,
                   otlp: str | None = None) -> LoadResult:
    """Run the load described by ``options``, exporting one client span per request via ``telemetry``.

    With ``options.processes`` > 1 the requests of processes 2..N are sent (and their spans exported, through
    ``setup_telemetry(otlp=otlp)``: ``--otlp``, else the ``OTEL_*`` variables) by spawned processes; their
    records are merged into this one's.

    Raises :class:`~deltatap.config.ConfigError` for bad options (unknown workload, bad URL, an
    unreachable ``--clock-sync`` collector), and its subclass :class:`LoadAborted` when every request
    of the warm-up failed; otherwise a target that fails requests does not raise - every failure is a
    record with its status and error kind, counted in the summary. ``say`` gets the one-line notes
    meant for the user (the model picked when ``options.model`` is None); default: logged at INFO.
    """
    say = say or log.info
    wall_start = time.time()
    tok = reference_tokenizer()
    spec = resolve_workload(options)
    n = options.planned_count()
    try:
        plan = spec.generate(n, options.seed, tok)
    except ValueError as exc:
        raise ConfigError(f"workload {spec.name}: {exc}") from None
    for r in plan:
        r.labels.update(options.labels)
    units = group_units(plan)
    if options.mode == "batch" and any(len(u) > 1 for u in units):
        raise ConfigError(f"--batch needs single-turn requests; workload {spec.name!r} plans multi-turn sessions")
    if options.processes > 1 and any(len(u) > 1 for u in units):
        raise ConfigError(f"--processes needs single-turn requests; workload {spec.name!r} plans multi-turn sessions")
    try:
        url, endpoint = resolve_url(options.target, options.endpoint)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    model, model_source = options.model, "given"
    if model is None:
        model, model_source, note = await pick_model(url, dict(options.headers), min(options.request_timeout_s, 10.0))
        say(note)
    target = Target(
        url=url, endpoint=endpoint, model=model, headers=dict(options.headers), timeout_s=options.request_timeout_s,
        refusal_statuses=frozenset(options.refusal_statuses), ignore_eos=options.ignore_eos,
    )
    clock: ClockEstimate | None = None
    if options.clock_sync:
        try:
            clock = await estimate_offset(options.clock_sync)
        except ConnectionError as exc:
            raise ConfigError(f"--clock-sync: {exc}") from None
    run_id = options.run_id or new_run_id()
    runner = Runner(target, tok, telemetry, run_id, clock, spin_ns=options.spin_us * 1000)
    procs = options.processes
    group: ProcessGroup | None = None
    cfg = ModeConfig(
        units=units, concurrency=options.concurrency or 1, batch=options.batch or 1, workers=options.workers,
        duration_s=options.duration_s, drain_s=options.drain_s,
        cycle=options.duration_s is not None and options.requests is None,
    )
    if procs > 1 and options.mode == "closed":
        cfg.concurrency = split_concurrency(cfg.concurrency, procs, 0)
    if options.mode == "open":
        assert options.rate is not None
        cfg.offsets_ns = schedule_offsets_ns(options.arrival, options.rate, len(units), options.seed).tolist()
    sessions = open_sessions(runner, sessions_needed(options.mode, cfg))
    extra_sessions: list[Any] = []
    gpu = GpuSampler() if options.gpu else None
    warm_report: dict[str, Any] | None = None
    warm_records: list[RequestRecord] = []
    progress = None
    coordinator: Coordinator | None = None
    assignment: Assignment | None = None
    interrupted: list[str] = []
    child_spans: list[dict[str, int]] = []
    send_cpu_s = 0.0
    send_wait_s: float | None = None
    try:
        if procs > 1:
            group = ProcessGroup(procs, otlp)  # (they start their interpreters during the warm-up)
        if gpu is not None:
            gpu.start()
        if options.warmup_requests > 0:
            warm_plan = group_units(spec.generate(options.warmup_requests, options.seed + 1, tok))
            wc = options.warmup_concurrency or options.concurrency or options.batch or min(8, options.workers * 2)
            if len(sessions) < wc:
                extra_sessions = open_sessions(runner, wc - len(sessions))
            warm_sessions = (sessions + extra_sessions)[:wc]
            try:
                warm_report = await warm_up(runner, warm_sessions, warm_plan, plan[0], options.warmup_probes, options.warmup_rounds)
            except LoadAborted:
                if options.out:  # what the warm-up got, to look at
                    _write_records(Path(options.out) / "warmup.jsonl", runner.records)
                raise
            warm_records = runner.records
            runner.records = []
            runner.counters = Counters()
        per = 0
        if options.preconnect or (options.preconnect is None and options.mode == "batch"):
            per = 1 if options.rate is None else 1 + int(options.rate / procs * 0.01 / len(sessions))
        if options.coordinate or options.coordinator:  # several hosts: this one's share, from one shared start
            coordinator, assignment = await _coordinate(options, spec, say)
            cfg.units = assignment.share(cfg.units)
            if cfg.offsets_ns is not None:
                cfg.offsets_ns = assignment.share(cfg.offsets_ns)
            cfg.start_mono_ns = assignment.start_mono_ns()
        if group is not None:  # several processes: each its share (request i to process i mod N), one start
            await group.prepare([_process_plan(options, cfg, runner, target, run_id, clock, p, procs, per)
                                 for p in range(1, procs)])
            runner.seq_step = procs
            runner._seq -= procs - 1  # (this process's first request is the run's first)
            cfg.units = Assignment(0, procs, 0).share(cfg.units)
            if cfg.offsets_ns is not None:
                cfg.offsets_ns = Assignment(0, procs, 0).share(cfg.offsets_ns)
        runner.prebuild([r for u in cfg.units for r in u])
        if per:
            await preconnect(sessions, per)
        results: list[dict[str, Any] | None] = []
        # Ctrl-C / SIGTERM ends the sending, not the run (several processes: every process's sending, group.stop); the
        # coordinating host of several hosts: a signal still ends the run at once
        sigs = STOP_SIGNALS if coordinator is None else ()
        with SendStop(runner, sigs, on_stop=None if group is None else group.stop,
                      on_again=None if group is None else group.hurry) as stop:
            # (the send phase's collection runs before a shared start is set: its CPU, tens to hundreds of ms with a
            # large plan, would otherwise fall between the start being sent and the start, and this process start late)
            with send_phase_gc(), send_phase_slice():
                if group is not None:
                    if cfg.start_mono_ns is None:
                        cfg.start_mono_ns = mono_ns() + PROCESS_START_IN_NS  # every process ready: start together, 0.1 s from now
                    await group.start(cfg.start_mono_ns, on_death=stop.stop)  # (a process lost: the run stops)
                if options.progress:
                    from deltatap.loadgen.progress import LiveProgress

                    total = len(plan) if options.duration_s is None else None
                    counters: Any = runner.counters if group is None else _SummedCounters(runner.counters, group)
                    progress = LiveProgress(counters, total)
                    progress.start()
                cpu0, wait0 = process_cpu_s(), loop_wait_s()
                await stop.run(MODES[options.mode](runner, cfg, sessions))
                send_cpu_s, wait1 = process_cpu_s() - cpu0, loop_wait_s()
                if wait0 is not None and wait1 is not None:
                    send_wait_s = wait1 - wait0
            if group is not None:  # (a stop meanwhile ends theirs too; then their records are a bounded wait)
                results = await group.results()
        if stop.name in _STOP_NAMES:  # (else a process was lost: group.lost names it)
            interrupted.append(stop.name)
        cpu_per_process: list[float | None] = [send_cpu_s]
        wait_per_process = [send_wait_s]
        for res in results:  # several processes: their records, in process order (the merge's sort below orders them)
            if res is None:  # (lost: named in group.lost)
                cpu_per_process.append(None)
                wait_per_process.append(None)
                continue
            runner.records.extend(res["records"])
            child_spans.append(res["spans"])
            cpu_per_process.append(res["cpu_s"])
            wait_per_process.append(res.get("wait_s"))
            if res.get("interrupted") in _STOP_NAMES and not interrupted:  # (one stopped by a SIGTERM of its own)
                interrupted.append(res["interrupted"])
        send_cpu_s = sum(c for c in cpu_per_process if c is not None)  # (every process's; the wait only where each could read its own)
        send_wait_s = None if None in wait_per_process else sum(w for w in wait_per_process if w is not None)
    finally:
        if group is not None:
            await group.close()
        if coordinator is not None:
            await coordinator.close()
        if progress is not None:
            await progress.stop()
        if gpu is not None:
            gpu.stop()
        for s in sessions + extra_sessions:
            await s.close()
        runner.clock_wait.close()
    measured = runner.records
    _count_output_tokens(measured, tok)
    _count_output_tokens(warm_records, tok)
    if warm_report is not None:
        warm = [r for r in warm_records if r.phase == "warmup"]
        sent, out_tokens = len(warm), sum(r.output_tokens or 0 for r in warm)
        warm_report.update(requests_sent=sent, output_tokens=out_tokens,
                           meets_4_5_1_minimum=sent >= 100 and out_tokens >= 10_000)  # ">= 100 requests or 10,000 output tokens, whichever is greater"
    windows: list[tuple[int, int]] = []
    if gpu is not None and gpu.available:
        for rec in measured:
            if rec.submit_mono_ns is not None and rec.end_mono_ns is not None:
                rec.energy_j = gpu.energy_j(rec.submit_mono_ns, rec.end_mono_ns)
                windows.append((rec.submit_mono_ns, rec.end_mono_ns))
    measured.sort(key=lambda r: (r.planned_mono_ns or 0, r.index))
    records = [r.to_dict() for r in measured]
    summary = summarize(records)
    summary["max_in_flight_observed"] = runner.counters.max_in_flight if group is None else _max_in_flight(measured)
    ok_out = sum(r.output_tokens or 0 for r in measured if r.status == Outcome.OK)
    summary["gpu"] = gpu.report(windows, ok_out, len(windows)) if gpu is not None else {"available": False, "reason": "disabled (--no-gpu)"}
    summary["warmup"] = warm_report or {"requests_per_round": 0, "verdict": "none: cold start (methodology 4.5.3)"}
    summary["run"] = _run_metadata(options, spec, tok, run_id, clock, telemetry, wall_start, len(plan))
    summary["run"]["model"] = model  # what every request asked for
    summary["run"]["model_source"] = model_source  # given (--model), listed (GET /v1/models) or default
    summary["run"]["provenance"] = await _provenance(options, plan, url)
    summary["run"]["processes"] = procs
    # CPU (user + system, every thread: spans are exported from their own) of the process(es) while sending
    summary["run"]["send_phase_cpu_s"] = send_cpu_s
    summary["run"]["send_phase_cpu_us_per_request"] = send_cpu_s * 1e6 / len(measured) if measured else None
    # how long the event loop's thread (every process's) was ready to run but waited for a CPU while sending:
    # what other work on the host took from the run (a send planned in such a wait is late by it)
    summary["run"]["send_phase_cpu_wait_s"] = send_wait_s
    # the same two, process by process (the first is this one; --processes N: then processes 2..N)
    summary["run"]["send_phase_cpu_s_per_process"] = cpu_per_process
    summary["run"]["send_phase_cpu_wait_s_per_process"] = wait_per_process
    for spans in child_spans:  # several processes: every process's spans
        for k in ("ended", "exported", "dropped"):
            summary["run"]["spans"][k] += spans[k]
    # SIGINT / SIGTERM ended the sending early (null: it ran to its end); --processes N: the processes whose records are lost
    summary["run"]["interrupted"] = interrupted[0] if interrupted else None
    summary["run"]["processes_lost"] = list(group.lost) if group is not None else []
    summary["run"]["processes_stopped"] = list(group.notes) if group is not None else []  # (by a SIGTERM of their own)
    if assignment is not None:
        summary["run"]["hosts"] = assignment.to_dict()  # several hosts: this one's share and the shared start
    result = LoadResult(summary, records, [r.to_dict() for r in warm_records], plan, None, summary["run"]["interrupted"],
                        summary["run"]["processes_lost"], summary["run"]["processes_stopped"])
    if options.out:
        result.out_dir = write_outputs(Path(options.out), result, measured, warm_records, options.write_requests)
    return result


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)  # the signals that end a send phase early (SendStop): an interrupted run


_STOP_NAMES = tuple(s.name for s in STOP_SIGNALS)


class SendStop:
    """Ends a send phase early: SIGINT (Ctrl-C) or SIGTERM while it runs (``signals``), or, in a spawned process of
    ``--processes N`` (loadgen/coordinate.py), the parent's word on ``stop_pipe`` (or the parent's end: its pipe closes).
    Nothing more is sent, what is in flight ends as ``client_cancel``, and the run goes on to write its records and
    summary; :attr:`name` is the stop's (the signal's name). ``on_stop(name)`` is called at the stop (the parent: tell the
    other processes). The one definition of an interrupted send phase, for one process, the parent and each spawned one::

        with SendStop(runner) as stop:
            await stop.run(send)

    A second signal while the block runs calls ``on_again()`` (the parent: stop waiting for the others' records), else
    is ignored; after the block, a signal acts as it would without this (a spawned process: ignored, until its records
    are handed back)."""

    def __init__(self, runner: Runner, signals: tuple[signal.Signals, ...] = STOP_SIGNALS,
                 on_stop: Callable[[str], None] | None = None, stop_pipe: Any = None,
                 on_again: Callable[[], None] | None = None) -> None:
        self.runner, self.signals, self.on_stop, self.pipe, self.on_again = runner, signals, on_stop, stop_pipe, on_again
        self.name: str | None = None
        self._task: asyncio.Future[Any] | None = None

    def __enter__(self) -> SendStop:
        loop = asyncio.get_running_loop()
        for sig in self.signals:
            loop.add_signal_handler(sig, self._signalled, sig.name)
        if self.pipe is not None:
            loop.add_reader(self.pipe.fileno(), self._heard)
        return self

    def __exit__(self, *exc: object) -> None:
        loop = asyncio.get_running_loop()
        if self.pipe is not None:
            loop.remove_reader(self.pipe.fileno())
            os.set_blocking(self.pipe.fileno(), True)  # (uvloop's reader left it non-blocking: the records' send would fail)
        for sig in self.signals:
            loop.remove_signal_handler(sig)
            if self.pipe is not None:  # (a spawned process: no signal ends it before its records are handed back)
                signal.signal(sig, signal.SIG_IGN)

    def _heard(self) -> None:
        try:
            msg = self.pipe.recv()
        except (EOFError, OSError):  # the parent is gone: nobody collects this run
            asyncio.get_running_loop().remove_reader(self.pipe.fileno())
            self.stop("EOF")
            return
        if isinstance(msg, tuple) and len(msg) == 2 and msg[0] == "stop":
            self.stop(str(msg[1]))

    def _signalled(self, name: str) -> None:
        if self.name is not None and self.on_again is not None:
            self.on_again()
        self.stop(name)

    def stop(self, name: str) -> None:
        if self.name is not None:
            return
        self.name = name
        if self._task is not None and not self._task.done():
            self._task.cancel()
        if self.on_stop is not None:
            self.on_stop(name)

    async def run(self, send: Any) -> None:
        """Await the send phase ``send`` (a coroutine), ended early by a stop (before it began: not run at all)."""
        if self.name is not None:
            send.close()
            return
        task = self._task = asyncio.ensure_future(send)
        try:
            await task
        except asyncio.CancelledError:
            if self.name is None or not task.cancelled():
                raise
            self.runner.cancel_flights()
            await self.runner.flights_ended(5.0)  # (a cancelled request files its record as it ends)


PROCESS_START_IN_NS = 100_000_000  # --processes: the shared start, this long after every process said it was ready


def process_cpu_s() -> float:
    """This process's CPU time so far (user + system, all threads), seconds."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def loop_wait_s() -> float | None:
    """Seconds the calling thread has spent runnable but waiting for a CPU (Linux ``/proc/thread-self/schedstat``,
    the scheduler's run-queue wait); None where the system does not say."""
    try:
        with open("/proc/thread-self/schedstat", "rb") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


def _process_plan(options: LoadOptions, cfg: ModeConfig, runner: Runner, target: Target, run_id: str,
                  clock: ClockEstimate | None, p: int, procs: int, preconnect_per: int) -> dict[str, Any]:
    """What spawned process ``p`` of ``procs`` needs to send its share (loadgen/coordinate.py ProcessGroup)."""
    share = Assignment(p, procs, 0)
    sub = replace(cfg, units=share.share(cfg.units), offsets_ns=share.share(cfg.offsets_ns) if cfg.offsets_ns is not None else None)
    if options.mode == "closed":
        sub.concurrency = split_concurrency(options.concurrency or 1, procs, p)
    return {"target": target, "run_id": run_id, "clock": clock, "spin_ns": options.spin_us * 1000, "mode": options.mode,
            "cfg": sub, "seq_start": runner._seq + p + 1 - procs, "seq_step": procs, "preconnect": preconnect_per,
            "sessions": sessions_needed(options.mode, sub)}


class _SummedCounters:
    """The live progress line's counters, adding the other processes' (each publishes its own 4 times a second)."""

    def __init__(self, own: Counters, group: ProcessGroup) -> None:
        self.own, self.group = own, group

    def _sum(self, name: str, slot: int) -> int:
        return getattr(self.own, name) + sum(self.group.progress_of(p)[slot] for p in range(1, self.group.n))

    sent = property(lambda self: self._sum("sent", 0))
    done = property(lambda self: self._sum("done", 1))
    in_flight = property(lambda self: self._sum("in_flight", 2))
    errors = property(lambda self: self._sum("errors", 3))
    recent_ttft_ns = property(lambda self: self.own.recent_ttft_ns)  # (this process's: a sample of the run's)


def _max_in_flight(records: list[RequestRecord]) -> int:
    """Most requests in flight at once, from the records' send and end stamps (several processes)."""
    edges = sorted([(r.send_mono_ns, 1) for r in records if r.send_mono_ns is not None]
                   + [(r.end_mono_ns, -1) for r in records if r.send_mono_ns is not None and r.end_mono_ns is not None],
                   key=lambda e: (e[0], e[1]))
    cur = best = 0
    for _t, d in edges:
        cur += d
        best = max(best, cur)
    return best


async def _provenance(options: LoadOptions, plan: list[PlannedRequest], url: str) -> dict[str, Any]:
    """The run's provenance (deltatap.core.provenance): seed, the planned bodies' hash, the target. The target's
    versions are not probed here: a GET /version through the taps would be measured as a request of the run (the
    components' versions come from their spans, in the collector's provenance.json)."""
    from deltatap.core.provenance import provenance, workload_sha256

    return provenance(tool="load", seed=options.seed, workload_bytes_sha256=workload_sha256(r.to_json() for r in plan),
                      components={"target": {"url": url}})


def _count_output_tokens(records: list[RequestRecord], tok: Any) -> None:
    have = [r for r in records if r.output_text or r.content_events]
    counts = tok.count_batch([r.output_text for r in have])
    for r, c in zip(have, counts, strict=True):
        r.output_tokens = c
    for r in records:
        if r.output_tokens is None and r.status == Outcome.OK:
            r.output_tokens = 0


def _run_metadata(options: LoadOptions, spec: WorkloadSpec, tok: Any, run_id: str, clock: ClockEstimate | None,
                  telemetry: Telemetry, wall_start: float, planned: int) -> dict[str, Any]:
    spec_dict = spec.as_dict()
    opts = options.model_dump(mode="json")
    opts["headers"] = sorted(options.headers)  # names only: values may be credentials
    return {
        "run_id": run_id,
        "deltatap_version": __version__,
        "python": platform.python_version(),
        "host": platform.node(),
        "started_unix_s": wall_start,
        "mode": options.mode,
        "seed": options.seed,
        "planned_requests": planned,
        "workload": spec_dict,
        "options": opts,
        "config_hash": options.config_hash(spec_dict),
        "tokenizer": tok.info.as_dict(),
        "clock": {
            "anchor_uncertainty_ns": ANCHOR.uncertainty_ns,
            "sync": None if clock is None else {"collector": options.clock_sync, "offset_ns": clock.offset_ns,
                                                "uncertainty_ns": clock.uncertainty_ns, "rtt_ns": clock.rtt_ns},
        },
        "spans": {"ended": telemetry.stats.spans_ended, "exported": telemetry.stats.spans_exported,
                  "dropped": telemetry.stats.spans_dropped},
    }


def _write_records(path: Path, records: list[RequestRecord]) -> None:
    w = RecordWriter(path)
    try:
        for r in records:
            w.write(r)
    finally:
        w.close()


def write_outputs(out: Path, result: LoadResult, measured: list[RequestRecord], warm: list[RequestRecord], plan: bool) -> Path:
    """Write the run's files into ``out``. A write the system refuses (a full disk) raises an OSError naming the file, that
    it is cut short and which files were not written (before: the system's reason alone, 'No space left on device')."""
    steps: list[tuple[str, Callable[[Path], None]]] = [("records.jsonl", lambda p: _write_records(p, measured))]
    if warm:
        steps.append(("warmup.jsonl", lambda p: _write_records(p, warm)))
    if plan:
        steps.append(("requests.jsonl", lambda p: write_requests(p, result.plan)))
    steps.append(("summary.json", lambda p: p.write_text(json.dumps(result.summary, indent=2, default=str) + "\n", encoding="utf-8")))
    steps.append(("run.json", lambda p: p.write_text(json.dumps(result.summary["run"], indent=2, default=str) + "\n", encoding="utf-8")))
    out.mkdir(parents=True, exist_ok=True)
    for k, (name, write) in enumerate(steps):
        try:
            write(out / name)
        except OSError as exc:
            if exc.filename is not None:  # (it names its path already: opening failed)
                raise
            rest = ", ".join(n for n, _w in steps[k + 1 :])
            raise OSError(exc.errno, f"{exc.strerror or exc}: written in part{f'; not written: {rest}' if rest else ''}",
                          str(out / name)) from None
    return out


async def _coordinate(options: LoadOptions, spec: WorkloadSpec, say: Callable[[str], None]) -> tuple[Coordinator | None, Assignment]:
    """Several hosts (loadgen/coordinate.py): serve as the coordinator or join one; returns this host's share."""
    key = plan_key({"workload": spec.name, "spec": options.workload, "seed": options.seed, "requests": options.requests,
                    "duration_s": options.duration_s, "rate": options.rate, "arrival": options.arrival, "mode": options.mode,
                    "endpoint": options.endpoint})
    if options.coordinator:
        a = await join(options.coordinator, key)
        say(f"host {a.index + 1} of {a.hosts}: clock offset to the coordinator {a.offset_ns / 1e6:+.3f} ms "
            f"(+/- {a.uncertainty_ns / 1e6:.3f} ms); shared start in {(a.start_mono_ns() - mono_ns()) / 1e9:.2f} s")
        return None, a
    assert options.coordinate and options.hosts
    c = Coordinator(options.hosts, key, options.start_in_s)
    await c.start(options.coordinate)
    say(f"coordinating {options.hosts} hosts at {c.url}: start the others with --coordinator {c.url}")
    try:
        a = await c.assign_self()
    except BaseException:
        await c.close()
        raise
    say(f"all {a.hosts} hosts joined; shared start in {(a.start_mono_ns() - mono_ns()) / 1e9:.2f} s")
    return c, a
