"""The Kubernetes example manifests (deploy/k8s/) hold together without a cluster: every document is a known
kind with the fields it needs, every deltatap container's arguments pass deltatap's own parser and checks,
every port a command listens on is a declared container port, every Service selects a workload and targets
a port it declares, every in-cluster URL names a Service port, and the OpenTelemetry Collector's shard list
is the collectors' StatefulSet. Not marked: it needs no binary and runs in the fast suite."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlparse

import yaml

from deploy.commands import check_command
from deltatap.core.topology import parse_hostport

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
SCALEOUT = ROOT / "deploy" / "otelcol" / "scaleout.yaml"
WORKLOADS = {"Deployment", "StatefulSet"}
KINDS = WORKLOADS | {"Service", "ConfigMap"}


def documents() -> list[tuple[str, dict]]:
    docs = []
    for f in sorted(K8S.glob("*.yaml")):
        for d in yaml.safe_load_all(f.read_text()):
            if d is not None:
                docs.append((f.name, d))
    return docs


def pod_containers(doc: dict) -> list[dict]:
    return doc["spec"]["template"]["spec"]["containers"]


def listen_ports(args) -> list[int]:
    """The ports a deltatap command binds (its HOST:PORT options that are not 'none')."""
    ports = []
    for flag in ("listen", "admin", "otlp_grpc", "otlp_http", "metrics"):
        v = getattr(args, flag, None)
        if isinstance(v, str) and v.lower() not in ("none", "off", ""):
            ports.append(parse_hostport(v, flag)[1])
    return ports


def test_manifests_are_known_kinds_with_names_and_unique() -> None:
    docs = documents()
    assert {f for f, _ in docs} == {"collectors.yaml", "otelcol.yaml", "stack.yaml"}
    seen = set()
    for f, d in docs:
        assert d.get("kind") in KINDS, (f, d.get("kind"))
        assert d.get("apiVersion") == ("apps/v1" if d["kind"] in WORKLOADS else "v1"), (f, d["kind"])
        key = (d["kind"], d["metadata"]["name"])
        assert key not in seen, key
        seen.add(key)
        if d["kind"] in WORKLOADS:
            sel = d["spec"]["selector"]["matchLabels"]
            labels = d["spec"]["template"]["metadata"]["labels"]
            assert sel.items() <= labels.items(), (f, sel, labels)


def test_deltatap_containers_pass_the_cli_and_declare_what_they_listen_on() -> None:
    n = 0
    for f, d in documents():
        if d["kind"] not in WORKLOADS:
            continue
        for c in pod_containers(d):
            if not c["image"].startswith("deltatap:"):
                continue
            n += 1
            args = check_command([str(a) for a in c["args"]])  # deltatap's parser and each command's own checks
            declared = {p["containerPort"] for p in c.get("ports", [])}
            assert set(listen_ports(args)) <= declared, (f, c["name"], listen_ports(args), declared)
            for p in c.get("ports", []):
                assert len(p["name"]) <= 15, p  # a Kubernetes port name (IANA_SVC_NAME)
            probe = c.get("readinessProbe", {}).get("httpGet")
            if probe:
                assert probe["port"] in {p["name"] for p in c["ports"]}, (f, c["name"], probe)
    assert n == 8  # 3 shards' template, the joiner, and three components with their tap sidecars = 1 + 1 + 6


def test_services_select_workloads_and_every_url_names_a_service_port() -> None:
    docs = documents()
    workloads = [d for _, d in docs if d["kind"] in WORKLOADS]
    services = {d["metadata"]["name"]: d for _, d in docs if d["kind"] == "Service"}
    for name, svc in services.items():
        selected = [w for w in workloads if svc["spec"]["selector"].items() <= w["spec"]["template"]["metadata"]["labels"].items()]
        assert len(selected) == 1, (name, [w["metadata"]["name"] for w in selected])
        declared = {p["name"]: p["containerPort"] for c in pod_containers(selected[0]) for p in c.get("ports", [])}
        for p in svc["spec"]["ports"]:
            assert p["targetPort"] in declared, (name, p)
            assert p["port"] == declared[p["targetPort"]], (name, p)  # the same number inside and out
    ports = {name: {p["port"] for p in s["spec"]["ports"]} for name, s in services.items()}
    for _, d in docs:
        if d["kind"] not in WORKLOADS:
            continue
        pod_ports = {p["containerPort"] for c in pod_containers(d) for p in c.get("ports", [])}
        for c in pod_containers(d):
            for a in map(str, c.get("args", [])):
                if "://" not in a:
                    continue
                u = urlparse(a)
                host = u.hostname or ""
                if host == "127.0.0.1":  # a sidecar's neighbour in the same pod
                    assert u.port in pod_ports, (d["metadata"]["name"], a)
                    continue
                svc = host.split(".")[-1] if host.count(".") == 1 else host  # pod-N.service -> service
                assert svc in ports and u.port in ports[svc], (d["metadata"]["name"], a)


def test_the_otel_collector_routes_to_the_collector_statefulset() -> None:
    docs = dict(((d["kind"], d["metadata"]["name"]), d) for _, d in documents())
    shards = docs[("StatefulSet", "deltatap-collector")]
    otelcol = docs[("Deployment", "otelcol")]
    (c,) = pod_containers(otelcol)
    env = {e["name"]: e["value"] for e in c["env"]}
    # every variable the Deployment sets is one the config reads, and the config reads nothing unset without a default
    used = dict(re.findall(r"\$\{env:([A-Z_]+)(:-[^}]*)?\}", SCALEOUT.read_text()))
    assert set(env) <= set(used), set(env) - set(used)
    assert all(v or k in env for k, v in used.items() if k != "OTELCOL_RETRY_S"), used
    hosts = yaml.safe_load(env["DELTATAP_SHARDS"])
    service = shards["spec"]["serviceName"]
    assert hosts == [f"{shards['metadata']['name']}-{i}.{service}:4317" for i in range(shards["spec"]["replicas"])]
    # the shards hand partial requests to the joiner's Service
    (collect,) = pod_containers(shards)
    args = check_command([str(a) for a in collect["args"]])
    assert urlparse(args.handoff).hostname == "deltatap-joiner"
    # the OTel Collector's config is mounted where its --config points
    mount = c["volumeMounts"][0]["mountPath"]
    assert c["args"] == ["--config", f"{mount}/scaleout.yaml"]


def test_the_scaleout_docs_commands_pass_the_cli() -> None:
    """Every `.venv/bin/deltatap ...` line of docs/scaleout.md is a valid command (placeholders are hosts)."""
    from deploy.test_docs import _commands

    doc = ROOT / "docs" / "scaleout.md"
    text = doc.read_text()
    for name in ("GATEWAY", "COORDINATOR", "COLLECTOR"):
        text = text.replace(name, "127.0.0.1")

    class Text:  # what _commands reads from a path
        def read_text(self, encoding: str = "utf-8") -> str:
            return text

    cmds = [w for w in _commands(Text()) if w and w[0].endswith("deltatap")]  # type: ignore[arg-type]
    assert len(cmds) >= 7, cmds
    from deploy.commands import parse

    for words in cmds:
        assert words[0] == ".venv/bin/deltatap", words
        if words[1] == "report":  # tests/deploy/commands.py checks the serving commands; report: the parser
            parse(words[1:])
        else:
            check_command(words[1:])
