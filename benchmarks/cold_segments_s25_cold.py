"""Where a cold tap's request path spends its time, segment by segment, A/B by source trees (issue 15, session 25 "cold").

Each tree is copied to a temporary folder and its proxy/relay.py given timing marks (mono ns, kept in a list written at
exit; the copy only — the tree is not touched): the read's packet stamp, Downstream.on_data's entry, the pair's deferred
work settled, the framing reader's feed, the span ids (trace_context + begin), the head rewrite, the rest up to the
forwarding write, that write's stamp and its return. Per round and tree: a tap (that copy, through
benchmarks/tap_cpu_ab.py's shim, --otlp none) in front of an upstream thread here that answers every read with a small
fixed response at once; one client connection sending a 7-header POST with a JSON body, reading the answer, then
sleeping --sleep-ms (30: the tap's CPU idles; 1: warm) before the next; the first 25 requests left out. Prints and
writes the segments' medians (us) per tree and round.

    .venv/bin/python benchmarks/cold_segments_s25_cold.py --tree base=/tmp/deltatap-base --tree new=. [--rounds 3] [--requests 150] [--sleep-ms 30]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from cold_syscalls_s26_cold import RESP, fixed_upstream  # noqa: E402
from tap_cpu_ab import parse_trees, shim  # noqa: E402

SEGMENTS = ["packet->on_data", "settle", "checks", "feed", "to span ids", "span ids", "rewrite", "to write", "write's stamp", "write's return"]
BODY = json.dumps({"model": "mock", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8, "stream": True}).encode()


def instrument(tree: Path, into: Path) -> Path:
    shutil.copytree(tree, into, symlinks=True, ignore=shutil.ignore_patterns(".git", "build", "__pycache__", "tests", "benchmarks", "docs"))
    p = into / "proxy" / "relay.py"
    s = p.read_text()
    s = s.replace('log = logging.getLogger("deltatap.tap")\n', 'log = logging.getLogger("deltatap.tap")\n_T = []\nimport atexit as _ax, json as _js\n'
                  '_ax.register(lambda: open(os.environ["COLD_SEGMENTS_OUT"], "w").write(_js.dumps(_T)) if os.environ.get("COLD_SEGMENTS_OUT") else None)\n', 1)
    def ins(before: str, line: str, occurrence: int = 0) -> None:
        nonlocal s
        at = -1
        for _ in range(occurrence + 1):
            at = s.index(before, at + 1)
        start = s.rindex("\n", 0, at) + 1
        indent = s[start : start + len(s[start:]) - len(s[start:].lstrip(" "))]
        s = s[:start] + indent + line + "\n" + s[start:]
    ins("if self.accounting or (self.up is not None and self.up.deferred):  # (the pair's deferred work first: _Watches)\n            self._settle()\n        if self.holding", "_T.append([t, mono()])")
    ins("if self.holding is not None:  # (a client's next request", "_T[-1].append(mono())")
    ins("self._process(data, self.reader.feed(data), t, bound)", "_T[-1].append(mono())")
    s = s.replace("self._process(data, self.reader.feed(data), t, bound)", "_evs = self.reader.feed(data)\n        _T[-1].append(mono())\n        self._process(data, _evs, t, bound)", 1)
    ins("trace_context(head)", "_T[-1].append(mono())", 0)
    ins("new_head, rid, created = rewrite_request_head(", "_T[-1].append(mono())")
    ins("heads.append((head, first, span, rid, created))", "_T[-1].append(mono())")
    ins("stamp = self._send_up(payload, ended, place=False)", "_T[-1].append(mono())")
    s = s.replace("stamp = self._send_up(payload, ended, place=False)\n", "stamp = self._send_up(payload, ended, place=False)\n"
                  "                    _T[-1].append(stamp[0]); _T[-1].append(mono())\n", 1)
    p.write_text(s)
    return into


def one_round(py: str, tmp: Path, name: str, path: Path, args: argparse.Namespace) -> list[float] | None:
    up, stop, port = fixed_upstream()
    out = tmp / f"marks-{name}.json"
    tap = subprocess.Popen([py, "-m", "deltatap.app.cli", "tap", "--link", "fw-engine", "--listen", f"127.0.0.1:{port}", "--no-admin",
                            "--upstream", f"http://127.0.0.1:{up.getsockname()[1]}", "--otlp", "none"],
                           env={**os.environ, "PYTHONPATH": str(path), "COLD_SEGMENTS_OUT": str(out)}, cwd=tmp,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                c = socket.create_connection(("127.0.0.1", port), timeout=10)
                break
            except OSError:
                time.sleep(0.1)
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for i in range(args.requests):
            time.sleep(args.sleep_ms / 1000)
            c.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nAccept: */*\r\n"
                      b"User-Agent: Python/3.11 aiohttp/3.9\r\nX-Request-Id: r-%d\r\nContent-Length: %d\r\n\r\n" % (i, len(BODY)) + BODY)
            got = b""
            while not got.endswith(RESP[-10:]):
                more = c.recv(65536)
                if not more:
                    raise RuntimeError("the tap closed the connection")
                got += more
        c.close()
    finally:
        stop.set()
        tap.terminate()
        try:
            tap.wait(15)
        except subprocess.TimeoutExpired:
            tap.kill()
            tap.wait()
        up.close()
    rows = [r for r in json.loads(out.read_text()) if len(r) == len(SEGMENTS) + 1][25:]
    if not rows:
        return None
    a = np.diff(np.array(rows, dtype=float), axis=1)
    return [round(float(np.percentile(a[:, i], 50)) / 1e3, 1) for i in range(a.shape[1])] + [
        round(float(np.percentile(np.array(rows, dtype=float)[:, -2] - np.array(rows, dtype=float)[:, 0], 50)) / 1e3, 1)]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tree", action="append", required=True, metavar="NAME=DIR")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--requests", type=int, default=150)
    p.add_argument("--sleep-ms", type=float, default=30)
    p.add_argument("--out", default=str(HERE / "results" / "cold_segments_s25_cold.json"))
    args = p.parse_args()
    args.out = str(Path(args.out).resolve())
    parsed = parse_trees(args.tree)  # (before the chdir)
    if parsed is None:
        return 2
    trees = list(parsed.items())
    py = sys.executable
    tmp = Path(tempfile.mkdtemp(prefix="deltatap-cold-"))
    os.chdir(tmp)
    paths = {}
    for name, folder in trees:
        copy = instrument(folder, tmp / f"tree-{name}")
        paths[name] = shim(copy, tmp / f"shim-{name}")
    load0 = os.getloadavg()[0]
    rounds: dict[str, list] = {name: [] for name in paths}
    for _ in range(args.rounds):
        for name, path in paths.items():
            got = one_round(py, tmp, name, path, args)
            rounds[name].append(got)
            print(name, dict(zip(SEGMENTS + ["packet->write's stamp"], got or [])), flush=True)
    res = {"benchmark": "cold_segments_s25_cold", "command": "python benchmarks/cold_segments_s25_cold.py " + " ".join(sys.argv[1:]),
           "what": "per tree, per round: the segments' medians in us (see the module's doc)", "segments": SEGMENTS + ["packet->write's stamp"],
           "loadavg_1m": {"before": load0, "after": os.getloadavg()[0]}, "sleep_ms": args.sleep_ms,
           "rounds": rounds,
           "median_of_rounds": {name: dict(zip(SEGMENTS + ["packet->write's stamp"], np.median(np.array([r for r in v if r]), axis=0).round(1).tolist()))
                                for name, v in rounds.items()}}
    Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps(res["median_of_rounds"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
