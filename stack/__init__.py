"""The reference stack: gateway, AI firewall and engine that state the true times of their events.

Three real aiohttp servers (DESIGN section 7), configured from strict YAML models
(:mod:`deltatap.stack.config`), each emitting its own OpenTelemetry SERVER span per request named
``deltatap.stack.<component>`` whose events are the generic point roles of
:class:`deltatap.vocab.Role`, stamped where bytes meet the socket (:mod:`deltatap.net.wire`).

In-process interface (tests, ``deltatap demo``, the accuracy benchmarks)::

    from deltatap.telemetry.tracer import setup_telemetry
    from deltatap.stack import EngineConfig, FirewallConfig, GatewayConfig, start_engine, start_firewall, start_gateway

    tel = setup_telemetry("deltatap-stack", otlp="grpc://127.0.0.1:4317")
    engine = await start_engine(EngineConfig(), tel, "127.0.0.1:0")          # listen defaults to cfg.listen
    fw = await start_firewall(FirewallConfig(upstream=engine.url), tel, "127.0.0.1:0")
    gw = await start_gateway(GatewayConfig(routes=[{"upstreams": [fw.url]}]), tel, "127.0.0.1:0")
    gw.url                       # "http://127.0.0.1:<port>"; .port, .name, .kind
    gw.extra["state"]            # the component's state (scheduler, counters) for assertions
    await gw.close(); await fw.close(); await engine.close()

    # or all three chained, optionally with deltatap taps on the links:
    from deltatap.stack import load_stack_config, start_stack
    stack = await start_stack(load_stack_config("configs/demo.yaml"), lambda service: tel, taps=True, ephemeral=True)
    stack.url                    # the edge tap (or the gateway without taps)
    await stack.close()

Configs load with :func:`load_component_config` (a component file, or its section of a combined
file such as ``configs/demo.yaml``); bad keys raise :class:`deltatap.config.ConfigError` naming
the file and key. See docs/stack.md for every key, the cost models and the span contents.
"""

from deltatap.stack.chain import RunningStack, StackConfig, load_stack_config, start_stack
from deltatap.stack.config import EngineConfig, FirewallConfig, GatewayConfig, load_component_config
from deltatap.stack.engine.app import start_engine
from deltatap.stack.firewall.app import start_firewall
from deltatap.stack.gateway.app import start_gateway
from deltatap.stack.server import RunningComponent

__all__ = [
    "EngineConfig",
    "FirewallConfig",
    "GatewayConfig",
    "RunningComponent",
    "RunningStack",
    "StackConfig",
    "load_component_config",
    "load_stack_config",
    "start_engine",
    "start_firewall",
    "start_gateway",
    "start_stack",
]
