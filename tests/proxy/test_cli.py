"""``deltatap tap``: options from flags and topology files, clear errors, SIGTERM in a real process."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

import aiohttp
import pytest
from tap_helpers import free_port

from deltatap.app.cli import build_parser
from deltatap.core.config import ConfigError
from deltatap.core.topology import load_topology
from deltatap.proxy.cli import build_options
from deltatap.proxy.errors import classify
from deltatap.net.h1 import Reader
from deltatap.proxy.headers import rewrite_request_head
from deltatap.proxy.options import TapOptions, options_from_topology

REPO = Path(__file__).resolve().parents[2]


def opts(*argv: str) -> TapOptions:
    return build_options(build_parser().parse_args(["tap", *argv]))


def test_flags_default_link_names_ports_and_kinds():
    o = opts("--link", "gw-fw", "--upstream", "http://127.0.0.1:8200")
    assert (o.listen_host, o.listen_port, o.admin_port) == ("127.0.0.1", 9200, 10200)
    assert (o.downstream, o.downstream_kind, o.upstream_name, o.upstream_kind) == ("gateway", "gateway", "firewall", "firewall")
    o = opts("--link", "cache-hop", "--listen", "127.0.0.1:0", "--upstream", "https://x.example/v1", "--downstream", "router",
             "--upstream-name", "cache", "--no-admin", "--label", "run=a", "--insecure", "--timeout-s", "3")
    assert o.admin_port is None and o.labels == {"run": "a"} and not o.verify_tls and o.timeout_s == 3
    assert (o.downstream_kind, o.upstream_kind) == ("router", "cache")


def test_topology_file(tmp_path):
    cfg = REPO / "configs" / "demo.yaml"
    o = opts("--config", str(cfg), "--link", "fw-engine")
    assert (o.listen_port, o.admin_port, o.upstream) == (9300, 10300, "http://127.0.0.1:8300")
    o = options_from_topology(load_topology(cfg), "edge", listen_port=0, upstream="http://127.0.0.1:1")
    assert o.listen_port == 0 and o.upstream == "http://127.0.0.1:1" and o.upstream_kind == "gateway"
    with pytest.raises(ConfigError, match="no link 'nope'"):
        opts("--config", str(cfg), "--link", "nope")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--link", "edge"], "--upstream URL is required"),
        (["--link", "custom", "--upstream", "http://h:1"], "--listen HOST:PORT is required"),
        (["--link", "edge", "--upstream", "ftp://h"], "must be an http:// or https:// URL"),
        (["--link", "edge", "--upstream", "http://h:1", "--listen", "nohost"], "must be HOST:PORT"),
        (["--link", "edge", "--upstream", "http://h:1", "--timeout-s", "0"], "--timeout-s: must be > 0"),
        (["--link", "edge", "--upstream", "http://h:1", "--upstream-kind", "blender"], "not a component kind"),
        (["--link", "edge", "--upstream", "http://h:1", "--label", "novalue"], "expected KEY=VALUE"),
    ],
)
def test_bad_input_errors_name_the_flag(argv, message):
    with pytest.raises(ConfigError, match=message):
        opts(*argv)


def test_sans_io_pieces():
    raw = (b"POST /v1/x?q HTTP/1.1\r\nhost: a\r\nConnection: close, X-A\r\nX-A: 1\r\nTraceParent: 00-" + b"9" * 32 + b"-" + b"8" * 16
           + b"-01\r\nTE: trailers\r\nExpect: 100-continue\r\nX-B: \xe9\r\n\r\n")
    ((_k, _s, _e, head),) = Reader(True).feed(raw)[:1]
    tp = "00-" + "1" * 32 + "-" + "2" * 16 + "-01"
    out, rid, created = rewrite_request_head(head, correlation_header=b"x-request-id", trace_headers={"traceparent": tp}, host_header=b"h",
                                             target_prefix=b"/p")
    assert created and len(rid) == 32
    assert out == (b"POST /p/v1/x?q HTTP/1.1\r\nConnection: close, X-A\r\nX-A: 1\r\nTE: trailers\r\nExpect: 100-continue\r\nX-B: \xe9\r\n"
                   b"Host: h\r\ntraceparent: " + tp.encode() + b"\r\nx-request-id: " + rid.encode() + b"\r\n\r\n")
    same, rid2, created2 = rewrite_request_head(Reader(True).feed(b"GET / HTTP/1.1\nX-Request-Id: r1\n\n")[0][3], correlation_header=b"x-request-id",
                                                trace_headers={"traceparent": tp})
    assert (rid2, created2) == ("r1", False) and same == b"GET / HTTP/1.1\nX-Request-Id: r1\ntraceparent: " + tp.encode() + b"\n\n"
    f = classify(ConnectionResetError())
    assert (f.status, f.outcome.value, f.error_type) == (502, "upstream_error", "upstream_reset")
    assert classify(asyncio.TimeoutError()).status == 504
    doc = json.loads(f.body("edge", "http://u"))["error"]
    assert doc["source"] == "deltatap" and doc["link"] == "edge"


async def test_cli_process_serves_and_drains_on_sigterm(upstream, tmp_path):
    port = free_port()
    spans = tmp_path / "spans.jsonl"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "deltatap.app.cli", "tap", "--link", "edge", "--listen", f"127.0.0.1:{port}", "--admin", "127.0.0.1:0",
        "--upstream", upstream.url, "--otlp", f"file:{spans}", "--grace-s", "5",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=env,
    )
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), 30)
        assert f"http://127.0.0.1:{port}" in line.decode()
        async with aiohttp.ClientSession() as s:
            async with s.post(f"http://127.0.0.1:{port}/v1/chat/completions?first_ms=1&gap_ms=50&n=6", json={"model": "m"}) as r:
                await r.content.readuntil(b'"t0"')
                proc.send_signal(signal.SIGTERM)  # mid-stream: the stream must still finish
                rest = await r.read()
        assert rest.endswith(b"data: [DONE]\n\n") and b'"t5"' in rest
        assert await asyncio.wait_for(proc.wait(), 20) == 0
        out = (await proc.stdout.read()).decode()
        assert "spans exported 1, dropped 0" in out
        doc = json.loads(spans.read_text().splitlines()[0])
        span = doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
        assert span["name"] == "deltatap.tap edge" and any(e["name"] == "first_token.received" for e in span["events"])
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
