"""Session 23's probe leftovers fixed by the lead: an ``--otlp file:`` without a path, the stack's taps taking their
default admin port from the tap's one rule, and the clock sync naming the endpoint it could not reach."""

from __future__ import annotations

import asyncio
import socket

import pytest

from deltatap.core.clocksync import estimate_offset
from deltatap.core.config import ConfigError
from deltatap.core.topology import load_topology
from deltatap.telemetry.tracer import TelemetryConfigError, make_exporter


@pytest.mark.parametrize("value", ["file:", "file:  "])
def test_otlp_file_without_a_path_is_refused_in_one_line(value):
    # before: "deltatap tap: .: Is a directory" (the exporter opened the current directory for appending)
    with pytest.raises(TelemetryConfigError, match=r"--otlp file: needs a path"):
        make_exporter(value)


def test_otlp_file_with_a_path_still_writes_there(tmp_path):
    exp = make_exporter(f"file:{tmp_path / 'spans.jsonl'}")
    try:
        assert exp.path == tmp_path / "spans.jsonl"
    finally:
        exp.shutdown()


def _topology(tmp_path, listen: str):
    path = tmp_path / "topo.yaml"
    path.write_text(
        "topology:\n  name: t\n  components:\n    - {name: client, kind: client}\n"
        "    - {name: engine, kind: engine, url: 'http://127.0.0.1:8300'}\n"
        f"  links:\n    - {{name: edge, downstream: client, upstream: engine, tap: {{listen: '{listen}'}}}}\n"
    )
    return load_topology(path)


def test_stack_tap_default_admin_port_is_the_taps_rule(tmp_path):
    from deltatap.stack.chain import _tap_listen

    assert _tap_listen(_topology(tmp_path, "127.0.0.1:9100"), "edge", False) == ("127.0.0.1", 9100, 10100)
    # before: 65000 + 1000 = 66000, which the socket layer wrapped to port 464
    with pytest.raises(ConfigError, match=r"past 65535.*links\.edge\.tap\.admin"):
        _tap_listen(_topology(tmp_path, "127.0.0.1:65000"), "edge", False)


def test_clock_sync_names_the_endpoint_not_the_collector():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nothing listens there
    with pytest.raises(ConnectionError, match=rf"cannot reach the clock endpoint http://127\.0\.0\.1:{port}/v1/clock"):
        asyncio.run(estimate_offset(f"http://127.0.0.1:{port}", samples=1, timeout_s=1.0))


def test_listen_error_line_takes_the_systems_reason_and_says_what_to_do():
    from deltatap.core.config import listen_error_line

    wrapped = OSError(98, "error while attempting to bind on address ('127.0.0.1', 9100): address already in use")
    assert listen_error_line("--listen", "127.0.0.1", 9100, wrapped) == (
        "--listen 127.0.0.1:9100: cannot listen (Address already in use; another process listens there: stop it, "
        "or choose another port (0 takes a free one))")
    assert "below 1024 need root" in listen_error_line("--listen", None, 80, OSError(13, "permission denied"))
    assert "no interface" in listen_error_line("--admin", "10.9.9.9", 9000, OSError(99, "cannot assign"))


def test_workers_admin_port_in_use_is_one_line_and_no_unclosed_session(tmp_path):
    import subprocess
    import sys

    with socket.socket() as held, socket.socket() as free:
        held.bind(("127.0.0.1", 0))
        held.listen()
        free.bind(("127.0.0.1", 0))
        admin, listen = held.getsockname()[1], free.getsockname()[1]
        free.close()
        p = subprocess.run([sys.executable, "-m", "deltatap", "tap", "--link", "edge", "--upstream", "http://127.0.0.1:9",
                            "--listen", f"127.0.0.1:{listen}", "--admin", f"127.0.0.1:{admin}", "--workers", "2", "--otlp", "none"],
                           capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, p.stderr
    errors = [ln for ln in p.stderr.splitlines() if "WARNING" not in ln]  # (the upstream-unreachable warnings of each worker)
    assert errors == [f"deltatap tap: --admin 127.0.0.1:{admin}: cannot listen (Address already in use; another process "
                      "listens there: stop it, or choose another port (0 takes a free one))"], p.stderr
