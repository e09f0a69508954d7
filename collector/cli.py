"""``deltatap collect`` (live OTLP receiver) and ``deltatap report --from FILE...`` (offline)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import signal
import sys
import time
from pathlib import Path

from rich.console import Console

from deltatap.collector.ingest import load
from deltatap.collector.outputs import note_senders, write_outputs, write_provenance
from deltatap.collector.pipeline import Pipeline, PipelineOptions
from deltatap.collector.service import ROWS_FORMATS, CollectorOptions, start_collector, tune_gc
from deltatap.collector.sinks import write_rows
from deltatap.collector.table import RENDERERS, decomposition, summary_csv, summary_json, summary_markdown, summary_rich
from deltatap.net import aio
from deltatap.core.config import ConfigError
from deltatap.collector.ingest import load_topology_offline
from deltatap.collector.reports.render_terminal import print_table

log = logging.getLogger("deltatap.collector")
STATS = ("p50", "p90", "p95", "p99", "p999", "mean")


def _none(v: str | None) -> str | None:
    return None if v is None or v.lower() in ("none", "off", "") else v


def _pipeline_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("assembly and join")
    g.add_argument("--grace-s", type=float, default=2.0, help="close a trace this long after its outermost span arrived (default 2)")
    g.add_argument("--orphan-wait-s", type=float, default=10.0, help="close a trace whose root never arrives this long after its last span (default 10)")
    g.add_argument("--max-open-traces", type=int, default=200_000, help="cap on traces being assembled; the oldest is evicted (default 200000)")
    g.add_argument("--join-window-s", type=float, default=5.0, help="body-fingerprint join: fragments must start within this window (default 5)")
    g.add_argument("--join-hold-s", type=float, default=1.0, help="wait this long for partner fragments before emitting a row (default 1)")


def _pipeline_options(args: argparse.Namespace) -> PipelineOptions:
    for flag in ("grace_s", "orphan_wait_s", "join_window_s", "join_hold_s"):
        if not 0 <= getattr(args, flag) < math.inf:  # NaN fails this too
            raise ConfigError(f"--{flag.replace('_', '-')} {getattr(args, flag)}: must be a number of seconds >= 0")
    if args.max_open_traces < 1:
        raise ConfigError("--max-open-traces must be >= 1")
    return PipelineOptions(grace_s=args.grace_s, orphan_wait_s=args.orphan_wait_s, max_open_traces=args.max_open_traces, join_window_s=args.join_window_s, join_hold_s=args.join_hold_s)


def register(subparsers: argparse._SubParsersAction) -> None:
    c = subparsers.add_parser(
        "collect",
        help="receive OTLP spans from taps, load generator and components; write decomposition rows and reports",
        description="OTLP/gRPC and OTLP/HTTP (protobuf and JSON) receiver that joins traces into per-request "
        "decomposition rows (profiles draft section 6). Ctrl-C (or --duration) ends the run and writes the reports.",
    )
    c.add_argument("--otlp-grpc", default="127.0.0.1:4317", help="HOST:PORT of the OTLP/gRPC receiver, or none (default 127.0.0.1:4317)")
    c.add_argument("--otlp-http", default="127.0.0.1:4318", help="HOST:PORT of the OTLP/HTTP receiver (/v1/traces, /v1/clock, /metrics), or none (default 127.0.0.1:4318)")
    c.add_argument("--metrics", default="127.0.0.1:9464", help="HOST:PORT for Prometheus /metrics, or none (default 127.0.0.1:9464)")
    c.add_argument("--topology", help="topology YAML (default: client -> gateway -> firewall -> engine on links edge, gw-fw, fw-engine)")
    c.add_argument("--out", required=True, help="output directory (rows file, summary, decomposition, sketches)")
    c.add_argument("--rows-format", default="parquet", choices=ROWS_FORMATS, help="rows file format (default parquet)")
    c.add_argument("--forward", help="also send everything received to this OTLP endpoint: grpc://HOST:PORT or http://HOST:PORT")
    c.add_argument("--reexport", action="store_true", help="send synthetic per-component decomposition spans to --forward (Jaeger waterfall)")
    c.add_argument("--handoff", metavar="URL", help="scale-out shard: send each partial request (a fragment whose partners another "
                   "collector may hold) to the joining collector at grpc://HOST:PORT or http://HOST:PORT instead of writing a "
                   "partial row (docs/scaleout.md)")
    c.add_argument("--duration", type=float, help="stop after this many seconds (default: until Ctrl-C / SIGTERM)")
    _pipeline_args(c)
    c.set_defaults(func=run_collect)

    r = subparsers.add_parser(
        "report",
        help="decompose offline inputs: OTLP JSON, Jaeger JSON, AIPerf profile_export.jsonl, load-generator records, rows files, sketches, output directories",
        description="Read span files (OTLP JSON as written by the OpenTelemetry Collector's file exporter or "
        "deltatap's --otlp file:PATH, Jaeger trace JSON), AIPerf profile_export.jsonl (joined on X-Request-ID), the load "
        "generator's records.jsonl (joined as client-side records), rows files and sketches.json of other collectors "
        "(merged), or whole output directories of `deltatap collect` and `deltatap load`, and print the decomposition.",
    )
    r.add_argument("--from", dest="inputs", nargs="+", required=True, metavar="PATH",
                   help="input files (format detected from content), or output directories of `deltatap collect` (rows file, "
                   "else sketches.json; span files) or `deltatap load` (records.jsonl, joined as client-side records)")
    r.add_argument("--topology", help="topology YAML (default: the default stack); taps need no listen address here")
    r.add_argument("--out", help="also write rows and report files into this directory")
    r.add_argument("--rows-format", default="parquet", choices=ROWS_FORMATS, help="rows file format with --out (default parquet)")
    r.add_argument("--format", default="rich", choices=("rich", "markdown", "csv", "json"), help="what to print (default rich)")
    r.add_argument("--stat", default="p50", choices=STATS, help="statistic of the decomposition table (default p50)")
    _pipeline_args(r)
    r.set_defaults(func=run_report)


# --------------------------------------------------------------------------------------------
# collect
# --------------------------------------------------------------------------------------------


def run_collect(args: argparse.Namespace) -> int:
    topo = load_topology_offline(args.topology)  # the collector binds no tap address: tap.listen is optional
    opts = CollectorOptions(
        otlp_grpc=_none(args.otlp_grpc), otlp_http=_none(args.otlp_http), metrics=_none(args.metrics), topology=topo,
        pipeline=_pipeline_options(args), out_dir=args.out, rows_format=args.rows_format, forward=args.forward, reexport=args.reexport,
        handoff=args.handoff, trim_s=1.0,
    )
    opts.check()
    if args.duration is not None and not 0 < args.duration < math.inf:  # NaN fails this too
        raise ConfigError(f"--duration {args.duration}: must be a number of seconds > 0 (leave it out to run until Ctrl-C)")
    return aio.run(_collect(opts, args.duration))


async def _collect(opts: CollectorOptions, duration: float | None) -> int:
    tune_gc()
    running = await start_collector(opts)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):  # pragma: no cover - non-main thread
            pass
    err = Console(stderr=True)
    err.print(f"deltatap collect: OTLP/gRPC {running.otlp_grpc_endpoint or 'off'}, OTLP/HTTP {running.otlp_http_url or 'off'}, "
              f"metrics {running.metrics_url or (running.otlp_http_url + '/metrics' if running.otlp_http_url else 'off')}; writing {opts.out_dir}")
    t0 = time.monotonic()
    try:
        await asyncio.wait_for(stop.wait(), duration) if duration else await stop.wait()
    except asyncio.TimeoutError:
        pass
    written = await running.close()
    s = running.stats()
    out = Console()
    topo = running.topology
    print_table(out, RENDERERS["rich"](decomposition(running.aggregator, topo), running.aggregator))
    err.print(
        f"{s['rows']} rows from {s['spans_received']} spans in {time.monotonic() - t0:.1f}s; joined {s['joined']}; "
        f"evicted {s['traces_evicted']}, late spans {s['late_spans']}, ambiguous {s['ambiguous']}, decode errors {s['decode_errors']}"
        + (f"; handed off {s['handed_off']} partial requests ({s['handoff_sent_spans']} spans sent, {s['handoff_dropped_spans']} dropped)"
           if "handoff_sent_spans" in s else "")
    )
    err.print(f"files: {', '.join(str(p) for p in written.values())}")
    return 0


# --------------------------------------------------------------------------------------------
# report
# --------------------------------------------------------------------------------------------


def run_report(args: argparse.Namespace) -> int:
    topo = load_topology_offline(args.topology)  # offline: no tap listens, so tap.listen is optional
    loaded = load(args.inputs, topo)
    err = Console(stderr=True)
    for line in loaded.found:  # a directory: what it was and which of its files were used
        err.print(line, highlight=False, markup=False, soft_wrap=True)
    opts = _pipeline_options(args)
    pipe = Pipeline(topo, PipelineOptions(**{**opts.__dict__, "max_open_traces": max(opts.max_open_traces, len(loaded.spans) + 1), "keep_rows": 0}))
    pipe.ingest(loaded.spans, 0.0)
    rows = pipe.flush(0.0) if loaded.spans else []
    agg = pipe.aggregator
    if loaded.rows:
        agg.add_rows(loaded.rows)
    for other in loaded.aggregates:
        if other.alpha != agg.alpha and agg.rows == 0:
            agg.alpha = other.alpha
        agg.merge(other)
    if agg.rows == 0:
        raise ConfigError(f"--from {' '.join(args.inputs)}: no requests found (no deltatap, client or component spans, rows or sketches)")
    stat = f"{args.stat}_ms"
    lines = decomposition(agg, topo, stat)
    if args.format == "rich":
        con = Console()
        print_table(con, RENDERERS["rich"](lines, agg, stat))
        print_table(con, summary_rich(agg, topo))
    elif args.format == "markdown":
        sys.stdout.write(RENDERERS["markdown"](lines, agg, stat) + "\n" + summary_markdown(agg, topo))
    elif args.format == "csv":
        sys.stdout.write(summary_csv(agg, topo))
    else:
        sys.stdout.write(summary_json(agg, topo) + "\n")
    if args.out:
        all_rows = rows + loaded.rows
        if all_rows:
            write_rows(all_rows, Path(args.out) / f"rows.{args.rows_format}", topo)
        stats = pipe.snapshot() if loaded.spans else {"rows": agg.rows}
        write_outputs(agg, topo, args.out, stats, stat)
        seen: dict[tuple, dict] = {}
        models: set[str] = set()
        note_senders(loaded.spans, seen, models)
        write_provenance(args.out, "report", topo, seen, models, {"paths": [str(p) for p in args.inputs]})
    if loaded.spans:
        s = pipe.snapshot()
        err.print(f"{len(rows)} requests from {s['spans_received']} spans; joined {s['joined']}; ambiguous {s['ambiguous']}")
    return 0
