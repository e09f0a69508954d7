"""``deltatap bench <test>``: one subcommand per methodology test (§5.1-5.10).

Every test takes the same target and output options (:func:`add_common`); its own flags come from its module.
"""

from __future__ import annotations

import argparse
import importlib
import math
import time
from pathlib import Path

from rich.console import Console

from deltatap.core.config import ConfigError, check_output_dir

WARMUP_OUTPUT_TOKENS = 32  # the warm-up's answer length, whatever the test's

# subcommand modules, in the draft's order
TEST_MODULES = (
    "single_level",  # 5.1
    "max_throughput",  # 5.2
    "throughput_latency",  # 5.3
    "itl",  # 5.4
    "capacity",  # 5.5
    "fairness",  # 5.6
    "prefix_cache",  # 5.7
    "memory_pressure",  # 5.8
    "long_context",  # 5.9
    "guardrails",  # 5.10
)


def _module(name: str):
    return importlib.import_module(f"deltatap.app.bench.{name}")


def add_common(p: argparse.ArgumentParser, name: str) -> None:
    g = p.add_argument_group("target (default: the embedded reference stack with taps and collector)")
    g.add_argument("--stack", metavar="FILE", help="embedded stack config, a file or packaged name (default: bench/reference, configs/bench/reference.yaml)")
    g.add_argument("--target", metavar="URL", help="bench an external OpenAI-compatible endpoint instead (e.g. the edge tap http://127.0.0.1:9100)")
    g.add_argument("--collect", metavar="HOST:PORT", help="with --target: start a collector on this OTLP/HTTP address (grpc://HOST:PORT: OTLP/gRPC); taps exporting to it give the per-component tables")
    g.add_argument("--topology", metavar="FILE", help="with --collect: the topology the taps are on (a topology file, or a stack config with a topology section)")
    g.add_argument("--model", help="model name in requests (default: the stack's first model, or the target's first listed)")
    o = p.add_argument_group("run")
    o.add_argument("--out", metavar="DIR", help=f"results directory (default: ./bench-{name})")
    o.add_argument("--quick", action="store_true", help="CI-sized run: fewer, shorter levels, one repetition (the report lists the deviations)")
    o.add_argument("--repetitions", type=int, metavar="N", help="independent runs per level (default: 3 for throughput-latency and prefix-cache, else 1 to fit a few minutes; --quick 1; §6.3 asks >= 3)")
    o.add_argument("--slo", action="append", metavar="NAME=MS", help="SLO for goodput (AIPerf): ttft=MS, tpot=MS or e2e=MS; repeat for several")
    o.add_argument("--capacity-rps", type=float, metavar="R", help="capacity estimate in req/s (default: measured by a closed-loop pre-run)")
    o.add_argument("--probe-concurrency", type=int, default=32, metavar="N", help="concurrency of that pre-run against an external target (default 32)")
    o.add_argument("--input-tokens", type=int, metavar="N", help="prompt length of the test's fixed-length workload (default 128, or the test's own)")
    o.add_argument("--output-tokens", type=int, metavar="N", help="answer length of the test's fixed-length workload (default 32, or the test's own)")
    o.add_argument("--workload", metavar="NAME|FILE", help="a load-generator workload instead of the fixed-length one (tests that shape requests ignore it)")
    o.add_argument("--min-requests", type=int, default=8, metavar="N", help="fewest requests in an open-loop level (default 8)")
    o.add_argument("--warmup", type=int, default=None, metavar="N", help="warm-up requests before measuring (default 100, --quick 8; §4.5.1 asks >= 100)")
    o.add_argument("--seed", type=int, default=42, help="seed of the request plans and arrivals (default 42)")
    o.add_argument("--formats", default="all", help="report formats: markdown,csv,json,html or all (default: all)")
    o.add_argument("--strict", action="store_true", help="exit 3 when a methodology requirement is not met (the report lists them either way)")


# the bench flags that count or rate something: each must be > 0 when given
POSITIVE_FLAGS: tuple[str, ...] = ("rate", "concurrency", "requests", "requests_per_slot", "capacity_rps", "probe_concurrency",
                                   "min_requests", "input_tokens", "output_tokens")


def check_args(args: argparse.Namespace) -> None:
    """What a bench checks before it starts anything: formats, SLOs, the flags that go together, the stack config
    (strictly, each component against its model) or the topology. Raises ConfigError with one line."""
    from deltatap.app.bench.measure import parse_slos
    from deltatap.app.bench.target import DEFAULT_STACK, Harness
    from deltatap.collector.reports.renderers import parse_formats

    parse_formats(args.formats)
    parse_slos(args.slo)
    if args.repetitions is not None and args.repetitions < 1:
        raise ConfigError("--repetitions: give at least 1")
    for dest, value in sorted(vars(args).items()):
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"--{dest.replace('_', '-')} {value}: give a finite number")
    for dest in POSITIVE_FLAGS:  # 0 would silently mean "the default" (they are read as `flag or default`)
        value = getattr(args, dest, None)
        if value is not None and not value > 0:
            raise ConfigError(f"--{dest.replace('_', '-')} {value}: give a number > 0 (leave it out for the default)")
    if getattr(args, "rate", None) is not None and getattr(args, "concurrency", None) is not None:
        raise ConfigError("--rate (open loop) and --concurrency (closed loop) contradict each other: give one")
    if args.out:  # (refused before anything starts, not after the run)
        check_output_dir(args.out, "--out")
    if args.collect and not args.target:
        raise ConfigError("--collect goes with --target (the embedded stack has its own collector)")
    h = Harness(Path("."), args.stack, args.target, args.collect, args.topology, args.model, print)
    if h.embedded:
        h._configs()
    elif args.stack and args.stack != DEFAULT_STACK:
        raise ConfigError("--stack configures the embedded stack; with --target the stack is yours (give --topology for --collect)")


async def run_bench(name: str, args: argparse.Namespace, console: Console | None = None):
    """Run test ``name`` with parsed ``args``; returns (report, files, context)."""
    from deltatap.app.bench.common import BenchContext, fixed_workload
    from deltatap.app.bench.measure import parse_slos
    from deltatap.app.bench.target import open_harness
    from deltatap.collector.reports.renderers import parse_formats

    mod = _module(name)
    check_args(args)
    formats = parse_formats(args.formats)
    args.input_tokens = args.input_tokens or getattr(mod, "INPUT_TOKENS", 128)
    args.output_tokens = args.output_tokens or getattr(mod, "OUTPUT_TOKENS", 32)
    if args.input_tokens < 1 or args.output_tokens < 1:
        raise ConfigError("--input-tokens / --output-tokens: give at least 1")
    slos = parse_slos(args.slo)
    console = console or Console()
    out = Path(args.out or f"bench-{mod.NAME}")
    out.mkdir(parents=True, exist_ok=True)
    reps = args.repetitions or (1 if args.quick else getattr(mod, "REPETITIONS", 1))
    t0 = time.monotonic()
    async with open_harness(out, args.stack, args.target, args.collect, args.topology, args.model) as h:
        ctx = BenchContext(args, h, console, out, slos, reps, args.quick)
        console.print(f"[bold]deltatap bench {mod.NAME}[/] (methodology §{mod.SECTION}) against "
                      f"{'the embedded reference stack (' + h.stack_src + ')' if h.embedded else args.target}; results in {out}", highlight=False)
        warm = args.warmup if args.warmup is not None else (8 if args.quick else 100)
        args.warmup = warm
        if warm:
            console.print(f"warm-up: {warm} requests (not measured)", highlight=False)
            # short fixed-length random-token requests: warm the stack, not the prefix cache (§5.7.3)
            await h.run_level({"warmup": ctx.closed_loop(8, warm, workload=fixed_workload(128, WARMUP_OUTPUT_TOKENS))}, "00-warmup")
        out_tokens = warm * WARMUP_OUTPUT_TOKENS
        ctx.require("4.5.1", "warm-up", ">= 100 requests or 10,000 output tokens", f"{warm} requests (~{out_tokens} tokens)", warm >= 100 or out_tokens >= 10_000)
        report = await mod.run(ctx)
    report.metadata.update({"test": mod.NAME, "section": mod.SECTION, "elapsed_s": round(time.monotonic() - t0, 1),
                            "quick": bool(args.quick), "repetitions": reps, "stack": h.stack_config()})
    from deltatap.app.bench.common import write_results

    files = write_results(ctx, report, formats)
    console.print(f"{time.monotonic() - t0:.1f} s", highlight=False)
    return report, files, ctx


def _cmd(name: str):
    def cmd(args: argparse.Namespace) -> int:
        from deltatap.net.aio import run

        _report, _files, ctx = run(run_bench(name, args))
        unmet = [r for r in ctx.requirements if not r.met]
        if args.strict and unmet:
            print(f"deltatap bench: --strict: {len(unmet)} methodology requirement(s) not met: " + "; ".join(r.what for r in unmet))
            return 3
        return 0

    return cmd


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("bench", help="the methodology's tests (§5.1-5.10) as commands, each attributed per component",
                              description="Run one test of the LLM benchmarking methodology draft end to end against the embedded reference "
                              "stack (default) or --target URL, and write its tables, plots and report (Markdown, CSV, JSON, HTML).")
    sub = p.add_subparsers(dest="bench_test", metavar="TEST")
    for name in TEST_MODULES:
        mod = _module(name)
        tp = sub.add_parser(mod.NAME, help=mod.HELP, description=" ".join((mod.__doc__ or mod.HELP).strip().split("\n\n")[0].split()))
        mod.add_arguments(tp)
        add_common(tp, mod.NAME)
        tp.set_defaults(func=_cmd(name))
    p.set_defaults(func=lambda _a: (p.print_help(), 2)[1])
