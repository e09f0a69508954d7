"""Start a real third-party stack on loopback with deltatap taps on every link (issue 7).

    .venv/bin/python realstack/launch.py configs/realstack-envoy-litellm.yaml [--no-taps] [--out runs/realstack]

Which software runs is read from the topology: each component's *name* is a part of
``realstack/parts.py`` (``envoy``, ``nginx``, ``haproxy``, ``litellm``, ``ref-firewall``,
``llama-server``, ``ref-engine``), its ``url`` is where the part listens, its ``timeout_s`` its
declared upstream timeout (Envoy's route timeout, nginx's ``proxy_read_timeout``), and each link's
``tap`` where deltatap's tap listens. Parts start from the engine outwards; a component forwards to
the tap on its upstream link (or straight to its upstream component with ``--no-taps``). With
``--collector`` (the default for the command line) ``deltatap collect`` runs too and every tap,
Envoy and LiteLLM export OTLP/gRPC to it; its report lands in ``--out``.

The tests (tests/realstack) use :class:`RealStack` with :func:`with_free_ports` and an in-process
collector.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import yaml  # noqa: E402 - deltatap's venv has it

from parts import ROOT, STARTERS, Ctx, Tools, needs, new_api_key  # noqa: E402
from procs import Proc, StartError, free_port, http_ok, tcp_open  # noqa: E402

from deltatap.core.config import ConfigError  # noqa: E402
from deltatap.core.topology import Topology, load_topology, parse_hostport  # noqa: E402


def parts_of(topology: Topology) -> list[str]:
    """The parts a topology runs (every component except the client), with a clear error for unknown ones."""
    names = [c.name for c in topology.components[1:]]
    unknown = [n for n in names if n not in STARTERS]
    if unknown:
        raise ConfigError(f"topology {topology.name!r}: components {unknown} are not real-stack parts (a component's name "
                          f"is the part to start); known: {sorted(STARTERS)}")
    return names


def missing_tools(topology: Topology, tools: Tools | None = None) -> list[str]:
    tools = tools or Tools.discover()
    return tools.missing([n for part in parts_of(topology) for n in needs(part)])


def with_free_ports(topology: Topology) -> Topology:
    """The same topology with every component URL, tap listen and admin address on a free port."""
    data = topology.model_dump(mode="json", exclude_none=True)
    for comp in data["components"][1:]:
        comp["url"] = f"http://127.0.0.1:{free_port()}"
    for link in data["links"]:
        if link.get("tap"):
            link["tap"]["listen"] = f"127.0.0.1:{free_port()}"
            link["tap"]["admin"] = f"127.0.0.1:{free_port()}"
    return Topology.model_validate(data)


class RealStack:
    """The running parts and taps of one topology; ``stop()`` ends them all."""

    def __init__(self, topology: Topology, config_path: Path, run_dir: Path, *, taps: bool = True,
                 otlp_grpc: str | None = None, tools: Tools | None = None, api_key: str | None = None,
                 reuse: frozenset[str] = frozenset()) -> None:
        unknown = set(reuse) - {c.name for c in topology.components[1:]}
        if unknown:
            raise ConfigError(f"topology {topology.name!r}: reuse names {sorted(unknown)} that are not its components")
        self.topology = topology
        self.reuse = frozenset(reuse)  # components already running at their topology URL (e.g. another RealStack's)
        self.config_path = Path(config_path)
        self.run_dir = Path(run_dir)
        self.taps = taps
        self.otlp_grpc = otlp_grpc  # HOST:PORT
        self.tools = tools or Tools.discover()
        self.api_key = api_key or new_api_key()
        self.procs: list[Proc] = []
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.topology_path = self.run_dir / "topology.yaml"
        self.topology_path.write_text(yaml.safe_dump(topology.model_dump(mode="json", exclude_none=True), sort_keys=False))

    # ---- addresses ---------------------------------------------------------------------------
    def _tapped(self, i: int) -> bool:
        link = self.topology.links[i]
        return self.taps and link.tap is not None

    def address_of_link(self, i: int) -> str:
        """Where the downstream side of link ``i`` sends its requests (the tap, or the component)."""
        link = self.topology.links[i]
        if self._tapped(i):
            return f"http://{link.tap.listen}"
        return self.topology.component(link.upstream).url

    @property
    def entry_url(self) -> str:
        return self.address_of_link(0)

    def url(self, component: str) -> str:
        return self.topology.component(component).url

    # ---- lifecycle ---------------------------------------------------------------------------
    def start(self) -> RealStack:
        missing = missing_tools(self.topology, self.tools)
        if missing:
            raise StartError("not installed (run .ci/realstack): " + "; ".join(missing))
        comps = self.topology.components
        try:
            for i in range(len(comps) - 1, 0, -1):
                comp = comps[i]
                host, port = parse_hostport(comp.url.removeprefix("http://").rstrip("/"), f"{comp.name}.url")
                upstream = self.address_of_link(i) if i < len(comps) - 1 else None
                ctx = Ctx(name=comp.name, listen_host=host, listen_port=port, upstream=upstream, timeout_s=comp.timeout_s,
                          config_path=self.config_path, run_dir=self.run_dir, tools=self.tools, otlp_grpc=self.otlp_grpc,
                          api_key=self.api_key)
                if comp.name not in self.reuse:
                    self.procs.append(STARTERS[comp.name](ctx))
                if self._tapped(i - 1):
                    self.procs.append(self._start_tap(i - 1))
        except BaseException:
            self.stop()
            raise
        return self

    def _start_tap(self, i: int) -> Proc:
        link = self.topology.links[i]
        argv = [sys.executable, "-m", "deltatap.app.cli", "tap", "--link", link.name, "--config", self.topology_path,
                "--otlp", f"grpc://{self.otlp_grpc}" if self.otlp_grpc else "none", "--grace-s", "2"]
        p = Proc(f"tap-{link.name}", argv, self.run_dir / f"tap-{link.name}.log", cwd=ROOT)
        host, port = parse_hostport(link.tap.listen)
        if link.tap.admin:
            ahost, aport = parse_hostport(link.tap.admin)
            p.wait_ready(http_ok(f"http://{ahost}:{aport}/healthz"), 30, "admin /healthz 200")
        else:
            p.wait_ready(tcp_open(host, port), 30, "listening")
        return p

    def stop(self) -> None:
        for p in reversed(self.procs):  # outermost first: taps and gateways before the engine
            p.stop()
        self.procs.clear()

    def __enter__(self) -> RealStack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _collector(args: argparse.Namespace, run_dir: Path) -> Proc:
    argv = [sys.executable, "-m", "deltatap.app.cli", "collect", "--otlp-grpc", args.otlp_grpc, "--otlp-http", args.otlp_http,
            "--metrics", "none", "--topology", args.config, "--out", run_dir / "collector", "--rows-format", "jsonl"]
    p = Proc("collector", argv, run_dir / "collector.log", cwd=ROOT)
    host, port = parse_hostport(args.otlp_grpc)
    p.wait_ready(tcp_open(host, port), 30, "OTLP/gRPC listening")
    return p


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config", help="topology YAML, e.g. configs/realstack-envoy-litellm.yaml")
    ap.add_argument("--out", default="runs/realstack", help="run directory: logs, rendered configs, collector output")
    ap.add_argument("--no-taps", action="store_true", help="start the parts chained directly, without deltatap taps")
    ap.add_argument("--no-collector", action="store_true", help="do not start deltatap collect (spans go nowhere)")
    ap.add_argument("--otlp-grpc", default="127.0.0.1:4317", help="collector OTLP/gRPC address (default 127.0.0.1:4317)")
    ap.add_argument("--otlp-http", default="127.0.0.1:4318", help="collector OTLP/HTTP address (default 127.0.0.1:4318)")
    args = ap.parse_args(argv)
    try:
        topology = load_topology(args.config)
        parts_of(topology)
    except ConfigError as exc:
        print(f"realstack: {exc}", file=sys.stderr)
        return 2
    run_dir = Path(args.out) / topology.name
    collector = None if args.no_collector else _collector(args, run_dir)
    stack = RealStack(topology, Path(args.config), run_dir, taps=not args.no_taps,
                      otlp_grpc=None if args.no_collector else args.otlp_grpc)
    stopping = False

    def _stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        stack.start()
        print(f"real stack {topology.name!r} up; send requests to {stack.entry_url}/v1/chat/completions")
        if any(c.name == "litellm" for c in topology.components):
            print(f"  LiteLLM key: Authorization: Bearer {stack.api_key}")
        print(f"  model name: gemma; logs and rendered configs in {run_dir}; Ctrl-C stops everything")
        while not stopping and all(p.alive() for p in stack.procs):
            time.sleep(0.5)
        dead = [p for p in stack.procs if not p.alive()]
        for p in dead:
            print(f"{p.name} exited ({p.popen.returncode}); log {p.log_path}:\n{p.tail()}", file=sys.stderr)
        return 1 if dead else 0
    except StartError as exc:
        print(f"realstack: {exc}", file=sys.stderr)
        return 1
    finally:
        stack.stop()
        if collector is not None:
            collector.stop(timeout_s=20)
            print(f"collector report: {run_dir / 'collector'} (decomposition.md, summary.md, rows.jsonl)")


if __name__ == "__main__":
    sys.exit(main())
