"""``deltatap compare``: see docs/compare.md."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from deltatap.core.config import ConfigError, check_output_dir

FORMATS = ("rich", "markdown", "json", "html")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "compare",
        help="compare runs: per delta and percentile, the difference with bootstrap intervals, a significance test, regressions",
        description="Compare two or more runs (rows files, or output directories of collect, report, demo, bench): per component "
        "delta and percentile, the difference against the baseline with a seeded bootstrap confidence interval, a Mann-Whitney "
        "test on the per-request values, and regressions flagged against --threshold. RUN is PATH or LABEL=PATH.",
    )
    p.add_argument("runs", nargs="+", metavar="RUN", help="PATH or LABEL=PATH; the first is the baseline unless --baseline says")
    p.add_argument("--baseline", help="label of the run the others are compared with (default: the first)")
    p.add_argument("--percentiles", type=float, nargs="+", default=[50.0, 90.0, 99.0], metavar="Q", help="percentiles to compare (default 50 90 99)")
    p.add_argument("--threshold", default="5%", help="a change that matters: a percentage of the baseline (5%%, the default) or milliseconds (0.5ms)")
    p.add_argument("--confidence", type=float, default=0.95, help="confidence level of the intervals (default 0.95)")
    p.add_argument("--resamples", type=int, default=2000, help="bootstrap resamples (default 2000)")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed: the same seed gives the same intervals (default 0)")
    p.add_argument("--deltas", nargs="+", metavar="NAME", help="compare only these deltas (default: every delta both runs observed)")
    p.add_argument("--format", default="rich", choices=FORMATS, help="what to print (default rich)")
    p.add_argument("--out", help="also write compare.md, compare.json and compare.html (with plots) into this directory")
    p.add_argument("--fail-on-regression", action="store_true", help="exit 1 when any regression is flagged (for CI)")
    p.set_defaults(func=run_compare)


def run_compare(args: argparse.Namespace) -> int:
    from rich.console import Console

    from deltatap.collector.compare.build import compare, load_runs
    from deltatap.collector.compare.render import print_terminal, render_html, render_json, render_markdown
    from deltatap.collector.compare.stats import Threshold

    try:
        threshold = Threshold.parse(args.threshold)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if args.out:  # (refused now, not after the comparison's resampling)
        check_output_dir(args.out, "--out")
    c = compare(load_runs(args.runs), args.baseline, args.percentiles, threshold, args.confidence, args.resamples, args.seed, args.deltas)
    if args.format == "rich":
        print_terminal(c, Console())
    else:
        sys.stdout.write({"markdown": render_markdown, "json": render_json, "html": render_html}[args.format](c))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        files = {"compare.md": render_markdown(c), "compare.json": render_json(c), "compare.html": render_html(c)}
        for name, text in files.items():
            (out / name).write_text(text, encoding="utf-8")
        print(f"wrote {', '.join(str(out / n) for n in files)}", file=sys.stderr)
    return 1 if args.fail_on_regression and any(p.regressions() for p in c.pairs) else 0
