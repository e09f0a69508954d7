"""`deltatap load --coordinate` / `--coordinator` (loadgen/coordinate.py) on loopback, in the fast suite (not
marked): three load generators split one open-loop plan from one shared start against the reference engine,
and every way of getting it wrong is one clear line. test_multihost.py runs the same across network
namespaces."""

from __future__ import annotations

import asyncio

import pytest

from deltatap.core.config import ConfigError
from deltatap.loadgen.arrivals import schedule_offsets_ns
from deltatap.loadgen.options import LoadOptions
from deltatap.loadgen.run import run_load
from deltatap.stack import EngineConfig, start_engine
from deltatap.telemetry.tracer import setup_telemetry
from obs_support import free_port

WORKLOAD = {"workload": "synthetic-uniform",
            "params": {"input": {"dist": "uniform", "min": 8, "max": 16}, "output": {"dist": "uniform", "min": 2, "max": 4}}}


def _opts(url: str, **kw) -> LoadOptions:
    return LoadOptions(target=url, model="deltatap-ref", workload=WORKLOAD, rate=20.0, requests=12, seed=3, progress=False,
                       gpu=False, request_timeout_s=20, **kw)


def test_three_hosts_send_one_plan_from_one_start() -> None:
    async def run():
        tel = setup_telemetry("deltatap-loadgen", otlp="none")
        engine = await start_engine(EngineConfig(), tel, "127.0.0.1:0")
        port = free_port()
        try:
            lead = asyncio.create_task(run_load(_opts(engine.url, coordinate=f"127.0.0.1:{port}", hosts=3, start_in_s=0.5), tel))
            await asyncio.sleep(0.3)
            others = [run_load(_opts(engine.url, coordinator=f"http://127.0.0.1:{port}"), tel) for _ in range(2)]
            return await asyncio.wait_for(asyncio.gather(lead, *others), 60)
        finally:
            await engine.close()
            tel.shutdown()

    results = asyncio.run(run())
    hosts = [r.summary["run"]["hosts"] for r in results]
    assert sorted(h["index"] for h in hosts) == [0, 1, 2] and {h["hosts"] for h in hosts} == {3}
    start = {h["start_unix_ns"] for h in hosts}
    assert len(start) == 1
    (start_ns,) = start
    offsets = schedule_offsets_ns("poisson", 20.0, 12, 3)
    seen = []
    for r, h in zip(results, hosts, strict=True):
        idx = sorted(x["index"] for x in r.records)
        assert idx == list(range(h["index"], 12, 3)), (h, idx)  # host i of N: units i, i+N, ...
        seen += idx
        for x in r.records:
            assert x["status"] == "ok", x
            # the one-host schedule from the shared start (one clock here: the offset estimate is ~0)
            assert abs(x["planned_send_unix_ns"] - (start_ns + int(offsets[x["index"]]))) <= 2_000_000 + h["clock_uncertainty_ns"]
    assert sorted(seen) == list(range(12))


@pytest.mark.parametrize("kw, message", [
    ({"coordinate": "127.0.0.1:1"}, "--coordinate needs --hosts N"),
    ({"hosts": 2}, "--hosts is the coordinator's"),
    ({"coordinate": "127.0.0.1:1", "hosts": 2, "coordinator": "http://127.0.0.1:1"}, "exclude each other"),
])
def test_bad_combinations_are_one_line(kw, message) -> None:
    with pytest.raises(ValueError, match=message):
        _opts("http://127.0.0.1:1", **kw)


def test_a_host_with_another_plan_or_no_coordinator_is_told_why() -> None:
    async def run():
        tel = setup_telemetry("deltatap-loadgen", otlp="none")
        engine = await start_engine(EngineConfig(), tel, "127.0.0.1:0")
        port = free_port()
        try:
            with pytest.raises(ConfigError, match="--coordinator http://127.0.0.1:1: "):
                await run_load(_opts(engine.url, coordinator="http://127.0.0.1:1"), tel)
            lead = asyncio.create_task(run_load(_opts(engine.url, coordinate=f"127.0.0.1:{port}", hosts=2), tel))
            await asyncio.sleep(0.3)
            other = _opts(engine.url, coordinator=f"http://127.0.0.1:{port}").model_copy(update={"seed": 4})
            with pytest.raises(ConfigError, match="is not the coordinator's"):
                await run_load(other, tel)
            lead.cancel()
            with pytest.raises(asyncio.CancelledError):
                await lead
        finally:
            await engine.close()
            tel.shutdown()

    asyncio.run(run())
