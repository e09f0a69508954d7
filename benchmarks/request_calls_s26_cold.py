"""Python calls per request on the tap's request path, counted where the host's load cannot move them (issue 15, session 26
"cold"), A/B by source trees.

benchmarks/tap_cpu_ab.py's counted tap (cProfile on between SIGUSR1 and SIGUSR2, each tree through its shim,
``--otlp none``) in front of an upstream thread here that answers each request with one small fixed response in one
write; one client connection sends a 7-header POST (no ``traceparent``: the usual head), reads the answer, then the
next: one read per request and per response, whatever the load (a streaming mock's reads merge or split with timing,
and its call counts with them). Per tree: every Python function's calls per request, the total, and the functions
whose count differs between the trees.

    .venv/bin/python benchmarks/request_calls_s26_cold.py --tree base=/tmp/s26base --tree new=. [--requests 2000]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from pstats import Stats

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from cold_syscalls_s26_cold import RESP, fixed_upstream, request  # noqa: E402
from tap_cpu_ab import _COUNTED, parse_trees, shim  # noqa: E402


def count(py: str, tmp: Path, name: str, path: Path, n: int, warm: int, resp: bytes = RESP) -> dict[str, float]:
    """Python calls per request, by function, of the tap from source tree ``path`` with an upstream answering ``resp``."""
    import socket

    up, stop, port = fixed_upstream(resp)
    prof = tmp / f"calls-{name}.prof"
    tap = subprocess.Popen([py, "-c", _COUNTED.format(out=str(prof)), "tap", "--link", "fw-engine", "--listen", f"127.0.0.1:{port}",
                            "--no-admin", "--upstream", f"http://127.0.0.1:{up.getsockname()[1]}", "--otlp", "none"],
                           env={**os.environ, "PYTHONPATH": str(path)}, cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                c = socket.create_connection(("127.0.0.1", port), timeout=10)
                break
            except OSError:
                time.sleep(0.1)

        def one(i: int) -> None:
            c.sendall(request(i))
            got = b""
            while not got.endswith(resp[-10:]):
                more = c.recv(65536)
                if not more:
                    raise RuntimeError("the tap closed the connection")
                got += more

        for i in range(warm):
            one(i)
        time.sleep(0.3)
        tap.send_signal(signal.SIGUSR1)
        time.sleep(0.3)
        for i in range(n):
            one(warm + i)
        time.sleep(0.3)  # (the last exchange's finish and span run after its read)
        tap.send_signal(signal.SIGUSR2)
        deadline = time.monotonic() + 30
        while not prof.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)
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
    out: dict[str, float] = {}
    for (fn, _ln, func), v in Stats(str(prof)).stats.items():
        key = f"{'/'.join(fn.split('/')[-2:])}:{func}" if fn != "~" else func
        if key.startswith("<built-in method __new__ of type object"):
            key = "<built-in method __new__ of type object>"  # (its address differs between processes)
        out[key] = out.get(key, 0) + v[1] / n
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tree", action="append", required=True, metavar="NAME=DIR")
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--out", default=str(HERE / "results" / "request_calls_s26_cold.json"))
    args = p.parse_args()
    args.out = str(Path(args.out).resolve())
    trees = parse_trees(args.tree)
    if trees is None:
        return 2
    return run("request_calls_s26_cold", trees, args, RESP)


def run(benchmark: str, trees: dict[str, Path], args: argparse.Namespace, resp: bytes, **extra: object) -> int:
    """Count each tree's tap (:func:`count`, upstream answering ``resp``), write ``args.out``: the calls per request, the
    functions whose count differs between the trees, every function's count (``extra``: more top-level fields)."""
    tmp = Path(tempfile.mkdtemp(prefix="deltatap-reqcalls-"))
    os.chdir(tmp)
    counts = {name: count(sys.executable, tmp, name, shim(tree, tmp / f"shim-{name}"), args.requests, args.warmup, resp)
              for name, tree in trees.items()}
    names = list(counts)
    keys = sorted(set().union(*counts.values()))
    differ = {k: {n: round(counts[n].get(k, 0.0), 2) for n in names} for k in keys
              if max(counts[n].get(k, 0.0) for n in names) - min(counts[n].get(k, 0.0) for n in names) >= 0.01}
    res = {"benchmark": benchmark, "command": f"python benchmarks/{benchmark}.py " + " ".join(sys.argv[1:]),
           "trees": {k: str(v) for k, v in trees.items()}, "requests": args.requests, **extra,
           "calls_per_request": {n: round(sum(c.values()), 2) for n, c in counts.items()}, "differ": differ,
           "per_function": {n: {k: round(v, 2) for k, v in sorted(c.items(), key=lambda kv: -kv[1])} for n, c in counts.items()}}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps({"calls_per_request": res["calls_per_request"], "differ": differ}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
