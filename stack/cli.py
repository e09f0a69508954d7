"""``deltatap stack engine|firewall|gateway|all``: run the reference stack from YAML.

    deltatap stack engine   --config configs/demo.yaml [--listen 127.0.0.1:8300]
    deltatap stack firewall --config configs/demo.yaml [--upstream http://127.0.0.1:9300]
    deltatap stack gateway  --config configs/demo.yaml [--upstream http://127.0.0.1:9200]
    deltatap stack all      --config configs/demo.yaml [--taps [--clock-sync URL]]

``--config`` takes a component's own file or a combined file (its ``engine:`` / ``firewall:`` /
``gateway:`` section is used). ``--upstream`` replaces the firewall's upstream, or every gateway
route's upstreams. Spans go where ``--otlp`` (or the ``OTEL_EXPORTER_OTLP_*`` variables) say.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from collections.abc import Awaitable, Callable
from typing import Any

from deltatap.net.aio import run
from deltatap.core.gc_pauses import settle
from deltatap.core.config import ConfigError, validate
from deltatap.telemetry.tracer import Telemetry, TelemetryConfigError, setup_telemetry
from deltatap.core.topology import parse_hostport
from deltatap.core.vocab import ComponentKind

from deltatap.stack.chain import load_stack_config, start_stack
from deltatap.stack.config import load_component_config
from deltatap.stack.engine.app import start_engine
from deltatap.stack.firewall.app import start_firewall
from deltatap.stack.gateway.app import start_gateway

STARTERS: dict[str, Callable[..., Awaitable[Any]]] = {
    ComponentKind.ENGINE.value: start_engine,
    ComponentKind.FIREWALL.value: start_firewall,
    ComponentKind.GATEWAY.value: start_gateway,
}


def _override_upstream(kind: str, cfg: Any, url: str) -> Any:
    data = cfg.model_dump()
    if kind == ComponentKind.FIREWALL.value:
        data["upstream"] = url
    else:
        data["routes"] = [{**r, "upstreams": [url]} for r in data["routes"]]
    return validate(type(cfg), data, f"--upstream {url}")


class _Telemetries:
    def __init__(self, otlp: str | None, protocol: str | None) -> None:
        self.otlp, self.protocol = otlp, protocol
        self.made: list[Telemetry] = []

    def __call__(self, service: str) -> Telemetry:
        try:
            tel = setup_telemetry(service, otlp=self.otlp, protocol=self.protocol)
        except TelemetryConfigError as exc:
            raise ConfigError(str(exc)) from None
        self.made.append(tel)
        return tel

    def shutdown(self) -> None:
        for tel in self.made:
            tel.shutdown()


async def _until_signal() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


async def _serve_one(args: argparse.Namespace, tels: _Telemetries) -> None:
    kind = args.component
    cfg = load_component_config(args.config, kind)
    if args.upstream:
        cfg = _override_upstream(kind, cfg, args.upstream)
    if args.listen:
        try:
            parse_hostport(args.listen, "--listen")
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    rc = await STARTERS[kind](cfg, tels(f"deltatap-stack-{kind}"), args.listen)
    settle()
    print(f"deltatap stack {kind} {rc.name}: listening on {rc.url}", flush=True)
    try:
        await _until_signal()
    finally:
        await rc.close()


async def _serve_all(args: argparse.Namespace, tels: _Telemetries) -> None:
    cfg = load_stack_config(args.config)
    if args.clock_sync and not args.taps:
        raise ConfigError("--clock-sync is the taps' clock exchange with the collector: give it with --taps")
    if args.clock_sync and not args.clock_sync.startswith(("http://", "https://")):
        raise ConfigError(f"--clock-sync {args.clock_sync!r}: expected the collector's base URL, e.g. http://127.0.0.1:4318")
    stack = await start_stack(cfg, tels, taps=args.taps, ephemeral=args.ephemeral, clock_sync=args.clock_sync)
    settle()
    for rc in stack.components:
        print(f"deltatap stack {rc.kind} {rc.name}: {rc.url}", flush=True)
    for link, tap in stack.taps.items():
        admin = f"  admin {tap.admin_url} (/metrics, /healthz)" if getattr(tap, "admin_url", None) else ""
        print(f"deltatap tap {link}: {tap.url}{admin}", flush=True)
    models = ", ".join(cfg.engine.models)
    print(f"send requests to {stack.url}/v1/chat/completions (model: {models})", flush=True)
    try:
        await _until_signal()
    finally:
        await stack.close()


def _run(serve: Callable[[argparse.Namespace, _Telemetries], Awaitable[None]]) -> Callable[[argparse.Namespace], int]:
    def func(args: argparse.Namespace) -> int:
        tels = _Telemetries(args.otlp, args.otlp_protocol)
        try:
            run(serve(args, tels))
        except OSError as exc:
            raise ConfigError(str(exc)) from None
        finally:
            tels.shutdown()
        return 0

    return func


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--otlp", default=None, help="span export: grpc://HOST:4317, http://HOST:4318, file:PATH or none (default: OTEL_* variables)")
    p.add_argument("--otlp-protocol", default=None, help="grpc or http/protobuf (default: from --otlp)")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("stack", help="run the reference gateway / firewall / engine", description=(__doc__ or "").replace("``", ""),
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="component", metavar="COMPONENT", required=True)
    for kind in STARTERS:
        p = sub.add_parser(kind, help=f"run the reference {kind}")
        p.add_argument("--config", default=None, help=f"YAML: {'an' if kind[0] in 'aeiou' else 'a'} {kind} file or a combined file with a '{kind}:' section (a path or a packaged name such as demo)")
        p.add_argument("--listen", default=None, help="HOST:PORT (default: the config's listen)")
        if kind != ComponentKind.ENGINE.value:
            p.add_argument("--upstream", default=None, help="upstream base URL (overrides the config)")
        else:
            p.set_defaults(upstream=None)
        _common(p)
        p.set_defaults(func=_run(_serve_one))
    p = sub.add_parser("all", help="run engine, firewall and gateway chained (optionally with taps)")
    p.add_argument("--config", required=True, help="combined YAML, a file or a packaged name (e.g. demo: the packaged configs/demo.yaml)")
    p.add_argument("--taps", action="store_true", help="put deltatap taps on the links (listen addresses from the topology)")
    p.add_argument("--ephemeral", action="store_true", help="listen on free ports instead of the configured ones")
    p.add_argument("--clock-sync", metavar="URL", default=None,
                   help="with --taps: the collector's base URL (GET /v1/clock, e.g. http://127.0.0.1:4318); each tap estimates its clock offset to it and retries promptly until it answers")
    _common(p)
    p.set_defaults(func=_run(_serve_all))
