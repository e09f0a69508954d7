"""A reset that comes with data is lost on uvloop's reader callbacks, and so by the stamped transport (session 24, "h2c").

Found while putting the h2 relay's pass-through (an h2c client in front of an HTTP/1.1-only upstream) on the CLI's loop:
when a peer's last bytes and its RST are both waiting at one readiness report, uvloop (libuv's uv_poll, which stops a
watcher on POLLERR) calls an ``add_reader`` callback once; that read takes the bytes, and the reset is never reported
(no further callback: the error stays pending on a socket nobody watches). asyncio's selector loop calls again and the
next ``recv`` raises ECONNRESET. The stamped transport (deltatap/net/kstamp.py) reads through ``add_reader``, one read
per callback, so on uvloop (every deltatap CLI process, deltatap.net.aio.run) such a reset is lost.

Two demonstrations, each run here:

1. ``socket``: a non-blocking socket read by an ``add_reader`` callback (one ``recv`` per call, as the transport does),
   its peer sending 6 bytes then closing with bytes of ours unread (a RST), on each loop; and TCP_INFO's state at the
   read (7, TCP_CLOSE: the reset was in before the read took the bytes).
2. ``tap``: ``deltatap tap`` (the CLI: uvloop) in front of an HTTP/1.1 upstream that answers a close-delimited response
   and resets at once (SO_LINGER 0): directly the client reads the answer then ECONNRESET; through the tap it reads
   the answer and then, where the bytes and the reset met at one readiness report (a race: --tries clients), nothing
   (a wait of --wait-s, then the client gives up): the tap never learned of the reset, so the client's connection stays
   open, and the tap's shutdown waits its --grace-s for that exchange. (The HTTP/2 relay's pass-through has the same exposure: see docs/tap.md.)

A re-arm of the reader (remove_reader + add_reader) after the read makes uvloop report the error (shown in 1); a
transport could instead read once more at once when the TCP_INFO it already reads before each read says TCP_CLOSE.

    .venv/bin/python benchmarks/uvloop_reset_s24_h2c.py [--wait-s 3]

Writes benchmarks/results/uvloop_reset_s24_h2c.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import uvloop

HERE = Path(__file__).resolve().parent
_LINGER_RST = struct.pack("ii", 1, 0)


async def socket_case(rearm: bool) -> dict:
    loop = asyncio.get_running_loop()
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    c = socket.socket()
    c.setblocking(False)
    try:
        c.connect(srv.getsockname())
    except BlockingIOError:
        pass
    s, _ = srv.accept()
    await asyncio.sleep(0.05)
    got: list = []
    state: list[int] = []

    def readable() -> None:
        state.append(c.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0])
        try:
            d = c.recv(65536)
        except OSError as exc:
            got.append(f"error {exc.errno}")
            loop.remove_reader(c.fileno())
            return
        got.append(len(d))
        if not d:
            loop.remove_reader(c.fileno())
        elif rearm:
            loop.remove_reader(c.fileno())
            loop.add_reader(c.fileno(), readable)

    loop.remove_reader(c.fileno())
    c.send(b"x" * 10)  # (unread by the peer: its close is a reset)
    await asyncio.sleep(0.05)
    s.send(b"answer")
    s.close()
    await asyncio.sleep(0.05)  # (both the 6 bytes and the RST are in before the reader is added)
    loop.add_reader(c.fileno(), readable)
    await asyncio.sleep(0.3)
    loop.remove_reader(c.fileno())
    c.close()
    srv.close()
    return {"reads": got, "tcp_state_at_each_read": state}


async def tap_case(py: str, wait_s: float, tries: int) -> dict:
    out: dict = {}

    async def serve(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk = await r.read(65536)
            if not chunk:
                w.close()
                return
            buf += chunk
        w.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nhello")  # (close-delimited)
        w.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RST)
        w.transport.abort()

    async def client(port: int) -> dict:
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        got, t0 = b"", time.monotonic()
        try:
            while True:
                chunk = await asyncio.wait_for(r.read(65536), wait_s)
                if not chunk:
                    return {"got": got.decode("latin-1"), "end": "fin", "s": time.monotonic() - t0}
                got += chunk
        except ConnectionResetError:
            return {"got": got.decode("latin-1"), "end": "rst", "s": time.monotonic() - t0}
        except TimeoutError:
            return {"got": got.decode("latin-1"), "end": f"nothing within {wait_s:g} s", "s": time.monotonic() - t0}
        finally:
            w.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    up = server.sockets[0].getsockname()[1]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([py, "-m", "deltatap", "tap", "--link", "fw-engine", "--listen", f"127.0.0.1:{port}", "--upstream",
                             f"http://127.0.0.1:{up}", "--otlp", "none", "--no-admin"], cwd="/tmp",
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(300):
            try:
                _r, w = await asyncio.open_connection("127.0.0.1", port)
                w.close()
                break
            except OSError:
                await asyncio.sleep(0.05)
        out = {"direct": [await client(up) for _ in range(tries)], "through the tap": [await client(port) for _ in range(tries)]}
        for k in list(out):
            ends = [x["end"] for x in out[k]]
            out[f"{k}: ends"] = {e: ends.count(e) for e in sorted(set(ends))}
        return out
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:  # (its shutdown waits --grace-s for the exchange whose reset it never saw)
            proc.kill()
            proc.wait()
            out["tap stopped within 10 s of SIGTERM"] = False
        server.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--wait-s", type=float, default=2.0)
    p.add_argument("--tries", type=int, default=5, help="clients, one after the other, each way (the loss is a race: the bytes "
                   "and the reset must wait together at one readiness report)")
    p.add_argument("--out", default=str(HERE / "results" / "uvloop_reset_s24_h2c.json"))
    args = p.parse_args()
    doc: dict = {"socket": {}, "loadavg": os.getloadavg()}
    for name, run in (("asyncio", asyncio.run), ("uvloop", uvloop.run)):
        doc["socket"][name] = run(socket_case(False))
        doc["socket"][f"{name}, reader re-armed after each read"] = run(socket_case(True))
    doc["tap"] = asyncio.run(tap_case(sys.executable, args.wait_s, args.tries))
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
