"""More than one host: the collector, each component with its tap, and two load generators each in their own
network namespace, joined by veth pairs to a bridge (their own addresses on 10.213.0.0/24; where the kernel
has netem, 1 ms of delay on every host's link, so a round trip between two hosts takes about 2 ms). Every span crosses
the network to the collector; every observer estimates its clock offset to the collector across it
(`--clock-sync`); the two load generators split one Poisson plan from one shared start set by the
coordinator (`deltatap load --coordinate` / `--coordinator`). The namespaces are always deleted.

Needs root and iproute2 (`ip netns`); skipped otherwise. Not timing-sensitive: the checks are on structure
(every request joined once, each host its share of one plan, each clock estimate within its own bound).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from deltatap.loadgen.arrivals import schedule_offsets_ns
from obs_support import DELTATAP, ROOT, Proc

pytestmark = pytest.mark.observability

SUBNET = "10.213.0"
HOSTS = {"obs": 1, "engine": 2, "firewall": 3, "gateway": 4, "load1": 5, "load2": 6}
RATE, REQUESTS, SEED = 8.0, 24, 7


def sh(*cmd: str) -> None:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {r.stderr.strip()}")


class Hosts:
    """Network namespaces on one bridge (in a hub namespace), created and always deleted."""

    def __init__(self) -> None:
        self.tag = f"dt{os.getpid() % 10000}"
        self.hub = f"{self.tag}-hub"
        self.names: list[str] = []
        self.delay_ns: int | None = None if shutil.which("tc") else 0  # one-way delay added on each host's link

    def ns(self, host: str) -> str:
        return f"{self.tag}-{host}"

    def ip(self, host: str) -> str:
        return f"{SUBNET}.{HOSTS[host]}"

    def create(self) -> None:
        sh("ip", "netns", "add", self.hub)
        self.names.append(self.hub)
        sh("ip", "-n", self.hub, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", self.hub, "link", "set", "br0", "up")
        for host, n in HOSTS.items():
            ns, a, b = self.ns(host), f"{self.tag}{n}a", f"{self.tag}{n}b"
            sh("ip", "netns", "add", ns)
            self.names.append(ns)
            sh("ip", "link", "add", a, "type", "veth", "peer", "name", b)
            sh("ip", "link", "set", a, "netns", ns)
            sh("ip", "link", "set", b, "netns", self.hub)
            sh("ip", "-n", self.hub, "link", "set", b, "master", "br0", "up")
            sh("ip", "-n", ns, "addr", "add", f"{self.ip(host)}/24", "dev", a)
            sh("ip", "-n", ns, "link", "set", a, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            if self.delay_ns is None or self.delay_ns:  # netem where the kernel has it (sch_netem), else none
                try:
                    sh("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", a, "root", "netem", "delay", "1ms")
                    self.delay_ns = 1_000_000
                except RuntimeError:
                    self.delay_ns = 0

    def delete(self) -> None:
        for ns in reversed(self.names):
            subprocess.run(["ip", "netns", "delete", ns], capture_output=True, timeout=30)  # its veth ends go with it
        self.names = []

    def run(self, host: str, name: str, args: list[str], log: Path) -> Proc:
        return Proc(name, ["ip", "netns", "exec", self.ns(host), *DELTATAP, *args], log)

    def wait(self, host: str, urls: list[str], timeout_s: float = 60.0) -> None:
        """Until every URL answers from inside ``host``'s namespace (bounded)."""
        code = ("import sys, time, urllib.request\n"
                f"deadline = time.monotonic() + {timeout_s}\n"
                "for u in sys.argv[1:]:\n"
                "    while True:\n"
                "        try:\n"
                "            urllib.request.urlopen(u, timeout=2).read(); break\n"
                "        except Exception as e:\n"
                "            if time.monotonic() > deadline: sys.exit(f'{u}: {e}')\n"
                "            time.sleep(0.2)\n")
        r = subprocess.run(["ip", "netns", "exec", self.ns(host), DELTATAP[0], "-c", code, *urls],
                           capture_output=True, text=True, timeout=timeout_s + 30)
        assert r.returncode == 0, r.stderr


@pytest.fixture
def hosts():
    if os.geteuid() != 0 or not shutil.which("ip"):
        pytest.skip("network namespaces need root and iproute2 (ip netns)")
    h = Hosts()
    try:
        h.create()
    except RuntimeError as exc:
        h.delete()
        pytest.skip(f"cannot create network namespaces here: {exc}")
    try:
        yield h
    finally:
        h.delete()


def read_jsonl(p: Path) -> list[dict]:
    return [json.loads(x) for x in p.read_text().splitlines() if x.strip()]


def test_taps_components_collector_and_two_load_generators_on_six_hosts(hosts: Hosts, tmp_path: Path) -> None:
    ip = hosts.ip
    otlp, clock = f"grpc://{ip('obs')}:4317", f"http://{ip('obs')}:4318"
    demo = str(ROOT / "configs" / "demo.yaml")
    procs: list[Proc] = []

    def start(host: str, name: str, args: list[str]) -> Proc:
        p = hosts.run(host, name, args, tmp_path / f"{name}.log")
        procs.append(p)
        return p

    def tap(host: str, link: str, port: int, upstream: str) -> None:
        start(host, f"tap-{link}", ["tap", "--config", demo, "--link", link, "--listen", f"{ip(host)}:{port}",
                                    "--admin", f"{ip(host)}:{port + 1000}", "--upstream", upstream, "--otlp", otlp, "--clock-sync", clock])

    try:
        collector = start("obs", "collector", ["collect", "--otlp-grpc", f"{ip('obs')}:4317", "--otlp-http", f"{ip('obs')}:4318",
                                               "--metrics", "none", "--topology", demo, "--out", str(tmp_path / "collector"),
                                               "--rows-format", "jsonl", "--grace-s", "0.5"])
        hosts.wait("obs", [f"{clock}/metrics"])
        start("engine", "engine", ["stack", "engine", "--config", demo, "--listen", f"{ip('engine')}:8300", "--otlp", otlp])
        tap("engine", "fw-engine", 9300, f"http://{ip('engine')}:8300")
        start("firewall", "firewall", ["stack", "firewall", "--config", demo, "--listen", f"{ip('firewall')}:8200",
                                       "--upstream", f"http://{ip('engine')}:9300", "--otlp", otlp])
        tap("firewall", "gw-fw", 9200, f"http://{ip('firewall')}:8200")
        start("gateway", "gateway", ["stack", "gateway", "--config", demo, "--listen", f"{ip('gateway')}:8100",
                                     "--upstream", f"http://{ip('firewall')}:9200", "--otlp", otlp])
        tap("gateway", "edge", 9100, f"http://{ip('gateway')}:8100")
        # from a load generator's host, across the network: every component, then every tap in front of it
        hosts.wait("load1", [f"http://{ip('engine')}:8300/health", f"http://{ip('firewall')}:8200/health",
                             f"http://{ip('gateway')}:8100/health", f"http://{ip('engine')}:10300/healthz",
                             f"http://{ip('firewall')}:10200/healthz", f"http://{ip('gateway')}:10100/healthz"])

        workload = tmp_path / "short.yaml"  # a few tokens each: well inside the demo gateway's 1 s timeout
        workload.write_text(json.dumps({"workload": "synthetic-uniform", "params": {"input": {"dist": "uniform", "min": 16, "max": 32},
                                                                                   "output": {"dist": "uniform", "min": 4, "max": 8}}}))
        load = ["load", "--target", f"http://{ip('gateway')}:9100", "--model", "deltatap-ref", "--workload", str(workload), "--rate", str(RATE), "--requests", str(REQUESTS), "--seed", str(SEED),
                "--otlp", otlp, "--clock-sync", clock, "--no-progress", "--no-gpu", "--request-timeout", "30"]
        coord = f"{ip('load1')}:7070"
        l1 = start("load1", "load1", [*load, "--out", str(tmp_path / "load1"), "--coordinate", coord, "--hosts", "2"])
        hosts.wait("load2", [f"http://{coord}/v1/clock"])
        l2 = start("load2", "load2", [*load, "--out", str(tmp_path / "load2"), "--coordinator", f"http://{coord}"])
        for p in (l1, l2):
            p.p.wait(120)
            assert p.p.returncode == 0, p.tail()
        time.sleep(2.0)  # the last spans through batching and the collector's grace
        assert collector.stop() == 0, collector.tail()
    finally:
        for p in reversed(procs):
            p.stop()

    # the two load generators: one plan, split, from one shared start
    runs = [json.loads((tmp_path / d / "run.json").read_text()) for d in ("load1", "load2")]
    recs = [read_jsonl(tmp_path / d / "records.jsonl") for d in ("load1", "load2")]
    assert [r["hosts"]["index"] for r in runs] == [0, 1] and {r["hosts"]["hosts"] for r in runs} == {2}
    start_ns = runs[0]["hosts"]["start_unix_ns"]
    assert runs[1]["hosts"]["start_unix_ns"] == start_ns
    assert sorted(x["index"] for x in recs[0]) == list(range(0, REQUESTS, 2))
    assert sorted(x["index"] for x in recs[1]) == list(range(1, REQUESTS, 2))
    offsets = schedule_offsets_ns("poisson", RATE, REQUESTS, SEED)
    for run, host_recs in zip(runs, recs, strict=True):
        bound = abs(run["hosts"]["clock_offset_ns"]) + run["hosts"]["clock_uncertainty_ns"] + 1_000_000
        for x in host_recs:  # each planned send is the single-host schedule's, from the shared start
            assert abs(x["planned_send_unix_ns"] - (start_ns + int(offsets[x["index"]]))) <= bound, (x["index"], bound)
            assert x["status"] in ("ok", "refused"), x  # the demo firewall refuses prompts with its keywords
    # the second host's offset to the coordinator was estimated across the network (its round trip crosses two links)
    assert runs[1]["hosts"]["clock_uncertainty_ns"] >= max(1, hosts.delay_ns or 0), runs[1]["hosts"]

    # the clocks: every observer estimated its offset to the collector across the network; all six share
    # one kernel clock, so a correct estimate is within its own uncertainty of zero
    for run in runs:
        sync = run["clock"]["sync"]
        assert sync["rtt_ns"] >= 2 * (hosts.delay_ns or 0) and sync["rtt_ns"] > 0, sync
        assert abs(sync["offset_ns"]) <= sync["uncertainty_ns"], sync

    # the collector: every request once, joined by trace id across six hosts, with cross-host error bounds
    rows = read_jsonl(tmp_path / "collector" / "rows.jsonl")
    measured = {x["trace_id"] for r in recs for x in r}
    rows = [r for r in rows if r["trace_id"] in measured]
    assert len(rows) == REQUESTS, len(rows)
    assert all(r["join_method"] == "trace_id" for r in rows)
    assert sum(r["outcome"] == "ok" for r in rows) >= REQUESTS // 2, [r["outcome"] for r in rows]
    for r in rows:
        observers = {v.split("/")[0] for k, v in r.items() if k.startswith("pt.") and k.endswith(".src") and v}
        # the client and the taps it crossed, each on its own host (a refused request stops at the firewall)
        assert len(observers) >= (4 if r["outcome"] == "ok" else 3), observers
        # each tap's and the client's points carry the uncertainty of their offset estimate across the network ...
        synced = [k[: -len(".src")] for k, v in r.items() if k.startswith("pt.") and k.endswith(".src") and v and v.startswith(("tap:", "client:"))]
        assert synced and all(r[f"{k}.unc_ns"] > 0 for k in synced), [(k, r[f"{k}.unc_ns"]) for k in synced]
        # ... and a delta between two hosts' points carries it as its error bound
        cross = [k[: -len(".within")] for k, v in r.items() if k.startswith("d.") and k.endswith(".within") and v is False]
        assert any(r[f"{k}.err_ns"] > 0 for k in cross), cross
