"""The example topologies and the component configs beside them agree with each other.

Each example rewires one real stack: a component's upstream must point at the tap in front of the next
component, not at the component itself, and each component's own telemetry must go to the collector.
These tests read the third-party files (LiteLLM YAML, Envoy AI Gateway resources, nginx.conf, shell
scripts) and check exactly those wiring facts against the topology, so a port changed in one file and
not the other fails here.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from deltatap.core.topology import Topology, load_topology, parse_hostport

EXAMPLES = Path(__file__).resolve().parents[2] / "configs" / "examples"
COMPONENTS = EXAMPLES / "components"
COLLECTOR_OTLP_GRPC = 4317


def _topo(name: str) -> Topology:
    return load_topology(EXAMPLES / f"{name}.yaml")


def _tap_port(topo: Topology, link: str) -> int:
    tap = topo.link(link).tap
    assert tap is not None, f"{topo.name}: link {link} is not tapped"
    return parse_hostport(tap.listen)[1]


def _port(url: str) -> int:
    return urlsplit(url).port or (443 if url.startswith("https") else 80)


def test_every_example_has_its_component_files():
    for topo_file in EXAMPLES.glob("*.yaml"):
        folder = COMPONENTS / topo_file.stem
        assert folder.is_dir() and any(folder.iterdir()), f"{topo_file.name}: no component snippets in {folder}"


@pytest.mark.parametrize("topo_file", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_link_is_tapped_with_distinct_ports(topo_file: Path):
    topo = load_topology(topo_file)
    ports = []
    for link in topo.links:
        assert link.tap is not None, f"{topo_file.name}: link {link.name} untapped"
        ports.append(parse_hostport(link.tap.listen)[1])
        if link.tap.admin:
            ports.append(parse_hostport(link.tap.admin)[1])
    comp_ports = [_port(c.url) for c in topo.components if c.url]
    assert len(set(ports + comp_ports)) == len(ports + comp_ports), f"{topo_file.name}: a port is used twice"
    # the tap on a link forwards to the component on its upstream side
    for link in topo.links:
        assert topo.upstream_url(link.name) == topo.component(link.upstream).url


def test_vllm_litellm_wiring():
    topo = _topo("vllm-litellm")
    cfg = yaml.safe_load((COMPONENTS / "vllm-litellm" / "litellm.yaml").read_text())
    bases = [m["litellm_params"]["api_base"] for m in cfg["model_list"]]
    assert bases and all(_port(b) == _tap_port(topo, "gw-engine") for b in bases), bases
    assert "otel" in cfg["litellm_settings"]["callbacks"]
    assert cfg["general_settings"]["forward_client_headers_to_llm_api"] is True
    assert topo.correlation_header.startswith("x-"), "LiteLLM only forwards x-* headers"
    vllm = (COMPONENTS / "vllm-litellm" / "serve-vllm.sh").read_text()
    assert f"--port {_port(topo.component('vllm').url)}" in vllm
    assert re.search(rf"--otlp-traces-endpoint grpc://[\w.]+:{COLLECTOR_OTLP_GRPC}\b", vllm)


def test_envoy_ai_gateway_guardrail_wiring():
    topo = _topo("envoy-ai-gateway-guardrail")
    docs = [d for d in yaml.safe_load_all((COMPONENTS / "envoy-ai-gateway-guardrail" / "aigw.yaml").read_text()) if d]
    by_kind: dict[str, list[dict]] = {}
    for d in docs:
        by_kind.setdefault(d["kind"], []).append(d)
    gateway = by_kind["Gateway"][0]
    assert gateway["spec"]["listeners"][0]["port"] == _port(topo.component("envoy-ai-gateway").url)
    backends = {b["metadata"]["name"]: b for b in by_kind["Backend"]}
    # the route's AIServiceBackend -> Backend -> the gw-fw tap
    route = by_kind["AIGatewayRoute"][0]
    svc_names = {ref["name"] for rule in route["spec"]["rules"] for ref in rule["backendRefs"]}
    ai_backends = {b["metadata"]["name"]: b for b in by_kind["AIServiceBackend"]}
    for name in svc_names:
        target = backends[ai_backends[name]["spec"]["backendRef"]["name"]]
        assert target["spec"]["endpoints"][0]["fqdn"]["port"] == _tap_port(topo, "gw-fw")
    assert route["spec"]["rules"][0]["timeouts"]["request"] == f"{int(topo.component('envoy-ai-gateway').timeout_s)}s"
    # Envoy's OpenTelemetry tracer -> the collector
    tracing = by_kind["EnvoyProxy"][0]["spec"]["telemetry"]["tracing"]
    assert tracing["provider"]["type"] == "OpenTelemetry"
    ref = tracing["provider"]["backendRefs"][0]
    assert ref["port"] == COLLECTOR_OTLP_GRPC
    assert backends[ref["name"]]["spec"]["endpoints"][0]["fqdn"]["port"] == COLLECTOR_OTLP_GRPC
    env = dict(
        line.split("=", 1)
        for line in (COMPONENTS / "envoy-ai-gateway-guardrail" / "guardrail.env").read_text().splitlines()
        if line and not line.startswith("#")
    )
    assert _port(env["OPENAI_BASE_URL"]) == _tap_port(topo, "fw-engine")
    assert _port(env["OTEL_EXPORTER_OTLP_ENDPOINT"]) == COLLECTOR_OTLP_GRPC
    vllm = (COMPONENTS / "envoy-ai-gateway-guardrail" / "serve-vllm.sh").read_text()
    assert f"--port {_port(topo.component('vllm').url)}" in vllm
    assert "--otlp-traces-endpoint grpc://" in vllm


def test_llamacpp_nginx_wiring():
    topo = _topo("llamacpp-nginx")
    conf = (COMPONENTS / "llamacpp-nginx" / "nginx.conf").read_text()
    code = "\n".join(line.split("#", 1)[0] for line in conf.splitlines())
    assert re.search(rf"listen\s+[\d.]+:{_port(topo.component('nginx').url)};", code)
    upstream = re.search(r"upstream\s+\w+\s*\{([^}]*)\}", code).group(1)
    assert re.search(rf"server\s+[\d.]+:{_tap_port(topo, 'proxy-engine')};", upstream)
    assert re.search(r"proxy_buffering\s+off;", code), "nginx would buffer the SSE stream"
    assert re.search(r"otel_trace_context\s+propagate;", code)
    assert re.search(rf"otel_exporter\s*\{{\s*endpoint\s+[\w.]+:{COLLECTOR_OTLP_GRPC};", code)
    assert code.count("{") == code.count("}")
    timeout = re.search(r"proxy_read_timeout\s+(\d+)s;", code).group(1)
    assert float(timeout) == topo.component("nginx").timeout_s
    llama = (COMPONENTS / "llamacpp-nginx" / "serve-llama.sh").read_text()
    assert f"--port {_port(topo.component('llama-server').url)}" in llama
