"""Span accounting behind a failing telemetry backend (issue 19's probe, repeated).

N requests (default 30,000) go through one in-process tap to a small in-process upstream while the tap exports
its spans to a backend that is dead (nothing listens), hangs (accepts, never answers), or answers 503 or 429.
When the traffic is over the tap's ``/metrics`` is read (ended, exported, dropped by reason, queued), then the
tap's telemetry is shut down (deadline ``$DELTATAP_SPAN_SHUTDOWN_S``, default 5 s) and timed. The issue's
probe, before the fix: 14,096 spans dropped, 0 exported, 15,904 neither, shutdown 24.6 s.

    .venv/bin/python benchmarks/span_accounting.py            # all four backends, 30,000 requests each

Writes benchmarks/results/span_accounting.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import aiohttp
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from deltatap.proxy import TapOptions, start_tap
from deltatap.telemetry.tracer import setup_telemetry

HERE = Path(__file__).resolve().parent
BODY = b'{"id":"x","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"ok"}}]}'


class _Status(BaseHTTPRequestHandler):
    status = 503

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(self.status)
        self.send_header("Retry-After", "1")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


@contextlib.contextmanager
def backend(kind: str) -> Iterator[str]:
    """The --otlp value of a failing backend: dead, hanging, 503 or 429 (all OTLP/HTTP on 127.0.0.1)."""
    if kind == "dead":
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        yield f"http://127.0.0.1:{port}"
        return
    if kind == "hanging":
        lsock = socket.socket()
        lsock.bind(("127.0.0.1", 0))
        lsock.listen(64)
        lsock.settimeout(0.05)
        stop, conns = threading.Event(), []

        def serve() -> None:
            while not stop.is_set():
                with contextlib.suppress(TimeoutError, OSError):
                    conn, _ = lsock.accept()
                    conn.setblocking(False)
                    conns.append(conn)
                for c in list(conns):
                    with contextlib.suppress(OSError):
                        c.recv(1 << 16)

        t = threading.Thread(target=serve, daemon=True)
        t.start()
        try:
            yield f"http://127.0.0.1:{lsock.getsockname()[1]}"
        finally:
            stop.set()
            t.join(5)
            for c in conns:
                c.close()
            lsock.close()
        return
    server = ThreadingHTTPServer(("127.0.0.1", 0), type("S", (_Status,), {"status": int(kind)}))
    server.daemon_threads = True
    t = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        t.join(5)


def span_metrics(text: str) -> dict:
    out: dict = {"dropped": {}}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "deltatap_tap_spans_dropped_total":
                out["dropped"][s.labels["reason"]] = int(s.value)
            elif s.name.startswith("deltatap_tap_spans_"):
                out[s.name.removeprefix("deltatap_tap_spans_").removesuffix("_total")] = int(s.value)
    out["unaccounted"] = out["ended"] - out["exported"] - sum(out["dropped"].values()) - out["queued"]
    return out


async def one_backend(kind: str, requests: int, concurrency: int) -> dict:
    async def chat(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=BODY, content_type="application/json")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    up_port = site._server.sockets[0].getsockname()[1]
    loop = asyncio.get_running_loop()
    with backend(kind) as otlp:
        tel = setup_telemetry("deltatap-tap-edge", otlp=otlp)
        tap = await start_tap(TapOptions(link="edge", upstream=f"http://127.0.0.1:{up_port}"), tel)
        ok = 0
        todo = iter(range(requests))
        t0 = time.monotonic()
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as s:

            async def worker() -> None:
                nonlocal ok
                for _ in todo:
                    async with s.post(f"{tap.url}/v1/chat/completions", json={"model": "m", "messages": []}) as r:
                        await r.read()
                        ok += r.status == 200

            await asyncio.gather(*(worker() for _ in range(concurrency)))
            traffic_s = time.monotonic() - t0
            async with s.get(tap.admin_url + "/metrics") as r:
                at_end = span_metrics(await r.text())
        await tap.close(grace_s=1)
        t1 = time.monotonic()
        await loop.run_in_executor(None, tel.shutdown)
        shutdown_s = time.monotonic() - t1
    await runner.cleanup()
    c = tel.stats.snapshot()
    return {
        "backend": kind, "requests": requests, "ok": ok, "traffic_s": round(traffic_s, 2),
        "metrics_after_traffic": at_end,
        "after_shutdown": {"ended": c.ended, "exported": c.exported, "queued": c.queued,
                           "dropped": c.dropped_by_reason, "unaccounted": c.unaccounted},
        "shutdown_s": round(shutdown_s, 2), "shutdown_deadline_s": tel.processor.shutdown_deadline_s,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=30_000)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--backends", nargs="+", default=["dead", "hanging", "503", "429"], choices=["dead", "hanging", "503", "429"])
    p.add_argument("--out", default=str(HERE / "results" / "span_accounting.json"))
    args = p.parse_args()
    runs = []
    for kind in args.backends:
        r = asyncio.run(one_backend(kind, args.requests, args.concurrency))
        print(json.dumps(r), flush=True)
        runs.append(r)
    Path(args.out).write_text(json.dumps({"command": "benchmarks/span_accounting.py", "runs": runs}, indent=2) + "\n")
    return 0 if all(r["after_shutdown"]["unaccounted"] == 0 and r["metrics_after_traffic"]["unaccounted"] == 0 for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
