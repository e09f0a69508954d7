"""Loopback capture with tcpdump: kernel stamps in nanoseconds, whole packets, only the run's ports."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path


class CaptureError(RuntimeError):
    pass


def tcpdump_path() -> str | None:
    return shutil.which("tcpdump") or ("/usr/bin/tcpdump" if os.path.exists("/usr/bin/tcpdump") else None)


def port_filter(ports: list[int]) -> str:
    return "tcp and (" + " or ".join(f"port {p}" for p in sorted(set(ports))) + ")"


class Capture:
    """``tcpdump -i lo -w FILE --time-stamp-precision=nano -B 65536 -s 0 -U <filter>``; :meth:`stop`
    returns the kernel's counts (received / dropped by kernel)."""

    def __init__(self, out: Path, ports: list[int], iface: str = "lo", buffer_kib: int = 65536) -> None:
        exe = tcpdump_path()
        if exe is None:
            raise CaptureError("tcpdump is not installed (apt-get install tcpdump)")
        self.out = out
        self.log = out.with_suffix(".tcpdump.log")
        self.argv = [exe, "-i", iface, "-w", str(out), "--time-stamp-precision=nano", "-B", str(buffer_kib), "-s", "0", "-U", "-n",
                     port_filter(ports)]
        self.proc: subprocess.Popen | None = None
        self.counts: dict[str, int] = {}

    def start(self, timeout_s: float = 10.0) -> None:
        self._logf = open(self.log, "w")
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.DEVNULL, stderr=self._logf, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise CaptureError(f"tcpdump exited with {self.proc.returncode}: {self.log.read_text().strip()} (needs root or CAP_NET_RAW)")
            if "listening on" in self.log.read_text():
                time.sleep(0.2)  # the filter is attached before the message; a little slack all the same
                return
            time.sleep(0.05)
        self.stop()
        raise CaptureError(f"tcpdump did not start within {timeout_s}s: {self.log.read_text().strip()}")

    def stop(self) -> dict[str, int]:
        p = self.proc
        if p is None:
            return self.counts
        if p.poll() is None:
            p.send_signal(signal.SIGINT)  # tcpdump flushes and prints its counts
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self._logf.close()
        self.proc = None
        text = self.log.read_text()
        for name, pat in (("captured", r"(\d+) packets? captured"), ("received_by_filter", r"(\d+) packets? received by filter"),
                          ("dropped_by_kernel", r"(\d+) packets? dropped by kernel")):
            m = re.search(pat, text)
            if m:
                self.counts[name] = int(m.group(1))
        return self.counts
