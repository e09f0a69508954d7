"""What one tap needs to run: :class:`TapOptions`, built from flags or from a topology file."""

from __future__ import annotations

from dataclasses import dataclass, field

from yarl import URL

from deltatap.core.config import ConfigError
from deltatap.core.redact import parse_keep
from deltatap.core.topology import Topology, parse_hostport
from deltatap.core.vocab import (DEFAULT_COMPONENTS, DEFAULT_CORRELATION_HEADER, DEFAULT_TAP_PROTOCOL, TAP_PROTOCOLS, ComponentKind,
                                 default_link)

_DEFAULT_KINDS = {name: kind for name, kind in DEFAULT_COMPONENTS}
# --protocol / links[].tap.protocol: deltatap.core.vocab.TAP_PROTOCOLS (what the tap expects from its clients).
# Streams are observed by content type either way (deltatap.proxy.h2relay.observer_for: application/grpc by
# deltatap.proxy.grpc.GrpcObserver).
PROTOCOLS = TAP_PROTOCOLS


@dataclass
class TapOptions:
    """One tap on one link. ``listen_port=0`` / ``admin_port=0`` pick free ports; ``admin_port=None``
    runs no admin server."""

    link: str
    upstream: str  # http(s)://host[:port][/prefix]
    listen_host: str = "127.0.0.1"
    listen_port: int = 0
    admin_host: str = "127.0.0.1"
    admin_port: int | None = 0
    downstream: str = ""  # component names; default from the default topology's link of that name
    upstream_name: str = ""
    downstream_kind: str = ""
    upstream_kind: str = ""
    host_header: str | None = None  # rewrite Host (default: preserve the client's)
    timeout_s: float | None = None  # the tap's own upstream timeout (none by default)
    verify_tls: bool = True
    correlation_header: str = DEFAULT_CORRELATION_HEADER
    clock_sync: str | None = None  # collector base URL answering GET /v1/clock
    clock_resync_s: float = 60.0
    fingerprint_key: str | None = None  # default: $DELTATAP_FINGERPRINT_KEY, then the documented default
    grace_s: float = 10.0  # SIGTERM: how long streams in flight may finish
    max_capture_bytes: int = 1 << 20  # bodies up to this size are parsed (model, usage); larger ones only hashed/counted
    labels: dict[str, str] = field(default_factory=dict)  # extra span attributes deltatap.label.<k>
    # False (default): every request gets a span, whatever the incoming traceparent's sampled flag says (a
    # gateway that marks traces unsampled must not blind the instrument). True: parent-based sampling.
    respect_sampling: bool = False
    header_timeout_s: float = 30.0  # a connection that has not sent a whole request head this long (idle included) is closed
    max_connections: int = 4096  # downstream connections open at once; more are closed at accept (counted)
    query_keep: frozenset[str] = frozenset()  # url.query keys whose values stay as sent (the others are hashed)
    tls_cert: str | None = None  # PEM certificate (chain): the tap speaks TLS toward its downstream (deltatap.proxy.tls)
    tls_key: str | None = None  # its PEM private key
    protocol: str = DEFAULT_TAP_PROTOCOL  # http: HTTP/1.1, and HTTP/2 where a client speaks it; grpc: HTTP/2 only (PROTOCOLS)

    def __post_init__(self) -> None:
        self.upstream_url = check_upstream(self.upstream)
        link = default_link(self.link)
        self.downstream = self.downstream or (link.downstream if link else "downstream")
        self.upstream_name = self.upstream_name or (link.upstream if link else "upstream")
        self.downstream_kind = str(self.downstream_kind or _guess_kind(self.downstream, ComponentKind.PROXY))
        self.upstream_kind = str(self.upstream_kind or _guess_kind(self.upstream_name, ComponentKind.PROXY))
        for name, kind in (("--downstream-kind", self.downstream_kind), ("--upstream-kind", self.upstream_kind)):
            if kind not in ComponentKind.__members__.values():
                raise ConfigError(f"{name}: {kind!r} is not a component kind; use one of {[k.value for k in ComponentKind]}")
        if not self.correlation_header or any(c in self.correlation_header for c in " :\r\n"):
            raise ConfigError(f"--correlation-header: {self.correlation_header!r} is not a header name")
        if self.timeout_s is not None and self.timeout_s <= 0:
            raise ConfigError(f"--timeout-s: must be > 0 (got {self.timeout_s}); leave it out for no tap timeout")
        if self.protocol not in PROTOCOLS:
            raise ConfigError(f"--protocol: {self.protocol!r} is not one of {', '.join(PROTOCOLS)}")
        if self.header_timeout_s <= 0:
            raise ConfigError(f"--header-timeout-s: must be > 0 (got {self.header_timeout_s})")
        if self.max_connections < 1:
            raise ConfigError(f"--max-connections: must be >= 1 (got {self.max_connections})")
        if self.grace_s < 0:
            raise ConfigError(f"--grace-s: must be >= 0 (got {self.grace_s})")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigError("--tls-cert and --tls-key go together: give both (the certificate and its key) or neither")
        if self.tls_cert is not None:
            from deltatap.proxy.tls import server_context

            server_context(self.tls_cert, self.tls_key or "")  # (every problem with the files: one line, now)
        try:
            self.query_keep = parse_keep([self.query_keep] if isinstance(self.query_keep, str) else self.query_keep)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None


def _guess_kind(name: str, fallback: ComponentKind) -> ComponentKind:
    if name in _DEFAULT_KINDS:
        return _DEFAULT_KINDS[name]
    try:
        return ComponentKind(name)
    except ValueError:
        return fallback


def check_upstream(value: str, what: str = "--upstream") -> URL:
    try:
        url = URL(value)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{what}: {value!r} is not a URL ({exc})") from None
    if url.scheme not in ("http", "https") or not url.host:
        raise ConfigError(f"{what}: {value!r} must be an http:// or https:// URL with a host, e.g. http://127.0.0.1:8300")
    if url.query_string or url.fragment:
        raise ConfigError(f"{what}: {value!r} must not carry a query or fragment")
    return url


def split_listen(value: str, what: str) -> tuple[str, int]:
    try:
        return parse_hostport(value, what)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def require_http_tap(topology: Topology | None, link_name: str, what: str = "the reference stack") -> None:
    """``what`` relays HTTP between its components (the reference gateway, firewall and engine speak HTTP, not gRPC):
    a topology that asks for a gRPC tap on one of its links gets one line saying so, before anything starts."""
    link = next((x for x in topology.links if x.name == link_name), None) if topology is not None else None
    if link is not None and link.tap is not None and link.tap.protocol != "http":
        raise ConfigError(
            f"topology {topology.name!r}, links[{link_name}].tap.protocol is {link.tap.protocol!r}, but {what} speaks HTTP "
            f"between its components; drop the protocol there, or run `deltatap tap --config FILE --link {link_name}` in front "
            f"of a gRPC server"
        )


def options_from_topology(topology: Topology, link_name: str, **overrides) -> TapOptions:
    """TapOptions for ``link_name`` of ``topology``; keyword overrides win (None values ignored)."""
    link = topology.link(link_name)
    tap = link.tap
    upstream = overrides.pop("upstream", None) or topology.upstream_url(link_name)
    if not upstream:
        raise ConfigError(
            f"topology {topology.name!r}, link {link_name!r}: no upstream URL; set links[].tap.upstream "
            f"or components[{link.upstream}].url, or pass --upstream"
        )
    kw: dict = {
        "link": link.name,
        "upstream": upstream,
        "downstream": link.downstream,
        "upstream_name": link.upstream,
        "downstream_kind": topology.component(link.downstream).kind.value,
        "upstream_kind": topology.component(link.upstream).kind.value,
        "correlation_header": topology.correlation_header,
    }
    if tap is not None:
        kw["listen_host"], kw["listen_port"] = split_listen(tap.listen, f"links[{link.name}].tap.listen")
        if tap.admin:
            kw["admin_host"], kw["admin_port"] = split_listen(tap.admin, f"links[{link.name}].tap.admin")
        elif kw["listen_port"]:
            kw["admin_host"], kw["admin_port"] = kw["listen_host"], kw["listen_port"] + 1000
        kw["host_header"] = tap.host_header
        kw["timeout_s"] = tap.timeout_s
        kw["verify_tls"] = tap.verify_tls
        kw["tls_cert"] = tap.tls_cert
        kw["tls_key"] = tap.tls_key
        kw["protocol"] = tap.protocol
    kw.update({k: v for k, v in overrides.items() if v is not None})
    return TapOptions(**kw)
