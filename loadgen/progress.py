"""Live progress (rich): completed/total, achieved rate, in flight, errors, rolling TTFT p50; and the
summary table printed at the end. Runs as one asyncio task ticking 4 times a second, off the hot path."""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from typing import Any

from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from deltatap.core.clock import mono_ns
from deltatap.loadgen.runner import Counters
from deltatap.loadgen.summary import ITL_GAPS_LABEL, ITL_PER_REQUEST_LABEL

PROBLEM_LINES = 5  # problem groups printed under the summary (all of them are in summary.json)


class LiveProgress:
    def __init__(self, counters: Counters, total: int | None, console: Console | None = None) -> None:
        self.counters = counters
        self.console = console or Console(stderr=True)
        self.progress = Progress(
            TextColumn("[bold]load"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TextColumn("{task.fields[rate]:>7.1f} req/s  in flight {task.fields[inflight]:>4}  errors {task.fields[errors]:>4}  "
                       "TTFT p50 {task.fields[ttft]}"),
            console=self.console, transient=False,
        )
        self.task_id = self.progress.add_task("load", total=total, rate=0.0, inflight=0, errors=0, ttft="-")
        self._window: deque[tuple[int, int]] = deque(maxlen=20)
        self._task: asyncio.Task | None = None

    def _tick(self) -> None:
        c = self.counters
        now = mono_ns()
        self._window.append((now, c.done))
        t_old, d_old = self._window[0]
        rate = (c.done - d_old) / ((now - t_old) / 1e9) if now > t_old else 0.0
        ttft = "-"
        if c.recent_ttft_ns:
            s = sorted(c.recent_ttft_ns)
            ttft = f"{s[len(s) // 2] / 1e6:.1f} ms"
        self.progress.update(self.task_id, completed=c.done, rate=rate, inflight=c.in_flight, errors=c.errors, ttft=ttft)

    async def _run(self) -> None:
        while True:
            self._tick()
            await asyncio.sleep(0.25)

    def start(self) -> None:
        self.progress.start()
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._tick()
        self.progress.stop()


def _fmt(v: Any, digits: int = 2) -> str:
    return "-" if v is None else f"{v:,.{digits}f}"


def _fmt_narrow(v: Any) -> str:
    """At most 7 characters up to 9,999,999: no decimals from 1,000 on."""
    return _fmt(v, 0 if v is not None and abs(v) >= 1000 else 2)


WIDE_TABLE = 112  # columns the full table needs; narrower consoles (a pipe is 80) get p50/p90/p99 only


def summary_table(summary: dict[str, Any], width: int | None = None) -> Table:
    """The metrics table; below :data:`WIDE_TABLE` columns it drops P95 and P99.9 and the borders, so
    no number is cut (a long metric name wraps instead)."""
    wide = width is None or width >= WIDE_TABLE
    metrics = summary["metrics_ms"]
    itl = metrics.get("inter_token_latency") or metrics.get("inter_chunk_latency")
    caption = (f"{ITL_PER_REQUEST_LABEL}: (last token - first token) / (tokens - 1), one value per request; "
               f"{ITL_GAPS_LABEL}: every gap between content events (the inter-chunk gap of deltatap report)") if itl else None
    if wide:
        t = Table(title="deltatap load - summary", caption=caption, show_lines=False)
    else:
        t = Table(title="deltatap load - summary", caption=caption, show_lines=False, box=box.SIMPLE_HEAD,
                  pad_edge=False, collapse_padding=True)
    keys = ("mean", "p50", "p90", "p95", "p99", "p99_9", "max") if wide else ("mean", "p50", "p90", "p99", "max")
    t.add_column("metric", justify="left", overflow="fold")
    for col in ("count", *keys):
        t.add_column(col.replace("_", "."), justify="right", no_wrap=True)

    def row(name: str, s: dict[str, Any] | None) -> None:
        if s:
            t.add_row(name, str(s["count"]), *(_fmt(s[k]) if wide else _fmt_narrow(s[k]) for k in keys))

    for key, label in (("ttft", "TTFT (ms)"), ("ttst", "TTST (ms)"), ("inter_token_latency", f"{ITL_PER_REQUEST_LABEL} (ms)"),
                       ("inter_chunk_latency", f"{ITL_GAPS_LABEL} (ms)"), ("request_latency", "request latency (ms)"),
                       ("schedule_lag", "schedule lag (ms)"), ("send_overhead", "send overhead (ms)")):
        row(label, metrics.get(key))
    row("ISL (tokens)", summary.get("input_sequence_length"))
    row("OSL (tokens)", summary.get("output_sequence_length"))
    row("tokens/s per user", summary.get("output_token_throughput_per_user"))
    return t


def problem_lines(summary: dict[str, Any], limit: int = PROBLEM_LINES) -> list[str]:
    """``problems: HTTP 404 x20: The model 'default' does not exist`` - one line per problem group (the
    most frequent ``limit``), never a bare count beside a kind name that could read as an HTTP status."""
    groups = summary.get("problems")
    if groups is None:  # a summary.json from before problems were grouped
        groups = [{"text": f"{k} x{v}"} for k, v in summary.get("error_kinds", {}).items()]
    lines = [("problems: " if i == 0 else "          ") + g["text"] for i, g in enumerate(groups[:limit])]
    more = sum(summary.get("error_kinds", {}).values()) - sum(g.get("count", 0) for g in groups[:limit])
    if lines and len(groups) > limit and more > 0:
        lines.append(f"          ... and {more} more failed requests of other kinds (summary.json: problems)")
    return lines


def print_summary(summary: dict[str, Any], console: Console | None = None) -> None:
    console = console or Console(stderr=True)
    console.print(summary_table(summary, console.width))
    console.print(
        f"requests ok {summary['request_count']} / {summary['requests_total']}, "
        f"duration {summary['benchmark_duration_s']:.2f} s, "
        f"{_fmt(summary['request_throughput_per_s'])} req/s, {_fmt(summary['output_token_throughput_per_s'], 1)} output tok/s"
    )
    for line in problem_lines(summary):
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    gpu = summary.get("gpu") or {}
    if gpu.get("available"):
        console.print(f"GPU energy {_fmt(gpu.get('energy_run_j'), 1)} J, {_fmt(gpu.get('tokens_per_joule'), 3)} tokens/J")
    warm = summary.get("warmup")
    if warm:
        console.print(f"warm-up: {warm['verdict']}")
