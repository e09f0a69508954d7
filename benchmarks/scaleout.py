"""Spans/s through the load-balanced tier: OpenTelemetry Collector (deploy/otelcol/scaleout.yaml, routing by
trace id) -> N `deltatap collect` shards (with a joining collector behind them, docs/scaleout.md).

    .venv/bin/python benchmarks/scaleout.py [--shards 0 1 3] [--requests 20000]

Needs the OpenTelemetry Collector that `bash .ci/observability --install` builds (or DELTATAP_OTELCOL). For each
shard count: start the joiner, the shards and the OTel Collector, pre-build the collector benchmark's exports
(benchmarks/collector_throughput.py: a client span and three tap spans per request with the taps' full attribute
set, 50 requests per export), send them to the OTel Collector over OTLP/gRPC with 4 calls in flight, and poll the
shards' /metrics until every span was received and every request was joined into a row. Measured: spans/s from
the first export until all rows were written (joined rate) and until all spans were received by the shards
(ingest rate). Every process shares this machine's CPUs (no pinning): the figures are the whole tier's on it.
Writes benchmarks/results/scaleout.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from benchmarks.collector_throughput import build_exports, send_all  # noqa: E402

DELTATAP = [sys.executable, "-m", "deltatap.app.cli"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def otelcol_binary() -> str:
    for p in (os.environ.get("DELTATAP_OTELCOL"), shutil.which("otelcol-deltatap"),
              str(Path(os.environ.get("DELTATAP_CACHE") or Path.home() / ".cache" / "deltatap") / "observability" / "bin" / "otelcol-deltatap")):
        if p and Path(p).is_file():
            return p
    sys.exit("benchmarks/scaleout.py: no OpenTelemetry Collector; run `bash .ci/observability --install` first")


def counters(url: str) -> dict[str, float]:
    out: dict[str, float] = {}
    with urllib.request.urlopen(url, timeout=5) as r:
        for fam in text_string_to_metric_families(r.read().decode()):
            for s in fam.samples:
                out[s.name] = out.get(s.name, 0.0) + s.value
    return out


def wait_up(url: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url, timeout=2).read()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"{url} did not come up in {timeout_s} s")


def start_otelcol(shard: list[tuple[str, str]], procs: list, tmp: Path) -> tuple[str, int]:
    grpc_port, metrics_port = free_port(), free_port()
    env = {**os.environ, "DELTATAP_SHARDS": "[" + ", ".join(g for g, _ in shard) + "]", "OTELCOL_OTLP_GRPC": f"127.0.0.1:{grpc_port}",
           "OTELCOL_OTLP_HTTP": f"127.0.0.1:{free_port()}", "OTELCOL_METRICS_PORT": str(metrics_port),
           # everything is offered at once: a request may wait behind the backlog far longer than the 5 s default
           "OTELCOL_TIMEOUT_S": "120", "OTELCOL_RETRY_S": "600"}
    procs.append(subprocess.Popen([otelcol_binary(), "--config", str(ROOT / "deploy" / "otelcol" / "scaleout.yaml")], env=env,
                                  stdout=open(tmp / "otelcol.log", "wb"), stderr=subprocess.STDOUT))
    wait_up(f"http://127.0.0.1:{metrics_port}/metrics")
    return f"grpc://127.0.0.1:{grpc_port}", metrics_port


def run_tier(shards: int, exports: list[bytes], spans_total: int, requests: int, tmp: Path, timeout_s: float) -> dict:
    procs: list[subprocess.Popen] = []

    def collect(name: str, *extra: str) -> tuple[str, str]:
        g, h = free_port(), free_port()
        log = open(tmp / f"{name}.log", "wb")
        procs.append(subprocess.Popen([*DELTATAP, "collect", "--otlp-grpc", f"127.0.0.1:{g}", "--otlp-http", f"127.0.0.1:{h}", "--metrics", "none",
                                       "--out", str(tmp / name), "--grace-s", "0.2", *extra], stdout=log, stderr=subprocess.STDOUT, cwd=ROOT))
        return f"127.0.0.1:{g}", f"http://127.0.0.1:{h}/metrics"

    try:
        if shards == 0:  # the baseline: the same exports straight to one collector, no OpenTelemetry Collector
            shard = [collect("direct")]
            wait_up(shard[0][1])
            target = f"grpc://{shard[0][0]}"
            metrics_port = None
        else:
            joiner, _ = collect("joiner")
            shard = [collect(f"shard{i}", "--handoff", f"grpc://{joiner}") for i in range(shards)]
            for _, m in shard:
                wait_up(m)
            target, metrics_port = start_otelcol(shard, procs, tmp)
        t0 = time.monotonic()
        import threading

        sender = threading.Thread(target=lambda: asyncio.run(send_all(target, exports)), daemon=True)
        sender.start()
        t_spans = t_rows = None
        got = {}
        while time.monotonic() - t0 < timeout_s:
            time.sleep(0.25)
            got = {"spans": 0.0, "rows": 0.0}
            per = []
            for _, m in shard:
                c = counters(m)
                got["spans"] += c.get("deltatap_collector_spans_received_total", 0)
                got["rows"] += c.get("deltatap_collector_rows_total", 0)
                per.append(c.get("deltatap_collector_spans_received_total", 0))
            if t_spans is None and got["spans"] >= spans_total:
                t_spans = time.monotonic() - t0
            if got["rows"] >= requests:
                t_rows = time.monotonic() - t0
                break
        sender.join(timeout=60)
        oc = counters(f"http://127.0.0.1:{metrics_port}/metrics") if metrics_port else {}
        return {
            "shards": shards, "path": "direct to one collector" if shards == 0 else f"OpenTelemetry Collector -> {shards} shard(s) + joiner", "requests": requests, "spans": spans_total,
            "ingest_s": t_spans, "ingest_spans_per_s": spans_total / t_spans if t_spans else None,
            "joined_s": t_rows, "joined_spans_per_s": spans_total / t_rows if t_rows else None,
            "rows": got.get("rows"), "spans_per_shard": per,
            "otelcol_sent_spans": oc.get("otelcol_exporter_sent_spans_total"), "otelcol_failed_spans": oc.get("otelcol_exporter_send_failed_spans_total"),
        }
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shards", type=int, nargs="+", default=[0, 1, 3], help="shard counts to run; 0 = straight to one collector (baseline)")
    ap.add_argument("--requests", type=int, default=20_000)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "scaleout.json"))
    args = ap.parse_args()
    load_start = os.getloadavg()
    exports = build_exports(args.requests, 50, with_client=True)
    spans = args.requests * 4
    runs = []
    for n in args.shards:
        with tempfile.TemporaryDirectory(prefix="deltatap-scaleout-") as d:
            r = run_tier(n, exports, spans, args.requests, Path(d), args.timeout)
        print(json.dumps(r), flush=True)
        runs.append(r)
    result = {
        "benchmark": "scaleout", "command": "benchmarks/scaleout.py " + " ".join(sys.argv[1:]),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "tier": "OpenTelemetry Collector (deploy/otelcol/scaleout.yaml) -> N deltatap collect shards (--handoff to a joiner), all on this machine",
        "runs": runs, "load_average_at_start": load_start, "load_average_at_end": os.getloadavg(),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
