"""TLS toward the client (``--tls-cert``/``--tls-key``): a stream relayed to a client that trusts the tap's
certificate, stamped from the TCP reads under the decryption (kernel stamps, as over plain TCP); ALPN; bad
certificate or key files as one line; a plain-HTTP client on the TLS port answered with a plain 400; a client that
never handshakes closed; WebSocket over TLS; ``--workers`` with TLS and the admin port's health routes."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import ssl
import subprocess
import sys

import aiohttp
import pytest
from tap_helpers import event_times, wait_spans
from websockets.asyncio.client import connect
from websockets.asyncio.server import serve

from deltatap.core.clock import mono_ns, to_unix_ns
from deltatap.core.config import ConfigError
from deltatap.core.vocab import Attr, TapEvent, parse_stamp_bounds
from deltatap.proxy import TapOptions
from deltatap.proxy.tls import ALPN_PROTOCOLS

pytestmark = pytest.mark.timeout(60)
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}


@pytest.fixture
def client_ctx(self_signed) -> ssl.SSLContext:
    """What a client that was given the tap's certificate as its CA uses."""
    return ssl.create_default_context(cafile=str(self_signed[0]))


@pytest.fixture
async def tls_tap(upstream, make_tap, self_signed):
    cert, key = self_signed
    return await make_tap(upstream.url, link="edge", tls_cert=str(cert), tls_key=str(key), header_timeout_s=2)


async def test_a_stream_through_a_tls_tap_is_relayed_and_stamped(tls_tap, upstream, client_ctx, span_exporter, telemetry):
    assert tls_tap.url.startswith("https://")
    got: list[int] = []
    sent = mono_ns()
    async with aiohttp.ClientSession() as s, s.post(tls_tap.url + "/v1/chat/completions?first_ms=20&gap_ms=10&n=5", json=CHAT,
                                                     ssl=client_ctx) as r:
        assert r.status == 200
        body = b""
        async for chunk in r.content.iter_any():
            got.append(mono_ns())
            body += chunk
    assert body.endswith(b"data: [DONE]\n\n") and body.count(b'"content"') >= 5
    (span,) = await wait_spans(span_exporter, telemetry, 1)
    a = span.attributes
    assert a[Attr.OUTCOME] == "ok" and a[Attr.STREAM_FORMAT] == "openai-chat" and a[Attr.CONTENT_EVENTS] >= 5
    t = event_times(span)
    order = [TapEvent.REQUEST_RECEIVED, TapEvent.REQUEST_FORWARDED, TapEvent.FIRST_TOKEN_RECEIVED, TapEvent.FIRST_TOKEN_FORWARDED,
             TapEvent.LAST_TOKEN_FORWARDED]
    assert [t[e] for e in order] == sorted(t[e] for e in order)
    # causality against the upstream's own write stamps and the client's receive: whatever the machine's load
    slack = 200_000
    assert to_unix_ns(sent) - slack <= t[TapEvent.REQUEST_RECEIVED]
    assert to_unix_ns(upstream.log.token_written[0][0]) - slack <= t[TapEvent.FIRST_TOKEN_RECEIVED]
    assert t[TapEvent.FIRST_TOKEN_FORWARDED] <= to_unix_ns(got[-1]) + slack
    # the request's reads are TLS: their stamps come with their interval where they are not exact, never a negative one
    bounds = parse_stamp_bounds(a.get(Attr.STAMP_BOUNDS, ""))
    assert all(b >= 0 and f >= 0 for b, f in bounds.values())


async def test_a_record_split_across_packets_is_stamped_when_it_completes(tls_tap, client_ctx, span_exporter, telemetry):
    """TLS buffers a record until its last byte: the request's read stamp is that byte's arrival, not the first's,
    and never before the client sent it (a client of its own on memory BIOs writes one record in two halves)."""
    host, port = tls_tap.url.removeprefix("https://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = client_ctx.wrap_bio(incoming, outgoing, server_hostname="localhost")
    for _ in range(20):  # the handshake, by hand
        try:
            tls.do_handshake()
            break
        except ssl.SSLWantReadError:
            writer.write(outgoing.read())
            incoming.write(await asyncio.wait_for(reader.read(65536), 10))
    writer.write(outgoing.read())
    tls.write(b"GET /status/200 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    record = outgoing.read()
    writer.write(record[:20])  # the record's header and a few bytes: nothing can be decrypted yet
    await writer.drain()
    await asyncio.sleep(0.05)
    second = mono_ns()
    writer.write(record[20:])
    answer = b""
    while b"\r\n\r\n" not in answer:
        chunk = await asyncio.wait_for(reader.read(65536), 10)
        assert chunk
        incoming.write(chunk)
        with contextlib.suppress(ssl.SSLWantReadError):
            answer += tls.read(65536)
    writer.close()
    assert answer.startswith(b"HTTP/1.1 200")
    (span,) = await wait_spans(span_exporter, telemetry, 1)
    received = event_times(span)[TapEvent.REQUEST_RECEIVED]
    assert received >= to_unix_ns(second) - 200_000  # (slack: the mono -> unix conversion, the kernel stamp's placement)


async def test_alpn_agrees_on_http1_with_a_client_that_speaks_it(tls_tap, client_ctx):
    assert "http/1.1" in ALPN_PROTOCOLS
    client_ctx.set_alpn_protocols(["http/1.1"])
    host, port = tls_tap.url.removeprefix("https://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port), ssl=client_ctx, server_hostname="localhost")
    try:
        assert writer.get_extra_info("ssl_object").selected_alpn_protocol() == "http/1.1"
        assert writer.get_extra_info("ssl_object").version() in ("TLSv1.2", "TLSv1.3")
        writer.write(b"GET /status/200 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        head = await asyncio.wait_for(reader.read(), 10)
        assert head.startswith(b"HTTP/1.1 200")
    finally:
        writer.close()


async def test_curl_streams_sse_through_the_tls_tap(tls_tap, self_signed):
    proc = await asyncio.create_subprocess_exec(
        "curl", "-sS", "-N", "--max-time", "20", "--cacert", str(self_signed[0]), "-H", "content-type: application/json",
        "-d", '{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}',
        tls_tap.url + "/v1/chat/completions?first_ms=5&gap_ms=5&n=3", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, err
    assert out.endswith(b"data: [DONE]\n\n") and out.count(b'"content"') >= 3


async def test_plain_http_to_the_tls_port_gets_a_plain_400_and_tls_still_works(tls_tap, client_ctx):
    host, port = tls_tap.url.removeprefix("https://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"GET /status/200 HTTP/1.1\r\nHost: x\r\n\r\n")
    answer = await asyncio.wait_for(reader.read(), 10)  # ... then the tap closes
    writer.close()
    assert answer.startswith(b"HTTP/1.1 400 Bad Request\r\n") and b"speaks TLS" in answer and b"https://" in answer
    reader, writer = await asyncio.open_connection(host, int(port))  # not TLS, not HTTP: closed without a word
    writer.write(b"\x00\x01garbage\r\n\r\n")
    assert await asyncio.wait_for(reader.read(), 10) == b""
    writer.close()
    assert tls_tap.tap.counters.tls_handshake_failures == 2
    async with aiohttp.ClientSession() as s, s.get(tls_tap.url + "/status/200", ssl=client_ctx) as r:
        assert r.status == 200


async def test_a_client_that_never_handshakes_is_closed_after_the_header_timeout(tls_tap):
    host, port = tls_tap.url.removeprefix("https://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    assert await asyncio.wait_for(reader.read(), 10) == b""  # (header_timeout_s=2)
    writer.close()
    assert tls_tap.tap.counters.tls_handshake_failures == 1


async def test_max_connections_refuses_at_accept_before_any_handshake(upstream, make_tap, self_signed, client_ctx):
    tap = await make_tap(upstream.url, link="edge", tls_cert=str(self_signed[0]), tls_key=str(self_signed[1]), max_connections=1)
    host, port = tap.url.removeprefix("https://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port), ssl=client_ctx, server_hostname="localhost")
    writer.write(b"GET /status/200 HTTP/1.1\r\nHost: x\r\n\r\n")  # kept alive: the one connection allowed
    assert (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)).startswith(b"HTTP/1.1 200")
    r2, w2 = await asyncio.open_connection(host, int(port))  # plain TCP: closed at accept, no ServerHello comes
    w2.write(b"\x16\x03\x01\x00\x05hello")
    assert await asyncio.wait_for(r2.read(), 10) == b""
    w2.close()
    writer.close()
    assert tap.tap.counters.connections_refused == 1 and tap.tap.counters.tls_handshake_failures == 0


async def test_websocket_over_tls_through_the_tap(make_tap, self_signed, client_ctx, span_exporter, telemetry):
    async def echo(ws):
        async for msg in ws:
            await ws.send(msg)

    async with serve(echo, "127.0.0.1", 0, compression=None) as server:
        port = server.sockets[0].getsockname()[1]
        tap = await make_tap(f"http://127.0.0.1:{port}", link="edge", tls_cert=str(self_signed[0]), tls_key=str(self_signed[1]))
        async with connect(tap.url.replace("https", "wss"), ssl=client_ctx, compression=None, open_timeout=10) as ws:
            for i in range(3):
                await ws.send(f"m{i}")
                assert await ws.recv() == f"m{i}"
    (span,) = await wait_spans(span_exporter, telemetry, 1, timeout_s=10)
    a = span.attributes
    assert a[Attr.WS_CLIENT.MESSAGES] == a[Attr.WS_SERVER.MESSAGES] == 3 and a[Attr.WS_CLIENT.CLOSE_CODE] == 1000


# ---- bad files: one line, no traceback ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def bad_files(tmp_path_factory, self_signed):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    d = tmp_path_factory.mktemp("tlsbad")
    other = ec.generate_private_key(ec.SECP256R1())
    (d / "other.key").write_bytes(other.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                      serialization.NoEncryption()))
    (d / "locked.key").write_bytes(other.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                       serialization.BestAvailableEncryption(b"secret")))
    (d / "junk.pem").write_text("not a certificate\n")
    return d


@pytest.mark.parametrize(("cert", "key", "says"), [
    ("missing.pem", "KEY", "--tls-cert {d}/missing.pem: cannot read it (No such file or directory)"),
    ("CERT", "missing.key", "--tls-key {d}/missing.key: cannot read it (No such file or directory)"),
    ("junk.pem", "KEY", "--tls-cert {d}/junk.pem: not a PEM certificate"),
    ("CERT", "junk.pem", "--tls-key {d}/junk.pem: not a PEM private key"),
    ("CERT", "other.key", "--tls-key {d}/other.key: does not match the certificate"),
    ("CERT", "locked.key", "--tls-key {d}/locked.key: the key is encrypted"),
    ("CERT", None, "--tls-cert and --tls-key go together"),
])
def test_bad_certificate_or_key_is_one_clear_line(bad_files, self_signed, cert, key, says):
    def path(name):
        return None if name is None else str(self_signed[0]) if name == "CERT" else str(self_signed[1]) if name == "KEY" else str(bad_files / name)

    with pytest.raises(ConfigError) as info:
        TapOptions(link="edge", upstream="http://127.0.0.1:1", tls_cert=path(cert), tls_key=path(key))
    msg = str(info.value)
    assert msg.startswith(says.format(d=bad_files)) and "\n" not in msg


def test_the_cli_says_it_in_one_line_without_a_traceback(bad_files, self_signed):
    r = subprocess.run([sys.executable, "-m", "deltatap.app.cli", "tap", "--link", "edge", "--upstream", "http://127.0.0.1:1",
                        "--listen", "127.0.0.1:0", "--otlp", "none", "--tls-cert", str(self_signed[0]), "--tls-key",
                        str(bad_files / "other.key")], capture_output=True, text=True, timeout=30)
    assert r.returncode != 0 and "Traceback" not in r.stderr + r.stdout
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "does not match the certificate" in lines[0], r.stderr


# ---- --workers with TLS ---------------------------------------------------------------------------------------------
async def test_two_tls_workers_serve_https_and_the_admin_port_answers_livez_readyz(upstream, self_signed, client_ctx):
    from tests.conftest import free_port

    port, admin = free_port(), free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "deltatap.app.cli", "tap", "--link", "edge", "--listen", f"127.0.0.1:{port}", "--admin",
        f"127.0.0.1:{admin}", "--upstream", upstream.url, "--otlp", "none", "--workers", "2", "--grace-s", "2",
        "--tls-cert", str(self_signed[0]), "--tls-key", str(self_signed[1]),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    try:
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
        assert f"https://127.0.0.1:{port}" in line and "2 workers" in line, line
        async with aiohttp.ClientSession() as s:
            for _ in range(10):  # a new connection each: spread over the workers
                async with s.get(f"https://127.0.0.1:{port}/status/200", ssl=client_ctx, headers={"Connection": "close"}) as r:
                    assert r.status == 200
            for route in ("/livez", "/readyz", "/healthz"):
                async with s.get(f"http://127.0.0.1:{admin}{route}") as r:
                    assert r.status == 200, route
                    assert (await r.json())["worker_status"] == ["ok", "ok"]
            async with s.get(f"http://127.0.0.1:{admin}/metrics") as r:
                text = await r.text()
        assert 'deltatap_tap_requests_total{link="edge",outcome="ok"} 10.0' in text
        assert 'deltatap_tap_tls_handshake_failures_total{link="edge"} 0.0' in text
    finally:
        proc.send_signal(signal.SIGTERM)
        out = (await asyncio.wait_for(proc.stdout.read(), 30)).decode()
        await proc.wait()
    assert "2 workers stopped" in out
