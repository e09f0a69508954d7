"""The link/component model (DESIGN section 1) as a strict config model.

A topology is an ordered chain of components, client first and engine last, and the links
between neighbours, each optionally tapped. The default (client -> gateway -> firewall -> engine
on links edge, gw-fw, fw-engine) needs no file. YAML form::

    name: demo
    components:
      - {name: client, kind: client, timeout_s: 30}
      - {name: gateway, kind: gateway, url: "http://127.0.0.1:8100", timeout_s: 10}
      - {name: firewall, kind: firewall, url: "http://127.0.0.1:8200", timeout_s: 15}
      - {name: engine, kind: engine, url: "http://127.0.0.1:8300", timeout_s: 30}
    links:
      - {name: edge, downstream: client, upstream: gateway, tap: {listen: "127.0.0.1:9100"}}
      - {name: gw-fw, downstream: gateway, upstream: firewall, tap: {listen: "127.0.0.1:9200"}}
      - {name: fw-engine, downstream: firewall, upstream: engine, tap: {listen: "127.0.0.1:9300"}}
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ConfigDict, Field, field_validator, model_validator

from deltatap.core.config import ConfigError, StrictModel, load_yaml, read_yaml, validate
from deltatap.core.vocab import (DEFAULT_COMPONENTS, DEFAULT_CORRELATION_HEADER, DEFAULT_LINKS, DEFAULT_TAP_PROTOCOL, TAP_PROTOCOLS,
                                 ComponentKind)


def parse_hostport(value: str, what: str = "listen address") -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) -> (host, port), with a clear error."""
    if not isinstance(value, str) or ":" not in value:
        raise ValueError(f"{what} {value!r} must be HOST:PORT")
    host, _, port_s = value.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    try:
        port = int(port_s)
    except ValueError:
        raise ValueError(f"{what} {value!r}: port {port_s!r} is not a number") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"{what} {value!r}: port {port} out of range 0-65535")
    return host, port


class _Frozen(StrictModel):
    """A part of the topology: frozen once validated (everything built from a Topology may cache on it)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class ComponentSpec(_Frozen):
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$", description="component name; points are named <name>.<role>")
    kind: ComponentKind = Field(description="client (first), engine (last), or an intermediary: gateway, firewall, router, cache, proxy")
    url: str | None = Field(default=None, description="where the component itself listens (not its tap)")
    timeout_s: float | None = Field(default=None, gt=0, description="the component's timeout toward its upstream (or the client's total timeout)")
    retries: int = Field(default=0, ge=0, description="retries toward its upstream after a failure or timeout")
    cancel_on_disconnect: bool | None = Field(default=None, description="engine: stops generating when the client goes away")
    description: str = Field(default="", description="free text shown in reports")


class TapSpec(_Frozen):
    listen: str = Field(description="HOST:PORT the tap listens on; downstream points here")
    admin: str | None = Field(default=None, description="HOST:PORT for /metrics and /healthz (default: listen port + 1000)")
    upstream: str | None = Field(default=None, description="URL to forward to (default: the upstream component's url)")
    host_header: str | None = Field(default=None, description="rewrite Host to this value (default: preserve)")
    timeout_s: float | None = Field(default=None, gt=0, description="the tap's own upstream timeout; none by default")
    verify_tls: bool = Field(default=True, description="verify the upstream's TLS certificate (https upstreams)")
    tls_cert: str | None = Field(default=None, description="PEM certificate: the tap speaks TLS toward its downstream (with tls_key)")
    tls_key: str | None = Field(default=None, description="PEM private key of tls_cert")
    protocol: str = Field(default=DEFAULT_TAP_PROTOCOL, description="http: HTTP/1.1, and HTTP/2 where a client speaks it; "
                          "grpc: a gRPC tap, HTTP/2 only (one of " + ", ".join(TAP_PROTOCOLS) + ")")

    @field_validator("protocol")
    @classmethod
    def _protocol(cls, v: str) -> str:
        if v not in TAP_PROTOCOLS:
            raise ValueError(f"must be one of {', '.join(TAP_PROTOCOLS)}")
        return v

    @field_validator("listen", "admin")
    @classmethod
    def _hostport(cls, v: str | None) -> str | None:
        if v is not None:
            parse_hostport(v)
        return v


class LinkModel(_Frozen):
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$", description="link name, e.g. edge, gw-fw, fw-engine")
    downstream: str = Field(description="the component on the client side of the link")
    upstream: str = Field(description="the component on the server side of the link (its neighbour toward the engine)")
    tap: TapSpec | None = Field(default=None, description="where a tap sits on this link; absent: the link is not tapped")


class Topology(_Frozen):
    name: str = Field(default="default", description="topology name, shown in reports")
    description: str = Field(default="", description="free text shown in reports")
    correlation_header: str = Field(default=DEFAULT_CORRELATION_HEADER, description="header the taps propagate (created if absent) and the collector joins on")
    components: tuple[ComponentSpec, ...] = Field(description="the chain in order: client first, engine last")
    links: tuple[LinkModel, ...] = Field(description="links between neighbouring components, each optionally tapped")

    @field_validator("components", "links", mode="before")
    @classmethod
    def _listed(cls, v: object, info) -> object:
        if v is None:  # (a key with nothing under it: YAML's null)
            what = "the chain, client first, engine last" if info.field_name == "components" else \
                "one per pair of neighbouring components, {name, downstream, upstream}"
            raise ValueError(f"empty; list {what}")
        return v

    @model_validator(mode="after")
    def _check(self) -> Topology:
        names = [c.name for c in self.components]
        dupes = {n for n in names if names.count(n) > 1}
        if dupes:
            raise ValueError(f"components: duplicate names {sorted(dupes)}")
        if len(self.components) < 2:
            raise ValueError("components: need at least a client and an engine")
        if self.components[0].kind != ComponentKind.CLIENT:
            raise ValueError("components[0]: the chain must start with a component of kind 'client'")
        if self.components[-1].kind != ComponentKind.ENGINE:
            raise ValueError("components[-1]: the chain must end with a component of kind 'engine'")
        for i, c in enumerate(self.components[1:-1], start=1):
            if c.kind in (ComponentKind.CLIENT, ComponentKind.ENGINE):
                raise ValueError(f"components[{i}] ({c.name}): a {c.kind} may only be at the end of the chain")
        order = {n: i for i, n in enumerate(names)}
        link_names = [link.name for link in self.links]
        if len(set(link_names)) != len(link_names):
            raise ValueError("links: duplicate link names")
        for j, link in enumerate(self.links):
            for side in ("downstream", "upstream"):
                ref = getattr(link, side)
                if ref not in order:
                    raise ValueError(f"links[{j}] ({link.name}).{side}: unknown component {ref!r}; known: {names}")
            if order[link.upstream] != order[link.downstream] + 1:
                raise ValueError(
                    f"links[{j}] ({link.name}): {link.downstream} -> {link.upstream} are not neighbours in the chain {names}"
                )
        return self

    # ---- queries -------------------------------------------------------------------------
    def component(self, name: str) -> ComponentSpec:
        for c in self.components:
            if c.name == name:
                return c
        raise KeyError(name)

    def link(self, name: str) -> LinkModel:
        for link in self.links:
            if link.name == name:
                return link
        raise ConfigError(f"topology {self.name!r} has no link {name!r}; links: {[x.name for x in self.links]}")

    @property
    def client(self) -> ComponentSpec:
        return self.components[0]

    @property
    def engine(self) -> ComponentSpec:
        return self.components[-1]

    def upstream_url(self, link_name: str) -> str | None:
        link = self.link(link_name)
        if link.tap and link.tap.upstream:
            return link.tap.upstream
        return self.component(link.upstream).url


def default_topology() -> Topology:
    return Topology(
        name="default",
        components=[ComponentSpec(name=n, kind=k) for n, k in DEFAULT_COMPONENTS],
        links=[LinkModel(name=link.name, downstream=link.downstream, upstream=link.upstream) for link in DEFAULT_LINKS],
    )


def load_topology(path: str | Path | None) -> Topology:
    """The topology in ``path`` (a whole file, or the ``topology:`` section of a larger one)."""
    if path is None:
        return default_topology()
    data: Any = read_yaml(path)
    if isinstance(data, dict) and "topology" in data and "components" not in data:
        return load_yaml(path, Topology, section="topology")
    return validate(Topology, data, str(path))
