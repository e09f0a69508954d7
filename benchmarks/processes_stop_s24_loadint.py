"""``deltatap load --processes N`` stopped mid-run, base tree against this one (session 24, task loadint).

For each tree (``--tree NAME=DIR``: a checkout whose ``deltatap`` package is imported through a symlink tree, so the
base copy runs its own loadgen/), alternating run by run:

* ``stop``: a closed loop of ``--concurrency C`` over N processes against the loadgen test server holding each answer
  ~2 s; once the server has C requests in flight, SIGINT to the command's process group (a terminal's Ctrl-C).
  Records: the exit status, seconds from the signal to the exit, the records written, their statuses, whether
  ``run.json`` says ``interrupted``, and whether any spawned process outlived the command.
* ``orphan``: the same run; SIGKILL to the command alone. Records: how many requests the server received after the
  kill (within ``--orphan-watch`` seconds) and whether the spawned processes were still alive then.
* ``cpu``: an open loop, ``--rate R --requests M --processes 2`` to a quick answer (1 ms, 2 tokens), run to its end:
  ``send_phase_cpu_us_per_request`` from run.json (CPU of all processes while sending, per request): what the stop
  machinery costs a run that is never stopped.

The server runs in its own process (tests/loadgen/loadgen_server.py, one per phase). Writes JSON to ``--out``.
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

ROOT = Path(__file__).resolve().parents[1]
MODULES = ("collector", "configs", "loadgen", "proxy", "stack")  # the editable install's deltatap.<name> -> <name>/

SERVER = r"""
import asyncio, sys
sys.path.insert(0, sys.argv[1])
from loadgen_server import ServerState, start_server
async def main():
    st = ServerState(first_ms=float(sys.argv[2]), interval_ms=float(sys.argv[3]), tokens=int(sys.argv[4]))
    runner, port = await start_server(st)
    print(port, flush=True)
    while True:  # one line per 0.05 s: requests received so far, in flight now
        print(len(st.seen), st.in_flight, flush=True)
        await asyncio.sleep(0.05)
asyncio.run(main())
"""


def package_tree(tree: Path, scratch: Path) -> Path:
    """A directory holding ``deltatap/`` for ``tree``: its deltatap/ entries and its top-level modules, symlinked."""
    pkg = scratch / tree.name.replace("/", "_") / "deltatap"
    pkg.mkdir(parents=True, exist_ok=True)
    for entry in (tree / "deltatap").iterdir():
        if not (pkg / entry.name).exists():
            (pkg / entry.name).symlink_to(entry)
    for m in MODULES:
        if not (pkg / m).exists():
            (pkg / m).symlink_to(tree / m)
    return pkg.parent


class Server:
    def __init__(self, first_ms: float, interval_ms: float, tokens: int) -> None:
        self.p = subprocess.Popen([sys.executable, "-c", SERVER, str(ROOT / "tests" / "loadgen"), str(first_ms),
                                   str(interval_ms), str(tokens)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                  cwd=str(ROOT))
        self.port = int(self.p.stdout.readline())
        self.seen = self.in_flight = 0

    def poll(self) -> None:
        """Read the server's newest counts (it prints them every 0.05 s)."""
        os.set_blocking(self.p.stdout.fileno(), False)
        while True:
            line = self.p.stdout.readline()
            if not line:
                break
            seen, fl = line.split()
            self.seen, self.in_flight = int(seen), int(fl)

    def wait_for(self, cond, timeout_s: float) -> bool:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            self.poll()
            if cond(self):
                return True
            time.sleep(0.02)
        return False

    def close(self) -> None:
        self.p.kill()
        self.p.wait()


def load(pkgdir: Path, port: int, out: Path, *flags: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(pkgdir)}
    return subprocess.Popen(
        [sys.executable, "-m", "deltatap.app.cli", "load", "--target", f"http://127.0.0.1:{port}", "--model", "m",
         "--no-progress", "--no-gpu", "--seed", "7", "--out", str(out), *flags],
        cwd=str(pkgdir), env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def children(pid: int) -> list[int]:
    try:
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []
    return [int(k) for k in kids if b"spawn_main" in Path(f"/proc/{k}/cmdline").read_bytes()]


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def outputs(out: Path) -> dict:
    recs = [json.loads(x) for x in (out / "records.jsonl").read_text().splitlines()] if (out / "records.jsonl").exists() else []
    run = json.loads((out / "run.json").read_text()) if (out / "run.json").exists() else {}
    statuses: dict[str, int] = {}
    for r in recs:
        statuses[r["status"]] = statuses.get(r["status"], 0) + 1
    return {"records": len(recs), "statuses": statuses, "interrupted": run.get("interrupted"), "run_json": bool(run),
            "send_phase_cpu_us_per_request": run.get("send_phase_cpu_us_per_request")}


def stop_run(pkgdir: Path, scratch: Path, procs: int, conc: int) -> dict:
    srv = Server(5.0, 50.0, 40)
    out = Path(tempfile.mkdtemp(dir=scratch))
    try:
        p = load(pkgdir, srv.port, out, "--concurrency", str(conc), "--duration", "60", "--processes", str(procs))
        ok = srv.wait_for(lambda s: s.in_flight >= conc, 60)
        kids = children(p.pid)
        t0 = time.monotonic()
        os.killpg(p.pid, signal.SIGINT)
        try:
            _o, err = p.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            _o, err = p.communicate()
        dt = time.monotonic() - t0
        time.sleep(0.5)
        return {"in_flight_at_signal": ok and conc, "exit": p.returncode, "signal_to_exit_s": round(dt, 3),
                "left_running": sum(alive(k) for k in kids), "traceback": "Traceback" in err.decode(), **outputs(out)}
    finally:
        srv.close()


def orphan_run(pkgdir: Path, scratch: Path, procs: int, conc: int, watch_s: float) -> dict:
    srv = Server(5.0, 50.0, 40)
    out = Path(tempfile.mkdtemp(dir=scratch))
    try:
        p = load(pkgdir, srv.port, out, "--concurrency", str(conc), "--duration", "60", "--processes", str(procs))
        srv.wait_for(lambda s: s.in_flight >= conc, 60)
        kids = children(p.pid)
        p.kill()
        p.wait()
        time.sleep(0.5)  # (what was sent before the kill has arrived)
        srv.poll()
        seen0 = srv.seen
        time.sleep(watch_s)
        srv.poll()
        left = sum(alive(k) for k in kids)
        for k in kids:
            if alive(k):
                os.kill(k, signal.SIGKILL)
        return {"requests_after_kill": srv.seen - seen0, "watch_s": watch_s, "spawned_alive_after": left}
    finally:
        srv.close()


def cpu_run(pkgdir: Path, scratch: Path, rate: float, requests: int) -> dict:
    srv = Server(1.0, 1.0, 2)
    out = Path(tempfile.mkdtemp(dir=scratch))
    try:
        p = load(pkgdir, srv.port, out, "--rate", str(rate), "--requests", str(requests), "--processes", "2")
        _o, err = p.communicate(timeout=300)
        return {"exit": p.returncode, "stderr_tail": err.decode()[-400:] if p.returncode else "", **outputs(out)}
    finally:
        srv.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", action="append", required=True, metavar="NAME=DIR")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--orphan-watch", type=float, default=3.0)
    ap.add_argument("--rate", type=float, default=400)
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--phases", default="stop,orphan,cpu")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="procstop_"))
    trees = {}
    for t in a.tree:
        name, _s, d = t.partition("=")
        trees[name] = package_tree(Path(d).resolve(), scratch)
    phases = a.phases.split(",")
    res: dict = {"args": vars(a), "load_average_start": os.getloadavg(), "runs": []}
    for rnd in range(a.rounds):
        for name, pkgdir in trees.items():
            row = {"round": rnd, "tree": name}
            if "stop" in phases:
                row["stop"] = stop_run(pkgdir, scratch, a.processes, a.concurrency)
            if "orphan" in phases:
                row["orphan"] = orphan_run(pkgdir, scratch, a.processes, a.concurrency, a.orphan_watch)
            if "cpu" in phases:
                row["cpu"] = cpu_run(pkgdir, scratch, a.rate, a.requests)
            print(json.dumps(row), flush=True)
            res["runs"].append(row)
    res["load_average_end"] = os.getloadavg()
    Path(a.out).write_text(json.dumps(res, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
