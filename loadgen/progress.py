"""Live progress (rich): completed/total, achieved rate, in flight, errors, rolling TTFT p50; and the
summary table printed at the end. Runs as one asyncio task ticking 4 times a second, off the hot path."""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from deltatap.core.clock import mono_ns
from deltatap.loadgen.runner import Counters


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


def summary_table(summary: dict[str, Any]) -> Table:
    t = Table(title="deltatap load - summary", show_lines=False)
    for col in ("metric", "count", "mean", "p50", "p90", "p95", "p99", "p99.9", "max"):
        t.add_column(col, justify="right" if col != "metric" else "left")

    def row(name: str, s: dict[str, Any] | None) -> None:
        if s:
            t.add_row(name, str(s["count"]), _fmt(s["mean"]), _fmt(s["p50"]), _fmt(s["p90"]), _fmt(s["p95"]),
                      _fmt(s["p99"]), _fmt(s["p99_9"]), _fmt(s["max"]))

    for key, label in (("ttft", "TTFT (ms)"), ("ttst", "TTST (ms)"), ("inter_token_latency", "ITL (ms)"),
                       ("inter_chunk_latency", "ICL (ms)"), ("request_latency", "request latency (ms)"),
                       ("schedule_lag", "schedule lag (ms)"), ("send_overhead", "send overhead (ms)")):
        row(label, summary["metrics_ms"].get(key))
    row("ISL (tokens)", summary.get("input_sequence_length"))
    row("OSL (tokens)", summary.get("output_sequence_length"))
    row("tokens/s per user", summary.get("output_token_throughput_per_user"))
    return t


def print_summary(summary: dict[str, Any], console: Console | None = None) -> None:
    console = console or Console(stderr=True)
    console.print(summary_table(summary))
    console.print(
        f"requests ok {summary['request_count']} / {summary['requests_total']}, "
        f"duration {summary['benchmark_duration_s']:.2f} s, "
        f"{_fmt(summary['request_throughput_per_s'])} req/s, {_fmt(summary['output_token_throughput_per_s'], 1)} output tok/s"
    )
    if summary["error_kinds"]:
        console.print("problems: " + ", ".join(f"{k} {v}" for k, v in summary["error_kinds"].items()))
    gpu = summary.get("gpu") or {}
    if gpu.get("available"):
        console.print(f"GPU energy {_fmt(gpu.get('energy_run_j'), 1)} J, {_fmt(gpu.get('tokens_per_joule'), 3)} tokens/J")
    warm = summary.get("warmup")
    if warm:
        console.print(f"warm-up: {warm['verdict']}")
