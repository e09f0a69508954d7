"""``deltatap tap``: run one tap from flags or from a topology file."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal

from deltatap.net import aio
from deltatap.net.kstamp import stamp_source
from deltatap.core.vocab import Attr
from deltatap.core.gc_pauses import settle
from deltatap.core.config import PROCESSES_PER_CPU, ConfigError, processes_allowed
from deltatap.telemetry.tracer import TelemetryConfigError, setup_telemetry
from deltatap.core.topology import load_topology
from deltatap.proxy.metrics import quiet_bad_requests
from deltatap.proxy.options import PROTOCOLS, TapOptions, default_admin_port, options_from_topology, split_listen

log = logging.getLogger("deltatap.tap")

# docs' port conventions for the default links (tests always use ephemeral ports)
DEFAULT_LISTEN = {"edge": "127.0.0.1:9100", "gw-fw": "127.0.0.1:9200", "fw-engine": "127.0.0.1:9300"}


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "tap",
        help="run a transparent tap proxy on one link",
        description="Forward every byte between a downstream and an upstream unchanged while stamping the "
        "request/first-token/last-token timeline into an OpenTelemetry span per request.",
    )
    p.add_argument("--link", required=True, help="link name (edge, gw-fw, fw-engine, or one from --config)")
    p.add_argument("--config", help="topology YAML; the link's tap section supplies listen/admin/upstream/...")
    p.add_argument("--listen", help="HOST:PORT to listen on (default: the link's convention, e.g. edge 127.0.0.1:9100)")
    p.add_argument("--upstream", help="URL to forward to, e.g. http://127.0.0.1:8300 (a path prefix is kept)")
    p.add_argument("--admin", help="HOST:PORT for /metrics and /healthz (default: listen port + 1000)")
    p.add_argument("--no-admin", action="store_true", help="run no admin server")
    p.add_argument("--downstream", help="component name on the client side of the link")
    p.add_argument("--upstream-name", help="component name on the server side of the link")
    p.add_argument("--downstream-kind", help="kind of the downstream component (client, gateway, firewall, ...)")
    p.add_argument("--upstream-kind", help="kind of the upstream component (gateway, firewall, engine, ...)")
    p.add_argument("--host-header", help="rewrite Host to this value (default: preserve the client's)")
    p.add_argument("--timeout-s", type=float, help="the tap's own upstream timeout (default: none)")
    p.add_argument("--insecure", action="store_true", help="do not verify the upstream's TLS certificate")
    p.add_argument("--correlation-header", help="correlation header, created if absent (default x-request-id)")
    p.add_argument("--clock-sync", metavar="URL", help="collector base URL (GET /v1/clock) to estimate clock offset")
    p.add_argument("--otlp", help="grpc://HOST:4317, http://HOST:4318, file:PATH or none (default: OTEL_EXPORTER_OTLP_*)")
    p.add_argument("--otlp-protocol", help="grpc or http/protobuf (default: OTEL_EXPORTER_OTLP_PROTOCOL)")
    p.add_argument("--fingerprint-key", help="key of the body fingerprint (default: $DELTATAP_FINGERPRINT_KEY)")
    p.add_argument("--grace-s", type=float, default=10.0, help="on SIGTERM, let streams in flight finish this long (default 10)")
    p.add_argument(
        "--respect-sampling",
        action="store_true",
        help="record no span for a request whose incoming traceparent is not sampled (default: record every request)",
    )
    p.add_argument("--label", action="append", default=[], metavar="KEY=VALUE", help="extra span attribute deltatap.label.KEY")
    p.add_argument("--query-keep", action="append", default=[], metavar="KEY",
                   help="query key whose value url.query keeps as sent (repeatable, or a,b); every other value is a keyed hash")
    p.add_argument("--header-timeout-s", type=float, metavar="S",
                   help="close a connection that has not sent a whole request head for S seconds, idle keep-alive included (default 30)")
    p.add_argument("--max-connections", type=int, metavar="N", help="downstream connections open at once; more are closed at accept (default 4096; the "
                        "open-file limit is raised toward its hard limit to fit them)")
    p.add_argument("--tls-cert", metavar="FILE", help="PEM certificate (chain): speak TLS toward the downstream (with --tls-key)")
    p.add_argument("--tls-key", metavar="FILE", help="PEM private key of --tls-cert")
    p.add_argument("--protocol", choices=PROTOCOLS, default=None,
                   help="http (default, or the topology's links[].tap.protocol): HTTP/1.1, and HTTP/2 where a client speaks it; "
                        "grpc: a gRPC tap, HTTP/2 only (h2c, or TLS with ALPN h2 toward an https:// upstream), other connections closed")
    p.add_argument("--workers", type=int, default=1, metavar="N",
                   help="run N tap processes on the listen port (SO_REUSEPORT); the admin port sums their metrics (default 1; at most "
                        "4 per CPU)")
    p.add_argument("--no-defer-watch", action="store_true",
                   help="watch each upstream read before the next ready one is forwarded, and account each request read "
                        "before its callback returns (default: every ready read of a poll round is forwarded first, then each "
                        "is watched; a request read's accounting waits until the tap has slept: until the pair's next "
                        "event, at most 20 ms with --timeout-s; stamps unchanged; also DELTATAP_TAP_DEFER=0)")
    p.set_defaults(func=run)


def _labels(values: list[str]) -> dict[str, str]:
    out = {}
    for v in values:
        key, sep, val = v.partition("=")
        if not sep or not key:
            raise ConfigError(f"--label {v!r}: expected KEY=VALUE")
        out[key] = val
    return out


def build_options(args: argparse.Namespace) -> TapOptions:
    common = {
        "host_header": args.host_header,
        "timeout_s": args.timeout_s,
        "correlation_header": args.correlation_header,
        "clock_sync": args.clock_sync,
        "fingerprint_key": args.fingerprint_key,
        "grace_s": args.grace_s,
        "respect_sampling": args.respect_sampling,
        "header_timeout_s": args.header_timeout_s,
        "max_connections": args.max_connections,
        "labels": _labels(args.label) or None,
        "query_keep": args.query_keep or None,
        "protocol": args.protocol,
        "downstream": args.downstream,
        "upstream_name": args.upstream_name,
        "downstream_kind": args.downstream_kind,
        "upstream_kind": args.upstream_kind,
        "upstream": args.upstream,
        "tls_cert": args.tls_cert,
        "tls_key": args.tls_key,
    }
    if args.insecure:
        common["verify_tls"] = False
    if args.listen:
        common["listen_host"], common["listen_port"] = split_listen(args.listen, "--listen")
    if args.admin:
        common["admin_host"], common["admin_port"] = split_listen(args.admin, "--admin")
    if args.config:
        opts = options_from_topology(load_topology(args.config), args.link, **common)
    else:
        if not args.upstream:
            raise ConfigError("--upstream URL is required (or --config FILE with the link's upstream)")
        if not args.listen:
            if args.link not in DEFAULT_LISTEN:
                raise ConfigError(f"--listen HOST:PORT is required for link {args.link!r}")
            common["listen_host"], common["listen_port"] = split_listen(DEFAULT_LISTEN[args.link], "--listen")
        opts = TapOptions(link=args.link, **{k: v for k, v in common.items() if v is not None})
    if args.no_admin:
        opts.admin_port = None
    elif not args.admin and opts.listen_port and opts.admin_port == 0:
        opts.admin_host, opts.admin_port = opts.listen_host, default_admin_port(opts.listen_port)
    return opts


async def _serve(opts: TapOptions, args: argparse.Namespace, report_fd: int | None = None) -> int:
    from deltatap.proxy.server import start_tap

    try:
        # OTLP/HTTP is exported from this event loop (no export thread: deltatap/telemetry/otlp_loop.py); gRPC and file keep the thread
        telemetry = setup_telemetry(f"deltatap-tap-{opts.link}", otlp=args.otlp, protocol=args.otlp_protocol, on_loop=True,
                                    resource_attributes={"deltatap.link": opts.link, Attr.STAMP_SOURCE: stamp_source()})
    except TelemetryConfigError as exc:
        raise ConfigError(str(exc)) from None
    try:
        running = await start_tap(opts, telemetry, reuse_port=report_fd is not None)
    except BaseException:
        telemetry.shutdown()
        raise
    tune_gc()  # start-up's objects, then each full collection's survivors, out of every later one: no 40-750 ms pauses mid-stream
    if report_fd is not None:  # a worker of --workers N: tell the parent where its admin server is
        os.write(report_fd, (json.dumps({"admin_url": running.admin_url}) + "\n").encode())
        os.close(report_fd)
    else:
        print(f"deltatap tap {opts.link}{' (gRPC)' if opts.protocol == 'grpc' else ''}: {running.url} -> {opts.upstream} (admin {running.admin_url or 'off'}; "
              f"read stamps: {stamp_source()}, see docs/tap.md)", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("tap %s: stopping (grace %.1fs)", opts.link, opts.grace_s)
    await running.close(opts.grace_s)
    # the span deadline holds for flush and shutdown together: what the close's flush used is not given twice
    left = max(0.1, telemetry.processor.shutdown_deadline_s - running.tap.flush_s)
    await loop.run_in_executor(None, telemetry.shutdown, left)
    s = telemetry.stats
    print(f"deltatap tap {opts.link}: stopped; spans exported {s.spans_exported}, dropped {s.spans_dropped}", flush=True)
    return 0


def tune_gc() -> None:
    """The tap's garbage-collector settings, once per tap process after start-up: the start-up freeze and the freeze of
    each full collection's survivors (:func:`deltatap.core.gc_pauses.settle`)."""
    settle(freeze_survivors=True)


FDS_PER_CONNECTION = 2  # a downstream connection and the upstream connection paired with it
FDS_RESERVED = 64  # the listening and admin sockets, packet sockets, the span export, pooled upstream connections (~20 idle)


def fit_open_files(max_connections: int) -> tuple[int, int]:
    """Raise this process's open-file limit (soft, up to the hard one) to what ``max_connections`` connection pairs
    need; returns (needed, the soft limit now). Below it a flood of connections meets EMFILE before --max-connections."""
    import resource

    needed = FDS_PER_CONNECTION * max_connections + FDS_RESERVED
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return needed, soft
    target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):
        return needed, soft
    return needed, target


def run(args: argparse.Namespace) -> int:
    opts = build_options(args)
    if args.no_defer_watch:  # (read when each upstream connection is made; the environment for --workers' processes too)
        from deltatap.proxy import relay

        os.environ["DELTATAP_TAP_DEFER"] = "0"
        relay.DEFER_WATCH = False
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO)
    quiet_bad_requests()  # (the --workers parent's summed admin server too)
    needed, soft = fit_open_files(opts.max_connections)  # (inherited by --workers' processes)
    if soft < needed:
        log.warning("tap %s: --max-connections %d needs about %d open files, this process may open %d (ulimit -n, hard limit "
                    "reached): past about %d connections new ones fail at accept; raise the hard limit or lower "
                    "--max-connections", opts.link, opts.max_connections, needed, soft,
                    max(0, (soft - FDS_RESERVED) // FDS_PER_CONNECTION))
    most = processes_allowed()  # (the load generator's --processes: the same bound)
    if not 1 <= args.workers <= most:
        raise ConfigError(f"--workers: must be 1 to {most} on this host ({PROCESSES_PER_CPU} per CPU it may use; got {args.workers})")
    if args.workers > 1:
        from deltatap.proxy.workers import run_workers

        return run_workers(opts, args.workers, lambda wopts, fd: aio.run(_serve(wopts, args, fd)))
    return aio.run(_serve(opts, args))
