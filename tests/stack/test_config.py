"""Every stack YAML in configs/ validates; bad configs fail with the file and key named."""

from __future__ import annotations

from pathlib import Path

import pytest

from deltatap.core.config import ConfigError
from deltatap.core.topology import load_topology

from deltatap.stack.chain import load_stack_config
from deltatap.stack.config import EngineConfig, FirewallConfig, GatewayConfig, load_component_config
from deltatap.stack.delays import DelaySampler, DelaySpec

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
STACK_YAMLS = sorted([CONFIGS / "demo.yaml", *CONFIGS.glob("stack-*.yaml")])


@pytest.mark.parametrize("path", STACK_YAMLS, ids=lambda p: p.name)
def test_stack_yaml_validates(path: Path) -> None:
    cfg = load_stack_config(path)
    assert cfg.topology is not None
    assert load_topology(path).name == cfg.topology.name
    for kind in ("engine", "firewall", "gateway"):
        load_component_config(path, kind)


def test_demo_follows_port_conventions() -> None:
    cfg = load_stack_config(CONFIGS / "demo.yaml")
    assert (cfg.gateway.listen, cfg.firewall.listen, cfg.engine.listen) == ("127.0.0.1:8100", "127.0.0.1:8200", "127.0.0.1:8300")
    taps = {link.name: link.tap.listen for link in cfg.topology.links}
    assert taps == {"edge": "127.0.0.1:9100", "gw-fw": "127.0.0.1:9200", "fw-engine": "127.0.0.1:9300"}
    assert cfg.gateway.routes[0].upstreams == ["http://127.0.0.1:9200"]
    assert cfg.firewall.upstream == "http://127.0.0.1:9300"
    assert cfg.gateway.upstream_policy.timeout_s == cfg.topology.component("gateway").timeout_s


def test_unknown_key_names_file_and_path(tmp_path: Path) -> None:
    p = tmp_path / "bad.yaml"
    p.write_text("engine:\n  scheduler:\n    max_btach: 4\n")
    with pytest.raises(ConfigError) as err:
        load_component_config(p, "engine")
    assert str(p) in str(err.value) and "scheduler.max_btach" in str(err.value) and "unknown key" in str(err.value)


def test_missing_section_is_named(tmp_path: Path) -> None:
    p = tmp_path / "only_engine.yaml"
    p.write_text("engine: {}\n")
    with pytest.raises(ConfigError, match="no top-level 'gateway' section"):
        load_component_config(p, "gateway")


def test_component_file_without_sections(tmp_path: Path) -> None:
    p = tmp_path / "fw.yaml"
    p.write_text("upstream: http://127.0.0.1:1234/\noutbound: {mode: hybrid, hybrid_buffer_tokens: 3}\n")
    cfg = load_component_config(p, "firewall")
    assert cfg.upstream == "http://127.0.0.1:1234" and cfg.outbound.mode == "hybrid"


@pytest.mark.parametrize(
    "model,data,fragment",
    [
        (FirewallConfig, {"upstream": "localhost:8300"}, "not an http(s) URL"),
        (FirewallConfig, {"inbound": {"rules": [{"name": "r", "regex": ["("], "action": "block"}]}}, "does not compile"),
        (FirewallConfig, {"inbound": {"rules": [{"name": "r", "action": "block"}]}}, "at least one keyword or regex"),
        (FirewallConfig, {"outbound": {"mode": "sometimes"}}, "outbound.mode"),
        (GatewayConfig, {"auth": {"enabled": True}}, "api_keys is empty"),
        (GatewayConfig, {"routes": []}, "routes"),
        (EngineConfig, {"delays": {"inbound": {"fixed_ms": 1, "distribution": "zipf"}}}, "distribution 'zipf' unknown"),
        (EngineConfig, {"listen": "8300"}, "HOST:PORT"),
        (EngineConfig, {"scheduler": {"max_batch": 0}}, "scheduler.max_batch"),
    ],
)
def test_bad_values_are_explained(tmp_path: Path, model, data, fragment: str) -> None:
    import yaml

    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(data))
    kind = {EngineConfig: "engine", FirewallConfig: "firewall", GatewayConfig: "gateway"}[model]
    with pytest.raises(ConfigError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        load_component_config(p, kind)


def test_delay_spec_number_and_seeded_draws() -> None:
    spec = DelaySpec.model_validate(3)
    assert spec.fixed_ms == 3 and spec.jitter_ms == 0
    j = DelaySpec(fixed_ms=3, jitter_ms=0.5)
    a = [DelaySampler(7).draw_ms(j) for _ in range(1)] + [DelaySampler(7).draw_ms(j)]
    assert a[0] == a[1]  # same seed, same draw
    draws = [DelaySampler(s).draw_ms(j) for s in range(200)]
    assert all(2.5 <= d <= 3.5 for d in draws) and max(draws) - min(draws) > 0.5
    assert DelaySampler(1).draw_ms(DelaySpec(fixed_ms=0.1, jitter_ms=5, distribution="normal")) >= 0
