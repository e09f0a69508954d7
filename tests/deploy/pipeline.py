"""The compose deployment, in one process on loopback: collector, reference stack with a tap on every
link, the load generator - the same components and wiring as docker-compose.yml's demo + load
profiles, on ephemeral ports. Used by the dashboard and forwarding tests."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from deltatap.collector.pipeline import PipelineOptions
from deltatap.collector.service import CollectorOptions, start_collector
from deltatap.telemetry.tracer import Telemetry, setup_telemetry
from deltatap.loadgen.options import LoadOptions
from deltatap.loadgen.run import run_load
from deltatap.proxy import TapOptions, options_from_topology, start_tap
from deltatap.stack import load_stack_config, start_engine, start_firewall, start_gateway

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "configs" / "demo.yaml"
# short requests: a few content tokens each, so the whole run takes seconds
SMALL_WORKLOAD = {
    "workload": "synthetic-uniform",
    "params": {"input": {"dist": "uniform", "min": 16, "max": 32}, "output": {"dist": "uniform", "min": 4, "max": 8}},
}


@dataclass
class Pipeline:
    collector: object
    taps: dict[str, object]  # link name -> running tap (admin server on)
    records: list = field(default_factory=list)

    @property
    def metrics_urls(self) -> dict[str, str]:
        urls = {"collector": self.collector.metrics_url}
        for link, tap in self.taps.items():
            urls[f"tap {link}"] = f"{tap.admin_url}/metrics"
        return urls


async def _scrape(session: aiohttp.ClientSession, url: str) -> str:
    async with session.get(url, timeout=aiohttp.ClientTimeout(total=5)) as r:
        r.raise_for_status()
        return await r.text()


async def scrape_all(p: Pipeline) -> dict[str, str]:
    async with aiohttp.ClientSession() as s:
        return {name: await _scrape(s, url) for name, url in p.metrics_urls.items()}


@asynccontextmanager
async def running_pipeline(tmp_path: Path, *, requests: int = 6, forward: str | None = None, reexport: bool = False,
                           unused_port: int) -> AsyncIterator[Pipeline]:
    cfg = load_stack_config(DEMO)
    collector = await start_collector(CollectorOptions(
        otlp_grpc="127.0.0.1:0", otlp_http="127.0.0.1:0", metrics="127.0.0.1:0", topology=cfg.topology,
        out_dir=tmp_path / "collector", rows_format="jsonl", forward=forward, reexport=reexport,
        pipeline=PipelineOptions(grace_s=0.5),
    ))
    tels: list[Telemetry] = []

    def telemetry_for(service: str) -> Telemetry:
        tel = setup_telemetry(service, otlp=collector.otlp_grpc_endpoint)
        tels.append(tel)
        return tel

    started: list = []

    async def tap(link: str, upstream: str, telemetry: Telemetry):
        topo = cfg.topology
        if link in [x.name for x in topo.links]:
            opts = options_from_topology(topo, link, upstream=upstream, listen_port=0, admin_port=0, clock_sync=collector.otlp_http_url)
        else:
            opts = TapOptions(link=link, upstream=upstream, listen_port=0, admin_port=0)
        running = await start_tap(opts, telemetry)
        started.append(running)
        return running

    try:
        # the chain, inside out, each upstream the next tap: as docker-compose.yml's demo profile wires it
        engine = await start_engine(cfg.engine, telemetry_for("deltatap-stack-engine"), "127.0.0.1:0")
        started.append(engine)
        taps = {"fw-engine": await tap("fw-engine", engine.url, telemetry_for("deltatap-tap-fw-engine"))}
        cfg.firewall.upstream = taps["fw-engine"].url
        firewall = await start_firewall(cfg.firewall, telemetry_for("deltatap-stack-firewall"), "127.0.0.1:0")
        started.append(firewall)
        taps["gw-fw"] = await tap("gw-fw", firewall.url, telemetry_for("deltatap-tap-gw-fw"))
        for route in cfg.gateway.routes:
            route.upstreams = [taps["gw-fw"].url]
        gateway = await start_gateway(cfg.gateway, telemetry_for("deltatap-stack-gateway"), "127.0.0.1:0")
        started.append(gateway)
        taps["edge"] = await tap("edge", gateway.url, telemetry_for("deltatap-tap-edge"))
        # a tap whose upstream is down (spans not exported): its upstream-error counters get samples
        dead_tel = setup_telemetry("deltatap-tap-dead", otlp="none")
        tels.append(dead_tel)
        taps["dead-upstream"] = await tap("dead-upstream", f"http://127.0.0.1:{unused_port}", dead_tel)
        async with aiohttp.ClientSession() as s:
            async with s.post(f"{taps['dead-upstream'].url}/v1/chat/completions", json={"model": "m", "messages": []}) as r:
                assert r.status >= 500, r.status
        opts = LoadOptions(target=taps["edge"].url, model=cfg.engine.models[0], workload=SMALL_WORKLOAD, concurrency=2,
                           requests=requests, clock_sync=collector.otlp_http_url, progress=False, gpu=False, request_timeout_s=30)
        result = await run_load(opts, telemetry_for("deltatap-loadgen"))
        await asyncio.gather(*(asyncio.to_thread(t.processor.force_flush, 5_000) for t in tels))
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and len(collector.rows()) < requests:
            await asyncio.sleep(0.1)
        yield Pipeline(collector, taps, result.records)
    finally:
        for comp in reversed(started):
            await (comp.close(0) if hasattr(comp, "admin_url") else comp.close())
        await asyncio.gather(*(asyncio.to_thread(t.shutdown) for t in tels))
        await collector.close()
