"""Helpers of the real-stack tests: a collector on its own thread, AIPerf as a subprocess, row lookups.

The launcher (``realstack/launch.py``) is imported from the repository's ``realstack/`` folder.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "realstack"))

from launch import RealStack, missing_tools, with_free_ports  # noqa: E402
from parts import Tools  # noqa: E402
from procs import StartError, free_port  # noqa: E402

from deltatap.collector.ingest import load  # noqa: E402
from deltatap.collector.pipeline import PipelineOptions  # noqa: E402
from deltatap.collector.rows import Row  # noqa: E402
from deltatap.collector.service import CollectorOptions, start_collector  # noqa: E402
from deltatap.core.topology import Topology, load_topology  # noqa: E402
from deltatap.core.vocab import Role, point  # noqa: E402

__all__ = ["ROOT", "CollectorThread", "RealStack", "StartError", "Tools", "free_port", "load_topology", "missing_tools",
           "run_aiperf", "pt", "delta_ms", "with_free_ports", "summary_ms", "aiperf_records", "Running", "require", "start_stack", "stop_stack", "stream_until_cut"]


class CollectorThread:
    """deltatap's collector (in-process API) on a private event loop, so tests stay synchronous.

    Traces are held open (long grace) until :meth:`rows` drains them, so AIPerf's records can be
    ingested before the rows are built.
    """

    def __init__(self, topology: Topology, out_dir: Path) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="realstack-collector", daemon=True)
        self._thread.start()
        opts = CollectorOptions(otlp_grpc="127.0.0.1:0", otlp_http="127.0.0.1:0", topology=topology, out_dir=out_dir,
                                rows_format="jsonl", pipeline=PipelineOptions(grace_s=600, orphan_wait_s=600))
        self.running = self._call(start_collector(opts))
        self.grpc_hostport = self.running.otlp_grpc_endpoint.removeprefix("grpc://")

    def _call(self, coro: Any, timeout: float = 60) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def ingest_files(self, paths: list[Path]) -> int:
        spans = load([str(p) for p in paths]).spans

        async def _ingest() -> None:
            self.running.pipeline.ingest(spans, time.monotonic())

        self._call(_ingest())
        return len(spans)

    def rows(self, settle_s: float = 6.0) -> list[Row]:
        """Wait for in-flight exports (tap batches, Envoy's and LiteLLM's flush), then close every trace."""
        time.sleep(settle_s)
        return list(self._call(self.running.drain()))

    def stats(self) -> dict[str, Any]:
        async def _stats() -> dict[str, Any]:
            return self.running.stats()

        return self._call(_stats())

    def close(self) -> dict[str, Path]:
        try:
            return self._call(self.running.close())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)


def run_aiperf(tools: Tools, url: str, out: Path, *, requests: int, concurrency: int = 1, isl: int = 130, osl: int = 24,
               api_key: str | None = None, seed: int = 7, timeout_s: float = 240) -> Path:
    """AIPerf against ``url`` (streaming chat); returns its ``profile_export.jsonl``."""
    argv = [str(tools.aiperf), "profile", "--model", "gemma", "--url", url, "--endpoint-type", "chat", "--streaming",
            "--request-count", str(requests), "--concurrency", str(concurrency), "--tokenizer", "cl100k_base",
            "--synthetic-input-tokens-mean", str(isl), "--synthetic-input-tokens-stddev", "0",
            "--output-tokens-mean", str(osl), "--output-tokens-stddev", "0", "--extra-inputs", "ignore_eos:true", "temperature:0",
            "--artifact-dir", str(out), "--ui-type", "none", "--no-gpu-telemetry", "--no-server-metrics",
            "--random-seed", str(seed), "--export-level", "raw"]
    if api_key:
        argv += ["--api-key", api_key]
    env = dict(os.environ, TIKTOKEN_CACHE_DIR=str(tools.tiktoken_dir))
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "aiperf.stdout", "wb") as log:
        rc = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, env=env, timeout=timeout_s, cwd=out).returncode
    export = out / "profile_export.jsonl"
    if rc != 0 or not export.is_file():
        tail = (out / "aiperf.stdout").read_text(errors="replace").splitlines()[-30:]
        raise AssertionError(f"aiperf exited {rc}; no {export}:\n" + "\n".join(tail))
    return export


def stream_until_cut(url: str, body: dict, rid: str, timeout_s: float = 60, api_key: str | None = None) -> dict:
    """POST a streamed chat request; read until the stream ends or is cut. Never retries."""
    u = urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout_s)
    t0 = time.monotonic()
    headers = {"content-type": "application/json", "x-request-id": rid}
    if api_key:
        headers["authorization"] = f"Bearer {api_key}"
    conn.request("POST", "/v1/chat/completions", json.dumps(body), headers)
    resp = conn.getresponse()
    data, cut = b"", False
    try:
        while chunk := resp.read1(65536):
            data += chunk
    except (http.client.IncompleteRead, ConnectionError) as exc:
        cut = True
        data += getattr(exc, "partial", b"") or b""
    finally:
        conn.close()
    done = b"[DONE]" in data
    return {"status": resp.status, "cut": cut or (resp.status == 200 and not done), "done": done,
            "elapsed_s": time.monotonic() - t0, "end_mono": time.monotonic(), "bytes": len(data)}


def _first_visible(raw: dict[str, Any]) -> tuple[float | None, bool]:
    """AIPerf's raw record -> (ms from request start to the first SSE chunk whose content is not whitespace,
    whether an earlier content chunk was whitespace only). deltatap's first content token is the first
    non-whitespace one; AIPerf's own TTFT also counts a whitespace-only first token."""
    leading_ws = False
    for resp in raw.get("responses") or ():
        for packet in resp.get("packets") or ():
            try:
                obj = json.loads(packet.get("value") or "")
            except ValueError:
                continue
            for ch in obj.get("choices") or () if isinstance(obj, dict) else ():
                d = ch.get("delta") or {}
                text = "".join(str(d.get(k) or "") for k in ("content", "reasoning_content"))
                if text and not text.isspace():
                    return (resp["perf_ns"] - raw["start_perf_ns"]) / 1e6, leading_ws
                leading_ws = leading_ws or bool(text)
    return None, leading_ws


def aiperf_records(path: Path) -> dict[str, dict[str, Any]]:
    """x_request_id -> {ttft_ms, visible_ttft_ms, whitespace_first, latency_ms, error} from AIPerf's profile_export.jsonl
    (and profile_export_raw.jsonl beside it, when AIPerf ran with --export-level raw)."""
    out = {}
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        rec = json.loads(line)
        meta, metrics = rec.get("metadata", {}), rec.get("metrics", {})
        ttft = metrics.get("time_to_first_token", {}).get("value")
        lat = metrics.get("request_latency", {}).get("value")
        out[meta["x_request_id"]] = {"ttft_ms": ttft, "visible_ttft_ms": None, "whitespace_first": None, "latency_ms": lat, "error": rec.get("error")}
    raw_path = path.with_name("profile_export_raw.jsonl")
    if raw_path.is_file():
        for line in raw_path.read_text().splitlines():
            if line.strip():
                raw = json.loads(line)
                rid = raw.get("metadata", {}).get("x_request_id")
                if rid in out:
                    out[rid]["visible_ttft_ms"], out[rid]["whitespace_first"] = _first_visible(raw)
    return out


def pt(row: Row, component: str, role: Role) -> int | None:
    obs = row.points.get(point(component, role))
    return None if obs is None else obs.unix_ns


def delta_ms(rows: list[Row], name: str) -> np.ndarray:
    return np.array([r.deltas[name].ns / 1e6 for r in rows if name in r.deltas])


def summary_ms(values: np.ndarray) -> dict[str, float]:
    if values.size == 0:
        return {"count": 0}
    return {"count": int(values.size), "p50": float(np.percentile(values, 50)), "p90": float(np.percentile(values, 90)),
            "p99": float(np.percentile(values, 99)), "min": float(values.min()), "max": float(values.max()),
            "mean": float(values.mean())}


# ------------------------------------------------------------------ starting a stack in a test


RUNS = ROOT / "runs" / "realstack-tests"


@dataclass
class Running:
    stack: RealStack
    collector: CollectorThread | None
    run_dir: Path


def require(config: str) -> None:
    """Skip loudly when a part of ``config`` is not installed."""
    missing = missing_tools(load_topology(ROOT / config))
    if missing:
        problems = os.environ.get("DELTATAP_REALSTACK_INSTALL_PROBLEMS", "")
        pytest.skip(f"REALSTACK PARTS NOT INSTALLED (run .ci/realstack): {'; '.join(missing)}"
                    + (f" | install problems: {problems}" if problems else ""))


def start_stack(config: str, name: str, *, taps: bool = True, collector: bool = True) -> Running:
    require(config)
    topo = with_free_ports(load_topology(ROOT / config))
    run_dir = RUNS / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    col = CollectorThread(topo, run_dir / "collector") if collector else None
    stack = RealStack(topo, ROOT / config, run_dir, taps=taps, otlp_grpc=col.grpc_hostport if col else None)
    try:
        stack.start()
    except BaseException:
        if col:
            col.close()
        raise
    return Running(stack, col, run_dir)


def stop_stack(r: Running) -> None:
    r.stack.stop()
    if r.collector:
        r.collector.close()

