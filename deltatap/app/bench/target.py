"""Where a bench sends its load, and how one load level is run and joined.

Two kinds of target:

* **embedded** (the default): the reference stack with a tap on every link and the collector, started in
  this process by :func:`deltatap.app.demo.launch_reference_stack` from a stack config (default
  ``configs/bench/reference.yaml``). A test that compares configurations (5.7 cache off/on, 5.10 guardrails)
  restarts it with overrides (:meth:`Harness.variant`). The engine's own span attributes (prefix-cache hits,
  preemptions) are read from its telemetry.
* **external** (``--target URL``): any OpenAI-compatible endpoint. With ``--collect HOST:PORT --topology FILE``
  a collector is started here on that OTLP/HTTP address (``grpc://HOST:PORT``: OTLP/gRPC): taps already on the
  links that export to it (``deltatap tap ... --otlp http://HOST:PORT``) give the per-component decomposition;
  without it the bench reports what the client sees.

:meth:`Harness.run_level` runs one load level (one or several concurrent ``run_load`` streams, e.g. one per
request class), waits until the collector has joined every request of the level, and returns its records,
rows and engine attributes.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import SpanProcessor
from pydantic import Field

from deltatap.core.config import ConfigError, StrictModel, find_config, load_yaml, read_yaml, validate
from deltatap.core.topology import Topology
from deltatap.core.vocab import Attr

DEFAULT_STACK = "bench/reference"  # configs/bench/reference.yaml
ROW_GRACE_S = 1.0  # a trace closes this long after its client span ends
ENGINE_ATTRS = (Attr.ENGINE_CACHE_N, Attr.ENGINE_PROMPT_N, Attr.ENGINE_PREEMPTIONS, Attr.ENGINE_BATCH_SIZE)


class BenchStackConfig(StrictModel):
    """A stack config as ``configs/demo.yaml`` has it; a ``load`` section, if any, is not used by the bench."""

    topology: Topology
    gateway: dict[str, Any] = Field(default_factory=dict)
    firewall: dict[str, Any] = Field(default_factory=dict)
    engine: dict[str, Any] = Field(default_factory=dict)
    load: dict[str, Any] = Field(default_factory=dict)


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


@dataclass
class LevelData:
    """One repetition of one load level."""

    records: list[dict[str, Any]]
    rows: list[Any]
    engine: dict[str, dict[str, Any]]  # trace id -> the engine span's attributes (embedded stack only)
    wall_s: float
    streams: dict[str, dict[str, Any]] = field(default_factory=dict)  # stream name -> its LoadOptions (JSON)


class _EngineSpans(SpanProcessor):
    """A span processor keeping the reference engine's per-request attributes by trace id."""

    def __init__(self) -> None:
        self.by_trace: dict[str, dict[str, Any]] = {}

    def on_end(self, span: Any) -> None:
        attrs = span.attributes or {}
        if Attr.ENGINE_PROMPT_N in attrs:
            self.by_trace[format(span.context.trace_id, "032x")] = {k: attrs.get(k) for k in ENGINE_ATTRS}


class Harness:
    """The target of a bench run; ``async with Harness.open(...)`` starts (and closes) what it needs."""

    def __init__(self, out: Path, stack_ref: str | None, target: str | None, collect: str | None, topology: str | None,
                 model: str | None, say: Any) -> None:
        self.out, self.target, self.collect, self.say = out, target, collect, say
        self.stack_ref = stack_ref or DEFAULT_STACK
        self.model = model
        self.raw: dict[str, Any] = {}
        self.topology: Topology | None = None
        self._topology_file = topology
        self._stack: Any = None
        self._collector: Any = None
        self._client_tel: Any = None
        self._spans = _EngineSpans()
        self._variant: dict[str, Any] = {}
        self.variant_label = ""
        if target is None:
            src = find_config(self.stack_ref)
            self.stack_src = str(src)
            load_yaml(src, BenchStackConfig)  # strict: unknown keys name the file
            self.raw = read_yaml(src)
        elif topology:
            self.topology = load_yaml(find_config(topology), BenchStackConfig).topology if _has_sections(topology) else load_yaml(find_config(topology), Topology)

    @property
    def embedded(self) -> bool:
        return self.target is None

    @property
    def edge_url(self) -> str:
        return self._stack.edge_url if self.embedded else str(self.target)

    def engine_model(self) -> Any:
        """The embedded engine's scheduler config (the configured truth), None for an external target."""
        if not self.embedded:
            return None
        return self._configs()[2].scheduler

    def stack_config(self) -> dict[str, Any]:
        return _merge(self.raw, self._variant) if self.embedded else {"target": self.target, "topology": self._topology_file}

    def _configs(self) -> tuple[Any, Any, Any, Topology]:
        from deltatap.stack.config import EngineConfig, FirewallConfig, GatewayConfig

        data = _merge(self.raw, self._variant)
        where = self.stack_src + (f" (variant {self.variant_label})" if self.variant_label else "")
        cfg = validate(BenchStackConfig, data, where)
        return (validate(GatewayConfig, cfg.gateway, f"{where} [gateway]"), validate(FirewallConfig, cfg.firewall, f"{where} [firewall]"),
                validate(EngineConfig, cfg.engine, f"{where} [engine]"), cfg.topology)

    # ---- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        from deltatap.telemetry.tracer import setup_telemetry

        if self.embedded:
            from deltatap.app.demo import launch_reference_stack

            gw, fw, en, topo = self._configs()
            self.topology = topo
            if self.model is None:
                self.model = en.models[0]
            self._spans = _EngineSpans()

            def observe(name: str, tel: Any) -> None:
                if name == "engine":
                    tel.provider.add_span_processor(self._spans)

            self._cm = launch_reference_stack(topo, gw, fw, en, self.out / "collector", ROW_GRACE_S, self.stack_src, observe)
            self._stack = await self._cm.__aenter__()
            self._client_tel = self._stack.tels["client"]
            return
        if self.collect:
            if self.topology is None:
                raise ConfigError("--collect needs --topology FILE: the links and components the taps report (the collector joins traces by it)")
            from deltatap.collector.pipeline import PipelineOptions
            from deltatap.collector.service import CollectorOptions, start_collector

            grpc = self.collect.startswith("grpc://")
            where = self.collect.removeprefix("grpc://").removeprefix("http://")
            self._collector = await start_collector(CollectorOptions(otlp_grpc=where if grpc else None, otlp_http="127.0.0.1:0" if grpc else where, topology=self.topology,
                                                                     out_dir=self.out / "collector", rows_format="parquet",
                                                                     pipeline=PipelineOptions(grace_s=ROW_GRACE_S)))
            self._client_tel = setup_telemetry("deltatap-client", otlp=self._collector.otlp_http_url)
        else:
            self._client_tel = setup_telemetry("deltatap-client", otlp=None)

    async def close(self) -> None:
        if self.embedded and self._stack is not None:
            await self._cm.__aexit__(None, None, None)
            self._stack = None
            return
        if self._client_tel is not None:
            await asyncio.to_thread(self._client_tel.shutdown)
            self._client_tel = None
        if self._collector is not None:
            await self._collector.close()
            self._collector = None

    @contextlib.asynccontextmanager
    async def variant(self, label: str, overrides: dict[str, Any]) -> AsyncIterator[Harness]:
        """The embedded stack restarted with ``overrides`` merged into its config (e.g. ``{"engine":
        {"scheduler": {"prefix_cache": False}}}``), back to the base config afterwards."""
        if not self.embedded:
            raise ConfigError(f"configuration {label!r} changes the stack, which only the embedded reference stack can do; "
                              "run this test without --target, or run each configuration yourself and compare with deltatap guardrails --runs")
        await self.close()
        self._variant, self.variant_label = overrides, label
        try:
            await self.start()
            yield self
        finally:
            await self.close()
            self._variant, self.variant_label = {}, ""
            await self.start()

    # ---- one level ---------------------------------------------------------------------------
    async def run_level(self, streams: dict[str, dict[str, Any]], name: str) -> LevelData:
        """Run the load streams (name -> LoadOptions fields) concurrently; wait for their rows."""
        from deltatap.loadgen.options import LoadOptions
        from deltatap.loadgen.run import run_load

        opts = {}
        for sname, fields in streams.items():
            data = {"progress": False, "gpu": False, "write_requests": False, "target": self.edge_url, "model": self.model,
                    "out": str(self.out / "levels" / name / sname), **fields}
            opts[sname] = validate(LoadOptions, data, f"bench level {name} [{sname}]")
        collector = self._stack.collector if self.embedded else self._collector
        t0 = time.monotonic()
        results = await asyncio.gather(*(run_load(o, self._client_tel, say=lambda _m: None) for o in opts.values()))
        wall = time.monotonic() - t0
        records: list[dict[str, Any]] = []
        for sname, res in zip(opts, results, strict=True):
            for r in res.records:
                r.setdefault("labels", {})["bench_stream"] = sname
            records += res.records
        rows: list[Any] = []
        if collector is not None:
            ids = {r["request_id"] for r in records}
            if self.embedded:
                await self._stack.settle(0, 0.0)  # engine idle, exporters flushed
            else:
                await asyncio.to_thread(self._client_tel.processor.force_flush, 5_000)
            deadline = time.monotonic() + 10.0 + ROW_GRACE_S
            while time.monotonic() < deadline:
                rows = [r for r in collector.rows() if r.request_id in ids]
                if len(rows) >= len(ids):
                    break
                await asyncio.sleep(0.1)
            if len(rows) < len(ids):
                await collector.drain()
                rows = [r for r in collector.rows() if r.request_id in ids]
        engine = {r["trace_id"]: self._spans.by_trace[r["trace_id"]] for r in records if r.get("trace_id") in self._spans.by_trace}
        return LevelData(records, rows, engine, wall, {k: o.model_dump(mode="json", exclude={"target", "out"}) for k, o in opts.items()})


def _has_sections(ref: str) -> bool:
    data = read_yaml(ref)
    return isinstance(data, dict) and "topology" in data


@contextlib.asynccontextmanager
async def open_harness(out: Path, stack_ref: str | None = None, target: str | None = None, collect: str | None = None,
                       topology: str | None = None, model: str | None = None, say: Any = print) -> AsyncIterator[Harness]:
    h = Harness(out, stack_ref, target, collect, topology, model, say)
    await h.start()
    try:
        yield h
    finally:
        await h.close()
