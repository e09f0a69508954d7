"""The launcher's pure parts, without any third-party binary (fast suite, not marked realstack):
template rendering, free-port rewriting, who forwards to whom with and without taps, unknown parts."""

from __future__ import annotations

import re

import pytest
from realstack_support import ROOT, RealStack, load_topology, with_free_ports

from deltatap.core.config import ConfigError

from parts import HERE, render  # noqa: E402 - realstack/ is on sys.path via realstack_support
from launch import parts_of  # noqa: E402


def test_render_fills_every_placeholder_and_keeps_nginx_variables(tmp_path):
    out = render(HERE / "nginx.conf", {"RUN_DIR": "/r", "LISTEN": "127.0.0.1:1", "UPSTREAM": "127.0.0.1:2", "READ_TIMEOUT": "5ms"},
                 tmp_path / "nginx.conf").read_text()
    assert not re.search(r"\$\{[A-Z_]+\}", out)
    assert "proxy_set_header Host $host;" in out and "proxy_read_timeout 5ms;" in out and "proxy_buffering off;" in out


def test_render_refuses_a_missing_value(tmp_path):
    with pytest.raises(KeyError, match="ROUTE_TIMEOUT"):
        render(HERE / "envoy.yaml", {"ADMIN_PORT": "1", "LISTEN_PORT": "2", "UPSTREAM_HOST": "h", "UPSTREAM_PORT": "3",
                                     "OTLP_HOST": "h", "OTLP_PORT": "4"}, tmp_path / "envoy.yaml")


def test_with_free_ports_moves_every_address():
    topo = load_topology(ROOT / "configs/realstack-envoy-litellm.yaml")
    moved = with_free_ports(topo)
    old = {c.url for c in topo.components[1:]} | {link.tap.listen for link in topo.links}
    new = {c.url for c in moved.components[1:]} | {link.tap.listen for link in moved.links}
    assert len(new) == 6 and not old & new
    assert [c.name for c in moved.components] == [c.name for c in topo.components]


@pytest.mark.parametrize("taps", [True, False])
def test_each_component_forwards_to_its_link_tap_or_straight_on(tmp_path, taps):
    topo = with_free_ports(load_topology(ROOT / "configs/realstack-envoy-litellm.yaml"))
    stack = RealStack(topo, ROOT / "configs/realstack-envoy-litellm.yaml", tmp_path, taps=taps, api_key="sk-test")
    for i, link in enumerate(topo.links):
        expected = f"http://{link.tap.listen}" if taps else topo.component(link.upstream).url
        assert stack.address_of_link(i) == expected
    assert load_topology(stack.topology_path) == topo


def test_a_component_that_is_no_part_is_a_clear_error():
    with pytest.raises(ConfigError, match="not real-stack parts"):
        parts_of(load_topology(ROOT / "configs/demo.yaml"))
    assert parts_of(load_topology(ROOT / "configs/realstack-cascade-refengine.yaml")) == ["envoy", "ref-engine"]
