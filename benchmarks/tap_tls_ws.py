"""What do TLS toward the client and WebSocket watching cost a tap? (issue 20)

One run, paths interleaved round by round, every server and tap in its own process:

* TTFT (request sent -> first content token read by the client) against the streaming mock upstream
  (benchmarks/tap_mock_upstream.py) on one kept-alive connection: ``direct``, through a plain ``tap``,
  ``direct-tls`` (the same mock serving HTTPS itself) and through a ``tap-tls`` (``--tls-cert/--tls-key``, a
  self-signed certificate made here; the client trusts it) in front of the plain mock. A TLS tap is compared with
  ``direct-tls`` (the client's TLS work is on both paths), a plain tap with ``direct``.
* The same on a new connection per request (TCP connect + TLS handshake + TTFT).
* WebSocket: round-trip time of small messages (one in flight) to a ``websockets`` echo server, ``direct`` and
  through a tap (frames watched both ways); the tap's span is read back from its ``--otlp file:`` output to
  check every message was counted.
* Each tap's CPU (user + system, from /proc) per request or per message, less what it uses idle (measured for 5 s
  before; /proc's 10 ms ticks make the per-request figure coarse: a few tens of µs).

    .venv/bin/python benchmarks/tap_tls_ws.py [--rounds 400] [--messages 3000]

Writes benchmarks/results/tap_tls_ws.json.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import ipaddress
import json
import os
import platform
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import numpy as np

from deltatap.core.clock import mono_ns
from deltatap.core.vocab import Attr

HERE = Path(__file__).resolve().parent
BODY = json.dumps({"model": "mock", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "stream": True}).encode()
ECHO = """
import asyncio, sys
from websockets.asyncio.server import serve
async def echo(ws):
    async for m in ws:
        await ws.send(m)
async def main():
    async with serve(echo, "127.0.0.1", int(sys.argv[1]), compression=None):
        await asyncio.Future()
asyncio.run(main())
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def self_signed(d: Path) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True).sign(key, hashes.SHA256()))
    (d / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (d / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                  serialization.NoEncryption()))
    return d / "cert.pem", d / "key.pem"


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def wait_port(port: int, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            _r, w = await asyncio.open_connection("127.0.0.1", port)
            w.close()
            return
        except OSError:
            await asyncio.sleep(0.1)
    raise SystemExit(f"nothing listens on 127.0.0.1:{port} after {timeout_s:g} s")


async def idle_cpu(pids: dict[str, int], seconds: float = 5.0) -> dict[str, float]:
    """Each process's CPU share while nothing is sent (subtracted from the per-request figures)."""
    c0 = {p: cpu_s(pid) for p, pid in pids.items()}
    await asyncio.sleep(seconds)
    return {p: (cpu_s(pid) - c0[p]) / seconds for p, pid in pids.items()}


def tap_cmd(link: str, port: int, upstream: str, spans: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "deltatap.app.cli", "tap", "--link", link, "--listen", f"127.0.0.1:{port}", "--no-admin",
            "--upstream", upstream, "--otlp", f"file:{spans}", *extra]


async def ttft(session: aiohttp.ClientSession, url: str, ssl_ctx: ssl.SSLContext | None) -> float:
    t0 = mono_ns()
    async with session.post(url + "/v1/chat/completions?first_ms=2&tokens=2", data=BODY, ssl=ssl_ctx,
                            headers={"content-type": "application/json"}) as r:
        async for chunk in r.content.iter_any():
            if b'"content": " tok' in chunk or b'"content":" tok' in chunk:
                t = mono_ns()
                await r.read()
                return (t - t0) / 1e6
    raise RuntimeError(f"{url}: no content token")


def stats(ms: list[float]) -> dict:
    a = np.asarray(ms)
    return {"n": len(a), "p50_ms": round(float(np.percentile(a, 50)), 4), "p99_ms": round(float(np.percentile(a, 99)), 4),
            "mean_ms": round(float(a.mean()), 4)}


def added(path: dict, base: dict) -> dict:
    return {"p50_ms": round(path["p50_ms"] - base["p50_ms"], 4), "p99_ms": round(path["p99_ms"] - base["p99_ms"], 4)}


async def run(args: argparse.Namespace) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="deltatap-tlsws-"))
    cert, key = self_signed(tmp)
    ctx = ssl.create_default_context(cafile=str(cert))
    up, upt, tp, tt, echo, tw = (free_port() for _ in range(6))
    procs: dict[str, subprocess.Popen] = {}
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    try:
        procs["upstream"] = subprocess.Popen([sys.executable, str(HERE / "tap_mock_upstream.py"), "--port", str(up)], env=env)
        procs["upstream-tls"] = subprocess.Popen([sys.executable, str(HERE / "tap_mock_upstream.py"), "--port", str(upt),
                                                  "--tls-cert", str(cert), "--tls-key", str(key)], env=env)
        procs["echo"] = subprocess.Popen([sys.executable, "-c", ECHO, str(echo)], env=env)
        procs["tap"] = subprocess.Popen(tap_cmd("edge", tp, f"http://127.0.0.1:{up}", tmp / "tap.jsonl"), env=env, stdout=subprocess.DEVNULL)
        procs["tap-tls"] = subprocess.Popen(tap_cmd("edge", tt, f"http://127.0.0.1:{up}", tmp / "tls.jsonl", "--tls-cert", str(cert),
                                                    "--tls-key", str(key)), env=env, stdout=subprocess.DEVNULL)
        procs["tap-ws"] = subprocess.Popen(tap_cmd("edge", tw, f"http://127.0.0.1:{echo}", tmp / "ws.jsonl"), env=env,
                                           stdout=subprocess.DEVNULL)
        for port in (up, upt, tp, tt, echo, tw):
            await wait_port(port)
        paths = {"direct": (f"http://127.0.0.1:{up}", None), "tap": (f"http://127.0.0.1:{tp}", None),
                 "direct-tls": (f"https://127.0.0.1:{upt}", ctx), "tap-tls": (f"https://127.0.0.1:{tt}", ctx)}
        out: dict = {}

        # TTFT on a kept-alive connection
        sessions = {p: aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) for p in paths}
        for p, (url, c) in paths.items():  # warm-up: connections open, code paths hot
            for _ in range(20):
                await ttft(sessions[p], url, c)
        taps = ("tap", "tap-tls", "tap-ws")
        idle = await idle_cpu({p: procs[p].pid for p in taps})  # (span export, packet-log hand-back: not per request)
        got: dict[str, list[float]] = {p: [] for p in paths}
        cpu0, w0 = {p: cpu_s(procs[p].pid) for p in ("tap", "tap-tls")}, time.monotonic()
        for _ in range(args.rounds):
            for p, (url, c) in paths.items():
                got[p].append(await ttft(sessions[p], url, c))
        wall = time.monotonic() - w0
        cpu = {p: (cpu_s(procs[p].pid) - cpu0[p] - idle[p] * wall) / args.rounds * 1e6 for p in cpu0}
        for s in sessions.values():
            await s.close()
        ka = {p: stats(v) for p, v in got.items()}
        out["keepalive_ttft"] = {"paths": ka, "added_over_direct": {"tap": added(ka["tap"], ka["direct"]),
                                                                    "tap-tls": added(ka["tap-tls"], ka["direct-tls"])},
                                 "tls_minus_plain_tap": added(ka["tap-tls"], ka["tap"]),
                                 "tap_cpu_us_per_request": {p: round(v, 1) for p, v in cpu.items()},
                                 "tap_idle_cpu_share": {p: round(v, 4) for p, v in idle.items()}}

        # a new connection per request: connect (+ handshake) + TTFT
        got = {p: [] for p in paths}
        for _ in range(args.new_conn_rounds):
            for p, (url, c) in paths.items():
                async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1, force_close=True)) as s:
                    got[p].append(await ttft(s, url, c))
        nc = {p: stats(v) for p, v in got.items()}
        out["new_connection_ttft"] = {"paths": nc, "tls_minus_plain_tap": added(nc["tap-tls"], nc["tap"]),
                                      "added_over_direct": {"tap": added(nc["tap"], nc["direct"]),
                                                            "tap-tls": added(nc["tap-tls"], nc["direct-tls"])}}

        # WebSocket round trips, one message in flight
        from websockets.asyncio.client import connect

        msg = b"x" * 64
        rtt: dict[str, list[float]] = {"direct": [], "tap": []}
        conns = {"direct": await connect(f"ws://127.0.0.1:{echo}/", compression=None),
                 "tap": await connect(f"ws://127.0.0.1:{tw}/", compression=None)}
        for ws in conns.values():
            for _ in range(50):
                await ws.send(msg)
                await ws.recv()
        c0, w0 = cpu_s(procs["tap-ws"].pid), time.monotonic()
        for _ in range(args.messages):
            for p, ws in conns.items():
                t0 = mono_ns()
                await ws.send(msg)
                await ws.recv()
                rtt[p].append((mono_ns() - t0) / 1e6)
        ws_cpu = (cpu_s(procs["tap-ws"].pid) - c0 - idle["tap-ws"] * (time.monotonic() - w0)) / (2 * args.messages) * 1e6
        for ws in conns.values():
            await ws.close()
        wst = {p: stats(v) for p, v in rtt.items()}
        out["websocket_rtt"] = {"paths": wst, "added_over_direct": added(wst["tap"], wst["direct"]),
                                "tap_cpu_us_per_message": round(ws_cpu, 1)}
    finally:
        for p in procs.values():
            p.terminate()
        for p in procs.values():
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
    # the WebSocket span: every message counted both ways (warm-up included)
    from deltatap.collector.spans import decode_json

    def spans_of(name: str) -> list:
        return [sp for line in (tmp / name).read_text().splitlines() if line.strip() for sp in decode_json(json.loads(line))]

    # the taps' own view: last request byte read -> written upstream, first token read -> written downstream (the
    # encryption of a TLS tap's writes is inside the second; its decryption is after the request's read stamp)
    for p, name in (("tap", "tap.jsonl"), ("tap-tls", "tls.jsonl")):
        attrs = [sp.attrs for sp in spans_of(name)]
        out["keepalive_ttft"].setdefault("self_reported_us", {})[p] = {
            k: {"p50": round(float(np.percentile(v, 50)) / 1e3, 1), "p99": round(float(np.percentile(v, 99)) / 1e3, 1)}
            for k, v in (("request", [a[Attr.OVERHEAD_REQUEST_NS] for a in attrs if Attr.OVERHEAD_REQUEST_NS in a]),
                         ("first_token", [a[Attr.OVERHEAD_FIRST_TOKEN_NS] for a in attrs if Attr.OVERHEAD_FIRST_TOKEN_NS in a])) if v}
    ws_attrs = next((sp.attrs for sp in spans_of("ws.jsonl") if sp.attrs.get(Attr.WS)), {})
    out["websocket_rtt"]["span_counts"] = {"client_messages": ws_attrs.get(Attr.WS_CLIENT.MESSAGES),
                                           "server_messages": ws_attrs.get(Attr.WS_SERVER.MESSAGES),
                                           "expected_each_way": args.messages + 50}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=400, help="keep-alive TTFT rounds per path (default 400)")
    p.add_argument("--new-conn-rounds", type=int, default=100, help="new-connection rounds per path (default 100)")
    p.add_argument("--messages", type=int, default=3000, help="WebSocket round trips per path (default 3000)")
    args = p.parse_args()
    from deltatap.net import aio

    t0 = time.time()
    res = aio.run(run(args))
    res["meta"] = {"command": "benchmarks/tap_tls_ws.py " + " ".join(sys.argv[1:]), "host": platform.node(),
                   "cpus": os.cpu_count(), "load_1m_at_end": os.getloadavg()[0], "duration_s": round(time.time() - t0, 1),
                   "python": platform.python_version(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    dest = HERE / "results" / "tap_tls_ws.json"
    dest.write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps(res, indent=2))
    print(f"wrote {dest}")


if __name__ == "__main__":
    main()
