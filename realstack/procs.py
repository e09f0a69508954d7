"""Child processes of the real stack: start with a log file, wait until ready, stop the whole group.

Stdlib only, so it runs under deltatap's venv (``realstack/launch.py``) and inside the tests.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path


class StartError(RuntimeError):
    """A part did not start or never became ready; the message carries the tail of its log."""


class Proc:
    def __init__(self, name: str, argv: list[str], log_path: Path, env: dict[str, str] | None = None, cwd: Path | None = None) -> None:
        self.name = name
        self.argv = [str(a) for a in argv]
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log_path, "ab")  # noqa: SIM115 - closed in stop()
        full_env = dict(os.environ)
        full_env.update(env or {})
        try:
            self.popen = subprocess.Popen(
                self.argv, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=full_env, cwd=cwd, start_new_session=True,
            )
        except OSError as exc:
            self._log.close()
            raise StartError(f"{name}: cannot run {self.argv[0]}: {exc}") from None

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, lines: int = 25) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def wait_ready(self, check: Callable[[], bool], timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.alive():
                raise StartError(f"{self.name} exited with {self.popen.returncode} before {what}; log {self.log_path}:\n{self.tail()}")
            if check():
                return
            time.sleep(0.1)
        raise StartError(f"{self.name}: {what} not reached within {timeout_s:.0f} s; log {self.log_path}:\n{self.tail()}")

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM to the process group, then SIGKILL after ``timeout_s``."""
        if self.alive():
            try:
                os.killpg(self.popen.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.popen.wait(timeout_s)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(self.popen.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.popen.wait(5)
        self._log.close()


def http_ok(url: str, expect: Callable[[int], bool] = lambda s: s == 200, headers: dict[str, str] | None = None) -> Callable[[], bool]:
    def check() -> bool:
        req = urllib.request.Request(url, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=2) as resp:
                return expect(resp.status)
        except urllib.error.HTTPError as exc:
            return expect(exc.code)
        except (OSError, ValueError):
            return False

    return check


def tcp_open(host: str, port: int) -> Callable[[], bool]:
    def check() -> bool:
        try:
            with socket.create_connection((host, port), timeout=1):
                return True
        except OSError:
            return False

    return check


_PICKED: set[int] = set()


def _ephemeral_range() -> tuple[int, int]:
    try:
        lo, hi = open("/proc/sys/net/ipv4/ip_local_port_range").read().split()
        return int(lo), int(hi)
    except (OSError, ValueError):
        return 32768, 60999


def free_port(host: str = "127.0.0.1") -> int:
    """A port free now and outside the kernel's ephemeral range. A port the kernel hands out for ``bind(0)`` is
    also the kind it hands to outgoing connections: between picking it and the server binding it, any process's
    ``connect`` may take it (seen: a tap's admin port taken by a client socket of the same run). Ports below the
    range are never given to outgoing connections, and this process does not hand the same one out twice."""
    lo, _hi = _ephemeral_range()
    start, end = (10000, lo) if lo > 12000 else (lo // 2, lo)
    rng = random.Random(os.getpid() ^ time.monotonic_ns())
    for _ in range(200):
        port = rng.randrange(start, end)
        if port in _PICKED:
            continue
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        _PICKED.add(port)
        return port
    with socket.socket() as s:  # a crowded range: fall back to the kernel's pick
        s.bind((host, 0))
        return s.getsockname()[1]
