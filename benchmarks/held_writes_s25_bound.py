"""How often a tap's forwarding write is stamped while TCP (or the tap's buffer) still holds its bytes, and what its
span then states (session 25, task "bound"; issues 15 and 19).

A tap (in process, in-memory span exporter) in front of a small streaming engine written here (raw asyncio:
``/stream`` answers an SSE stream of ``--tokens`` chunks 1 ms apart, ``/big`` a JSON body of ``--big-bytes``), driven
by three kinds of client on 127.0.0.1:

* ``normal``: reads everything as it comes;
* ``slow``: SO_RCVBUF 4 KiB, starts reading 100 ms after its request, then 512 B every 2 ms (a slow reader);
* ``big``: a large request body (``--big-bytes`` of prompt) answered by a large non-streamed body (``/big``, as
  large), read as it comes.

Each case runs with the packet log and without it (``DELTATAP_PACKET_STAMPS=0``: a child process per mode). Per case:
spans, and per write event (``request.forwarded``, ``response.headers_forwarded``, ``first_token.forwarded``,
``last_token.forwarded``) how many spans state it placed/exact (not stated), bounded (a finite interval wider than
50 us: how wide, median and max) or unknown (``?``: nothing saw the bytes leave before the exchange ended).

    .venv/bin/python benchmarks/held_writes_s25_bound.py --tree base=/tmp/s25base --tree new=. \
        --out benchmarks/results/held_writes_s25_bound.json

(``--tree NAME=DIR``, repeatable: the same cases on each tree, e.g. the session's starting tree, where a held write
was stated exact; each child process imports its own tree.)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

WRITE_EVENTS = ("request.forwarded", "response.headers_forwarded", "first_token.forwarded", "last_token.forwarded")
# an OpenAI-sized chunk (~230 B)
_TOKEN = (b'data: {"id":"chatcmpl-0123456789abcdef0123456789","object":"chat.completion.chunk","created":1700000000,'
          b'"model":"m","system_fingerprint":"fp_0123456789","choices":[{"index":0,"delta":{"content":"tok"},'
          b'"logprobs":null,"finish_reason":null}]}\n\n')
_DONE = b"data: [DONE]\n\n"


def _chunk(b: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(b), b)


async def _engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, tokens: int, big: int) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            if length:
                await reader.readexactly(length)
            if head.startswith(b"POST /big"):
                body = b'{"usage": {"prompt_tokens": 1, "completion_tokens": 1}, "pad": "' + b"x" * big + b'"}'
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
                await writer.drain()
                continue
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
            for _ in range(tokens):
                writer.write(_chunk(_TOKEN))
                await writer.drain()
                await asyncio.sleep(0.001)
            writer.write(_chunk(_DONE) + b"0\r\n\r\n")
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def _client(port: int, kind: str, requests: int, big: int) -> int:
    """``requests`` exchanges on one connection (a raw socket: what is not read stays in the kernel, as with a real
    slow reader); returns how many completed."""
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    if kind == "slow":
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await loop.sock_connect(sock, ("127.0.0.1", port))
    path = b"/big" if kind == "big" else b"/stream"
    done = 0
    try:
        for _ in range(requests):
            body = b'{"model": "m", "stream": true}' if kind != "big" else b'{"model": "m", "prompt": "' + b"p" * big + b'"}'
            await loop.sock_sendall(sock, b"POST %s HTTP/1.1\r\nHost: e\r\nContent-Type: application/json\r\n"
                                    b"Content-Length: %d\r\n\r\n%s" % (path, len(body), body))
            if kind == "slow":
                await asyncio.sleep(0.1)
            got = bytearray()
            need = None  # the whole response's length, once its head says (Content-Length)
            while True:
                data = await loop.sock_recv(sock, 512 if kind == "slow" else 1 << 20)
                if not data:
                    return done
                got += data
                if need is None and b"\r\n\r\n" in got:
                    head, _, _ = bytes(got).partition(b"\r\n\r\n")
                    low = head.lower()
                    if b"content-length:" in low:
                        need = len(head) + 4 + int(low.split(b"content-length:", 1)[1].split(b"\r\n", 1)[0])
                if (need is not None and len(got) >= need) or (need is None and got.endswith(b"0\r\n\r\n")):
                    break
                if kind == "slow":
                    await asyncio.sleep(0.002)
            done += 1
    finally:
        sock.close()
    return done


def _count(spans: list) -> dict:
    from deltatap.core.vocab import Attr, parse_stamp_bounds

    per: dict[str, dict] = {ev: {"stated_exact": 0, "bounded": 0, "unknown": 0, "bounds_ms": []} for ev in WRITE_EVENTS}
    any_bounded = any_unknown = 0
    for sp in spans:
        names = {e.name for e in sp.events}
        sb = parse_stamp_bounds(sp.attributes.get(Attr.STAMP_BOUNDS))
        b_any = u_any = False
        for ev in WRITE_EVENTS:
            if ev not in names:
                continue
            b = sb.get(ev)
            if b is None:
                per[ev]["stated_exact"] += 1
            elif b[1] < 0:
                per[ev]["unknown"] += 1
                u_any = True
            else:
                per[ev]["bounded"] += 1
                per[ev]["bounds_ms"].append(b[1] / 1e6)
                b_any = True
        any_bounded += b_any
        any_unknown += u_any
    for d in per.values():
        bs = d.pop("bounds_ms")
        d["bound_median_ms"] = round(statistics.median(bs), 3) if bs else None
        d["bound_max_ms"] = round(max(bs), 3) if bs else None
    return {"spans": len(spans), "spans_with_a_bounded_write": any_bounded, "spans_with_an_unknown_write": any_unknown,
            "events": per}


async def _run_mode(args: argparse.Namespace) -> dict:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    import deltatap.proxy
    from deltatap.net import kstamp, pktstamp
    from deltatap.proxy import TapOptions, start_tap
    from deltatap.telemetry.tracer import setup_telemetry

    server = await asyncio.start_server(lambda r, w: _engine(r, w, args.tokens, args.big_bytes), "127.0.0.1", 0)
    eport = server.sockets[0].getsockname()[1]
    exporter = InMemorySpanExporter()
    tel = setup_telemetry("held-writes", exporter=exporter)
    tap = await start_tap(TapOptions(upstream=f"http://127.0.0.1:{eport}", link="fw-engine"), tel)
    out: dict = {"tree": str(Path(deltatap.proxy.__file__).resolve().parents[1]), "packet_log": pktstamp.packet_log() is not None,
                 "kernel_stamps": kstamp.enabled(), "cases": {}}
    try:
        for kind, conns, per_conn in (("normal", args.conns, args.requests), ("slow", args.conns, max(1, args.requests // 4)),
                                      ("big", max(1, args.conns // 2), max(1, args.requests // 8))):
            exporter.clear()
            t0 = time.monotonic()
            done = await asyncio.gather(*(_client(tap.port, kind, per_conn, args.big_bytes) for _ in range(conns)))
            want = sum(done)
            deadline = time.monotonic() + 10
            while len(exporter.get_finished_spans()) < want and time.monotonic() < deadline:
                tel.processor.force_flush()
                await asyncio.sleep(0.05)
            res = _count([s for s in exporter.get_finished_spans() if s.name.startswith("deltatap.tap")])
            res["completed"] = want
            res["seconds"] = round(time.monotonic() - t0, 2)
            out["cases"][kind] = res
    finally:
        await tap.close(grace_s=1)
        server.close()
        tel.shutdown()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "held_writes_s25_bound.json"))
    ap.add_argument("--conns", type=int, default=8, help="client connections per case (big: half)")
    ap.add_argument("--requests", type=int, default=24, help="requests per connection, normal case (slow: 1/4, big: 1/8)")
    ap.add_argument("--tokens", type=int, default=40)
    ap.add_argument("--big-bytes", type=int, default=2 << 20)
    ap.add_argument("--tree", action="append", metavar="NAME=DIR",
                    help="a source tree to run (repeatable; default: this one); each child imports its own tree through "
                         "benchmarks/tap_cpu_ab.py's shim (PYTHONPATH), not the editable install")
    ap.add_argument("--mode", choices=("child",), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.mode == "child":
        print(json.dumps(asyncio.run(_run_mode(args))))
        return
    result: dict = {"command": " ".join([".venv/bin/python", "benchmarks/held_writes_s25_bound.py", *sys.argv[1:]]),
                    "load_before": os.getloadavg(), "modes": {}}
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from tap_cpu_ab import shim

    trees = {name: str(Path(d).resolve()) for name, d in (t.split("=", 1) for t in args.tree)} if args.tree else {"this": str(ROOT)}
    tmp = Path(tempfile.mkdtemp(prefix="held_writes_"))
    runs = []
    for name, tree in trees.items():
        shim_dir = shim(Path(tree), tmp / f"shim_{name}")
        for mode, env in (("packet_log", {}), ("no_packet_log", {"DELTATAP_PACKET_STAMPS": "0"})):
            runs.append((f"{name}_{mode}", {**env, "PYTHONPATH": str(shim_dir)}))
    for mode, env in runs:
        argv = [sys.executable, str(Path(__file__).resolve()), "--mode", "child", "--conns", str(args.conns), "--requests", str(args.requests),
                "--tokens", str(args.tokens), "--big-bytes", str(args.big_bytes)]
        p = subprocess.run(argv, env={**os.environ, **env}, capture_output=True, text=True, timeout=170, cwd=tmp)
        if p.returncode != 0:
            raise SystemExit(f"{mode}: child failed\n{p.stderr[-3000:]}")
        result["modes"][mode] = json.loads(p.stdout.strip().splitlines()[-1])
        print(mode, json.dumps(result["modes"][mode], indent=1), file=sys.stderr)
    shutil.rmtree(tmp, ignore_errors=True)
    result["load_after"] = os.getloadavg()
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(args.out)


if __name__ == "__main__":
    main()
