"""``deltatap tap --workers N``: N tap processes on one listening port, one admin port summing their metrics.

The parent binds the listen address once with ``SO_REUSEPORT`` (without listening: it takes no connection) to fix
the port, then forks N workers; each runs an ordinary tap (:mod:`deltatap.proxy.server`) listening on that port
with ``SO_REUSEPORT``, so the kernel spreads new connections over them, and its own admin server on a private
loopback port. Each worker exports its own spans (they carry the same link and resource). The parent serves the
public admin port: ``/metrics`` is every worker's metrics summed sample by sample (counters, histograms and the
in-flight gauge add up; clock offsets and maxima take the largest), ``/healthz`` is ok when every worker says ok.
SIGTERM/SIGINT to the parent drain every worker within the grace period. The parent opens the packet log the workers
share before the fork (:func:`_share_packet_log`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable

import aiohttp
from aiohttp import web
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families

from deltatap.proxy.options import TapOptions

log = logging.getLogger("deltatap.tap")
_TAKE_MAX = ("_offset_seconds", "_uncertainty_seconds", "_max_seconds")


def sum_metrics(texts: list[str]) -> str:
    """Prometheus text of several processes of one kind, summed per sample (largest value for offsets and maxima)."""
    order: list[str] = []
    families: dict[str, tuple[str, str]] = {}
    samples: dict[str, dict[tuple, float]] = {}
    for text in texts:
        for fam in text_string_to_metric_families(text):
            if fam.name not in families:
                families[fam.name] = (fam.documentation, fam.type)
                order.append(fam.name)
                samples[fam.name] = {}
            into = samples[fam.name]
            take_max = fam.name.endswith(_TAKE_MAX)
            for s in fam.samples:
                key = (s.name, tuple(sorted(s.labels.items())))
                if key not in into:
                    into[key] = s.value
                else:
                    into[key] = max(into[key], s.value) if take_max else into[key] + s.value
    out: list[str] = []
    for name in order:
        doc, kind = families[name]
        out.append(f"# HELP {name} {doc}")
        out.append(f"# TYPE {name} {kind}")
        for (sname, labels), value in samples[name].items():
            lab = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
            out.append(f"{sname}{{{lab}}} {_number(value)}" if lab else f"{sname} {_number(value)}")
    return "\n".join(out) + "\n"


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(v: float) -> str:
    return repr(float(v)) if v == v and v not in (float("inf"), float("-inf")) else ("+Inf" if v > 0 else "-Inf" if v < 0 else "NaN")


def _reserve(host: str, port: int) -> socket.socket:
    """Bind (not listen) the listen address with SO_REUSEPORT: fixes a port for port 0 and fails early when taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    s.bind((host, port))
    return s


def run_workers(opts: TapOptions, workers: int, serve_worker: Callable[[TapOptions, int], int]) -> int:
    """Fork ``workers`` processes running ``serve_worker(worker_opts, report_fd)`` and serve the summed admin port."""
    from deltatap.core.config import ConfigError, listen_error_line

    try:
        reserved = _reserve(opts.listen_host or "0.0.0.0", opts.listen_port)
    except OSError as exc:
        raise ConfigError(listen_error_line("--listen", opts.listen_host, opts.listen_port, exc)) from None
    port = reserved.getsockname()[1]
    _share_packet_log(opts, port)
    children: list[int] = []
    ready_r, ready_w = os.pipe()
    for i in range(workers):
        pid = os.fork()
        if pid == 0:  # a worker
            os.close(ready_r)
            reserved.close()
            wopts = _worker_fields(opts, port)
            code = 1
            try:
                code = serve_worker(wopts, ready_w)
            except BaseException as exc:  # noqa: BLE001 - a worker reports and exits, never returns into the parent's code
                print(f"deltatap tap {opts.link}: worker {i}: {exc}", file=sys.stderr, flush=True)
            finally:
                os._exit(code)
        children.append(pid)
    os.close(ready_w)
    admins: list[str] = []
    with os.fdopen(ready_r) as ready:
        for line in ready:
            doc = json.loads(line)
            admins.append(doc["admin_url"])
            if len(admins) == workers:
                break
    reserved.close()
    if len(admins) < workers:
        for pid in children:
            _signal(pid, signal.SIGTERM)
        _reap(children)
        raise ConfigError(f"tap {opts.link}: {workers - len(admins)} of {workers} workers did not start (see the lines above)")
    from deltatap.net import aio

    return aio.run(_parent(opts, port, admins, children))


def _share_packet_log(opts: TapOptions, port: int) -> None:
    """Open the packet log the workers share (:func:`deltatap.net.pktstamp.shared_packet_log`), before the fork: one
    packet socket and one ring for all of them, its filter attached once on the tap's ends (:func:`tap_ends`). The
    workers inherit the socket and its mapping, the same kernel ring: each packet is logged once, not once per worker
    (each worker's own log kept every worker's packets: the listen port is shared, and past 120 watched ports the filter
    keeps a range), and no connection attaches a filter. Nothing where reads are not kernel-stamped
    (``DELTATAP_KERNEL_STAMPS=0``: no transport would read the log)."""
    from deltatap.net import kstamp, pktstamp

    if kstamp.enabled():
        pktstamp.shared_packet_log(*tap_ends(opts, port))


def tap_ends(opts: TapOptions, port: int) -> tuple[list[int], list[tuple[bytes, int]]]:
    """The ends of a tap's stamped connections, for its packet log's filter: the listen port (the clients'
    connections), and the upstream's IPv4 addresses, resolved now, with its port (the upstream connections; one made
    to an address resolved otherwise later is watched by its port, as before)."""
    up = opts.upstream_url
    up_port = up.port or (443 if up.scheme == "https" else 80)
    remote: set[tuple[bytes, int]] = set()
    try:
        for *_x, addr in socket.getaddrinfo(up.host or "", up_port, socket.AF_INET, socket.SOCK_STREAM):
            remote.add((socket.inet_aton(addr[0]), up_port))
    except (OSError, UnicodeError) as exc:  # (unresolvable now: its connections are watched by their ports)
        log.info("tap %s: upstream %s not resolved for the packet log (%s)", opts.link, up.host, exc)
    return [port], sorted(remote)


def _worker_fields(opts: TapOptions, port: int) -> TapOptions:
    fields = {k: getattr(opts, k) for k in TapOptions.__dataclass_fields__}
    fields.update(listen_port=port, admin_host="127.0.0.1", admin_port=0 if opts.admin_port is not None else None)
    return TapOptions(**fields)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _reap(children: list[int]) -> list[int]:
    codes = []
    for pid in children:
        try:
            _pid, status = os.waitpid(pid, 0)
            codes.append(os.waitstatus_to_exitcode(status))
        except ChildProcessError:
            codes.append(0)
    return codes


async def _parent(opts: TapOptions, port: int, admins: list[str], children: list[int]) -> int:
    session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5))
    runner = None
    admin_url = "off"
    if opts.admin_port is not None:
        async def fetch(url: str) -> tuple[int, str]:
            async with session.get(url) as r:
                return r.status, await r.text()

        async def get_metrics(request: web.Request) -> web.Response:
            got = await asyncio.gather(*(fetch(a + "/metrics") for a in admins if a), return_exceptions=True)
            texts = [t for g in got if not isinstance(g, BaseException) for t in [g[1]]]
            return web.Response(body=sum_metrics(texts).encode(), headers={"Content-Type": CONTENT_TYPE_LATEST})

        async def get_health(request: web.Request) -> web.Response:
            got = await asyncio.gather(*(fetch(a + "/healthz") for a in admins if a), return_exceptions=True)
            docs = [json.loads(g[1]) if not isinstance(g, BaseException) else {"status": "unreachable"} for g in got]
            ok = all(not isinstance(g, BaseException) and g[0] == 200 for g in got)
            status = "ok" if ok else next((d.get("status") for d in docs if d.get("status") != "ok"), "unreachable")
            doc = {"status": status, "link": opts.link, "workers": len(admins), "worker_status": [d.get("status") for d in docs],
                   "in_flight": sum(int(d.get("in_flight", 0)) for d in docs)}
            return web.json_response(doc, status=200 if ok else 503)

        async def get_live(request: web.Request) -> web.Response:
            """Liveness, as one tap's: 200 while the workers serve, whatever the upstream does."""
            resp = await get_health(request)
            resp.set_status(200 if any(d != "unreachable" for d in json.loads(resp.body)["worker_status"]) else 503)
            return resp

        app = web.Application()
        app.router.add_get("/metrics", get_metrics)
        app.router.add_get("/healthz", get_health)
        app.router.add_get("/readyz", get_health)
        app.router.add_get("/livez", get_live)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, opts.admin_host, opts.admin_port, reuse_address=True)
        try:
            await site.start()
        except OSError as exc:
            for pid in children:
                _signal(pid, signal.SIGTERM)
            await asyncio.get_running_loop().run_in_executor(None, _reap, children)
            await session.close()  # (else asyncio's "Unclosed client session" follows the line below)
            await runner.cleanup()
            from deltatap.core.config import ConfigError, listen_error_line

            raise ConfigError(listen_error_line("--admin", opts.admin_host, opts.admin_port, exc)) from None
        aport = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        admin_url = f"http://{opts.admin_host}:{aport}"
    print(f"deltatap tap {opts.link}: {'https' if opts.tls_cert else 'http'}://{opts.listen_host}:{port} -> {opts.upstream} ({len(children)} workers; admin {admin_url})",
          flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    reaped = loop.run_in_executor(None, _reap, children)
    await asyncio.wait([asyncio.ensure_future(stop.wait()), reaped], return_when=asyncio.FIRST_COMPLETED)
    for pid in children:
        _signal(pid, signal.SIGTERM)
    codes = await reaped
    await session.close()
    if runner is not None:
        await runner.cleanup()
    print(f"deltatap tap {opts.link}: {len(children)} workers stopped", flush=True)
    return max(codes, default=0)
