"""The ``deltatap`` console script.

Subcommands are registered by the packages themselves: each module in :data:`COMMAND_MODULES`
exposes ``register(subparsers)``, which adds its parser and sets ``func`` (``args -> exit code``).
No if-chains here.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

from deltatap import __version__
from deltatap.core.config import ConfigError, os_error_line

COMMAND_MODULES: tuple[str, ...] = (
    "deltatap.proxy.cli",  # deltatap tap
    "deltatap.stack.cli",  # deltatap stack gateway|firewall|engine|all
    "deltatap.loadgen.cli",  # deltatap load
    "deltatap.collector.cli",  # deltatap collect, deltatap report
    "deltatap.collector.reports.cli",  # deltatap guardrails, deltatap cascade
    "deltatap.app.demo",  # deltatap demo
    "deltatap.app.bench.cli",  # deltatap bench <test>
    "deltatap.collector.compare.cli",  # deltatap compare
    "deltatap.app.sign",  # deltatap sign, deltatap verify
    "deltatap.app.selftest",  # deltatap selftest
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="deltatap",
        description="Where the time goes in an LLM serving stack: taps, load generator, collector, reports.",
    )
    parser.add_argument("--version", action="version", version=f"deltatap {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv for debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            # a package not built yet in this checkout; anything else missing is a real error
            if exc.name and (name == exc.name or name.startswith(exc.name + ".")):
                continue
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    # gRPC's C core logs at INFO to stderr unless told otherwise (e.g. "Other threads are currently calling into gRPC,
    # skipping fork() handlers" at each fork of a process that holds a gRPC channel: selftest printed six); its
    # warnings and errors still show. Set before anything imports grpc; GRPC_VERBOSITY in the environment wins.
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    parser = build_parser()
    args = parser.parse_args(argv)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except ConfigError as exc:
        print(f"deltatap {args.command}: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        # the environment refused: an --out that cannot be created or written, a port in use, a file that
        # vanished. One line; -vv keeps the traceback for a bug report.
        if args.verbose >= 2:
            raise
        print(f"deltatap {args.command}: {os_error_line(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
