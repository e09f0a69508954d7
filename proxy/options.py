"""What one tap needs to run: :class:`TapOptions`, built from flags or from a topology file."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from pydantic import ValidationError
from yarl import URL

from deltatap.core.config import ConfigError
from deltatap.core.redact import parse_keep
from deltatap.core.topology import ComponentSpec, LinkModel, Topology, parse_hostport
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
        if self.clock_sync:
            check_upstream(self.clock_sync, "--clock-sync", "http://127.0.0.1:4318 (the collector's OTLP/HTTP port)")
        link = default_link(self.link)
        self.downstream = self.downstream or (link.downstream if link else "downstream")
        self.upstream_name = self.upstream_name or (link.upstream if link else "upstream")
        self.downstream_kind = str(self.downstream_kind or _guess_kind(self.downstream, ComponentKind.PROXY))
        self.upstream_kind = str(self.upstream_kind or _guess_kind(self.upstream_name, ComponentKind.PROXY))
        for name, kind in (("--downstream-kind", self.downstream_kind), ("--upstream-kind", self.upstream_kind)):
            if kind not in ComponentKind.__members__.values():
                raise ConfigError(f"{name}: {kind!r} is not a component kind; use one of {[k.value for k in ComponentKind]}")
        _check_names(self.link, self.downstream, self.upstream_name, self.downstream_kind, self.upstream_kind)
        if not _is_token(self.correlation_header):
            raise ConfigError(f"--correlation-header: {self.correlation_header!r} is not a header name (letters, digits and "
                              f"!#$%&'*+-.^_`|~, e.g. x-request-id)")
        if self.host_header is not None and (not self.host_header or any(c.isspace() or not c.isprintable() or c in "/?#@"
                                                                         for c in self.host_header)):
            raise ConfigError(f"--host-header: {self.host_header!r} is not a Host value (HOST or HOST:PORT, no spaces or "
                              f"line breaks)")
        if self.timeout_s is not None and not 0 < self.timeout_s < math.inf:
            raise ConfigError(f"--timeout-s: must be > 0 and finite (got {self.timeout_s}); leave it out for no tap timeout")
        if self.protocol not in PROTOCOLS:
            raise ConfigError(f"--protocol: {self.protocol!r} is not one of {', '.join(PROTOCOLS)}")
        if not 0 < self.header_timeout_s < math.inf:
            raise ConfigError(f"--header-timeout-s: must be > 0 and finite (got {self.header_timeout_s})")
        if self.max_connections < 1:
            raise ConfigError(f"--max-connections: must be >= 1 (got {self.max_connections})")
        if not 0 <= self.grace_s < math.inf:
            raise ConfigError(f"--grace-s: must be >= 0 and finite (got {self.grace_s})")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigError("--tls-cert and --tls-key go together: give both (the certificate and its key) or neither")
        if self.tls_cert is not None:
            from deltatap.proxy.tls import server_context

            server_context(self.tls_cert, self.tls_key or "")  # (every problem with the files: one line, now)
        try:
            self.query_keep = parse_keep([self.query_keep] if isinstance(self.query_keep, str) else self.query_keep)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None


_TCHAR = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


def _is_token(name: str) -> bool:
    """An HTTP field name (RFC 9110 token): what the tap may write as a header name."""
    return bool(name) and all(c in _TCHAR for c in name)


def _check_names(link: str, downstream: str, upstream: str, downstream_kind: str, upstream_kind: str) -> None:
    """The link and component names, by the topology's own rules (:class:`LinkModel`, :class:`ComponentSpec`): a tap run
    from flags names them as a topology file would."""
    for flag, make in (("--link", lambda: LinkModel(name=link, downstream=downstream, upstream=upstream)),
                       ("--downstream", lambda: ComponentSpec(name=downstream, kind=downstream_kind)),
                       ("--upstream-name", lambda: ComponentSpec(name=upstream, kind=upstream_kind))):
        try:
            make()
        except ValidationError:
            value = link if flag == "--link" else downstream if flag == "--downstream" else upstream
            raise ConfigError(f"{flag}: {value!r} is not a name: one or more letters, digits, '_', '.' or '-' (as in a topology "
                              f"file)") from None


def _guess_kind(name: str, fallback: ComponentKind) -> ComponentKind:
    if name in _DEFAULT_KINDS:
        return _DEFAULT_KINDS[name]
    try:
        return ComponentKind(name)
    except ValueError:
        return fallback


def check_upstream(value: str, what: str = "--upstream", example: str = "http://127.0.0.1:8300") -> URL:
    try:
        url = URL(value)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{what}: {value!r} is not a URL ({exc})") from None
    if url.scheme not in ("http", "https") or not url.host:
        raise ConfigError(f"{what}: {value!r} must be an http:// or https:// URL with a host, e.g. {example}")
    if url.query_string or url.fragment:
        raise ConfigError(f"{what}: {value!r} must not carry a query or fragment")
    if url.user is not None or url.password is not None:
        raise ConfigError(f"{what}: {url.with_user(None)} must not carry user:password@ (it would be shown in logs and never "
                          f"sent: the tap forwards the client's own Authorization header unchanged)")
    if url.explicit_port == 0:
        raise ConfigError(f"{what}: {value!r}: port 0 is not a port to connect to; name the server's port")
    return url


ADMIN_PORT_OFFSET = 1000  # the admin port's default: the listen port + this


def default_admin_port(listen_port: int, where: str = "--admin HOST:PORT") -> int:
    """The admin port a tap listening on ``listen_port`` uses when none is named (listen port + 1000)."""
    port = listen_port + ADMIN_PORT_OFFSET
    if port > 65535:
        raise ConfigError(f"the default admin port, the listen port {listen_port} + {ADMIN_PORT_OFFSET} = {port}, is past 65535; "
                          f"name one with {where} (or run none: --no-admin)")
    return port


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
            kw["admin_host"], kw["admin_port"] = kw["listen_host"], default_admin_port(kw["listen_port"], f"links[{link.name}].tap.admin")
        kw["host_header"] = tap.host_header
        kw["timeout_s"] = tap.timeout_s
        kw["verify_tls"] = tap.verify_tls
        kw["tls_cert"] = tap.tls_cert
        kw["tls_key"] = tap.tls_key
        kw["protocol"] = tap.protocol
    kw.update({k: v for k, v in overrides.items() if v is not None})
    return TapOptions(**kw)
