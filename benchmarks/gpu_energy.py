"""Does ``deltatap load``'s GPU section say what the GPU did? (a check that needs an NVIDIA GPU)

The load generator samples each GPU through NVML once a second (loadgen/gpu.py) and reports energy over the run's
window (``energy_run_j``, with ``energy_run_bounds_j`` where the GPU has NVML's total-energy counter), tokens per joule
and mean utilisation. This script runs it against an engine that really uses the GPU and sets its figures against two
referees sampling the same GPU ten times as often:

* ``--role engine``: an OpenAI-compatible streaming engine (aiohttp) whose every output token is ``--matmuls``
  half-precision products of two ``--size`` x ``--size`` matrices on the GPU (PyTorch), synchronised, before the token's
  SSE chunk is written: a role chunk first, then one chunk per token (``max_tokens`` honoured), then the usage chunk and
  ``[DONE]``. Its own CPU is reported.
* the NVML referee (a thread of this process): the energy counter (``nvmlDeviceGetTotalEnergyConsumption``), power and
  utilisation every ``--referee-ms`` (default 100 ms);
* ``nvidia-smi --query-gpu=... -lms``: power draw and utilisation, an independent reader of the same driver.

Over the run's window (the first request's T_submit to the last response's end, from ``records.jsonl``) it reports the
load generator's ``energy_run_j`` and bounds against the referee's counter difference (interpolated at the window's
edges; with 100 ms samples its own bound is tight), the energy a 1 Hz power trapezoid gives (what the sampler did
before it read the counter: the referee's power subsampled at 1 Hz) and a 10 Hz one, and the mean utilisation against
nvidia-smi's. Between rounds the GPU idles ``--idle-s`` seconds, so windows hold edges where power moves.

    python3 benchmarks/gpu_energy.py --out benchmarks/results/gpu_energy.json

Needs: an NVIDIA GPU with its driver, PyTorch with CUDA, nvidia-ml-py (or pynvml), and deltatap installed
(``deltatap`` on PATH, or ``--deltatap CMD``). Written in session 22 on a host without a GPU (the session's device
machine was not lent): without NVML it says so and exits 2, which is all that has run; its first run on a GPU is its test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path


def engine_main(port: int, size: int, matmuls: int) -> None:
    import torch
    from aiohttp import web

    dev = torch.device("cuda")
    a = torch.randn(size, size, device=dev, dtype=torch.float16)
    b = torch.randn(size, size, device=dev, dtype=torch.float16)

    def token_work() -> None:
        c = a
        for _ in range(matmuls):
            c = torch.mm(c, b)
            c = c / c.norm()  # (keeps the values finite; part of the work)
        torch.cuda.synchronize()

    token_work()  # (CUDA context and kernels loaded before the first request)
    lock = threading.Lock()  # one token's work at a time on the GPU, as a batch-of-one engine

    def locked_work() -> None:
        with lock:
            token_work()

    def chunk(obj: dict) -> bytes:
        return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"

    async def models(_req: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "gpu-matmul", "object": "model"}]})

    async def chat(req: web.Request) -> web.StreamResponse:
        body = await req.json()
        n = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(req)
        base = {"id": "chatcmpl-gpu", "object": "chat.completion.chunk", "created": int(time.time()), "model": "gpu-matmul"}
        await resp.write(chunk({**base, "choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]}))
        loop = asyncio.get_running_loop()
        for i in range(n):
            await loop.run_in_executor(None, locked_work)
            await resp.write(chunk({**base, "choices": [{"index": 0, "delta": {"content": f" w{i}"}, "finish_reason": None}]}))
        await resp.write(chunk({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}))
        prompt = sum(len(str(m.get("content", "")).split()) for m in body.get("messages", []))
        await resp.write(chunk({**base, "choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": n,
                                                                  "total_tokens": prompt + n}}))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_http(port: int, proc: subprocess.Popen, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"gpu_energy: the engine exited ({proc.returncode}) before it listened")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"gpu_energy: the engine did not listen on 127.0.0.1:{port} within {timeout_s:.0f} s")


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class NvmlReferee(threading.Thread):
    """Every ``interval_s``: (unix ns, energy counter mJ or None, power W, utilisation %) for GPU ``index``."""

    def __init__(self, index: int, interval_s: float) -> None:
        super().__init__(daemon=True, name="nvml-referee")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # "pynvml is deprecated" (it wraps nvidia-ml-py)
            import pynvml

        self.nv = pynvml
        self.nv.nvmlInit()
        self.h = self.nv.nvmlDeviceGetHandleByIndex(index)
        self.interval_s = interval_s
        self.samples: list[tuple[int, float | None, float, float]] = []
        self.stop = threading.Event()
        try:
            self.nv.nvmlDeviceGetTotalEnergyConsumption(self.h)
            self.counter = True
        except Exception:
            self.counter = False

    def run(self) -> None:
        nxt = time.monotonic()
        while not self.stop.is_set():
            t = time.time_ns()
            e = float(self.nv.nvmlDeviceGetTotalEnergyConsumption(self.h)) if self.counter else None
            p = self.nv.nvmlDeviceGetPowerUsage(self.h) / 1000.0
            u = float(self.nv.nvmlDeviceGetUtilizationRates(self.h).gpu)
            self.samples.append((t, e, p, u))
            nxt += self.interval_s
            self.stop.wait(max(0.0, nxt - time.monotonic()))


def _interp(ts: list[int], vs: list[float], t: int) -> float:
    import numpy as np

    return float(np.interp(float(t), [float(x) for x in ts], vs))


def _trapezoid_j(ts: list[int], ps: list[float], t0: int, t1: int) -> float:
    import numpy as np

    t = np.asarray(ts, dtype=float)
    p = np.asarray(ps, dtype=float)
    inside = (t > t0) & (t < t1)
    xs = np.concatenate(([float(t0)], t[inside], [float(t1)]))
    return float(np.trapezoid(np.interp(xs, t, p), xs / 1e9))


def one_round(args, deltatap: list[str], url: str, referee: NvmlReferee, smi: list[tuple[int, float, float]],
              work: Path, k: int) -> dict:
    out = work / f"run{k}"
    cmd = [*deltatap, "load", "--target", url, "--concurrency", str(args.concurrency), "--duration", str(args.duration),
           "--warmup", "0", "--no-progress", "--out", str(out)]
    if args.workload:
        cmd += ["--workload", args.workload]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.duration + 300)
    if p.returncode != 0:
        raise SystemExit(f"gpu_energy: deltatap load failed ({p.returncode}): {(p.stderr or p.stdout).strip()[-600:]}")
    summary = json.loads((out / "summary.json").read_text())
    recs = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines() if line.strip()]
    starts = [r.get("request_written_unix_ns") or r.get("send_unix_ns") for r in recs]
    ends = [r.get("end_unix_ns") for r in recs]
    t0 = min(s for s in starts if s is not None)
    t1 = max(e for e in ends if e is not None)
    gpu = summary.get("gpu") or {}
    ref = [s for s in referee.samples]
    ts, es, ps, us = [s[0] for s in ref], [s[1] for s in ref], [s[2] for s in ref], [s[3] for s in ref]
    res: dict = {"window_s": (t1 - t0) / 1e9, "requests": len(recs),
                 "ok": sum(1 for r in recs if r.get("status") == "ok"),
                 "output_tokens": sum(r.get("output_tokens") or 0 for r in recs),
                 "loadgen": {k2: gpu.get(k2) for k2 in ("available", "reason", "energy_method", "energy_run_j",
                                                        "energy_run_bounds_j", "tokens_per_joule", "joules_per_request")},
                 "loadgen_gpus": gpu.get("gpus")}
    if referee.counter:
        ref_j = (_interp(ts, es, t1) - _interp(ts, es, t0)) / 1000.0
        inside = [i for i, t in enumerate(ts) if t0 <= t <= t1]
        before = [i for i, t in enumerate(ts) if t <= t0]
        after = [i for i, t in enumerate(ts) if t >= t1]
        res["referee_counter_j"] = ref_j
        res["referee_counter_bounds_j"] = [(es[inside[-1]] - es[inside[0]]) / 1000.0 if inside else 0.0,
                                           (es[after[0]] - es[before[-1]]) / 1000.0 if before and after else None]
    res["referee_trapezoid_10hz_j"] = _trapezoid_j(ts, ps, t0, t1)
    step = max(1, round(1.0 / args.referee_ms * 1000))  # every Nth sample: 1 Hz
    sub = list(range(0, len(ts), step))
    res["referee_trapezoid_1hz_j"] = _trapezoid_j([ts[i] for i in sub], [ps[i] for i in sub], t0, t1) if len(sub) >= 2 else None
    win = [i for i, t in enumerate(ts) if t0 <= t <= t1]
    res["referee_util_mean_pct"] = sum(us[i] for i in win) / len(win) if win else None
    res["referee_power_mean_w"] = sum(ps[i] for i in win) / len(win) if win else None
    sw = [(p_, u_) for t, p_, u_ in smi if t0 <= t <= t1]
    res["nvidia_smi_power_mean_w"] = sum(p_ for p_, _ in sw) / len(sw) if sw else None
    res["nvidia_smi_util_mean_pct"] = sum(u_ for _, u_ in sw) / len(sw) if sw else None
    lg = gpu.get("energy_run_j")
    if lg is not None and res.get("referee_counter_j"):
        res["loadgen_vs_referee"] = lg / res["referee_counter_j"]
        lo, hi = gpu.get("energy_run_bounds_j") or (None, None)
        res["referee_within_loadgen_bounds"] = (lo is not None and lo <= res["referee_counter_j"] * 1.0005
                                                and (hi is None or res["referee_counter_j"] <= hi * 1.0005))
    if res.get("referee_trapezoid_1hz_j") and res.get("referee_counter_j"):
        res["trapezoid_1hz_vs_counter"] = res["referee_trapezoid_1hz_j"] / res["referee_counter_j"]
        res["trapezoid_10hz_vs_counter"] = res["referee_trapezoid_10hz_j"] / res["referee_counter_j"]
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--role", choices=["engine"], help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--size", type=int, default=4096, help="matrix side of each token's products (default 4096)")
    ap.add_argument("--matmuls", type=int, default=20, help="products per output token (default 20)")
    ap.add_argument("--concurrency", type=int, default=4, help="closed loop of deltatap load (default 4)")
    ap.add_argument("--duration", type=float, default=20.0, help="seconds of each round's load (default 20)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds, the GPU idle --idle-s between them (default 3)")
    ap.add_argument("--idle-s", type=float, default=5.0)
    ap.add_argument("--workload", default=None, help="deltatap workload (default: deltatap's)")
    ap.add_argument("--referee-ms", type=float, default=100.0, help="the NVML referee's sampling period (default 100 ms)")
    ap.add_argument("--gpu-index", type=int, default=0)
    ap.add_argument("--deltatap", default=None, help="command that runs deltatap (default: deltatap on PATH, else python -m deltatap.app.cli)")
    ap.add_argument("--out", default="benchmarks/results/gpu_energy.json")
    args = ap.parse_args()
    if args.role == "engine":
        engine_main(args.port, args.size, args.matmuls)
        return 0
    if args.deltatap:
        deltatap = shlex.split(args.deltatap)
    elif shutil.which("deltatap"):
        deltatap = ["deltatap"]
    else:
        deltatap = [sys.executable, "-m", "deltatap.app.cli"]
    try:
        referee = NvmlReferee(args.gpu_index, args.referee_ms / 1000.0)
    except Exception as exc:
        print(f"gpu_energy: no NVIDIA GPU through NVML here ({type(exc).__name__}: {exc}); this check needs one",
              file=sys.stderr)
        return 2
    port = _free_port()
    engine = subprocess.Popen([sys.executable, __file__, "--role", "engine", "--port", str(port), "--size",
                               str(args.size), "--matmuls", str(args.matmuls)])
    smi_rows: list[tuple[int, float, float]] = []
    smi = None
    try:
        _wait_http(port, engine)
        referee.start()
        if shutil.which("nvidia-smi"):
            smi = subprocess.Popen(["nvidia-smi", f"--id={args.gpu_index}", "--query-gpu=power.draw,utilization.gpu",
                                    "--format=csv,noheader,nounits", "-lms", str(int(args.referee_ms))],
                                   stdout=subprocess.PIPE, text=True)

            def read_smi() -> None:
                for line in smi.stdout:
                    try:
                        p_, u_ = (float(x) for x in line.split(","))
                    except ValueError:
                        continue
                    smi_rows.append((time.time_ns(), p_, u_))

            threading.Thread(target=read_smi, daemon=True).start()
        cpu0 = _cpu_s(engine.pid)
        rounds = []
        with tempfile.TemporaryDirectory(prefix="gpu-energy-") as tmp:
            for k in range(args.rounds):
                time.sleep(args.idle_s)
                r = one_round(args, deltatap, f"http://127.0.0.1:{port}", referee, smi_rows, Path(tmp), k)
                rounds.append(r)
                print(f"round {k}: {r['requests']} requests in {r['window_s']:.1f} s; deltatap {r['loadgen']['energy_run_j']} J "
                      f"{r['loadgen']['energy_run_bounds_j']} ({r['loadgen']['energy_method']}); referee counter "
                      f"{r.get('referee_counter_j')} J; 1 Hz trapezoid {r.get('referee_trapezoid_1hz_j')} J", file=sys.stderr)
        cpu = _cpu_s(engine.pid) - cpu0
    finally:
        referee.stop.set()
        if smi is not None:
            smi.terminate()
        engine.terminate()
        try:
            engine.wait(10)
        except subprocess.TimeoutExpired:
            engine.kill()
    name = referee.nv.nvmlDeviceGetName(referee.h)
    reqs = sum(r["requests"] for r in rounds)
    result = {"benchmark": "gpu_energy", "gpu": name.decode() if isinstance(name, bytes) else str(name),
              "driver": (lambda v: v.decode() if isinstance(v, bytes) else str(v))(referee.nv.nvmlSystemGetDriverVersion()),
              "energy_counter": referee.counter, "size": args.size, "matmuls": args.matmuls,
              "concurrency": args.concurrency, "duration_s": args.duration, "referee_ms": args.referee_ms,
              "engine_cpu_s": cpu, "engine_cpu_per_request_ms": cpu / reqs * 1000 if reqs else None, "rounds": rounds}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "rounds"}), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
