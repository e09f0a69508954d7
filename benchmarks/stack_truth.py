"""How close the reference stack's own stamps sit to the socket: agreement between neighbouring observers.

    .venv/bin/python benchmarks/stack_truth.py [--requests 200] [--concurrency 1]

Runs gateway -> firewall -> engine chained on loopback in this process (no taps, outbound inspection off,
a fast engine) and an independent aiohttp client. For every request it takes the differences between a
component's stamp and its neighbour's stamp of the same bytes crossing the same socket (e.g. the gateway's
``in.exit`` - last byte of the forwarded request written - and the firewall's ``in.arrive`` - the read
carrying that request's first byte). These hop times are what a stamp taken anywhere else would add as
error; they must be >= 0 (causality) and small. Target (issue 3: "first token within ~2 ms of when the
client saw it"): p50 of every hop under 2 ms, no negative hop. Writes benchmarks/results/stack_truth.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
from pathlib import Path

import aiohttp
import numpy as np
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from deltatap.core.clock import mono_ns, to_unix_ns  # noqa: E402
from deltatap.core.sse import StreamObserver  # noqa: E402
from deltatap.telemetry.tracer import setup_telemetry  # noqa: E402
from deltatap.core.vocab import Attr, Role  # noqa: E402
from deltatap.stack import EngineConfig, StackConfig, start_stack  # noqa: E402

TARGET_P50_US = 2000.0
# (name, (observer, role) that happens first, (observer, role) of the same bytes seen next)
HOPS = [
    ("client send -> gateway in.arrive", ("client", "send"), ("gateway", Role.IN_ARRIVE)),
    ("gateway in.exit -> firewall in.arrive", ("gateway", Role.IN_EXIT), ("firewall", Role.IN_ARRIVE)),
    ("firewall in.exit -> engine queue", ("firewall", Role.IN_EXIT), ("engine", Role.QUEUE)),
    ("engine first_token -> firewall out.first_in", ("engine", Role.FIRST_TOKEN), ("firewall", Role.OUT_FIRST_IN)),
    ("firewall out.first_out -> gateway out.first_in", ("firewall", Role.OUT_FIRST_OUT), ("gateway", Role.OUT_FIRST_IN)),
    ("gateway out.first_out -> client first content read", ("gateway", Role.OUT_FIRST_OUT), ("client", "first")),
]


async def one(session: aiohttp.ClientSession, url: str, rid: str) -> dict[str, int]:
    body = {"model": "deltatap-ref", "messages": [{"role": "user", "content": f"question {rid}"}], "max_tokens": 4, "stream": True}
    t_send = mono_ns()
    async with session.post(url + "/v1/chat/completions", json=body, headers={"x-request-id": rid}) as resp:
        obs = StreamObserver(path="/v1/chat/completions")
        async for chunk in resp.content.iter_any():
            obs.feed(chunk, mono_ns())
    return {"send": to_unix_ns(t_send), "first": to_unix_ns(obs.first_token_mono_ns)}


async def run(n: int, concurrency: int) -> dict:
    exporter = InMemorySpanExporter()
    tel = setup_telemetry("bench-stack-truth", exporter=exporter)
    engine = EngineConfig.model_validate({"scheduler": {"prefill_base_ms": 1, "prefill_per_token_ms": 0.02, "decode_base_ms": 5}})
    cfg = StackConfig(engine=engine)
    cfg.firewall.outbound.enabled = False
    stack = await start_stack(cfg, lambda service: tel, ephemeral=True)
    client: dict[str, dict[str, int]] = {}
    sem = asyncio.Semaphore(concurrency)
    try:
        async with aiohttp.ClientSession() as session:
            await one(session, stack.url, "warmup")

            async def go(i: int) -> None:
                async with sem:
                    client[f"r{i}"] = await one(session, stack.url, f"r{i}")

            await asyncio.gather(*(go(i) for i in range(n)))
    finally:
        await stack.close()
    tel.processor.force_flush()
    stamps: dict[tuple[str, str], dict[str, int]] = {}
    for span in exporter.get_finished_spans():
        rid = span.attributes.get(Attr.REQUEST_ID)
        if rid in client:
            stamps[(rid, span.attributes[Attr.COMPONENT])] = {e.name: e.timestamp for e in span.events}
    tel.shutdown()
    hops = {}
    for name, (a_obs, a_role), (b_obs, b_role) in HOPS:
        vals = []
        for rid, c in client.items():
            a = c[a_role] if a_obs == "client" else stamps[(rid, a_obs)][a_role]
            b = c[b_role] if b_obs == "client" else stamps[(rid, b_obs)][b_role]
            vals.append((b - a) / 1000.0)
        v = np.array(vals)
        hops[name] = {"p50_us": round(float(np.percentile(v, 50)), 1), "p99_us": round(float(np.percentile(v, 99)), 1),
                      "min_us": round(float(v.min()), 1), "max_us": round(float(v.max()), 1), "negative": int((v < 0).sum())}
    met = all(h["p50_us"] < TARGET_P50_US and h["negative"] == 0 for h in hops.values())
    return {"benchmark": "stack_truth", "command": f"benchmarks/stack_truth.py --requests {n} --concurrency {concurrency}",
            "requests": n, "concurrency": concurrency, "hops": hops, "target_p50_us": TARGET_P50_US, "met": met,
            "cpus": os.cpu_count(), "python": platform.python_version(), "loadavg": os.getloadavg()[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--concurrency", type=int, default=1)
    args = ap.parse_args()
    from deltatap.net.aio import run as aio_run

    result = aio_run(run(args.requests, args.concurrency))
    path = ROOT / "benchmarks" / "results" / f"stack_truth_c{args.concurrency}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
