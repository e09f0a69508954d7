"""Real processes for the reliability suite: ``deltatap tap`` and ``deltatap collect`` as subprocesses, their
/metrics read back, their RSS, and tiny OTLP/HTTP backends that fail on purpose (hanging, 503, 429)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

DELTATAP = [sys.executable, "-m", "deltatap.app.cli"]
REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


@dataclass
class Proc:
    proc: subprocess.Popen
    log: Path

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 20.0) -> int:
        """Signal it and wait (bounded); a process that outlives ``timeout_s`` is killed and the test told."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
            raise AssertionError(f"pid {self.proc.pid} did not end within {timeout_s} s of signal {sig}:\n{self.text()[-2000:]}")


def spawn(args: list[str], log: Path, env: dict[str, str] | None = None) -> Proc:
    fh = open(log, "wb")
    p = subprocess.Popen([*DELTATAP, *args], stdout=fh, stderr=subprocess.STDOUT, cwd=REPO, env={**os.environ, **(env or {})})
    fh.close()
    return Proc(p, log)


async def wait_http(url: str, proc: Proc, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as s:
        while True:
            if proc.proc.poll() is not None:
                raise AssertionError(f"process ended (rc {proc.proc.returncode}) before {url} answered:\n{proc.text()[-3000:]}")
            try:
                async with s.get(url, timeout=aiohttp.ClientTimeout(total=1)) as r:
                    if r.status < 500:
                        return
            except (aiohttp.ClientError, asyncio.TimeoutError):
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"{url} did not answer within {timeout_s} s:\n{proc.text()[-3000:]}")
            await asyncio.sleep(0.1)


@dataclass
class TapProc(Proc):
    port: int = 0
    admin: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


async def start_tap_proc(upstream: str, otlp: str, log: Path, *extra: str, env: dict[str, str] | None = None) -> TapProc:
    port, admin = free_port(), free_port()
    p = spawn(["tap", "--link", "edge", "--listen", f"127.0.0.1:{port}", "--admin", f"127.0.0.1:{admin}",
               "--upstream", upstream, "--otlp", otlp, *extra], log, env)
    tap = TapProc(p.proc, p.log, port, admin)
    await wait_http(f"http://127.0.0.1:{admin}/livez", tap)
    return tap


async def metrics(admin_port: int) -> dict[str, float]:
    """The admin port's samples: ``name{label=value,...}`` -> value (labels sorted, ``link`` left out)."""
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{admin_port}/metrics", timeout=aiohttp.ClientTimeout(total=10)) as r:
        text = await r.text()
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for smp in fam.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(smp.labels.items()) if k != "link")
            out[f"{smp.name}{{{labels}}}" if labels else smp.name] = smp.value
    return out


def span_counts(m: dict[str, float]) -> dict[str, float]:
    """ended / exported / dropped (all reasons) / queued from the tap's metrics."""
    dropped = {k.split("reason=")[1].rstrip("}"): v for k, v in m.items() if k.startswith("deltatap_tap_spans_dropped_total{")}
    return {
        "ended": m.get("deltatap_tap_spans_ended_total", -1),
        "exported": m.get("deltatap_tap_spans_exported_total", -1),
        "dropped": sum(dropped.values()),
        "dropped_by_reason": {k: v for k, v in dropped.items() if v},
        "queued": m.get("deltatap_tap_spans_queued", -1),
    }


# ---- OTLP/HTTP backends that fail on purpose ------------------------------------------------------------
@dataclass
class Backend:
    kind: str
    endpoint: str
    received: int = 0
    last_at: float = 0.0  # time.monotonic() of the last export request's arrival
    runner: web.AppRunner | None = None

    async def close(self) -> None:
        if self.runner is not None:
            await self.runner.shutdown()
            await self.runner.cleanup()


async def start_backend(kind: str) -> Backend:
    """``dead``: a port nothing listens on; ``hang``: takes the request and never answers; ``503`` / ``429``:
    answers that status (with ``Retry-After: 1`` for 429)."""
    if kind == "dead":
        return Backend(kind, f"http://127.0.0.1:{free_port()}")
    be = Backend(kind, "")
    release = asyncio.Event()

    async def traces(request: web.Request) -> web.Response:
        be.last_at = time.monotonic()
        await request.read()
        be.received += 1
        if kind == "hang":
            await release.wait()  # never set: the exporter's own timeout ends the wait
        headers = {"Retry-After": "1"} if kind == "429" else {}
        return web.Response(status=int(kind), text="no", headers=headers)

    app = web.Application(client_max_size=64 << 20)
    app.router.add_post("/v1/traces", traces)
    be.runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
    await be.runner.setup()
    site = web.TCPSite(be.runner, "127.0.0.1", 0)
    await site.start()
    be.endpoint = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
    return be
