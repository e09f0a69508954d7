"""``deltatap bench throughput-latency`` against a real engine: llama.cpp (llama-server, 4 slots) behind a deltatap tap,
a 3-level open-loop sweep through the tap, the tap's spans joined by the bench's own collector (OTLP/gRPC).

Checks what must hold whatever the machine's speed: every level has its requests answered, the bench's collector
joined a row per request with the engine's TTFT from the tap's points, and the report carries the table of §5.3.5,
the decomposition per level and the compliance table. Figures of the run go to docs/bench.md, not into assertions.
"""

from __future__ import annotations

import os
import time

import pytest
import yaml
from realstack_support import ROOT, RUNS, require
from rich.console import Console

pytestmark = [pytest.mark.realstack, pytest.mark.timeout(600)]
CONFIG = "configs/bench/realstack-llama.yaml"


async def test_bench_sweep_through_a_tap_in_front_of_llamacpp(tmp_path):
    from launch import RealStack, load_topology, with_free_ports
    from procs import free_port

    from deltatap.app.bench.cli import run_bench
    from deltatap.app.cli import build_parser

    require(CONFIG)
    topo = with_free_ports(load_topology(ROOT / CONFIG))
    grpc = f"127.0.0.1:{free_port()}"
    run_dir = RUNS / f"bench-llama-{time.strftime('%Y%m%d-%H%M%S')}"
    stack = RealStack(topo, ROOT / CONFIG, run_dir, taps=True, otlp_grpc=grpc).start()
    try:
        topo_file = tmp_path / "topology.yaml"
        topo_file.write_text(yaml.safe_dump(topo.model_dump(mode="json", exclude_none=True), sort_keys=False), encoding="utf-8")
        args = build_parser().parse_args(["bench", "throughput-latency", "--target", stack.entry_url, "--collect", f"grpc://{grpc}",
                                          "--topology", str(topo_file), "--quick", "--probe-concurrency", "4", "--levels", "0.3,0.7,1.2",
                                          "--duration", "8", "--warmup", "4", "--output-tokens", "24", "--out", str(run_dir / "bench")])
        report, files, ctx = await run_bench("throughput_latency", args, Console(file=open(os.devnull, "w"), width=200))
    finally:
        stack.stop()
    levels = report.section("results").table("levels").records()
    assert len(levels) == 3
    for lv in levels:
        assert lv["success"] == 1.0 and lv["requests"] >= 8, lv
        assert lv["ttft_p50_ms"] > 0 and lv["achieved_tok_s"] > 0
    decomp = report.section("components").table("decomposition_p50")
    engine = decomp.row_by("component", "Model Engine")
    assert all(engine[f"l{i}"] is not None and engine[f"l{i}"] > 0 for i in range(3)), engine
    assert report.section("results").data["capacity_rps"] > 0
    assert files["json"].is_file() and (run_dir / "bench" / "bench.json").is_file()
