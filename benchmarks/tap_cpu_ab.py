"""CPU per request of the tap built from two (or more) source trees, in one run: benchmarks/tap_cpu.py's measurement
(one tap process per tree in front of the same streaming mock upstream, paths interleaved in a shuffled order each
round, CPU from /proc/PID/stat) with each tap importing its own tree. On a shared machine, before/after figures
taken in separate runs differ by more than a small change; taken in one run they share the load.

    git worktree add /tmp/deltatap-base HEAD~1
    .venv/bin/python benchmarks/tap_cpu_ab.py --tree base=/tmp/deltatap-base --tree new=. [--requests 2000] [--rounds 4]

Each tap process gets ``PYTHONPATH`` pointing at a shim of its tree (a temporary ``deltatap`` package of links to the
tree's ``deltatap/*`` and to its top-level folders as setup.py maps them, ``proxy`` → ``deltatap.proxy`` and so on),
so the installed editable checkout is not what it imports. C accelerators come with the tree's built ``.so`` files
(none built there: the Python reference runs). Writes benchmarks/results/tap_cpu_ab.json.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from tap_cpu import PATH, drive, measure, start_tap  # noqa: E402
from tap_overhead import free_port, stop_all, wait_port  # noqa: E402

from deltatap.net import aio  # noqa: E402


def shim(tree: Path, into: Path) -> Path:
    """A directory to put on PYTHONPATH so that ``deltatap.*`` is imported from ``tree``."""
    setup = tree / "setup.py"
    folders: dict[str, str] = {}
    for node in ast.parse(setup.read_text()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "FOLDERS" for t in node.targets):
            folders = ast.literal_eval(node.value)
    pkg = into / "deltatap"
    pkg.mkdir(parents=True)
    mapped = {name.split(".", 1)[1]: tree / folder for name, folder in folders.items()}
    for entry in (tree / "deltatap").iterdir():
        if entry.name != "__pycache__" and entry.name not in mapped:
            (pkg / entry.name).symlink_to(entry.resolve())
    for name, folder in mapped.items():
        (pkg / name).symlink_to(folder.resolve())
    return into


def parse_trees(specs: list[str]) -> dict[str, Path] | None:
    """``--tree NAME=DIR`` values as {name: resolved DIR} (resolve them before any chdir); None, with one line on stderr
    saying why, where a value is not NAME=DIR with DIR a deltatap source tree (setup.py and deltatap/ in it)."""
    trees: dict[str, Path] = {}
    for spec in specs:
        name, _, folder = spec.partition("=")
        tree = Path(folder or ".").resolve()
        if not name or not (tree / "setup.py").is_file() or not (tree / "deltatap").is_dir():
            print(f"--tree {spec}: give NAME=DIR with DIR a deltatap source tree (setup.py and deltatap/ in it)", file=sys.stderr)
            return None
        trees[name] = tree
    return trees


# a tap whose cProfile counts only between SIGUSR1 (enable) and SIGUSR2 (disable, write the stats): the measured
# requests' Python function calls, not the start-up's
_COUNTED = (
    "import cProfile, signal, sys, time; from deltatap.app.cli import main; p = cProfile.Profile(time.thread_time); "
    "signal.signal(signal.SIGUSR1, lambda *a: p.enable()); "
    "signal.signal(signal.SIGUSR2, lambda *a: (p.disable(), p.dump_stats({out!r}))); sys.exit(main(sys.argv[1:]))"
)


def count_calls(py: str, trees: dict[str, Path], shims: dict[str, Path], up_port: int, tmp: Path, args: argparse.Namespace) -> dict:
    """Python function calls per request of each tree's tap (cProfile's count over ``--calls`` requests at each
    concurrency, after a warm-up; the profiler is on only while they run): a figure the host's load does not move."""
    import signal

    from pstats import Stats

    from tap_overhead import free_port

    body = json.dumps({"model": "mock", "messages": [{"role": "user", "content": "hello"}], "max_tokens": args.tokens, "stream": True,
                       "stream_options": {"include_usage": True}}).encode()
    q = f"?first_ms=0&gap_ms={args.gap_ms}"
    out: dict = {}
    for name, tree in trees.items():
        for conc in args.concurrency:
            prof = tmp / f"calls-{name}-{conc}.prof"
            port = free_port()
            tap = subprocess.Popen(
                [py, "-c", _COUNTED.format(out=str(prof)), "tap", "--link", "fw-engine", "--listen", f"127.0.0.1:{port}", "--no-admin",
                 "--upstream", f"http://127.0.0.1:{up_port}", "--otlp", "none"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(shims[name])}, cwd=tmp)
            try:
                wait_port(port, tap, "deltatap tap (counted)")
                url = f"http://127.0.0.1:{port}{PATH}{q}"
                aio.run(drive(url, conc, min(200, args.calls), body))
                tap.send_signal(signal.SIGUSR1)
                time.sleep(0.2)
                ok = aio.run(drive(url, conc, args.calls, body))
                tap.send_signal(signal.SIGUSR2)
                deadline = time.monotonic() + 30
                while not prof.exists() and time.monotonic() < deadline:
                    time.sleep(0.1)
                time.sleep(0.5)
            finally:
                tap.terminate()
                tap.wait(30)
            st = Stats(str(prof))
            total = sum(v[1] for v in st.stats.values())  # (every call, recursive ones included)
            out.setdefault(str(conc), {})[f"tap-{name}"] = {"requests": args.calls, "ok": ok, "calls_per_request": round(total / args.calls, 1)}
            print(f"calls c={conc} tap-{name}: {total / args.calls:.1f} per request", flush=True)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tree", action="append", required=True, metavar="NAME=DIR", help="a source tree to run a tap from (twice or more)")
    p.add_argument("--requests", type=int, default=2000, help="requests per path per round")
    p.add_argument("--rounds", type=int, default=4, help="rounds; figures are the median (default 4)")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    p.add_argument("--tokens", type=int, default=8, help="content events per stream (default 8)")
    p.add_argument("--gap-ms", type=float, default=1.0, help="gap between content events (default 1)")
    p.add_argument("--otlp", choices=["http", "file", "none"], default="none", help="the taps' span export (default none)")
    p.add_argument("--calls", type=int, default=0, metavar="N",
                   help="also count each tree's Python function calls per request over N requests per concurrency (cProfile, "
                        "the profiler on only while they run; span export none), after the CPU rounds")
    p.add_argument("--out", default=str(HERE / "results" / "tap_cpu_ab.json"))
    args = p.parse_args()
    args.out = str(Path(args.out).resolve())
    trees = parse_trees(args.tree)
    if trees is None:
        return 2
    if len(trees) < 2:
        print("give --tree NAME=DIR at least twice (the trees to compare)", file=sys.stderr)
        return 2
    py = sys.executable
    tmp = Path(tempfile.mkdtemp(prefix="deltatap-cpu-ab-"))
    os.chdir(tmp)  # (python -m puts the working directory first on sys.path: a checkout there would win over the shim)
    procs: list[subprocess.Popen] = []
    up_port = free_port()
    try:
        up = subprocess.Popen([py, str(HERE / "tap_mock_upstream.py"), "--port", str(up_port)], stdout=subprocess.DEVNULL)
        procs.append(up)
        wait_port(up_port, up, "mock upstream")
        urls, pids = {"direct": f"http://127.0.0.1:{up_port}/v1/chat/completions"}, {"upstream": up.pid}
        shims: dict[str, Path] = {}
        for name, tree in trees.items():
            path = shims[name] = shim(tree, tmp / f"shim-{name}")
            check = subprocess.run([py, "-c", "import deltatap.proxy.relay as r; print(r.__file__)"], capture_output=True, text=True,
                                   env={**os.environ, "PYTHONPATH": str(path)}, cwd=tmp, check=True)
            if not Path(check.stdout.strip()).resolve().is_relative_to(tree):
                print(f"--tree {name}: the tap would import {check.stdout.strip()}, not {tree}", file=sys.stderr)
                return 1
            urls[f"tap-{name}"], pids[f"tap-{name}"] = start_tap(py, args.otlp, up_port, tmp, procs, None, {"PYTHONPATH": str(path)})
        load = os.getloadavg()[0]
        levels = aio.run(measure(urls, pids, args))
        for proc in procs[1:]:
            proc.terminate()
        for proc in procs[1:]:
            proc.wait(30)
        calls = count_calls(py, trees, shims, up_port, tmp, args) if args.calls else None
    finally:
        stop_all(procs)
    result = {
        "command": "python benchmarks/tap_cpu_ab.py " + " ".join(sys.argv[1:]),
        "what": "CPU microseconds (user+system, all threads) per request of each tap process (tap-<tree>), median of the rounds, "
                "trees interleaved in one run; see benchmarks/tap_cpu.py",
        "trees": {name: str(tree) for name, tree in trees.items()},
        "tokens_per_stream": args.tokens,
        "gap_ms": args.gap_ms,
        "otlp": args.otlp,
        "loadavg_1m_before": load,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "levels": levels,
    }
    if calls is not None:
        result["python_calls_per_request"] = calls
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({c: {k: (v.get("cpu_us_per_request"), v.get("user_us_per_request")) for k, v in lv.items() if k != "direct"}
                      for c, lv in levels.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
