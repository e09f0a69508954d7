"""A cold tap's request, cut at its own system calls, A/B by source trees (issue 15, session 26 "cold").

No timing marks in the code: ``perf record -e raw_syscalls:sys_enter,raw_syscalls:sys_exit`` on each tap process (its
event-loop thread) while one client connection sends a POST every ``--sleep-ms`` (30: the tap's CPU idles between
requests) to the tap in front of an upstream thread here that answers each read with a small fixed response at once.
Per request, from the syscalls' kernel timestamps (us):

* ``wake->read``: the loop's ``epoll_pwait`` returns -> the request's ``recvmsg`` returns (uvloop's dispatch, the
  C read's TCP_INFO, anything run before the read);
* ``read->forward``: that read returns -> the forwarding ``sendto`` is entered (the request path in Python and C);
* ``forward``: the forwarding ``sendto`` itself (on loopback it runs the upstream's TCP input and wakes it);
* ``forward->next``: the ``sendto`` returns -> the tap's next syscall (what runs after the forward, and any time the
  woken upstream held the tap's CPU: the tap is preempted there when the upstream is switched in on its CPU);
* ``response read->forward``: the response's read returns -> its forwarding ``sendto`` is entered;
* ``response forward->sleep``: that ``sendto`` returns -> the next ``epoll_pwait`` (the deferred request account
  and the response's watch, after the client was woken).

Trees alternate round by round; each through benchmarks/tap_cpu_ab.py's shim, ``--otlp none``.

    .venv/bin/python benchmarks/cold_syscalls_s26_cold.py --tree base=/tmp/s26base --tree new=. [--rounds 4] [--requests 120]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from tap_cpu_ab import parse_trees, shim  # noqa: E402

_SSE = b'data: {"choices":[]}\n\ndata: [DONE]\n\n'
# (its Content-Length right: session 25's cold_segments script, since retired, said 40 for 38 bytes, so from its second
# exchange the tap's upstream reader read the next answer as this one's body and then passed the connection on unparsed)
RESP = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n" % len(_SSE) + _SSE
BODY = json.dumps({"model": "mock", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8, "stream": True}).encode()
SEGMENTS = ["wake->read", "read->forward", "forward", "forward->next", "response read->forward", "response forward->sleep"]
EPOLL = {232, 281}  # epoll_wait, epoll_pwait


def fixed_upstream(resp: bytes | tuple[bytes, ...] = RESP, gap_s: float = 0.0) -> tuple[socket.socket, threading.Event, int]:
    """A listening upstream on 127.0.0.1 that answers every read on every connection with ``resp`` (the tap's start-up
    probe connects too), and a free port for the tap: (listener, stop event, port). Set the event and close the
    listener to end it. ``resp`` as several parts: each written on its own, ``gap_s`` apart (``TCP_NODELAY``: each
    leaves as it is written)."""
    parts = (resp,) if isinstance(resp, bytes) else tuple(resp)
    up = socket.socket()
    up.bind(("127.0.0.1", 0))
    up.listen(8)
    stop = threading.Event()

    def answer(c: socket.socket) -> None:
        with c:
            while not stop.is_set():
                try:
                    got = c.recv(65536)
                    if not got:
                        return
                    for k, part in enumerate(parts):
                        if k:
                            time.sleep(gap_s)
                        c.sendall(part)
                except OSError:
                    return

    def serve() -> None:
        while not stop.is_set():
            try:
                c, _ = up.accept()
            except OSError:
                return
            if len(parts) > 1:
                c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=answer, args=(c,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return up, stop, port
READS = {0, 45, 47}  # read, recvfrom, recvmsg
SENDS = {1, 44, 46}  # write, sendto, sendmsg
_LINE = re.compile(r"\s*(\d+)\s+([\d.]+):\s+raw_syscalls:sys_(enter|exit):\s+NR (\d+) (.*)")


def request(i: int) -> bytes:
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nAccept: */*\r\n"
            b"User-Agent: Python/3.11 aiohttp/3.9\r\nX-Request-Id: r-%06d\r\nContent-Length: %d\r\n\r\n" % (i, len(BODY)) + BODY)


def segments(perf_data: Path) -> dict[str, list[float]]:
    """Each request's segments (see the module doc) from the tap's syscall events."""
    out = subprocess.run(["perf", "script", "-i", str(perf_data), "-F", "tid,time,event,trace"], capture_output=True, text=True).stdout
    ev = []
    for line in out.splitlines():
        m = _LINE.match(line)
        if m:
            tid, t, kind, nr, rest = m.groups()
            ev.append((int(tid), float(t) * 1e6, kind == "enter", int(nr), rest.strip()))
    if not ev:
        return {}
    main = Counter(e[0] for e in ev).most_common(1)[0][0]  # (the event loop's thread: nearly all syscalls)
    ev = [e for e in ev if e[0] == main]
    req_n, resp_n = f"= {len(request(0))}", f"= {len(RESP)}"
    got: dict[str, list[float]] = {s: [] for s in SEGMENTS}
    woke = None
    for j, (_tid, t, enter, nr, rest) in enumerate(ev):
        if nr in EPOLL and not enter:
            woke = t
        if nr not in READS or enter or rest not in (req_n, resp_n):
            continue
        send = next((k for k in range(j + 1, min(j + 40, len(ev))) if ev[k][3] in SENDS and ev[k][2]), None)
        if send is None or send + 2 >= len(ev) or ev[send + 1][2] or ev[send + 1][3] != ev[send][3]:
            continue
        sent = ev[send + 1][1]
        if rest == req_n:
            if woke is not None:
                got["wake->read"].append(t - woke)
            got["read->forward"].append(ev[send][1] - t)
            got["forward"].append(sent - ev[send][1])
            got["forward->next"].append(ev[send + 2][1] - sent)
        else:
            got["response read->forward"].append(ev[send][1] - t)
            sleep = next((k for k in range(send + 2, min(send + 200, len(ev))) if ev[k][3] in EPOLL and ev[k][2]), None)
            if sleep is not None:
                got["response forward->sleep"].append(ev[sleep][1] - sent)
    return got


def one_round(py: str, tmp: Path, name: str, path: Path, args: argparse.Namespace, rnd: int) -> dict[str, list[float]]:
    up, stop, port = fixed_upstream()
    tap = subprocess.Popen([py, "-m", "deltatap.app.cli", "tap", "--link", "fw-engine", "--listen", f"127.0.0.1:{port}", "--no-admin",
                            "--upstream", f"http://127.0.0.1:{up.getsockname()[1]}", "--otlp", "none"],
                           env={**os.environ, "PYTHONPATH": str(path)}, cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    data = tmp / f"perf-{name}-{rnd}.data"
    perf = None
    try:
        for _ in range(100):
            try:
                c = socket.create_connection(("127.0.0.1", port), timeout=10)
                break
            except OSError:
                time.sleep(0.1)
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def one(i: int) -> None:
            c.sendall(request(i))
            got = b""
            while not got.endswith(RESP[-10:]):
                more = c.recv(65536)
                if not more:
                    raise RuntimeError("the tap closed the connection")
                got += more

        for i in range(args.warmup):
            one(i)
            time.sleep(args.sleep_ms / 1000)
        perf = subprocess.Popen(["perf", "record", "-q", "-e", "raw_syscalls:sys_enter,raw_syscalls:sys_exit", "-o", str(data), "-p", str(tap.pid)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.5)
        for i in range(args.requests):
            time.sleep(args.sleep_ms / 1000)
            one(args.warmup + i)
        time.sleep(0.1)
        perf.send_signal(signal.SIGINT)
        perf.wait(30)
        c.close()
    finally:
        if perf is not None and perf.poll() is None:
            perf.kill()
        stop.set()
        tap.terminate()
        try:
            tap.wait(15)
        except subprocess.TimeoutExpired:
            tap.kill()
            tap.wait()
        up.close()
    return segments(data)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tree", action="append", required=True, metavar="NAME=DIR")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--requests", type=int, default=120)
    p.add_argument("--warmup", type=int, default=25)
    p.add_argument("--sleep-ms", type=float, default=30)
    p.add_argument("--out", default=str(HERE / "results" / "cold_syscalls_s26_cold.json"))
    args = p.parse_args()
    args.out = str(Path(args.out).resolve())
    trees = parse_trees(args.tree)
    if trees is None:
        return 2
    py = sys.executable
    tmp = Path(tempfile.mkdtemp(prefix="deltatap-coldsys-"))
    os.chdir(tmp)  # (python -m puts the working directory first on sys.path: a checkout there would win over the shim)
    paths = {name: shim(tree, tmp / f"shim-{name}") for name, tree in trees.items()}
    load0 = os.getloadavg()[0]
    rounds: dict[str, list[dict]] = {name: [] for name in paths}
    for rnd in range(args.rounds):
        for name, path in (paths.items() if rnd % 2 == 0 else reversed(paths.items())):
            got = one_round(py, tmp, name, path, args, rnd)
            med = {k: (round(float(np.median(v)), 1) if v else None) for k, v in got.items()}
            med["n"] = len(got.get("read->forward", []))
            rounds[name].append(med)
            print(name, med, flush=True)
    res = {"benchmark": "cold_syscalls_s26_cold", "command": "python benchmarks/cold_syscalls_s26_cold.py " + " ".join(sys.argv[1:]),
           "trees": {k: str(v) for k, v in trees.items()}, "what": "per tree, per round: each segment's median over the requests, us (module doc)",
           "segments": SEGMENTS, "sleep_ms": args.sleep_ms, "loadavg_1m": {"before": load0, "after": os.getloadavg()[0]}, "rounds": rounds,
           "median_of_rounds": {name: {s: round(float(np.median([r[s] for r in v if r.get(s) is not None])), 1) for s in SEGMENTS
                                       if any(r.get(s) is not None for r in v)} for name, v in rounds.items()}}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps(res["median_of_rounds"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
