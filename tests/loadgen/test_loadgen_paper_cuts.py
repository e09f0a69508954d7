"""A newcomer's first runs (issue 13): the model the target lists, non-2xx answers with their status and the
server's own message, an unreachable target named with its reason, the warm-up stopping on 100 % errors,
help texts, the GPU log level and the ITL names in the summary.

Real servers on 127.0.0.1: the reference engine (deltatap.stack) and the loadgen test server."""

from __future__ import annotations

import argparse
import io
import json
import logging
import re
import socket
from pathlib import Path

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from rich.console import Console

from loadgen_server import load_cli as _cli
from deltatap.loadgen import LoadAborted, LoadOptions, run_load
from deltatap.loadgen.client import models_url, server_message
from deltatap.loadgen.gpu import GpuSampler, no_gpu_log_level, nvidia_gpu_present
from deltatap.loadgen.progress import print_summary
from deltatap.loadgen.records import read_records
from deltatap.telemetry.tracer import setup_telemetry

ROOT = Path(__file__).resolve().parents[2]
SMALL = {"workload": "synthetic-uniform", "params": {"input": {"dist": "fixed", "value": 16},
                                                     "output": {"dist": "fixed", "value": 3}}}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def opts(url: str, **kw) -> LoadOptions:
    base = dict(target=url, progress=False, gpu=False, workload=SMALL, seed=5)
    base.update(kw)
    return LoadOptions(**base)


def printed(summary: dict, width: int = 200) -> str:
    buf = io.StringIO()
    print_summary(summary, Console(file=buf, width=width, color_system=None))
    return buf.getvalue()


@pytest.fixture
async def engine():
    """The reference engine serving deltatap-ref (first) and tiny-ref, on a free loopback port."""
    from deltatap.stack.config import EngineConfig
    from deltatap.stack.engine.app import start_engine

    cfg = EngineConfig.model_validate({"models": ["deltatap-ref", "tiny-ref"], "scheduler": {
        "prefill_base_ms": 1.0, "prefill_per_token_ms": 0.0, "decode_base_ms": 2.0, "decode_per_seq_ms": 0.0}})
    tel = setup_telemetry("deltatap-test-engine", exporter=InMemorySpanExporter())
    running = await start_engine(cfg, tel, "127.0.0.1:0")
    try:
        yield running.url
    finally:
        await running.close()
        tel.shutdown()




# --------------------------------------------------------------------------- 1. the model the target lists


async def test_without_model_the_first_listed_model_is_used_and_named(engine, telemetry, tmp_path):
    said: list[str] = []
    res = await run_load(opts(engine, concurrency=2, requests=4, out=str(tmp_path)), telemetry, say=said.append)
    assert res.summary["request_count"] == 4, res.summary["problems"]
    assert len(said) == 1 and "'deltatap-ref'" in said[0] and "/v1/models" in said[0]
    run = json.loads((tmp_path / "run.json").read_text())
    assert run["model"] == "deltatap-ref" and run["model_source"] == "listed"


async def test_cli_without_model_says_which_model_it_picked(engine, tmp_path):
    rc, _out, err = await _cli("--target", engine, "--requests", "3", "--no-progress", "--no-gpu",
                               "--workload", "synthetic-uniform", "--otlp", "none", "--out", str(tmp_path))
    assert rc == 0, err
    picked = [line for line in err.splitlines() if line.startswith("deltatap load:") and "model" in line]
    assert len(picked) == 1 and "using model 'deltatap-ref'" in picked[0]
    assert all(r["status"] == "ok" for r in read_records(tmp_path / "records.jsonl"))


@pytest.mark.parametrize(("models", "why"), [(None, "HTTP 500: model list unavailable"), ([], "lists no model")])
async def test_without_model_a_failing_or_empty_list_falls_back_to_the_default(sse_server, telemetry, models, why):
    state, url = sse_server
    state.models, state.tokens = models, 2
    said: list[str] = []
    res = await run_load(opts(url, concurrency=1, requests=2), telemetry, say=said.append)
    assert state.models_asked == 1
    assert len(said) == 1 and why in said[0] and "falling back to model 'default'" in said[0]
    assert {s.body["model"] for s in state.seen} == {"default"}
    assert res.summary["run"]["model"] == "default" and res.summary["run"]["model_source"] == "default"


async def test_a_given_model_is_sent_without_asking_the_target(sse_server, telemetry):
    state, url = sse_server
    state.tokens = 2
    said: list[str] = []
    res = await run_load(opts(url, concurrency=1, requests=2, model="mine"), telemetry, say=said.append)
    assert said == [] and state.models_asked == 0
    assert {s.body["model"] for s in state.seen} == {"mine"}
    assert res.summary["run"]["model_source"] == "given"


def test_models_url_of_base_and_endpoint_urls():
    assert models_url("http://h:1/v1/chat/completions") == "http://h:1/v1/models"
    assert models_url("http://h:1/prefix/v1/completions") == "http://h:1/prefix/v1/models"
    assert models_url("http://h:1/bad/500") == "http://h:1/v1/models"


# --------------------------------------------------------------------------- 2. non-2xx: status and message


async def test_404_is_reported_with_its_status_and_the_servers_message(engine, telemetry, tmp_path):
    res = await run_load(opts(engine, model="default", concurrency=2, requests=6, out=str(tmp_path)), telemetry)
    recs = read_records(tmp_path / "records.jsonl")
    assert all(r["http_status"] == 404 and r["error_kind"] == "http_status" for r in recs)
    assert all(r["server_message"].startswith("The model 'default' does not exist") for r in recs)
    (group,) = res.summary["problems"]
    assert group["kind"] == "http_status" and group["http_status"] == 404 and group["count"] == 6
    text = printed(res.summary)
    assert "problems: HTTP 404 x6: The model 'default' does not exist" in text
    assert not re.search(r"http_status \d", text)  # never a count that reads like an HTTP status


@pytest.mark.parametrize(
    ("path", "line"),
    [
        ("/bad/500", "problems: HTTP 500 x4: boom"),
        ("/bad/404-text", "problems: HTTP 404 x4: no such route here"),
        ("/bad/refused", "problems: refused (HTTP 403) x4: blocked by policy"),
    ],
)
async def test_error_bodies_give_the_message_json_or_text(sse_server, telemetry, path, line):
    _state, url = sse_server
    res = await run_load(opts(url + path, concurrency=2, requests=4), telemetry)
    assert line in printed(res.summary)


async def test_a_long_error_page_is_cut_to_about_200_characters(sse_server, telemetry):
    _state, url = sse_server
    res = await run_load(opts(url + "/bad/502-html", concurrency=1, requests=2), telemetry)
    msg = res.records[0]["server_message"]
    assert msg.startswith("<html><body>bad gateway") and msg.endswith("...") and len(msg) <= 200
    assert res.summary["problems"][0]["text"].startswith("HTTP 502 x2: <html>")


def test_server_message_forms():
    assert server_message(b'{"error": {"message": "m1", "type": "x"}}') == "m1"
    assert server_message(b'{"error": "m2"}') == "m2"
    assert server_message(b'{"detail": "m3"}') == "m3"
    assert server_message(b'{"other": 1}') == '{"other": 1}'
    assert server_message(b"") is None


# --------------------------------------------------------------------------- 3. unreachable: what and why


async def test_unreachable_target_names_the_address_and_the_reason(telemetry):
    port = free_port()  # nothing listens there
    res = await run_load(opts(f"http://127.0.0.1:{port}", concurrency=2, requests=5), telemetry)
    line = f"cannot connect to 127.0.0.1:{port} (connection refused) - 5 requests; is the server running?"
    assert res.summary["problems"][0]["text"] == line
    assert f"problems: {line}" in printed(res.summary)
    assert "unreachable 5" not in printed(res.summary)


@pytest.mark.parametrize("flags, line", [
    (("--rate", "1", "--duration", "inf"), "  - --duration: Input should be a finite number"),
    (("--rate", "nan", "--duration", "1"), "  - --rate: Input should be a finite number"),
    (("--concurrency", "1", "--requests", "1", "--request-timeout", "inf"), "  - --request-timeout: Input should be a finite number"),
])
async def test_cli_refuses_infinite_and_nan_seconds_and_rates(flags, line):
    """An infinite --duration planned an overflowing request count (a traceback); NaN slipped through gt=0."""
    port = free_port()  # (never reached: refused before anything starts)
    rc, out, err = await _cli("--target", f"http://127.0.0.1:{port}", *flags, "--no-progress", "--no-gpu", "--otlp", "none")
    assert rc == 2 and out == "" and "Traceback" not in err
    assert err.splitlines()[0] == "deltatap load: its flags: invalid configuration"
    assert any(x.startswith(line) for x in err.splitlines()), err


async def test_cli_refuses_an_out_that_is_a_file_before_the_run(sse_server, tmp_path):
    """--out naming a file failed only when the records were written, after the whole run: refused up front now."""
    state, url = sse_server
    path = tmp_path / "afile"
    path.write_text("x")
    rc, out, err = await _cli("--target", url, "--model", "m", "--requests", "2", "--warmup", "0", "--no-progress",
                              "--no-gpu", "--otlp", "none", "--out", str(path))
    assert rc == 2 and out == "" and "Traceback" not in err
    assert err.strip() == f"deltatap load: --out {path}: already exists and is not a directory; name a directory, or a new path"
    assert state.seen == [] and state.models_asked == 0  # (nothing was sent)


# --------------------------------------------------------------------------- 4. warm-up stops on 100 % errors


async def test_warmup_with_every_request_failing_stops_the_run(sse_server, telemetry, tmp_path):
    state, url = sse_server
    with pytest.raises(LoadAborted, match=r"warm-up: all 7 requests failed, nothing measured: HTTP 500 x7: boom"):
        await run_load(opts(url + "/bad/500", concurrency=2, requests=50, warmup_requests=5, warmup_probes=2,
                            out=str(tmp_path)), telemetry)
    assert state.errors_sent == 7  # 2 probes + 5 warm-up requests; no further rounds, nothing measured
    assert len(read_records(tmp_path / "warmup.jsonl")) == 7
    assert not (tmp_path / "records.jsonl").exists()


async def test_cli_warmup_failure_is_one_line_and_a_non_zero_exit(engine):
    rc, out, err = await _cli("--target", engine, "--model", "default", "--requests", "5", "--warmup", "3",
                              "--warmup-probes", "2", "--no-progress", "--no-gpu", "--otlp", "none")
    assert rc == 1 and out == ""
    assert "Traceback" not in err
    (line,) = [x for x in err.splitlines() if "warm-up" in x]
    assert line.startswith("deltatap load: warm-up: all 5 requests failed") and "HTTP 404 x5: The model 'default' does not exist" in line


async def test_a_warmup_of_refusals_is_not_a_failure(sse_server, telemetry):
    _state, url = sse_server  # a guardrail refusing everything answers: the run goes on and reports it
    res = await run_load(opts(url + "/bad/refused", concurrency=1, requests=2, warmup_requests=2, warmup_probes=2), telemetry)
    assert res.summary["status_counts"] == {"refused": 2}


# --------------------------------------------------------------------------- 5. help texts


def _load_parser() -> argparse.ArgumentParser:
    from deltatap.app.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["load"]


def _loadgen_texts() -> list[str]:
    from deltatap.loadgen.workloads import WORKLOADS
    from deltatap.loadgen.workloads import lengths
    from deltatap.loadgen.workloads.base import WorkloadFile

    p = _load_parser()
    texts = [p.description or ""] + [a.help or "" for a in p._actions]
    texts += [f.description or "" for f in LoadOptions.model_fields.values()]
    texts += [WorkloadFile.__doc__ or ""] + [getattr(lengths, n).__doc__ or "" for n in ("Fixed", "Uniform", "LogNormal", "Choice")]
    for entry in WORKLOADS.values():
        texts.append(entry.description or "")
        texts += [f.description or "" for f in entry.params.model_fields.values()]
    return texts


def test_every_load_flag_has_help():
    missing = [a.option_strings for a in _load_parser()._actions if a.option_strings and not a.help]
    assert missing == []


def test_load_texts_are_plain_and_grammatical():
    for text in _loadgen_texts():
        assert "``" not in text, text
        assert not re.search(r"\ba [aeio]\w", text), text  # "a engine"


def test_every_load_option_is_described():
    assert [n for n, f in LoadOptions.model_fields.items() if not f.description] == []


# --------------------------------------------------------------------------- 6. no GPU: INFO, not WARNING


async def test_a_machine_without_gpu_logs_no_warning(sse_server, telemetry, caplog):
    probe = GpuSampler()
    if probe.available or nvidia_gpu_present():
        probe.stop()
        pytest.skip("this machine has an NVIDIA GPU")
    state, url = sse_server
    state.tokens = 2
    with caplog.at_level(logging.DEBUG, logger="deltatap"):
        res = await run_load(opts(url, concurrency=1, requests=2, gpu=True), telemetry)
    assert res.summary["gpu"]["available"] is False
    loud = [r for r in caplog.records if r.name.startswith("deltatap.loadgen") and r.levelno >= logging.WARNING]
    assert loud == []
    assert any("no GPU metrics" in r.getMessage() and r.levelno == logging.INFO for r in caplog.records)


def test_nvml_failing_where_a_gpu_is_present_is_a_warning():
    assert no_gpu_log_level(gpu_present=True) == logging.WARNING
    assert no_gpu_log_level(gpu_present=False) == logging.INFO


# --------------------------------------------------------------------------- 7. ITL: one definition per name


async def test_summary_names_the_two_itl_figures_apart(sse_server, telemetry):
    state, url = sse_server
    state.first_ms, state.interval_ms, state.tokens = 2.0, 1.0, 4
    res = await run_load(opts(url, concurrency=2, requests=4), telemetry)
    assert "per request" in res.summary["itl_method"] and "deltatap report calls the inter-chunk gap" in res.summary["itl_method"]
    for width in (80, 200):
        text = printed(res.summary, width)
        assert "ITL per request, AIPerf (ms)" in text and "chunk gaps (ms)" in text
        assert "ITL (ms)" not in text and "ICL" not in text
        assert "…" not in text  # piped at 80 columns, no cell is cut
    assert "p99.9" in printed(res.summary, 200)
