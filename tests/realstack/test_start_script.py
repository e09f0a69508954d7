"""The documented one command (realstack/start.sh) brings the whole real stack up with taps and the
collector, serves a request end to end, and on SIGTERM stops everything and leaves the collector's report."""

from __future__ import annotations

import re
import signal
import subprocess
import time
import uuid

import pytest
import yaml
from realstack_support import ROOT, free_port, load_topology, require, stream_until_cut, with_free_ports

from deltatap.collector.sinks import read_rows

pytestmark = [pytest.mark.realstack, pytest.mark.timeout(240)]

CONFIG = "configs/realstack-envoy-litellm.yaml"


def test_start_script_runs_the_stack_and_writes_the_report(tmp_path):
    require(CONFIG)
    topo = with_free_ports(load_topology(ROOT / CONFIG))  # the config's ports, moved to free ones
    cfg = tmp_path / "realstack-envoy-litellm.yaml"
    cfg.write_text(yaml.safe_dump(topo.model_dump(mode="json", exclude_none=True), sort_keys=False))
    out = tmp_path / "runs"
    log = open(tmp_path / "start.log", "w+")  # noqa: SIM115 - closed below
    proc = subprocess.Popen([str(ROOT / "realstack" / "start.sh"), str(cfg), "--out", str(out),
                             "--otlp-grpc", f"127.0.0.1:{free_port()}", "--otlp-http", f"127.0.0.1:{free_port()}"],
                            stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)
    try:
        deadline = time.monotonic() + 150
        text = ""
        while time.monotonic() < deadline and proc.poll() is None:
            text = (tmp_path / "start.log").read_text()
            if "Ctrl-C stops everything" in text:
                break
            time.sleep(0.5)
        assert "Ctrl-C stops everything" in text, f"start.sh did not come up (exit {proc.poll()}):\n{text[-3000:]}"
        url = re.search(r"send requests to (http://\S+)/v1/chat/completions", text).group(1)
        key = re.search(r"Bearer (\S+)", text).group(1)
        assert url == f"http://{topo.links[0].tap.listen}", "requests must enter through the edge tap"
        rid = f"start-{uuid.uuid4()}"
        got = stream_until_cut(url, {"model": "gemma", "stream": True, "max_tokens": 8,
                                     "messages": [{"role": "user", "content": "Say hello."}]}, rid, api_key=key)
        assert got["status"] == 200 and got["done"], got
        time.sleep(6)  # span batches reach the collector
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        finally:
            log.close()
    assert proc.returncode == 0, (tmp_path / "start.log").read_text()[-3000:]
    report_dir = out / topo.name / "collector"
    assert (report_dir / "decomposition.md").is_file()
    rows = [r for r in read_rows(report_dir / "rows.jsonl") if r.request_id == rid]
    assert len(rows) == 1, f"the collector's rows have no single row for {rid}"
    assert {"envoy_inbound", "litellm_inbound", "engine_ttft"} <= set(rows[0].deltas)
