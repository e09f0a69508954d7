"""deltatap's shared vocabulary: timeline points, span/event/attribute names, and the link model.

Every package (proxy, loadgen, stack, collector) speaks these names and no package reaches into
another's internals. Changing a name here changes the wire format of deltatap's spans: the
collector, the Grafana dashboard and the docs all read them.

Two layers of points:

* Generic, per component: ``<component>.<role>`` (``gateway.in.arrive``, ``engine.first_token``).
  They work for any topology (no firewall, two gateways, a cache ...).
* The profiles draft section 6 names t0..t12 for the default stack
  client -> gateway -> firewall -> engine, which :data:`DEFAULT_POINT_ALIASES` maps onto the
  generic points.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

# --------------------------------------------------------------------------------------------
# Component kinds and roles
# --------------------------------------------------------------------------------------------


class ComponentKind(StrEnum):
    CLIENT = "client"
    GATEWAY = "gateway"
    FIREWALL = "firewall"
    ROUTER = "router"
    CACHE = "cache"
    PROXY = "proxy"
    ENGINE = "engine"


INTERMEDIARY_KINDS = frozenset(
    {ComponentKind.GATEWAY, ComponentKind.FIREWALL, ComponentKind.ROUTER, ComponentKind.CACHE, ComponentKind.PROXY}
)


class Role(StrEnum):
    """Role of a point inside one component (the suffix of a generic point name)."""

    # client
    SEND = "send"  # t0: request transmission begins
    FIRST_TOKEN_RECEIVED = "first_token_received"  # t12
    LAST_TOKEN_RECEIVED = "last_token_received"
    END = "end"
    # intermediaries (gateway, firewall, router, ...), request path
    IN_ARRIVE = "in.arrive"  # t1 (gateway), t3 (firewall)
    IN_DECISION = "in.decision"  # t4 (firewall): inbound decision reached
    IN_EXIT = "in.exit"  # t2 (gateway), t5 (firewall)
    # intermediaries, response path
    OUT_FIRST_IN = "out.first_in"  # t9 (firewall): first token arrives from upstream
    OUT_FIRST_OUT = "out.first_out"  # t10 (firewall), t11 (gateway): first token released downstream
    OUT_LAST_IN = "out.last_in"
    OUT_LAST_OUT = "out.last_out"
    # engine
    QUEUE = "queue"  # t6: request enters queue
    EXEC_START = "exec_start"  # t6a: prefill begins
    FIRST_TOKEN = "first_token"  # t7
    LAST_TOKEN = "last_token"  # t8


def point(component: str, role: Role | str) -> str:
    """Generic point name, e.g. ``point("gateway", Role.IN_ARRIVE) == "gateway.in.arrive"``."""
    return f"{component}.{role}"


# The profiles draft's names for the default topology client -> gateway -> firewall -> engine.
DEFAULT_POINT_ALIASES: dict[str, str] = {
    "t0": point("client", Role.SEND),
    "t1": point("gateway", Role.IN_ARRIVE),
    "t2": point("gateway", Role.IN_EXIT),
    "t3": point("firewall", Role.IN_ARRIVE),
    "t4": point("firewall", Role.IN_DECISION),
    "t5": point("firewall", Role.IN_EXIT),
    "t6": point("engine", Role.QUEUE),
    "t6a": point("engine", Role.EXEC_START),
    "t7": point("engine", Role.FIRST_TOKEN),
    "t8": point("engine", Role.LAST_TOKEN),
    "t9": point("firewall", Role.OUT_FIRST_IN),
    "t10": point("firewall", Role.OUT_FIRST_OUT),
    "t11": point("gateway", Role.OUT_FIRST_OUT),
    "t12": point("client", Role.FIRST_TOKEN_RECEIVED),
}
TIMELINE_POINTS: tuple[str, ...] = tuple(DEFAULT_POINT_ALIASES)

# --------------------------------------------------------------------------------------------
# Span names and kinds
# --------------------------------------------------------------------------------------------

SPAN_TAP = "deltatap.tap"  # full name: "deltatap.tap <link>"; kind SERVER
SPAN_CLIENT = "deltatap.client"  # kind CLIENT, from the load generator
SPAN_COMPONENT_PREFIX = "deltatap.stack"  # reference stack: "deltatap.stack.gateway", ...
SPAN_DECOMPOSITION_PREFIX = "deltatap.delta"  # synthetic per-component spans re-exported by the collector

INSTRUMENTATION_SCOPE = "deltatap"


def tap_span_name(link: str) -> str:
    return f"{SPAN_TAP} {link}"


def component_span_name(component: str) -> str:
    return f"{SPAN_COMPONENT_PREFIX}.{component}"


# --------------------------------------------------------------------------------------------
# Event names on a tap span (DESIGN section 2). Each carries the exact timestamp of the event.
# --------------------------------------------------------------------------------------------


class TapEvent(StrEnum):
    REQUEST_RECEIVED = "request.received"  # request head read from downstream
    REQUEST_BODY_RECEIVED = "request.body_received"  # last byte of request body read
    REQUEST_FORWARDED = "request.forwarded"  # last byte of request written upstream
    RESPONSE_HEADERS = "response.headers"  # status line + headers received from upstream
    RESPONSE_HEADERS_FORWARDED = "response.headers_forwarded"
    FIRST_TOKEN_RECEIVED = "first_token.received"  # first *content* token read from upstream
    FIRST_TOKEN_FORWARDED = "first_token.forwarded"  # ... and written downstream
    LAST_TOKEN_RECEIVED = "last_token.received"
    LAST_TOKEN_FORWARDED = "last_token.forwarded"
    RESPONSE_END = "response.end"  # end of upstream body
    FIRST_MESSAGE_RECEIVED = "first_message.received"  # gRPC: first response message read from upstream
    LAST_MESSAGE_RECEIVED = "last_message.received"  # gRPC: last response message
    RESPONSE_TRAILERS = "response.trailers"  # gRPC: trailers (grpc-status) read, or a trailers-only response
    FIRST_REQUEST_MESSAGE_RECEIVED = "first_request_message.received"  # gRPC: read that completed the first request message
    FIRST_REQUEST_MESSAGE_FORWARDED = "first_request_message.forwarded"  # ... the write that carried it upstream
    LAST_REQUEST_MESSAGE_RECEIVED = "last_request_message.received"  # gRPC: the last request message (client streaming)
    LAST_REQUEST_MESSAGE_FORWARDED = "last_request_message.forwarded"
    DOWNSTREAM_CLOSED = "downstream.closed"  # client went away before the end
    UPSTREAM_CLOSED = "upstream.closed"  # upstream closed before the end
    UPSTREAM_ERROR = "upstream.error"
    TIMEOUT = "timeout"


class ClientEvent(StrEnum):
    SEND = "client.send"  # t0
    FIRST_TOKEN = "client.first_token"  # t12
    LAST_TOKEN = "client.last_token"
    END = "client.end"
    ERROR = "client.error"
    CANCEL = "client.cancel"


# Which generic role each tap event observes, on the tap's downstream (D) or upstream (U) side of
# the link: a tap between D and U sees D's request leave (D.in.exit) when it *receives* the
# request and U's arrival when it has *forwarded* it; on the way back, the first token it receives
# is U releasing it (U.out.first_out) and the one it forwards is D receiving it (D.out.first_in).
# For the client (D) and the engine (U) the roles map to their own names (see :func:`tap_point`).
TAP_EVENT_OBSERVES: dict[TapEvent, tuple[str, Role]] = {
    TapEvent.REQUEST_RECEIVED: ("downstream", Role.IN_EXIT),
    TapEvent.REQUEST_FORWARDED: ("upstream", Role.IN_ARRIVE),
    TapEvent.FIRST_TOKEN_RECEIVED: ("upstream", Role.OUT_FIRST_OUT),
    TapEvent.FIRST_TOKEN_FORWARDED: ("downstream", Role.OUT_FIRST_IN),
    TapEvent.LAST_TOKEN_RECEIVED: ("upstream", Role.OUT_LAST_OUT),
    TapEvent.LAST_TOKEN_FORWARDED: ("downstream", Role.OUT_LAST_IN),
}

_CLIENT_ROLE = {
    Role.IN_EXIT: Role.SEND,
    Role.OUT_FIRST_IN: Role.FIRST_TOKEN_RECEIVED,
    Role.OUT_LAST_IN: Role.LAST_TOKEN_RECEIVED,
}
_ENGINE_ROLE = {
    Role.IN_ARRIVE: Role.QUEUE,
    Role.OUT_FIRST_OUT: Role.FIRST_TOKEN,
    Role.OUT_LAST_OUT: Role.LAST_TOKEN,
}


def tap_point(event: TapEvent, downstream: str, downstream_kind: str, upstream: str, upstream_kind: str) -> str | None:
    """The generic point a tap event approximates, or None for events that observe no point."""
    spec = TAP_EVENT_OBSERVES.get(event)
    if spec is None:
        return None
    side, role = spec
    if side == "downstream":
        name, kind = downstream, downstream_kind
        if kind == ComponentKind.CLIENT:
            role = _CLIENT_ROLE[role]
    else:
        name, kind = upstream, upstream_kind
        if kind == ComponentKind.ENGINE:
            role = _ENGINE_ROLE[role]
    return point(name, role)


# --------------------------------------------------------------------------------------------
# Attribute names
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WsDirectionAttrs:
    """Attribute keys of one direction of a WebSocket tunnel (:mod:`deltatap.proxy.websocket`), by its sender:
    ``deltatap.ws.client.*`` (messages the downstream sent) or ``deltatap.ws.server.*`` (the upstream's)."""

    sender: str

    def _k(self, name: str) -> str:
        return f"deltatap.ws.{self.sender}.{name}"

    @property
    def MESSAGES(self) -> str:  # data messages (text/binary, fragments joined)
        return self._k("messages")

    @property
    def FRAMES(self) -> str:  # frames parsed, control frames included
        return self._k("frames")

    @property
    def BYTES(self) -> str:  # bytes relayed in this direction (wire, headers included)
        return self._k("bytes")

    @property
    def PAYLOAD_BYTES(self) -> str:
        return self._k("payload_bytes")

    @property
    def PINGS(self) -> str:
        return self._k("pings")

    @property
    def PONGS(self) -> str:
        return self._k("pongs")

    @property
    def COMPRESSED(self) -> str:  # messages with permessage-deflate (payload opaque to the tap)
        return self._k("compressed")

    @property
    def CLOSE_CODE(self) -> str:  # status code of this sender's close frame (1005: none in the frame)
        return self._k("close_code")

    @property
    def MALFORMED(self) -> str:  # why the tap stopped parsing this direction (bytes still relayed)
        return self._k("malformed")

    @property
    def FIRST_RECEIVED_UNIX_NS(self) -> str:  # read that completed the first message
        return self._k("first_message.received_unix_ns")

    @property
    def FIRST_RECEIVED_BOUND_NS(self) -> str:  # its bytes arrived at most this much earlier
        return self._k("first_message.received_bound_ns")

    @property
    def FIRST_FORWARDED_UNIX_NS(self) -> str:  # write that carried its last byte on
        return self._k("first_message.forwarded_unix_ns")

    @property
    def FIRST_FORWARDED_BOUND_NS(self) -> str:  # its bytes left at most this much later
        return self._k("first_message.forwarded_bound_ns")

    @property
    def ARRIVALS_MS(self) -> str:  # each message's arrival, ms after the first's (the first 256)
        return self._k("arrivals_ms")

    @property
    def GAP_MEAN_MS(self) -> str:  # between message arrivals
        return self._k("gap.mean_ms")

    @property
    def GAP_MAX_MS(self) -> str:
        return self._k("gap.max_ms")

    @property
    def GAP_P99_MS(self) -> str:
        return self._k("gap.p99_ms")

    @property
    def GAP_FWD_MAX_MS(self) -> str:  # between their departures
        return self._k("gap_forwarded.max_ms")


class _AttrKeys:
    """Span attribute keys (read as ``Attr.NAME``: :data:`Attr`). ``deltatap.*`` are ours; the rest are OpenTelemetry
    semantic conventions."""

    OBSERVER = "deltatap.observer"  # "tap" | "client" | "component"
    LINK = "deltatap.link"
    DOWNSTREAM = "deltatap.downstream"  # component name on the client side of the link
    DOWNSTREAM_KIND = "deltatap.downstream.kind"
    UPSTREAM = "deltatap.upstream"  # component name on the server side of the link
    UPSTREAM_KIND = "deltatap.upstream.kind"
    COMPONENT = "deltatap.component"  # for a component's own span
    COMPONENT_KIND = "deltatap.component.kind"
    REQUEST_ID = "deltatap.request_id"  # value of the correlation header
    CORRELATION_HEADER = "deltatap.correlation_header"
    BODY_FINGERPRINT = "deltatap.body.fingerprint"  # keyed hash of the request body
    BODY_BYTES_IN = "deltatap.body.request_bytes"
    BODY_BYTES_OUT = "deltatap.body.response_bytes"
    STREAM_FORMAT = "deltatap.stream.format"  # openai-chat | openai-completions | responses | anthropic | llamacpp | kserve-v2 | grpc-message | none
    STREAMING = "deltatap.streaming"
    CHUNKS = "deltatap.stream.chunks"  # transport chunks read from upstream
    EVENTS = "deltatap.stream.events"  # SSE events parsed (gRPC: response messages)
    FIRST_TOKEN_SOURCE = "deltatap.first_token.source"  # gRPC: content (a decoded method's text) | message (each message)
    GRPC_MESSAGE_BYTES = "deltatap.grpc.message_bytes"  # response message payload bytes, without the 5-byte prefixes
    GRPC_UNDECODABLE = "deltatap.grpc.undecodable"  # messages of a decoded method that could not be read
    GRPC_COMPRESSED = "deltatap.grpc.compressed_messages"  # response messages with the compressed flag (grpc-encoding)
    GRPC_REQUEST_MESSAGES = "deltatap.grpc.request_messages"  # request messages the client sent (client/bidi streaming: many)
    GRPC_REQUEST_MESSAGE_BYTES = "deltatap.grpc.request_message_bytes"  # their payload bytes, without the 5-byte prefixes
    CONTENT_EVENTS = "deltatap.stream.content_events"  # events carrying content tokens
    GAP_COUNT = "deltatap.stream.gap.count"  # inter-content-event gaps (upstream side)
    GAP_MEAN_MS = "deltatap.stream.gap.mean_ms"
    GAP_MAX_MS = "deltatap.stream.gap.max_ms"
    GAP_P99_MS = "deltatap.stream.gap.p99_ms"
    GAP_FWD_MEAN_MS = "deltatap.stream.gap_forwarded.mean_ms"  # same gaps, on the downstream side
    GAP_FWD_MAX_MS = "deltatap.stream.gap_forwarded.max_ms"
    GAP_FWD_P99_MS = "deltatap.stream.gap_forwarded.p99_ms"
    OVERHEAD_REQUEST_NS = "deltatap.overhead.request_ns"  # received -> forwarded inside the tap
    OVERHEAD_FIRST_TOKEN_NS = "deltatap.overhead.first_token_ns"
    OVERHEAD_HOP_NS = "deltatap.overhead.hop_ns"  # bound on the extra hop's delivery, which the two above cannot stamp
    CLOCK_OFFSET_NS = "deltatap.clock.offset_ns"  # observer clock minus collector clock
    CLOCK_UNCERTAINTY_NS = "deltatap.clock.uncertainty_ns"
    STAMP_SOURCE = "deltatap.stamp.source"  # resource: where read stamps come from (deltatap.net.kstamp.stamp_source)
    STAMP_BOUNDS = "deltatap.stamp.bounds"  # events whose time is an interval, not exact: format_stamp_bounds
    OUTCOME = "deltatap.outcome"  # see Outcome
    ERROR_CAUSE = "deltatap.error.cause"
    FIREWALL_DECISION = "deltatap.firewall.decision"  # allow | allow_after_analysis | block_pattern | block_analysis | modify
    FIREWALL_OUTBOUND_DECISION = "deltatap.firewall.outbound_decision"  # same values, response inspection
    FIREWALL_INBOUND_MS = "deltatap.firewall.inbound_ms"  # inbound inspection time the cost model drew
    FIREWALL_OUTBOUND_MS = "deltatap.firewall.outbound_ms"  # total outbound inspection time drawn
    FIREWALL_OUTBOUND_CHECKS = "deltatap.firewall.outbound_checks"  # outbound inspections (windows)
    WS = "deltatap.ws"  # true: the exchange upgraded to WebSocket; its span lasts as long as the tunnel
    WS_DEFLATE = "deltatap.ws.deflate"  # permessage-deflate negotiated (payloads opaque, counted)
    WS_CLOSED_BY = "deltatap.ws.closed_by"  # client | server: the first close frame's sender, else the first TCP close
    WS_CLIENT = WsDirectionAttrs("client")  # deltatap.ws.client.*: what the downstream sent
    WS_SERVER = WsDirectionAttrs("server")  # deltatap.ws.server.*: what the upstream sent
    LABEL_PREFIX = "deltatap.label."  # workload labels: deltatap.label.workload, deltatap.label.class, ...
    RUN_ID = "deltatap.run_id"
    # engine telemetry passed through the stream (llama.cpp timings) or headers
    ENGINE_PROMPT_MS = "deltatap.engine.prompt_ms"
    ENGINE_PREDICTED_MS = "deltatap.engine.predicted_ms"
    ENGINE_PROMPT_N = "deltatap.engine.prompt_n"
    ENGINE_PREDICTED_N = "deltatap.engine.predicted_n"
    ENGINE_CACHE_N = "deltatap.engine.cache_n"
    # reference-stack engine's own span
    ENGINE_PREEMPTIONS = "deltatap.engine.preemptions"  # times the request was preempted (KV cache ran out)
    ENGINE_BATCH_SIZE = "deltatap.engine.batch_size"  # sequences running when its first token was produced
    ENGINE_TOKENS_AFTER_DISCONNECT = "deltatap.engine.tokens_after_disconnect"  # generated after the client left
    # timeouts declared by a component (seconds), for the cascade report
    TIMEOUT_S = "deltatap.timeout_s"
    RETRIES = "deltatap.retries"
    ATTEMPT = "deltatap.attempt"

    # OpenTelemetry semantic conventions (HTTP + GenAI)
    HTTP_METHOD = "http.request.method"
    HTTP_STATUS = "http.response.status_code"
    RPC_SYSTEM = "rpc.system"  # "grpc"
    RPC_SERVICE = "rpc.service"
    RPC_METHOD = "rpc.method"
    RPC_GRPC_STATUS = "rpc.grpc.status_code"
    URL_PATH = "url.path"
    URL_QUERY = "url.query"
    SERVER_ADDRESS = "server.address"
    SERVER_PORT = "server.port"
    CLIENT_ADDRESS = "client.address"
    ERROR_TYPE = "error.type"
    GENAI_SYSTEM = "gen_ai.system"
    GENAI_OPERATION = "gen_ai.operation.name"
    GENAI_REQUEST_MODEL = "gen_ai.request.model"
    GENAI_RESPONSE_MODEL = "gen_ai.response.model"
    GENAI_RESPONSE_ID = "gen_ai.response.id"
    GENAI_REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
    GENAI_INPUT_TOKENS = "gen_ai.usage.input_tokens"
    GENAI_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
    GENAI_FINISH_REASONS = "gen_ai.response.finish_reasons"
    # vLLM's llm_request span (seconds, floats)
    VLLM_TIME_IN_QUEUE = "gen_ai.latency.time_in_queue"
    VLLM_TTFT = "gen_ai.latency.time_to_first_token"
    VLLM_PREFILL = "gen_ai.latency.time_in_model_prefill"
    VLLM_DECODE = "gen_ai.latency.time_in_model_decode"
    VLLM_INFERENCE = "gen_ai.latency.time_in_model_inference"
    VLLM_E2E = "gen_ai.latency.e2e"


# The span attribute keys: the class above's, read from an instance's own dict. Python 3.11 does not specialise a read
# of a class's attribute (``SomeClass.NAME``: a type lookup each time), but does an instance's (about half the time);
# a tap's span reads some 40 keys per request.
Attr = _AttrKeys()
Attr.__dict__.update((k, v) for k, v in vars(_AttrKeys).items() if not k.startswith("_"))


class Observer(StrEnum):
    TAP = "tap"
    CLIENT = "client"
    COMPONENT = "component"


class Outcome(StrEnum):
    OK = "ok"
    HTTP_ERROR = "http_error"  # upstream answered with >= 400
    REFUSED = "refused"  # blocked / refusal by a firewall
    TIMEOUT = "timeout"
    CLIENT_CANCEL = "client_cancel"  # downstream went away
    UPSTREAM_ERROR = "upstream_error"  # connect failure, reset, broken stream


# Correlation header propagated (created if absent) by every tap and sent by the load generator.
DEFAULT_CORRELATION_HEADER = "x-request-id"

# What a tap expects from its clients (``deltatap tap --protocol``, a topology's ``links[].tap.protocol``;
# docs/tap.md). ``http``: HTTP/1.1, a connection that opens with HTTP/2's preface (or negotiates ALPN h2) relayed as
# HTTP/2; ``grpc``: HTTP/2 only (a gRPC tap), any other connection closed at its first bytes and counted.
TAP_PROTOCOLS: tuple[str, ...] = ("http", "grpc")
DEFAULT_TAP_PROTOCOL = "http"

# --------------------------------------------------------------------------------------------
# The default topology: client -> gateway -> firewall -> engine, tapped on edge, gw-fw, fw-engine
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LinkSpec:
    name: str
    downstream: str
    upstream: str


DEFAULT_COMPONENTS: tuple[tuple[str, ComponentKind], ...] = (
    ("client", ComponentKind.CLIENT),
    ("gateway", ComponentKind.GATEWAY),
    ("firewall", ComponentKind.FIREWALL),
    ("engine", ComponentKind.ENGINE),
)
DEFAULT_LINKS: tuple[LinkSpec, ...] = (
    LinkSpec("edge", "client", "gateway"),
    LinkSpec("gw-fw", "gateway", "firewall"),
    LinkSpec("fw-engine", "firewall", "engine"),
)


def default_link(name: str) -> LinkSpec | None:
    return next((link for link in DEFAULT_LINKS if link.name == name), None)


# The profiles draft section 6 deltas, over the t-point aliases (end, start).
DRAFT_DELTAS: dict[str, tuple[str, str]] = {
    "gateway_inbound": ("t2", "t1"),
    "firewall_inbound": ("t5", "t3"),
    "firewall_inbound_block": ("t4", "t3"),
    "engine_queue": ("t6a", "t6"),
    "engine_prefill": ("t7", "t6a"),
    "engine_ttft": ("t7", "t6"),
    "firewall_outbound": ("t10", "t9"),
    "gateway_outbound": ("t11", "t10"),
    "system_ttft": ("t12", "t0"),
    "output_path_overhead": ("t12", "t7"),
}


# --------------------------------------------------------------------------------------------
# Stamp bounds: an event whose time deltatap cannot know exactly carries an interval
# --------------------------------------------------------------------------------------------

# A stamp within this of the truth counts as exact (the packet stamps' own agreement with a capture is a few µs);
# a wider interval is stated on the span (Attr.STAMP_BOUNDS) and carried into every delta's error bound.
STAMP_EXACT_NS = 50_000
# A side of an interval deltatap could not bound at all (a write whose bytes TCP still held when its stamp was taken,
# and no later observation saw them leave: no packet log, or the log missed it, and the socket still held bytes, or was
# gone, when the exchange ended): the event happened at or after ``t`` (at or before, for a read), how much later is
# not known. Written "?" in the span attribute and as JSON null in rows; every sum with it is unknown (:func:`add_bounds`).
BOUND_UNKNOWN = -1


def format_stamp_bounds(bounds: dict[str, tuple[int, int]]) -> str | None:
    """``{event: (before_ns, after_ns)}`` -> the span attribute's value: ``"event=before/after,..."``, only the events
    whose interval ``[t - before, t + after]`` is wider than :data:`STAMP_EXACT_NS` or has a side that is unknown
    (:data:`BOUND_UNKNOWN`, any negative value: written ``?``, e.g. ``"first_token.forwarded=0/?"``); None when every
    one is exact. A read's bytes may have arrived *before* its stamp (they waited in the socket), a write's left *after*
    it."""
    parts = None  # (a loop, not a comprehension: no frame of its own, and no list while every event is exact)
    for ev, (b, a) in bounds.items():
        if b + a > STAMP_EXACT_NS or b < 0 or a < 0:
            if parts is None:
                parts = []
            parts.append(f"{ev}={'?' if b < 0 else b}/{'?' if a < 0 else a}")
    return ",".join(parts) if parts else None


def _bound_side(text: str) -> int:
    return BOUND_UNKNOWN if text == "?" else max(0, int(text))


def parse_stamp_bounds(value: object) -> dict[str, tuple[int, int]]:
    """Inverse of :func:`format_stamp_bounds` (``?`` -> :data:`BOUND_UNKNOWN`; anything malformed is left out)."""
    out: dict[str, tuple[int, int]] = {}
    if not isinstance(value, str):
        return out
    for part in value.split(","):
        ev, _, ba = part.partition("=")
        b, _, a = ba.partition("/")
        try:
            out[ev] = (_bound_side(b), _bound_side(a))
        except ValueError:
            continue
    return out


def add_bounds(*bounds: int) -> int:
    """The sum of error bounds (ns), :data:`BOUND_UNKNOWN` when any of them is unknown (negative)."""
    total = 0
    for b in bounds:
        if b < 0:
            return BOUND_UNKNOWN
        total += b
    return total


def delta_bound(end: tuple[int, int] | None, start: tuple[int, int] | None) -> int:
    """The error bound a delta ``end - start`` takes from its two points' intervals ``(before_ns, after_ns)``
    (None: exact): the true delta lies in ``[d - (end.before + start.after), d + (end.after + start.before)]``;
    :data:`BOUND_UNKNOWN` when a side that enters it is unknown (the delta has no bound, never a number)."""
    eb, ea = end or (0, 0)
    sb, sa = start or (0, 0)
    if eb < 0 or ea < 0 or sb < 0 or sa < 0:
        return BOUND_UNKNOWN
    return max(eb + sa, ea + sb)

