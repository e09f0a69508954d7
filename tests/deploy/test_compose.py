"""docker-compose.yml without Docker: every deltatap service's command is parsed by `deltatap`'s own
parser and validated the way the command validates it before it starts serving; the wiring between
services (ports, Prometheus targets, Grafana data sources, mounted files, variables) is consistent.

Checked for the plain file (defaults), for `.env.example`, and for each profile.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from deltatap.core.config import ConfigError
from deltatap.core.topology import parse_hostport

from .commands import COMMAND_CHECKS, check_tap, parse
from .compose import (
    COMPOSE_FILE,
    ENV_EXAMPLE,
    ROOT,
    InterpolationError,
    command_list,
    env_example_keys,
    interpolate,
    load_compose,
    port_mappings,
    read_env_file,
    variables_used,
)

PROFILES = (set(), {"demo"}, {"load"}, {"demo", "load"})
ENVS = {
    "defaults": {},
    "env.example": read_env_file(ENV_EXAMPLE),
    # a two-link stack, as docs/quickstart.md runs it (with --scale tap-gw-fw=0)
    "vllm-litellm": {"DELTATAP_TOPOLOGY": "configs/examples/vllm-litellm.yaml", "DELTATAP_ENGINE_LINK": "gw-engine",
                     "DELTATAP_GATEWAY_URL": "http://host.docker.internal:4000", "DELTATAP_ENGINE_URL": "http://host.docker.internal:8000"},
}
SCALED_TO_ZERO = {"vllm-litellm": {"tap-gw-fw"}}


def _deltatap_services(compose) -> dict[str, dict]:
    return {n: s for n, s in compose.services.items() if "build" in s or str(s.get("image", "")).startswith("deltatap")}


# ---- tests ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("env_name", sorted(ENVS))
def test_every_deltatap_command_parses_and_validates(env_name: str):
    compose = load_compose(ENVS[env_name])
    services = _deltatap_services(compose)
    assert {"tap-edge", "tap-gw-fw", "tap-fw-engine", "collector"} <= set(services)
    for name, svc in services.items():
        if name in SCALED_TO_ZERO.get(env_name, ()):
            continue
        cmd = command_list(svc)
        assert cmd, f"{name}: no command"
        check = COMMAND_CHECKS.get(cmd[0])
        assert check is not None, f"{name}: `deltatap {cmd[0]}` has no validation in COMMAND_CHECKS"
        args = parse(cmd)
        try:
            check(args)
        except ConfigError as exc:
            pytest.fail(f"{name} ({env_name}): `deltatap {' '.join(cmd)}` fails validation: {exc}")
        if cmd[0] == "tap":  # inside a container a tap must listen on all interfaces, with its admin port on
            from deltatap.proxy.cli import build_options

            opts = build_options(args)
            assert opts.listen_host == "0.0.0.0" and opts.admin_port, name


def test_a_bad_command_is_caught():
    """The check above can fail: an unknown flag and a bad upstream are both reported."""
    with pytest.raises(pytest.fail.Exception):
        parse(["tap", "--link", "edge", "--no-such-flag"])
    args = parse(["tap", "--link", "edge", "--listen", "0.0.0.0:9100", "--upstream", "ftp://x"])
    with pytest.raises(ConfigError):
        check_tap(args)


def test_taps_wrap_the_stack_through_environment_variables():
    text = COMPOSE_FILE.read_text(encoding="utf-8")
    for var in ("DELTATAP_GATEWAY_URL", "DELTATAP_FIREWALL_URL", "DELTATAP_ENGINE_URL"):
        assert var in variables_used(text)
    env = {"DELTATAP_GATEWAY_URL": "http://10.0.0.1:4000", "DELTATAP_FIREWALL_URL": "http://10.0.0.2:8000",
           "DELTATAP_ENGINE_URL": "https://10.0.0.3:8443"}
    compose = load_compose(env)
    upstream = {n: parse(command_list(s)).upstream for n, s in compose.services.items() if n.startswith("tap-")}
    assert upstream == {"tap-edge": env["DELTATAP_GATEWAY_URL"], "tap-gw-fw": env["DELTATAP_FIREWALL_URL"],
                        "tap-fw-engine": env["DELTATAP_ENGINE_URL"]}


def test_every_variable_is_documented_in_env_example():
    used = variables_used(COMPOSE_FILE.read_text(encoding="utf-8"))
    missing = used - env_example_keys()
    assert not missing, f".env.example does not mention {sorted(missing)}"


def test_demo_profile_chains_reference_stack_through_the_taps():
    compose = load_compose({})
    active = compose.active({"demo"})
    assert {"gateway", "firewall", "engine"} <= set(active)
    assert not {"gateway", "firewall", "engine"} & set(compose.active(set()))
    args = {n: parse(command_list(active[n])) for n in ("tap-edge", "tap-gw-fw", "tap-fw-engine", "gateway", "firewall", "engine")}
    # the taps' default upstreams are the demo services, on the ports they listen on
    for tap, comp in (("tap-edge", "gateway"), ("tap-gw-fw", "firewall"), ("tap-fw-engine", "engine")):
        u = urlsplit(args[tap].upstream)
        assert u.hostname == comp and u.port == parse_hostport(args[comp].listen)[1], (tap, comp)
    # the components' upstreams are the next tap
    for comp, tap in (("gateway", "tap-gw-fw"), ("firewall", "tap-fw-engine")):
        u = urlsplit(args[comp].upstream)
        assert u.hostname == tap and u.port == parse_hostport(args[tap].listen)[1], (comp, tap)


def test_load_profile_targets_the_edge_tap():
    compose = load_compose({})
    active = compose.active({"load"})
    load = [s for s in active.values() if command_list(s)[:1] == ["load"]]
    assert len(load) == 1 and load[0].get("profiles") == ["load"]
    args = parse(command_list(load[0]))
    edge = parse(command_list(active["tap-edge"]))
    u = urlsplit(args.target)
    assert u.hostname == "tap-edge" and u.port == parse_hostport(edge.listen)[1]


def test_published_ports_are_unique_and_match_what_services_listen_on():
    compose = load_compose({})
    host_ports = []
    for profiles in PROFILES:
        for name, svc in compose.active(profiles).items():
            for host, container in port_mappings(svc):
                if host is not None:
                    host_ports.append((host, name))
    assert len({p for p, _ in host_ports}) == len(set(host_ports)), f"a host port is published twice: {sorted(set(host_ports))}"
    listens = {}
    for name, svc in _deltatap_services(compose).items():
        args = parse(command_list(svc))
        for attr in ("listen", "otlp_grpc", "otlp_http"):
            if getattr(args, attr, None):
                listens.setdefault(name, set()).add(parse_hostport(getattr(args, attr))[1])
    for name, svc in compose.services.items():
        for _host, container in port_mappings(svc):
            if name in listens:
                assert container in listens[name], f"{name} publishes {container} but listens on {listens[name]}"


def test_prometheus_scrapes_every_tap_admin_port_and_the_collector():
    compose = load_compose({})
    prom = yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text())
    targets = {t for job in prom["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]}
    for name, svc in _deltatap_services(compose).items():
        args = parse(command_list(svc))
        if args.command == "tap":
            assert f"{name}:{parse_hostport(args.admin)[1]}" in targets, name
        elif args.command == "collect":
            assert f"{name}:{parse_hostport(args.metrics)[1]}" in targets, name
    for t in targets:
        host = t.split(":")[0]
        assert host in compose.services, f"Prometheus scrapes {t}, which is not a compose service"


def test_collector_forwards_to_jaeger_and_everything_exports_to_the_collector():
    compose = load_compose({})
    jaeger_cfg = yaml.safe_load((ROOT / "deploy" / "jaeger" / "config.yaml").read_text())
    protocols = jaeger_cfg["receivers"]["otlp"]["protocols"]
    assert protocols["grpc"]["endpoint"] == "0.0.0.0:4317" and protocols["http"]["endpoint"] == "0.0.0.0:4318"
    assert jaeger_cfg["extensions"]["jaeger_query"]["http"]["endpoint"].endswith(":16686")
    collector = parse(command_list(compose.services["collector"]))
    assert urlsplit(collector.forward).hostname == "jaeger" and urlsplit(collector.forward).port == 4317
    assert collector.reexport
    grpc_port = parse_hostport(collector.otlp_grpc)[1]
    for name, svc in _deltatap_services(compose).items():
        args = parse(command_list(svc))
        if getattr(args, "otlp", None):
            u = urlsplit(args.otlp)
            assert (u.scheme, u.hostname, u.port) == ("grpc", "collector", grpc_port), name
        if getattr(args, "clock_sync", None):
            assert urlsplit(args.clock_sync).port == parse_hostport(collector.otlp_http)[1], name


def test_mounted_files_exist_and_grafana_points_at_the_services():
    compose = load_compose({})
    for name, svc in compose.services.items():
        for vol in svc.get("volumes", []):
            src = str(vol).split(":")[0]
            if src.startswith("."):
                assert (ROOT / src).exists(), f"{name} mounts {src}, which does not exist"
    ds = yaml.safe_load((ROOT / "deploy/grafana/provisioning/datasources/deltatap.yaml").read_text())
    for d in ds["datasources"]:
        u = urlsplit(d["url"])
        assert u.hostname in compose.services, d
        exposed = {c for _h, c in port_mappings(compose.services[u.hostname])}
        assert u.port in exposed, d
    home = compose.services["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert (ROOT / "deploy/grafana/dashboards" / Path(home).name).is_file()


def test_interpolation_follows_compose_rules():
    assert interpolate("${A:-x}", {}) == "x" and interpolate("${A:-x}", {"A": ""}) == "x"
    assert interpolate("${A-x}", {"A": ""}) == "" and interpolate("$$A", {"A": "1"}) == "$A"
    with pytest.raises(InterpolationError):
        interpolate("${A:?set A}", {})


def test_every_published_port_binds_loopback_unless_told_otherwise():
    """Issue 19: the taps and the OTLP receivers (no credentials) were published on every interface."""
    for env, want, want_ui in (({}, "127.0.0.1", "127.0.0.1"), ({"DELTATAP_BIND": "10.0.0.5"}, "10.0.0.5", "127.0.0.1"),
                               ({"DELTATAP_UI_BIND": "0.0.0.0"}, "127.0.0.1", "0.0.0.0")):
        compose = load_compose(env)
        for profiles in PROFILES:
            for name, svc in compose.active(profiles).items():
                for p in svc.get("ports", []):
                    host_ip = str(p).split(":")[0] if str(p).count(":") == 2 else None
                    expect = want_ui if name in ("jaeger", "prometheus", "grafana") else want
                    assert host_ip == expect, f"{name} publishes {p!r} with {env}: expected it bound to {expect}"
