"""`deltatap report` / `summary` / `collect` on what the real components write: a collector's output directory,
a load generator's (records.jsonl + run.json), an offline topology without tap addresses, unreadable files, and
a gRPC port already taken. One real run on loopback (engine, a tap on its link, collector, load generator) feeds
every test of the module: the load generator exports no spans, so its requests reach the collector only through
the tap, and `report --from` must join the records into the rows as the client's side."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from deltatap.app.cli import main
from deltatap.collector.ingest import load_topology_offline
from deltatap.core.config import ConfigError
from deltatap.core.topology import load_topology
from tests.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]
REQUESTS = 4
# client -> engine with a tap on the one link, and no tap.listen: an offline report never binds it
TOPOLOGY = """\
name: offline-two
components:
  - {name: client, kind: client, timeout_s: 30}
  - {name: engine, kind: engine}
links:
  - {name: edge, downstream: client, upstream: engine, tap: {}}
"""
SMALL_WORKLOAD = {
    "workload": "synthetic-uniform",
    "params": {"input": {"dist": "uniform", "min": 16, "max": 32}, "output": {"dist": "uniform", "min": 4, "max": 8}},
}


async def _run(base: Path, topo_path: Path) -> None:
    from deltatap.collector.pipeline import PipelineOptions
    from deltatap.collector.service import CollectorOptions, start_collector
    from deltatap.loadgen.options import LoadOptions
    from deltatap.loadgen.run import run_load
    from deltatap.proxy import TapOptions, start_tap
    from deltatap.stack import load_stack_config, start_engine
    from deltatap.telemetry.tracer import setup_telemetry

    topo = load_topology_offline(topo_path)
    cfg = load_stack_config(ROOT / "configs" / "demo.yaml")
    collector = await start_collector(CollectorOptions(otlp_grpc=None, otlp_http="127.0.0.1:0", metrics=None, topology=topo,
                                                       out_dir=base / "collector", rows_format="parquet",
                                                       # (no client span: each trace is an orphan, closed this long after its
                                                       # last span - the default grace of a rooted trace - not the default 10 s)
                                                       pipeline=PipelineOptions(grace_s=0.3, orphan_wait_s=2.0)))
    tels = [setup_telemetry(n, otlp=collector.otlp_http_url) for n in ("deltatap-engine", "deltatap-tap-edge")]
    client_tel = setup_telemetry("deltatap-loadgen", otlp="none")  # the load generator's spans go nowhere
    engine = tap = None
    try:
        engine = await start_engine(cfg.engine, tels[0], "127.0.0.1:0")
        tap = await start_tap(TapOptions(link="edge", upstream=engine.url, listen_port=0, admin_port=None, downstream="client",
                                         upstream_name="engine", downstream_kind="client", upstream_kind="engine"), tels[1])
        opts = LoadOptions(target=tap.url, model=cfg.engine.models[0], workload=SMALL_WORKLOAD, concurrency=2, requests=REQUESTS,
                           out=str(base / "load"), progress=False, gpu=False, request_timeout_s=20)
        await run_load(opts, client_tel)
        await asyncio.gather(*(asyncio.to_thread(t.processor.force_flush, 5_000) for t in tels))
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and len(collector.rows()) < REQUESTS:
            await asyncio.sleep(0.1)
        await collector.drain()
    finally:
        if tap is not None:
            await tap.close()
        if engine is not None:
            await engine.close()
        await asyncio.gather(*(asyncio.to_thread(t.shutdown) for t in [*tels, client_tel]))
        await collector.close()


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    base = tmp_path_factory.mktemp("offline")
    topo_path = base / "topology.yaml"
    topo_path.write_text(TOPOLOGY)
    asyncio.run(asyncio.wait_for(_run(base, topo_path), 90))
    assert (base / "collector" / "rows.parquet").is_file() and (base / "collector" / "sketches.json").is_file()
    assert (base / "load" / "records.jsonl").is_file() and (base / "load" / "run.json").is_file()
    return base, topo_path


def _cli(*args: str, columns: int = 80, timeout: float = 90) -> subprocess.CompletedProcess:
    """The real command line, stdout piped (not a terminal)."""
    env = {**os.environ, "COLUMNS": str(columns), "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "deltatap.app.cli", *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)


# ------------------------------------------------------------------ report --from DIR / records.jsonl


def test_report_reads_collector_and_loadgen_directories_and_joins_records(run, capsys):
    base, topo = run
    coll, load = base / "collector", base / "load"
    assert main(["report", "--from", str(coll), str(load), "--topology", str(topo), "--format", "json"]) == 0
    cap = capsys.readouterr()
    summary = json.loads(cap.out)
    lines = cap.err.splitlines()
    assert any(x.startswith(f"--from {coll}: collector output; using rows.parquet ({REQUESTS} rows)") and "not used: sketches.json" in x for x in lines), lines
    assert any(x.startswith(f"--from {load}: load-generator output; using records.jsonl ({REQUESTS} measured requests") for x in lines), lines
    assert f"load-generator records: {REQUESTS} joined into their rows (client points added)" in lines
    # the rows had only the edge tap's approximation of the client's points; joined, TTFT is the client's own
    want = sorted((r["first_token_unix_ns"] - r["request_written_unix_ns"]) / 1e6 for r in map(json.loads, (load / "records.jsonl").read_text().splitlines()))
    assert summary["system_ttft"]["count"] == REQUESTS
    assert summary["system_ttft"]["min_ms"] == pytest.approx(want[0]) and summary["system_ttft"]["max_ms"] == pytest.approx(want[-1])
    assert summary["tap_edge_request"]["count"] == REQUESTS and summary["residual"]["count"] == REQUESTS
    # named twice (the directory and the file in it): counted once
    assert main(["report", "--from", str(coll), str(load), str(load / "records.jsonl"), "--topology", str(topo), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["system_ttft"]["count"] == REQUESTS


def test_report_from_records_jsonl_alone(run, capsys):
    base, topo = run
    rec = base / "load" / "records.jsonl"
    assert main(["report", "--from", str(rec), "--topology", str(topo), "--format", "json"]) == 0
    cap = capsys.readouterr()
    assert f"--from {rec}: load-generator records; using {REQUESTS} measured requests as client-side records" in cap.err
    summary = json.loads(cap.out)
    want = sorted((r["first_token_unix_ns"] - r["request_written_unix_ns"]) / 1e6 for r in map(json.loads, rec.read_text().splitlines()))
    assert summary["system_ttft"]["count"] == REQUESTS
    assert summary["system_ttft"]["min_ms"] == pytest.approx(want[0]) and summary["system_ttft"]["max_ms"] == pytest.approx(want[-1])


def test_a_directory_with_nothing_to_read_is_one_clear_line(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("hello")
    assert main(["report", "--from", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "neither a collector's output directory" in err


# ------------------------------------------------------------------ offline topology


def test_offline_topology_needs_no_tap_listen(run):
    _, topo = run
    with pytest.raises(ConfigError, match="listen"):
        load_topology(topo)  # the live tap still needs its address
    t = load_topology_offline(topo)
    assert [x.name for x in t.links] == ["edge"] and t.links[0].tap is not None


# ------------------------------------------------------------------ summary: C.1 from run.json


@pytest.fixture(scope="module")
def summary_cli(run, tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    """``deltatap summary`` of the run's collector directory and load-generator records, piped at 80 columns, with
    ``--out``: what it printed and the directory it wrote (read by two tests: one interpreter start, not two)."""
    base, topo = run
    out = tmp_path_factory.mktemp("summary") / "out"
    p = _cli("summary", str(base / "collector"), "--records", str(base / "load" / "records.jsonl"), "--topology", str(topo), "--out", str(out))
    return p, out


def test_summary_fills_appendix_c1_from_the_loadgen_run_json(run, summary_cli):
    base, topo = run
    p, out = summary_cli
    assert p.returncode == 0, p.stderr
    doc = json.loads((out / "report.json").read_text())
    c1 = {r["field"]: r["value"] for r in doc["sections"]["minimum"]["tables"]["minimum"]["rows"]}
    run_json = json.loads((base / "load" / "run.json").read_text())
    assert c1["Model"] == "deltatap-ref"
    assert c1["Workload"] == "synthetic-uniform"
    assert c1["Load Model"] == f"closed-loop concurrency 2, {REQUESTS} requests"
    assert c1["SUT Boundary"].startswith("compound: everything behind " + run_json["options"]["target"])
    prov = run_json["provenance"]  # deltatap.core.provenance: C.1 filled from it
    assert run_json["options"]["target"] in c1["Software"] and f"({prov['suite_version']})" in c1["Software"]
    assert c1["Hardware"] == prov["hardware"]["accelerator_summary"] and c1["Seed"] == str(run_json["seed"])
    assert not [k for k, v in c1.items() if v == "unknown"], c1
    # the minimum report is printed once (the text block), not again as a table
    assert p.stdout.count("=== LLM Benchmark Report (Minimum) ===") == 1 and "Minimum viable report (Appendix C.1)" not in p.stdout
    assert (out / "report.md").read_text().count("Model: deltatap-ref") == 1
    # two inter-token figures, two names
    assert "ITL (per request) P50" in p.stdout and "inter-chunk gap P50" in p.stdout and "ITL P50" not in p.stdout


def test_piped_output_at_80_columns_is_not_cropped(run, summary_cli):
    base, topo = run
    p = _cli("report", "--from", str(base / "collector"), str(base / "load"), "--topology", str(topo))
    assert p.returncode == 0, p.stderr
    assert "…" not in p.stdout
    for name in ("tap_edge_first_token", "output_path_overhead_last", "Residual (network + interaction)"):
        assert name in p.stdout, name
    p = summary_cli[0]
    assert p.returncode == 0, p.stderr
    assert "…" not in p.stdout and "tap_edge_first_token" in p.stdout


# ------------------------------------------------------------------ unreadable inputs


def _garbage(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(bytes(range(256)) * 8 + b"\xff\xfe\x00garbage")
    return path


@pytest.mark.parametrize("name", ["garbage.bin", "fake.parquet", "fake.csv", "fake.jsonl", "fake.json", "dir/rows.parquet"])
@pytest.mark.parametrize("command", ["report", "summary"])
def test_unreadable_input_is_one_line_and_exit_2(tmp_path, capsys, name, command):
    f = _garbage(tmp_path / name)
    target = f.parent if name.startswith("dir/") else f
    args = ["report", "--from", str(target)] if command == "report" else ["summary", str(target)]
    assert main(args) == 2  # no exception escapes
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(f) in err and "expected" in err, err
    assert "Traceback" not in err and "UnicodeDecodeError" not in err and "ArrowInvalid" not in err


def test_unreadable_run_json_and_records_beside_good_rows(run, tmp_path, capsys):
    base, _ = run
    d = tmp_path / "r"
    d.mkdir()
    (d / "rows.parquet").write_bytes((base / "collector" / "rows.parquet").read_bytes())
    _garbage(d / "run.json")
    assert main(["summary", str(d)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{d / 'run.json'}: not a text file" in err
    (d / "run.json").unlink()
    _garbage(d / "records.jsonl")
    assert main(["summary", str(d)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{d / 'records.jsonl'}: not a text file" in err and "records.jsonl (JSON lines" in err


def test_unreadable_input_from_the_command_line_prints_no_traceback(tmp_path):
    f = _garbage(tmp_path / "fake.parquet")
    p = _cli("report", "--from", str(f))
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.count("\n") == 1 and "not a readable Parquet file" in p.stderr and "Traceback" not in p.stderr


# ------------------------------------------------------------------ collect: gRPC port in use


def test_collect_with_grpc_port_in_use_is_one_clean_line(tmp_path):
    port = free_port()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        p = _cli("collect", "--otlp-grpc", f"127.0.0.1:{port}", "--otlp-http", "none", "--metrics", "none",
                 "--out", str(tmp_path / "c"), "--duration", "1", timeout=60)
    assert p.returncode == 2
    assert p.stderr == f"deltatap collect: --otlp-grpc 127.0.0.1:{port}: cannot listen (Address already in use; another process listens there: stop it, or choose another port (0 takes a free one))\n", p.stderr


def test_collect_records_provenance_and_c1_uses_it_without_records(run, tmp_path):
    """The collector's provenance.json (deltatap.core.provenance): the senders' versions from their spans, the models
    asked for, the topology hash; C.1 of a collector directory alone takes Model, Hardware and Software from it."""
    base, topo = run
    prov = json.loads((base / "collector" / "provenance.json").read_text())
    assert prov["tool"] == "deltatap collect" and prov["models"] == ["deltatap-ref"] and len(prov["topology_sha256"]) == 64
    assert {"deltatap-tap-edge", "engine"} <= set(prov["components"]) and prov["hardware"]["fingerprint_hash"]  # the senders here
    out = tmp_path / "out"
    p = _cli("summary", str(base / "collector"), "--topology", str(topo), "--out", str(out), "--quiet")
    assert p.returncode == 0, p.stderr
    doc = json.loads((out / "report.json").read_text())
    c1 = {r["field"]: r["value"] for r in doc["sections"]["minimum"]["tables"]["minimum"]["rows"]}
    assert c1["Model"] == "deltatap-ref" and c1["Hardware"] == prov["hardware"]["accelerator_summary"]
    assert "deltatap-tap-edge" in c1["Software"] and c1["Suite Version"] == prov["suite_version"]
