import pytest

from deltatap.core.config import ConfigError
from deltatap.core.topology import default_topology, load_topology


def write(tmp_path, text):
    p = tmp_path / "t.yaml"
    p.write_text(text)
    return p


def test_default_topology_is_the_draft_stack():
    t = default_topology()
    assert [c.name for c in t.components] == ["client", "gateway", "firewall", "engine"]
    assert [link.name for link in t.links] == ["edge", "gw-fw", "fw-engine"]


def test_custom_topology_without_firewall(tmp_path):
    t = load_topology(write(tmp_path, """
components:
  - {name: c, kind: client}
  - {name: envoy, kind: gateway, url: "http://127.0.0.1:1"}
  - {name: llama, kind: engine, url: "http://127.0.0.1:2"}
links:
  - {name: a, downstream: c, upstream: envoy, tap: {listen: "127.0.0.1:9000"}}
  - {name: b, downstream: envoy, upstream: llama}
"""))
    assert t.upstream_url("b") == "http://127.0.0.1:2"


@pytest.mark.parametrize(
    "text, needle",
    [
        ("components: [{name: c, kind: client}, {name: e, kind: engine}]\nlinks: []\nfoo: 1\n", "foo: unknown key"),
        ("components: [{name: c, kind: client}, {name: e, kind: engyne}]\nlinks: []\n", "components.1.kind"),
        ("components: [{name: e, kind: engine}, {name: c, kind: client}]\nlinks: []\n", "must start"),
        ("components: [{name: c, kind: client}, {name: e, kind: engine}]\nlinks: [{name: l, downstream: c, upstream: x}]\n", "unknown component 'x'"),
        ("components: [{name: c, kind: client}, {name: e, kind: engine}]\nlinks: [{name: l, downstream: c, upstream: e, tap: {listen: nope}}]\n", "HOST:PORT"),
        ("components: [\n  - oops", "not valid YAML at line"),
    ],
)
def test_bad_topologies_name_the_key(tmp_path, text, needle):
    with pytest.raises(ConfigError) as err:
        load_topology(write(tmp_path, text))
    assert needle in str(err.value)
    assert "t.yaml" in str(err.value)


def test_missing_file_is_clear(tmp_path):
    with pytest.raises(ConfigError, match="file not found"):
        load_topology(tmp_path / "nope.yaml")


def test_tap_protocol_in_the_topology(tmp_path):
    from deltatap.core.vocab import TAP_PROTOCOLS

    t = load_topology(write(tmp_path, """
components:
  - {name: c, kind: client}
  - {name: triton, kind: engine, url: "http://127.0.0.1:8001"}
links:
  - {name: l, downstream: c, upstream: triton, tap: {listen: "127.0.0.1:9001", protocol: grpc}}
"""))
    assert t.link("l").tap.protocol == "grpc"
    assert default_topology().links[0].tap is None
    assert load_topology(write(tmp_path, """
components: [{name: c, kind: client}, {name: e, kind: engine}]
links: [{name: l, downstream: c, upstream: e, tap: {listen: "127.0.0.1:9001"}}]
""")).link("l").tap.protocol == TAP_PROTOCOLS[0] == "http"


def test_unknown_tap_protocol_is_one_problem_line_naming_the_key_and_the_values(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_topology(write(tmp_path, """
components: [{name: c, kind: client}, {name: e, kind: engine}]
links: [{name: l, downstream: c, upstream: e, tap: {listen: "127.0.0.1:9001", protocol: h2c}}]
"""))
    msg = str(err.value)
    assert "t.yaml" in msg
    (problem,) = [line for line in msg.splitlines() if line.startswith("  - ")]  # (the file's heading line, then one per problem)
    assert "links.0.tap.protocol" in problem and "must be one of http, grpc" in problem and "'h2c'" in problem
