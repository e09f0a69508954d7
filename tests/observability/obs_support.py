"""What the observability tests share (tests/observability/conftest.py holds the fixtures): where the
OpenTelemetry Collector, Jaeger, Prometheus and Chromium binaries are, and child processes with their logs.

Each binary is looked up in its environment variable (``.ci/observability`` exports them), then on PATH, then
in the cache ``.ci/observability`` builds into (``$DELTATAP_CACHE/observability/bin``, default
``~/.cache/deltatap``). A part that is not found SKIPS the test that needs it, with the reason and any
install problem ``.ci/observability`` met; it never passes silently.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DELTATAP = [sys.executable, "-m", "deltatap.app.cli"]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

def cache_dir() -> Path:
    return Path(os.environ.get("DELTATAP_CACHE") or Path.home() / ".cache" / "deltatap")


@dataclass(frozen=True)
class Part:
    env: str  # the environment variable that names the binary
    names: tuple[str, ...]  # executable names looked up on PATH and in the cache
    what: str  # for the skip message

    def find(self) -> Path | None:
        v = os.environ.get(self.env)
        if v:
            p = Path(v)
            return p if p.is_file() and os.access(p, os.X_OK) else None
        for n in self.names:
            w = shutil.which(n)
            if w:
                return Path(w)
        for n in self.names:
            p = cache_dir() / "observability" / "bin" / n
            if p.is_file() and os.access(p, os.X_OK):
                return p
        return None

    def require(self) -> Path:
        p = self.find()
        if p is None:
            given = os.environ.get(self.env)
            why = f"{self.env}={given} is not an executable file" if given else f"not in ${self.env}, on PATH ({', '.join(self.names)}) nor in {cache_dir() / 'observability' / 'bin'}"
            problems = os.environ.get("DELTATAP_OBSERVABILITY_INSTALL_PROBLEMS")
            pytest.skip(f"{self.what}: {why}; run `bash .ci/observability`" + (f" (install problems: {problems})" if problems else ""))
        return p


OTELCOL = Part("DELTATAP_OTELCOL", ("otelcol-deltatap",), "OpenTelemetry Collector (deploy/otelcol/builder-config.yaml)")
JAEGER = Part("DELTATAP_JAEGER", ("jaeger",), "Jaeger v2")
PROMETHEUS = Part("DELTATAP_PROMETHEUS", ("prometheus",), "Prometheus")
CHROMIUM = Part("DELTATAP_CHROMIUM", ("chromium", "chromium-headless-shell", "chromium-browser"), "Chromium")



# --------------------------------------------------------------------------------------------
# processes: the real binaries and `deltatap collect`, each with its log kept for the failure message
# --------------------------------------------------------------------------------------------


class Proc:
    """A child process started with its output in ``log``; ``stop()`` ends it (SIGTERM, then SIGKILL)."""

    def __init__(self, name: str, argv: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.name, self.argv, self.log = name, argv, log
        self._fh = open(log, "wb")
        self.p = subprocess.Popen(argv, stdout=self._fh, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}, cwd=ROOT)

    def tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.p.poll() is None

    def kill(self) -> None:
        if self.alive():
            self.p.send_signal(signal.SIGKILL)
            self.p.wait(10)

    def stop(self, timeout_s: float = 30.0) -> int | None:
        if self.alive():
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait(10)
        self._fh.close()
        return self.p.returncode


def wait_http(url: str, proc: Proc | None = None, timeout_s: float = 30.0) -> None:
    """Until ``url`` answers 2xx (bounded); fails with the process's log tail if it died or never answered."""
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        if proc is not None and not proc.alive():
            pytest.fail(f"{proc.name} exited with {proc.p.returncode}:\n{proc.tail()}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if 200 <= r.status < 300:
                    return
        except OSError as exc:
            last = str(exc)
        time.sleep(0.1)
    pytest.fail(f"{url} did not answer in {timeout_s} s ({last})" + (f"; {proc.name} log:\n{proc.tail()}" if proc else ""))


def http_text(url: str, timeout_s: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout_s) as r:
        return r.read().decode()


def metric_sum(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` (Prometheus text format) whose labels include ``labels``."""
    from prometheus_client.parser import text_string_to_metric_families

    total = 0.0
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            # prometheus_client names a counter's sample NAME_total even where the exporter wrote NAME
            if name in (s.name, s.name.removesuffix("_total")) and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


def start_collect(name: str, tmp: Path, grpc_port: int, http_port: int, *extra: str) -> Proc:
    """`deltatap collect` on loopback, rows as JSON lines, ready when its OTLP/HTTP port serves /metrics."""
    out = tmp / name
    argv = [*DELTATAP, "collect", "--otlp-grpc", f"127.0.0.1:{grpc_port}", "--otlp-http", f"127.0.0.1:{http_port}",
            "--metrics", "none", "--out", str(out), "--rows-format", "jsonl", *extra]
    p = Proc(name, argv, tmp / f"{name}.log")
    p.out = out  # type: ignore[attr-defined]
    p.metrics_url = f"http://127.0.0.1:{http_port}/metrics"  # type: ignore[attr-defined]
    wait_http(p.metrics_url, p)  # type: ignore[attr-defined]
    return p
