"""Reproduction (session 25, referee): a token whose forwarding write TCP holds is stamped at the write, stated exact.

    .venv/bin/python benchmarks/held_last_s25_referee.py [--case last|first-split|last-late]   (root: CAP_NET_RAW)

One ``deltatap tap`` process (spans to a file) in front of a raw upstream that answers an SSE stream: a role chunk,
the first token, then 40 tokens of ~1 KB 2 ms apart, ``[DONE]``. The client has a 4 KiB receive buffer, sends the
request, reads NOTHING for 0.4 s, then everything. With the window shut the tap's later writes wait in its kernel
(and its transport): the last token's bytes cannot leave before the client reads (the window is closed), so its
``last_token.forwarded`` event can be no earlier than the moment the client began to read (``began``). Prints that
event's time and its stated bound against ``began``; exit status 1 when the stamp is before ``began`` with no bound
that reaches it (the defect: stated exact, the starting tree), 3 when it is stated unknown (``0/?``: honest, not
placed; 4d96d60, 34c4ad6), 0 when placed at its departure or bounded to reach it (294b06e, after 8d76446: both
cases placed 0.42-0.46 ms after the client began to read, exact). ``--case last-late`` (the last token, a 3 KB usage
chunk and ``[DONE]`` in one upstream write, the chunked end 1 ms later; the client reads 2 KB every 10 ms): base 1
(stated exact 107-145 ms before the byte could fit the client's buffer), 294b06e 0 (placed at most 10 ms before the
client held the byte) -- the late placements the wire referee shows on 294b06e under --slow-reader are not made small
by it yet. Run it on another tree with that tree's
interpreter on PYTHONPATH (e.g. PYTHONPATH=/tmp/s25base .venv/bin/python benchmarks/held_last_s25_referee.py).

``--case first-split``: the role chunk and two 30 KB tokens come in one upstream write, so the first token's event
ends past the window the client leaves open: its ``first_token.forwarded`` is checked the same way. Both cases end
(the upstream's last write, the exchange's END) long before the client reads, so no later read of the exchange is
left to place the held write from the packet log (session 24's retry, ``Upstream._place_first``, runs at later reads
and at the END only). What the wire referee showed first: ``benchmarks/wire_referee.py --slow-reader gateway``
(tap gw-fw's ``gateway.out.last_in``: 190 of 190 rows early by 0.3-6.9 s, stated exact, on the starting tree).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 10.0
N_TOKENS = 40


def _chunk(b: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(b), b)


def _ev(text: str) -> bytes:
    return b'data: {"choices":[{"index":0,"delta":{"content":"' + text.encode() + b'"}}]}\n\n'


def read_head(conn: socket.socket) -> bytes | None:
    """What ``conn`` sent up to the end of a request head (its first bytes after it included); None when it ended
    before one."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        data = conn.recv(65536)
        if not data:
            return None
        buf += data
    return buf


def upstream(listener: socket.socket, stop: threading.Event, first_write: int = 0, tail: bool = False) -> None:
    listener.settimeout(0.5)
    while not stop.is_set():
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            continue
        except OSError:  # (closed at the end)
            return
        with conn:
            conn.settimeout(TIMEOUT_S)
            if read_head(conn) is None:
                continue
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
            role = b'data: {"choices":[{"index":0,"delta":{"role":"assistant"}}]}\n\n'
            if first_write:  # the role chunk and the first tokens in one write: the first token ends past a 4 KiB window
                conn.sendall(_chunk(role + b"".join(_ev(f"f{i:03d} " + "y" * 30000) for i in range(first_write))))
            else:
                conn.sendall(_chunk(role))
            for i in range(N_TOKENS - (1 if tail else 0)):
                conn.sendall(_chunk(_ev(f"t{i:03d} " + "x" * 1000)))
                time.sleep(0.002)
            if tail:  # the last token, a 3 KB usage chunk and the end in one write: the tap forwards them in one
                usage = b'data: {"choices":[],"usage":{"completion_tokens":%d,"pad":"%s"}}\n\n' % (N_TOKENS, b"u" * 3000)
                conn.sendall(_chunk(_ev(f"t{N_TOKENS - 1:03d} " + "x" * 1000)) + _chunk(usage) + _chunk(b"data: [DONE]\n\n"))
                time.sleep(0.001)
                conn.sendall(b"0\r\n\r\n")  # the end of the chunked body on its own: a second tap write, also held
            else:
                conn.sendall(_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
            time.sleep(0.2)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_tap(upstream_port: int, work: Path, *extra: str) -> tuple[subprocess.Popen, int, Path]:
    """One ``deltatap tap`` process (this interpreter's, in a session of its own) on a free port in front of
    127.0.0.1:``upstream_port``, spans to ``work``/spans.jsonl, its output to ``work``/tap.log; ``extra``: more of its
    options. (process, port, spans file); :func:`listening` tells when it accepts connections."""
    port = free_port()
    spans = work / "spans.jsonl"
    exe = Path(sys.executable).parent / "deltatap"
    tap = subprocess.Popen([str(exe), "tap", "--link", "edge", "--listen", f"127.0.0.1:{port}", "--upstream",
                            f"http://127.0.0.1:{upstream_port}", "--no-admin", "--grace-s", "1", "--otlp", f"file:{spans}", *extra],
                           stdout=open(work / "tap.log", "w"), stderr=subprocess.STDOUT, start_new_session=True)
    return tap, port, spans


def listening(tap: subprocess.Popen, port: int, work: Path) -> bool:
    """Whether the tap accepts connections within TIMEOUT_S (False, said, when it does not, or it exited)."""
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return True
        except OSError:
            if time.monotonic() > deadline or tap.poll() is not None:
                print("the tap did not start; see", work / "tap.log")
                return False
            time.sleep(0.05)


def stop_tap(tap: subprocess.Popen) -> None:
    """SIGTERM, and SIGKILL to its session when it has not exited 10 s later."""
    tap.send_signal(signal.SIGTERM)
    try:
        tap.wait(10)
    except subprocess.TimeoutExpired:
        os.killpg(tap.pid, signal.SIGKILL)
        tap.wait()


def main() -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", choices=["last", "first-split", "last-late"], default="last",
                    help="first-split: the role chunk and 2 tokens of 30 KB in one write; the first token's event ends "
                    "past the client's window: its forwarded stamp is checked instead; last-late: the last token, a 3 KB "
                    "usage chunk and the end in one upstream write, the client reading 2 KB every 10 ms from 0.1 s: the "
                    "stamp must not be after the client held the token's last byte")
    args = ap.parse_args()
    event = "first_token.forwarded" if args.case == "first-split" else "last_token.forwarded"
    work = Path(tempfile.mkdtemp(prefix="held-last-"))
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()
    th = threading.Thread(target=upstream, args=(listener, stop, 2 if args.case == "first-split" else 0, args.case == "last-late"), daemon=True)
    th.start()
    tap, port, spans = start_tap(listener.getsockname()[1], work)
    try:
        if not listening(tap, port, work):
            return 2
        c = socket.socket()
        c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        c.settimeout(TIMEOUT_S)
        c.connect(("127.0.0.1", port))
        c.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: e\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
        time.sleep(0.1 if args.case == "last-late" else 0.4)  # the window shut: the tap's writes wait
        began = time.time_ns()
        got = b""
        reads: list[tuple[int, int]] = []  # (bytes held after the recv, when it returned)
        while not got.endswith(b"0\r\n\r\n"):
            data = c.recv(2048 if args.case == "last-late" else 65536)
            if not data:
                break
            got += data
            reads.append((len(got), time.time_ns()))
            if args.case == "last-late":
                time.sleep(0.01)
        c.close()
        assert b"t%03d" % (N_TOKENS - 1) in got, got[-300:]
    finally:
        stop_tap(tap)
        stop.set()
        listener.close()
        th.join(5)
    sys.path.insert(0, str(ROOT))
    from deltatap.core.vocab import Attr, parse_stamp_bounds

    found, stated = None, {}
    for line in spans.read_text().splitlines():
        obj = json.loads(line)
        for ev in _events(obj):
            if ev[0] == event:
                found = ev
                stated = parse_stamp_bounds(_span_attr(obj, Attr.STAMP_BOUNDS))
    if found is None:
        print(f"no {event} event in", spans)
        return 2
    _, t_ns, _attrs = found
    _before, after = stated.get(event, (0, 0))
    early_ms = (began - t_ns) / 1e6
    print(f"client began to read at {began}; {event} at {t_ns}: {early_ms:.3f} ms before the bytes could leave;"
          f" its stated interval (deltatap.stamp.bounds): {stated.get(event, 'none: stated exact')}")
    if args.case == "last-late":
        pos = got.rindex(b"t%03d " % (N_TOKENS - 1))
        end = got.index(b"\n\n", pos) + 1  # the byte completing the event (the blank line's line end)
        held = next(t for n, t in reads if n > end)
        late_ms = (t_ns - held) / 1e6
        print(f"the client held the last token's completing byte at {held}; the stamp is {late_ms:+.3f} ms from it")
        if t_ns - _before > held + 50_000:  # (stated exact: _before == 0; 50 us: the exact tolerance)
            print(f"DEFECT: {event} is after the client already held the token's bytes (the write placed at a later byte)")
            return 1
        # the byte fits the client's buffer (SO_RCVBUF 4096: at most ~16 KB with the kernel's doubling and slack) only
        # once the client has read up to 16 KB before it: it cannot have left before that read
        room = next((t for n, t in reads if n >= end - 16384), began)
        if t_ns < room and (after >= 0 and t_ns + after < room):
            print(f"DEFECT: {event} is {(room - t_ns) / 1e6:.3f} ms before its bytes could leave (the client's buffer was full)")
            return 1
        print("ok: not after the client held the bytes")
        return 0
    if t_ns < began and (after >= 0 and t_ns + after < began):  # (an unknown side, -1, claims nothing)
        print(f"DEFECT: {event} is before its bytes could leave and its bound does not reach them")
        return 1
    if after < 0:
        print("UNPLACED: stated unknown (claims nothing: honest, but the departure is not found; the packet log has it)")
        return 3
    print("ok: placed at or after the client began to read" if t_ns >= began else "ok: its interval reaches the departure")
    return 0


def _span_attr(obj, key):
    """The first span attribute ``key`` in one line of the file export (OTLP JSON)."""
    stack = [obj]
    while stack:
        o = stack.pop()
        if isinstance(o, dict):
            if o.get("key") == key and isinstance(o.get("value"), dict):
                return next(iter(o["value"].values()), None)
            stack.extend(o.values())
        elif isinstance(o, list):
            stack.extend(o)
    return None


def _events(obj):
    """(name, unix ns, attributes) of every span event in one line of the tap's file export (OTLP JSON)."""
    out = []

    def attrs(lst):
        d = {}
        for a in lst or []:
            v = a.get("value", {})
            d[a.get("key")] = next(iter(v.values()), None) if v else None
        return d

    def walk(o):
        if isinstance(o, dict):
            if "timeUnixNano" in o and "name" in o:
                out.append((o["name"], int(o["timeUnixNano"]), attrs(o.get("attributes"))))
            for v in o.values():
                walk(v)
        elif isinstance(o, list):
            for v in o:
                walk(v)

    walk(obj)
    return out


if __name__ == "__main__":
    sys.exit(main())
