"""``deltatap load``: the command-line face of :func:`deltatap.loadgen.run_load`."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from typing import Any

from deltatap.core.config import ConfigError, check_output_dir
from deltatap.loadgen.arrivals import ARRIVALS


def _kv(text: str, sep: str, what: str) -> tuple[str, str]:
    k, s, v = text.partition(sep)
    if not s or not k.strip():
        raise argparse.ArgumentTypeError(f"{what} {text!r}: expected KEY{sep}VALUE")
    return k.strip(), v.strip()


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "load",
        help="drive traffic: open loop, closed loop or barrier batches; per-request records and client spans",
        description="Load generator (methodology draft 4.2-4.6). Exactly one of --rate, --concurrency, --batch "
        "(default: --concurrency 1); --requests and/or --duration bound the run.",
    )
    p.add_argument("--target", required=True, help="base URL (e.g. http://127.0.0.1:9100) or full endpoint URL")
    p.add_argument("--endpoint", choices=["chat", "completions"], default="chat",
                   help="OpenAI API to call: chat (/v1/chat/completions) or completions (/v1/completions)")
    p.add_argument("--model", help="model name put in each request body (default: the first model the target lists "
                   "at GET /v1/models, else 'default')")
    p.add_argument("--workload", default="synthetic-uniform", help="workload name or YAML file (see configs/workloads/)")
    shape = p.add_mutually_exclusive_group()
    shape.add_argument("--rate", type=float, help="open loop: mean requests per second")
    shape.add_argument("--concurrency", type=int, help="closed loop: requests kept in flight")
    shape.add_argument("--batch", type=int, help="barrier-synchronised batches of N requests sent at one instant")
    p.add_argument("--arrival", choices=sorted(ARRIVALS), default="poisson", help="open-loop arrival process")
    p.add_argument("--requests", type=int, help="number of measured requests (default 100 without --duration)")
    p.add_argument("--duration", type=float, dest="duration_s", help="stop sending after S seconds")
    p.add_argument("--seed", type=int, default=42, help="seed of the request plan and arrival times (same seed, same run)")
    p.add_argument("--warmup", type=int, default=0, dest="warmup_requests",
                   help="warm-up requests before measuring (methodology 4.5 asks >= 100; 0 = cold start)")
    p.add_argument("--warmup-probes", type=int, default=5,
                   help="probe requests before and after each warm-up round, to check latency is stable")
    p.add_argument("--warmup-rounds", type=int, default=3, help="most warm-up rounds before measuring anyway")
    p.add_argument("--warmup-concurrency", type=int,
                   help="warm-up requests in flight (default: --concurrency or --batch, else min(8, 2 x --workers))")
    p.add_argument("--out", help="output directory (records.jsonl, summary.json, run.json, requests.jsonl)")
    p.add_argument("--header", action="append", default=[], metavar="NAME:VALUE", type=lambda s: _kv(s, ":", "--header"),
                   help="extra request header (repeatable)")
    p.add_argument("--label", action="append", default=[], metavar="KEY=VALUE", type=lambda s: _kv(s, "=", "--label"),
                   help="label put on every request and span (repeatable)")
    p.add_argument("--request-timeout", type=float, default=600.0, dest="request_timeout_s",
                   help="seconds one request may take, the whole answer included")
    p.add_argument("--drain", type=float, default=30.0, dest="drain_s", help="with --duration: grace for in-flight requests")
    p.add_argument("--workers", type=int, default=4, help="open loop: HTTP sessions requests rotate over")
    p.add_argument("--otlp", help="span export: grpc://HOST:4317, http://HOST:4318, file:PATH or none")
    p.add_argument("--clock-sync", help="collector base URL (its OTLP/HTTP port) to estimate the clock offset against")
    p.add_argument("--refusal-status", type=int, action="append", dest="refusal_statuses",
                   help="HTTP status counted as a refusal (repeatable; default 403 and 451)")
    p.add_argument("--ignore-eos", action="store_true", help="ask the engine to generate exactly max_tokens")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no live progress line on stderr")
    p.add_argument("--no-gpu", dest="gpu", action="store_false", help="do not sample GPU metrics")
    p.add_argument("--preconnect", action=argparse.BooleanOptionalAction, default=None,
                   help="open connections before the first timed send (default: only with --batch)")
    p.add_argument("--spin-us", type=int, default=1500,
                   help="final microseconds of each send wait spent yielding to the loop instead of on a timer")
    p.add_argument("--coordinate", metavar="HOST:PORT", help="load from several hosts: this one coordinates, listening here; "
                   "every host sends its share of one plan from one shared start (docs/scaleout.md)")
    p.add_argument("--hosts", type=int, help="with --coordinate: how many hosts send load, this one included")
    p.add_argument("--coordinator", metavar="URL", help="load from several hosts: join the coordinator at http://HOST:PORT "
                   "(run with the same workload, seed and load shape as it)")
    p.add_argument("--start-in", type=float, default=2.0, dest="start_in_s",
                   help="with --coordinate: seconds from the last host joining to the shared start (default 2)")
    p.add_argument("--processes", type=int, default=1, help="send from N processes (one per core): request i goes to process "
                   "i mod N, all from one shared start, records merged into one output (--rate or --concurrency)")
    p.add_argument("--run-id", help="run id used in request ids and spans (default: 8 random hex digits)")
    p.add_argument("--plan-only", action="store_true", help="write the request sequence to --out/requests.jsonl and exit")
    p.add_argument("--json", action="store_true", help="print summary.json to stdout")
    # what a refused option is called where the user typed it (LoadOptions' field -> the flag; its first spelling)
    p.set_defaults(func=main, flag_names={a.dest: a.option_strings[0] for a in p._actions if a.option_strings})


def main(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from deltatap.net import aio
    from deltatap.core.config import format_validation_error
    from deltatap.telemetry.tracer import TelemetryConfigError
    from deltatap.loadgen.options import LoadOptions

    fields = {k: getattr(args, k) for k in (
        "target", "endpoint", "model", "workload", "rate", "concurrency", "batch", "arrival", "requests", "duration_s",
        "seed", "warmup_requests", "warmup_probes", "warmup_rounds", "warmup_concurrency", "out", "request_timeout_s",
        "drain_s", "workers", "clock_sync", "ignore_eos", "progress", "gpu", "run_id", "preconnect", "spin_us",
        "coordinate", "hosts", "coordinator", "start_in_s", "processes",
    )}
    fields["headers"] = dict(args.header)
    fields["labels"] = dict(args.label)
    if args.refusal_statuses:
        fields["refusal_statuses"] = args.refusal_statuses
    try:
        options = LoadOptions(**fields)
    except ValidationError as err:
        names = {**getattr(args, "flag_names", {}), "headers": "--header", "labels": "--label"}
        raise ConfigError(format_validation_error(err, "its flags", names)) from None
    if args.plan_only:
        return _plan_only(options)
    if options.out:  # (refused now, not after the whole run: its records would be lost)
        check_output_dir(options.out, "--out")
    try:
        from deltatap.loadgen.runner import load_telemetry

        telemetry = load_telemetry(args.otlp)
    except TelemetryConfigError as exc:
        raise ConfigError(str(exc)) from None
    from deltatap.loadgen.progress import print_summary
    from deltatap.loadgen.run import LoadAborted, run_load

    try:
        result = aio.run(run_load(options, telemetry, say=_say, otlp=args.otlp))
    except LoadAborted as exc:
        print(f"deltatap load: {exc}", file=sys.stderr)
        return 1
    finally:
        telemetry.shutdown()
    if args.json:
        json.dump(result.summary, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        print_summary(result.summary)
    if result.out_dir:
        print(f"records: {result.out_dir / 'records.jsonl'}  summary: {result.out_dir / 'summary.json'}", file=sys.stderr)
    for line in result.lost + result.stopped:  # --processes N: a process that died, failed or was stopped on its own
        _say(f"--processes: {line}")
    if result.lost and not result.interrupted:  # (its loss stopped the run: the plan no longer held)
        _say(f"the sending stopped when a process was lost; {len(result.records)} requests of the others recorded")
    if result.interrupted:  # Ctrl-C / SIGTERM: the sending stopped, what it got is written; the signal's exit status
        if not result.stopped:
            _say(f"interrupted ({result.interrupted}): nothing more was sent; {len(result.records)} requests recorded")
        return 128 + getattr(signal, result.interrupted)
    return 0 if result.summary["request_count"] > 0 and not result.lost else 1


def _say(line: str) -> None:
    print(f"deltatap load: {line}", file=sys.stderr, flush=True)


def _plan_only(options: Any) -> int:
    from pathlib import Path

    from deltatap.loadgen.run import resolve_workload
    from deltatap.loadgen.tokens import reference_tokenizer
    from deltatap.loadgen.workloads.base import write_requests

    if not options.out:
        raise ConfigError("--plan-only needs --out DIR")
    spec = resolve_workload(options)
    plan = spec.generate(options.planned_count(), options.seed, reference_tokenizer())
    path = Path(options.out) / "requests.jsonl"
    write_requests(path, plan)
    print(f"{len(plan)} requests planned ({spec.name}, seed {options.seed}): {path}", file=sys.stderr)
    return 0
