"""Reproduction (session 25, referee): a read stamped at a spurious retransmission's duplicate, not the copy that arrived.

    .venv/bin/python benchmarks/tlp_dup_s25_referee.py        (root: the tap's packet log needs CAP_NET_RAW)

What the wire referee found at 200 req/s with 2 tap workers (docs/benchmarks.md, Session 25 referee, item 3): a tap
that reads late leaves the segment un-ACKed (delayed ACK), the sender's tail-loss probe sends it again, the tap's ACK
D-SACKs the duplicate (the first copy had arrived), and the tap stamps the read at the duplicate's arrival. Here, made
to happen on purpose: one ``deltatap tap`` (spans to a file) before a raw upstream; a client makes 3 exchanges on one
keep-alive connection (the tap's upstream connection leaves quick-ACK mode), then a 4th: the upstream stops the tap
(SIGSTOP), writes the role chunk and the first token as two segments (two packets out: the probe timer is 2 x RTT,
not 200 ms), waits ``--stop-ms``, resumes the tap (SIGCONT) and finishes. The first token's bytes reached the tap's
socket when they were sent (``sent``, loopback; the capture would show the first copy then, the duplicate later);
``first_token.received`` should be there. Prints the stamp against ``sent``, the stated interval, and whether the
kernel retransmitted (``tcpi_total_retrans`` of the upstream socket). Exit 1: stamped > 1 ms after ``sent`` and
stated exact while a retransmission happened (the defect); 2: no retransmission happened (case not met, run again);
0 otherwise.

Result (session 25, head 286263f's working tree): NOT reproduced this way. With the role chunk and the token both
pending (``--stop-ms 60``, 1 or 2 workers) the kernel retransmitted the token once and the tap still stamped the
first copy (-8 us, exact): the packet log's placement of a read of two segments plus a duplicate is right. With the
role chunk sent first (``--role-before-ms 0.5-2``) the tap's read ACKed it and no probe came (one packet out: the
probe waits ~200 ms, the delayed ACK 40). The chain's cases (a read of the token alone, ``tcpi_segs_in`` up by 2 with
the duplicate; 2 workers, the C read paths, load 4-6) remain to be made small.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import struct
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from held_last_s25_referee import TIMEOUT_S, _chunk, _events, _span_attr, listening, read_head, start_tap, stop_tap  # noqa: E402

ROLE = b'data: {"choices":[{"index":0,"delta":{"role":"assistant"}}]}\n\n'


def _tok(i: int) -> bytes:
    return b'data: {"choices":[{"index":0,"delta":{"content":"t%d "}}]}\n\n' % i


def total_retrans(s: socket.socket) -> int:
    info = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
    return struct.unpack_from("I", info, 100)[0]  # tcpi_total_retrans (struct tcp_info, Linux)


def upstream(listener: socket.socket, tap_pid: list[int], stop_ms: float, out: dict, role_before: float | None = None) -> None:
    listener.settimeout(TIMEOUT_S)
    conn, _ = listener.accept()
    while True:  # (the tap may probe first: a connection that sends nothing)
        conn.settimeout(TIMEOUT_S)
        first = conn.recv(65536, socket.MSG_PEEK)
        if first:
            break
        conn.close()
        conn, _ = listener.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # (else Nagle holds the token behind the un-ACKed role chunk)
    with conn:
        for n in range(4):
            if read_head(conn) is None:
                return
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
            if n < 3:
                conn.sendall(_chunk(ROLE) + _chunk(_tok(0)) + _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
                continue
            r0 = total_retrans(conn)
            time.sleep(0.02)  # (the head's ACK back)
            if role_before is not None:  # the role chunk read by the tap before it stops (its ACK maybe still delayed)
                conn.sendall(_chunk(ROLE))
                time.sleep(role_before / 1e3)
            os.kill(tap_pid[0], signal.SIGSTOP)
            try:
                if role_before is None:
                    conn.sendall(_chunk(ROLE))
                conn.sendall(_chunk(_tok(1)))
                out["sent"] = time.time_ns()
                time.sleep(stop_ms / 1e3)
            finally:
                os.kill(tap_pid[0], signal.SIGCONT)
            out["retrans"] = total_retrans(conn) - r0
            time.sleep(0.005)
            conn.sendall(_chunk(_tok(2)) + _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
            time.sleep(0.1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stop-ms", type=float, default=60.0, help="how long the tap is stopped (delayed ACK min is 40 ms)")
    ap.add_argument("--role-before-ms", type=float, default=None, help="the role chunk this long before the stop (the tap "
                    "reads it; its ACK may still be delayed when the token goes): the token is then read alone")
    ap.add_argument("--workers", type=int, default=1, help="tap --workers (the stop hits every worker)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tlp-dup-"))
    listener = socket.create_server(("127.0.0.1", 0))
    tap, port, spans = start_tap(listener.getsockname()[1], work, *(["--workers", str(args.workers)] if args.workers > 1 else []))
    out: dict = {}
    th = threading.Thread(target=upstream, args=(listener, [-tap.pid], args.stop_ms, out, args.role_before_ms), daemon=True)
    try:
        if not listening(tap, port, work):
            return 2
        th.start()
        c = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S)
        for n in range(4):
            c.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: e\r\nContent-Type: application/json\r\nX-Request-ID: q%d\r\n"
                      b"Content-Length: 2\r\n\r\n{}" % n)
            got = b""
            while not got.endswith(b"0\r\n\r\n"):
                data = c.recv(65536)
                if not data:
                    break
                got += data
        c.close()
        th.join(TIMEOUT_S)
    finally:
        os.killpg(tap.pid, signal.SIGCONT)
        stop_tap(tap)
        listener.close()
    from deltatap.core.vocab import Attr, parse_stamp_bounds

    found, stated = None, {}
    for line in spans.read_text().splitlines():
        obj = json.loads(line)
        if "q3" not in line:
            continue
        for ev in _events(obj):
            if ev[0] == "first_token.received":
                found = ev
                stated = parse_stamp_bounds(_span_attr(obj, Attr.STAMP_BOUNDS))
    if found is None or "sent" not in out:
        print("no first_token.received for the 4th exchange (or the upstream did not get there)", out)
        return 2
    t = found[1]
    before, _after = stated.get("first_token.received", (0, 0))
    late_ms = (t - out["sent"]) / 1e6
    print(f"first token sent (and in the tap's socket) at {out['sent']}; first_token.received {late_ms:+.3f} ms from it; "
          f"stated interval {stated.get('first_token.received', 'none: exact')}; retransmissions while the tap was stopped: {out['retrans']}")
    if not out["retrans"]:
        print("no retransmission happened: the case was not met")
        return 2
    if late_ms > 1.0 and (before >= 0 and t - before > out["sent"] + 1_000_000):
        print("DEFECT: the read is stamped at the duplicate (the retransmission), not at the copy that arrived, and stated exact")
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
