"""``deltatap tap`` fed bad flags (found by probing it, session 23): each gets one line on stderr and exit 2, before any
socket is opened or process forked; never a traceback, never a tap that starts and then fails every connection."""

from __future__ import annotations

import asyncio
import logging

import pytest

import deltatap.proxy.cli as tap_cli
import deltatap.proxy.workers as tap_workers
from deltatap.app.cli import main
from deltatap.core.config import ConfigError
from deltatap.proxy.options import TapOptions, default_admin_port

BASE = ["tap", "--link", "edge", "--upstream", "http://127.0.0.1:9", "--listen", "127.0.0.1:0", "--otlp", "none"]


@pytest.fixture
def no_start(monkeypatch):
    """A tap that passed its checks would start here: the test fails instead of serving (or forking)."""

    def started(*_a, **_k):
        raise AssertionError("the tap started: the flags were not refused")

    monkeypatch.setattr(tap_cli.aio, "run", started)
    monkeypatch.setattr(tap_workers, "run_workers", started)


def _one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("deltatap tap: "), err
    return lines[0]


@pytest.mark.parametrize("flags, names", [
    # before: nan started a tap whose every accepted connection was reset with a traceback (call_at(nan));
    # inf was taken (a timer that overflows, a grace that never ends)
    (["--header-timeout-s", "nan"], "--header-timeout-s"),
    (["--header-timeout-s", "inf"], "--header-timeout-s"),
    (["--timeout-s", "nan"], "--timeout-s"),
    (["--timeout-s", "inf"], "--timeout-s"),
    (["--grace-s", "nan"], "--grace-s"),
    (["--grace-s", "inf"], "--grace-s"),
    # before: forked as many tap processes as asked (100000 took the host to a load of 390)
    (["--workers", "100000"], "--workers"),
    # before: written into every forwarded request head as given (a header injected upstream)
    (["--host-header", "x\r\nEvil: 1"], "--host-header"),
    (["--host-header", ""], "--host-header"),
    # before: a header name the tap would write that is not one (RFC 9110 token)
    (["--correlation-header", "x(y)"], "--correlation-header"),
    (["--correlation-header", "h\u00e9ader"], "--correlation-header"),
    # before: taken, then printed over several lines and put in every span; a topology refuses the same names
    (["--link", ""], "--link"),
    (["--link", "a\nb"], "--link"),
    (["--downstream", "a b"], "--downstream"),
    # before: started, then warned 'cannot reach the collector at bogus/v1/clock' every minute
    (["--clock-sync", "bogus"], "--clock-sync"),
    # before: the password was printed in the start line (and never sent); port 0 gave 'connection refused'
    (["--upstream", "http://user:secret@127.0.0.1:9"], "--upstream"),
    (["--upstream", "http://127.0.0.1:0"], "--upstream"),
])
def test_bad_flag_is_one_line_and_nothing_starts(capsys, no_start, flags, names):
    argv = list(BASE)
    for i in range(0, len(flags), 2):  # a flag already in BASE is replaced, not repeated
        if flags[i] in argv:
            argv[argv.index(flags[i]) + 1] = flags[i + 1]
        else:
            argv += flags[i : i + 2]
    assert main(argv) == 2
    line = _one_line(capsys)
    assert names in line
    assert "secret" not in line


def test_default_admin_port_past_65535_is_refused(capsys, no_start):
    # before: listen 65000 put the admin server on port 464 (66000 wrapped to 16 bits)
    argv = [a if a != "127.0.0.1:0" else "127.0.0.1:65000" for a in BASE]
    assert main(argv) == 2
    line = _one_line(capsys)
    assert "66000" in line and "--admin" in line and "--no-admin" in line
    with pytest.raises(ConfigError, match="past 65535"):
        default_admin_port(64536)
    assert default_admin_port(64535) == 65535


def test_good_values_still_pass():
    o = TapOptions(link="edge", upstream="http://127.0.0.1:9", host_header="example.com:8080", correlation_header="X-Req_ID.1",
                   clock_sync="http://127.0.0.1:4318", timeout_s=1e300, header_timeout_s=0.5, grace_s=0.0, downstream="gw.1-a_b")
    assert o.host_header == "example.com:8080" and o.correlation_header == "X-Req_ID.1"
    assert TapOptions(link="edge", upstream="http://[::1]:8300/prefix").upstream_url.port == 8300


async def _raw(port: int, data: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    try:
        return await asyncio.wait_for(reader.read(200), 5)
    finally:
        writer.close()


async def test_admin_port_bad_requests_are_one_line_each(upstream, make_tap, caplog):
    # before: each was an ERROR from aiohttp.server with a 10-line traceback (anyone reaching the admin port filled the log)
    tap = await make_tap(upstream.url)
    bad = [b"GET /" + b"a" * 20_000 + b" HTTP/1.1\r\n\r\n", b"GET /metrics HTTP/7.0\r\n\r\n",
           b"POST /healthz HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"]
    with caplog.at_level(logging.INFO, logger="aiohttp.server"):
        for data in bad:
            assert (await _raw(tap.admin_port, data)).startswith(b"HTTP/1.0 400")
        await asyncio.sleep(0.05)
    records = [r for r in caplog.records if r.name == "aiohttp.server"]
    assert len(records) == len(bad)
    for r in records:
        line = r.getMessage()
        assert r.exc_info is None and r.levelno == logging.INFO and "\n" not in line and "answered 400" in line, line
    # and the admin server still answers
    assert b"200 OK" in await _raw(tap.admin_port, b"GET /livez HTTP/1.1\r\nHost: a\r\n\r\n")


def test_open_file_limit_is_raised_to_what_max_connections_needs():
    # before: --max-connections 4096 under ulimit -n 1024 (a common default): a connection flood met EMFILE at accept
    # (the tap retrying each second, requests timing out) long before the cap; the soft limit is now raised toward
    # the hard one at start, and a hard limit too low is one warning line
    import resource

    from deltatap.proxy.cli import FDS_PER_CONNECTION, FDS_RESERVED, fit_open_files

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2 * FDS_RESERVED + 100:
        pytest.skip("hard open-file limit too low to lower and raise here")
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (FDS_RESERVED + 10, hard))
        needed, now = fit_open_files(50)
        assert needed == FDS_PER_CONNECTION * 50 + FDS_RESERVED
        assert now == needed == resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        assert fit_open_files(10) == (FDS_PER_CONNECTION * 10 + FDS_RESERVED, now)  # (never lowered)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
