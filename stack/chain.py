"""The whole reference stack in one process: engine, firewall and gateway chained on loopback,
optionally with deltatap taps on the links between them (``deltatap.proxy.start_tap``).

    cfg = load_stack_config("configs/demo.yaml")        # or StackConfig() for defaults
    stack = await start_stack(cfg, telemetry_for, taps=True, ephemeral=True)
    stack.url        # where a client sends requests (the edge tap, or the gateway)
    await stack.close()

``telemetry_for(service_name)`` returns the :class:`~deltatap.telemetry.Telemetry` each part
exports through (one per component, so Jaeger shows them as separate services; the caller owns and
shuts them down). ``ephemeral=True`` listens on free ports (tests); otherwise each component's
``listen`` and each tap's ``topology`` listen address are used (configs/demo.yaml follows the port
conventions in docs/stack.md). In the chain every gateway route points at the firewall (or the
tap in front of it) and the firewall at the engine (or its tap).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deltatap.core.config import ConfigError, read_yaml
from deltatap.telemetry.tracer import Telemetry
from deltatap.core.topology import Topology, load_topology, parse_hostport
from deltatap.core.vocab import ComponentKind

from deltatap.stack.config import EngineConfig, FirewallConfig, GatewayConfig, load_component_config
from deltatap.stack.engine.app import start_engine
from deltatap.stack.firewall.app import start_firewall
from deltatap.stack.gateway.app import start_gateway
from deltatap.stack.server import RunningComponent

EPHEMERAL = "127.0.0.1:0"


@dataclass
class StackConfig:
    engine: EngineConfig = field(default_factory=EngineConfig)
    firewall: FirewallConfig = field(default_factory=FirewallConfig)
    gateway: GatewayConfig = field(default_factory=GatewayConfig)
    topology: Topology | None = None


def load_stack_config(path: str | Path) -> StackConfig:
    """All three sections of a combined file (a missing section means that component's defaults)."""
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping with gateway/firewall/engine/topology sections")
    cfg = StackConfig()
    for kind in (ComponentKind.ENGINE.value, ComponentKind.FIREWALL.value, ComponentKind.GATEWAY.value):
        if kind in data:
            setattr(cfg, kind, load_component_config(path, kind))
    if "topology" in data:
        cfg.topology = load_topology(path)
    return cfg


@dataclass
class RunningStack:
    engine: RunningComponent
    firewall: RunningComponent
    gateway: RunningComponent
    taps: dict[str, Any] = field(default_factory=dict)  # link name -> proxy.RunningTap

    @property
    def url(self) -> str:
        edge = self.taps.get("edge")
        return edge.url if edge is not None else self.gateway.url

    @property
    def components(self) -> list[RunningComponent]:
        return [self.gateway, self.firewall, self.engine]

    async def close(self) -> None:
        """Close from the entry inwards, so nothing in flight loses its upstream first."""
        if "edge" in self.taps:
            await self.taps["edge"].close(0)
        await self.gateway.close()
        if "gw-fw" in self.taps:
            await self.taps["gw-fw"].close(0)
        await self.firewall.close()
        if "fw-engine" in self.taps:
            await self.taps["fw-engine"].close(0)
        await self.engine.close()


def _tap_listen(topo: Topology | None, link: str, ephemeral: bool) -> tuple[str, int, int | None]:
    if ephemeral or topo is None:
        return "127.0.0.1", 0, 0  # free ports, the admin server's too
    spec = next((x for x in topo.links if x.name == link), None)
    if spec is None or spec.tap is None:
        return "127.0.0.1", 0, 0
    from deltatap.proxy.options import default_admin_port

    host, port = parse_hostport(spec.tap.listen)
    admin = parse_hostport(spec.tap.admin)[1] if spec.tap.admin else default_admin_port(port, f"links.{link}.tap.admin")
    return host, port, admin


async def _start_tap(link: str, upstream: str, cfg: StackConfig, telemetry: Telemetry, ephemeral: bool, clock_sync: str | None = None) -> Any:
    try:
        from deltatap.proxy import TapOptions, start_tap
    except ImportError as exc:  # pragma: no cover - the tap ships in the same distribution
        raise ConfigError(f"--taps needs deltatap's tap package (proxy): {exc}") from None
    host, port, admin = _tap_listen(cfg.topology, link, ephemeral)
    return await start_tap(TapOptions(link=link, upstream=upstream, listen_host=host, listen_port=port, admin_port=admin, clock_sync=clock_sync), telemetry)


async def start_stack(
    cfg: StackConfig,
    telemetry_for: Callable[[str], Telemetry],
    *,
    taps: bool = False,
    ephemeral: bool = False,
    clock_sync: str | None = None,
) -> RunningStack:
    """Start engine, firewall and gateway chained, with taps when ``taps``; ``clock_sync`` (a collector's
    base URL, ``GET /v1/clock``) makes every tap estimate its clock offset to that collector."""
    if taps and cfg.topology is not None:  # (before anything starts: the components speak HTTP to each other)
        from deltatap.proxy.options import require_http_tap

        for link in cfg.topology.links:
            require_http_tap(cfg.topology, link.name, "deltatap stack --taps")
    started: list[Any] = []
    try:
        listen = (lambda c: EPHEMERAL) if ephemeral else (lambda c: c.listen)
        engine = await start_engine(cfg.engine, telemetry_for("deltatap-stack-engine"), listen(cfg.engine))
        started.append(engine)
        running_taps: dict[str, Any] = {}
        tap_tel = telemetry_for("deltatap-tap") if taps else None
        fw_upstream = engine.url
        if tap_tel is not None:
            running_taps["fw-engine"] = tap = await _start_tap("fw-engine", engine.url, cfg, tap_tel, ephemeral, clock_sync)
            started.append(tap)
            fw_upstream = tap.url
        fw_cfg = cfg.firewall.model_copy(update={"upstream": fw_upstream})
        firewall = await start_firewall(fw_cfg, telemetry_for("deltatap-stack-firewall"), listen(cfg.firewall))
        started.append(firewall)
        gw_upstream = firewall.url
        if tap_tel is not None:
            running_taps["gw-fw"] = tap = await _start_tap("gw-fw", firewall.url, cfg, tap_tel, ephemeral, clock_sync)
            started.append(tap)
            gw_upstream = tap.url
        routes = [r.model_copy(update={"upstreams": [gw_upstream]}) for r in cfg.gateway.routes]
        gateway = await start_gateway(cfg.gateway.model_copy(update={"routes": routes}), telemetry_for("deltatap-stack-gateway"), listen(cfg.gateway))
        started.append(gateway)
        if tap_tel is not None:
            running_taps["edge"] = tap = await _start_tap("edge", gateway.url, cfg, tap_tel, ephemeral, clock_sync)
            started.append(tap)
        return RunningStack(engine=engine, firewall=firewall, gateway=gateway, taps=running_taps)
    except BaseException:
        for part in reversed(started):
            await part.close()
        raise
