"""Strict configuration models of the reference stack (engine, firewall, gateway).

A component reads either a file of its own (the model's keys at the top level) or one section of
a combined file such as ``configs/demo.yaml`` (top-level ``gateway:``, ``firewall:``, ``engine:``
and ``topology:``). Every unknown key is an error naming the file and the key path.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from deltatap.core.config import ConfigError, StrictModel, read_yaml, validate
from deltatap.core.topology import parse_hostport
from deltatap.core.vocab import DEFAULT_CORRELATION_HEADER, ComponentKind

from deltatap.stack.delays import ZERO, DelaySpec


class StageDelays(StrictModel):
    """Extra delays a component adds at each stage (on top of any cost model)."""

    inbound: DelaySpec = Field(default=ZERO, description="after the request is read, before it is forwarded / queued")
    outbound_first: DelaySpec = Field(default=ZERO, description="before the first content chunk is released")
    outbound_chunk: DelaySpec = Field(default=ZERO, description="before every later chunk is released")


class ComponentBase(StrictModel):
    name: str = Field(default="", pattern=r"^[A-Za-z0-9_.-]*$", description="component name in spans (default: its kind)")
    listen: str = "127.0.0.1:0"
    seed: int = 0
    correlation_header: str = DEFAULT_CORRELATION_HEADER
    delays: StageDelays = StageDelays()
    description: str = ""

    @field_validator("listen")
    @classmethod
    def _hostport(cls, v: str) -> str:
        parse_hostport(v)
        return v


class UpstreamPolicy(StrictModel):
    """How an intermediary talks to its upstream."""

    timeout_s: float | None = Field(default=None, gt=0, description="whole upstream exchange, headers to last byte")
    connect_timeout_s: float = Field(default=5.0, gt=0)
    propagate_trace: bool = Field(default=True, description="send traceparent/tracestate and the correlation header upstream")
    cancel_on_disconnect: bool = Field(default=True, description="close the upstream request when the downstream goes away")

    @field_validator("timeout_s", mode="before")
    @classmethod
    def _none(cls, v):
        return None if v in ("none", "null", 0) else v


def _check_url(v: str) -> str:
    if not re.match(r"^https?://[^/\s]+", v):
        raise ValueError(f"{v!r} is not an http(s) URL such as http://127.0.0.1:8300")
    return v.rstrip("/")


# ------------------------------------------------------------------------------------------ engine


class EngineModel(StrictModel):
    """Scheduler cost model; defaults resemble a ~1B model on one data-centre GPU."""

    max_batch: int = Field(default=32, ge=1, description="running sequences per step (continuous batching)")
    chunked_prefill: bool = Field(default=False, description="mix prefill chunks into decode steps")
    max_batched_tokens: int = Field(default=2048, ge=1, description="token budget of one step with chunked prefill")
    prefill_base_ms: float = Field(default=2.0, ge=0, description="fixed cost of a step that prefills")
    prefill_per_token_ms: float = Field(default=0.05, ge=0)
    decode_base_ms: float = Field(default=10.0, ge=0, description="decode step time at batch size 1")
    decode_per_seq_ms: float = Field(default=0.2, ge=0, description="added per sequence in the batch")
    kv_capacity_tokens: int = Field(default=65536, ge=1, description="KV cache size; running out preempts")
    max_model_len: int = Field(default=8192, ge=1, description="prompt + output tokens one request may use")
    prefix_cache: bool = True
    prefix_block_tokens: int = Field(default=16, ge=1)
    prefix_cache_blocks: int = Field(default=4096, ge=0)
    policy: Literal["fcfs", "priority"] = Field(
        default="fcfs", description="admission order: fcfs (arrival order) or priority (lowest priority value first, "
        "then arrival; vLLM's --scheduling-policy priority); preemption then picks the lowest-priority newest sequence")
    priority_header: str = Field(default="x-priority", min_length=1, description="request header carrying an integer priority (default 0)")

    def decode_ms(self, batch: int) -> float:
        return self.decode_base_ms + self.decode_per_seq_ms * max(0, batch - 1) if batch else 0.0


class EngineConfig(ComponentBase):
    models: list[str] = Field(default_factory=lambda: ["deltatap-ref"], min_length=1)
    default_max_tokens: int = Field(default=128, ge=1)
    cancel_on_disconnect: bool = Field(default=True, description="abort generation when the client goes away")
    scheduler: EngineModel = EngineModel()


# ---------------------------------------------------------------------------------------- firewall


class Rule(StrictModel):
    name: str = Field(min_length=1)
    keywords: list[str] = Field(default_factory=list, description="case-insensitive substrings")
    regex: list[str] = Field(default_factory=list)
    action: Literal["block", "modify", "analyze"]
    replacement: str = "[redacted]"
    analysis_blocks: bool = Field(default=False, description="analyze: the deep analysis ends in a block")

    @model_validator(mode="after")
    def _patterns(self) -> Rule:
        if not self.keywords and not self.regex:
            raise ValueError(f"rule {self.name!r}: give at least one keyword or regex")
        for r in self.regex:
            try:
                re.compile(r)
            except re.error as exc:
                raise ValueError(f"rule {self.name!r}: regex {r!r} does not compile: {exc}") from None
        return self


class InspectionCost(StrictModel):
    """Time one inspection takes: fixed + per_token_ms * tokens, + deep_analysis when a rule flags."""

    fixed: DelaySpec = ZERO
    per_token_ms: float = Field(default=0.0, ge=0)
    deep_analysis: DelaySpec = ZERO


class InboundInspection(StrictModel):
    enabled: bool = True
    rules: list[Rule] = Field(default_factory=list)
    cost: InspectionCost = InspectionCost()


class OutboundInspection(StrictModel):
    enabled: bool = True
    mode: Literal["buffered", "streaming", "hybrid"] = "streaming"
    window_tokens: int = Field(default=1, ge=1, description="streaming: tokens checked together")
    hybrid_buffer_tokens: int = Field(default=16, ge=1, description="hybrid: tokens held back before streaming")
    rules: list[Rule] = Field(default_factory=list)
    cost: InspectionCost = Field(default=InspectionCost(), description="cost of one check (window or whole buffer)")


class BlockResponse(StrictModel):
    style: Literal["error_403", "refusal_200"] = "error_403"
    message: str = "The request was blocked by the content policy."


class FirewallConfig(ComponentBase):
    upstream: str = "http://127.0.0.1:8300"
    upstream_policy: UpstreamPolicy = UpstreamPolicy()
    inbound: InboundInspection = InboundInspection()
    outbound: OutboundInspection = OutboundInspection()
    block: BlockResponse = BlockResponse()

    @field_validator("upstream")
    @classmethod
    def _url(cls, v: str) -> str:
        return _check_url(v)


# ----------------------------------------------------------------------------------------- gateway


class Auth(StrictModel):
    enabled: bool = False
    api_keys: list[str] = Field(default_factory=list, description="accepted as 'Authorization: Bearer K' or 'x-api-key: K'")

    @model_validator(mode="after")
    def _keys(self) -> Auth:
        if self.enabled and not self.api_keys:
            raise ValueError("auth.enabled is true but auth.api_keys is empty")
        return self


class RateLimit(StrictModel):
    enabled: bool = False
    requests_per_s: float = Field(default=100.0, gt=0)
    burst: int = Field(default=100, ge=1)
    per: Literal["key", "global"] = "key"


class Route(StrictModel):
    model: str = Field(default="*", description="model name, or a glob such as 'llama-*'; '*' matches any")
    upstreams: list[str] = Field(min_length=1)
    policy: Literal["round_robin", "least_outstanding"] = "round_robin"

    @field_validator("upstreams")
    @classmethod
    def _urls(cls, v: list[str]) -> list[str]:
        return [_check_url(u) for u in v]


class RetryPolicy(StrictModel):
    max_retries: int = Field(default=0, ge=0)
    backoff_ms: float = Field(default=25.0, ge=0, description="first backoff; doubles each retry")
    backoff_multiplier: float = Field(default=2.0, ge=1)
    max_backoff_ms: float = Field(default=1000.0, ge=0)
    jitter: float = Field(default=0.0, ge=0, le=1, description="fraction of the backoff drawn at random (seeded)")
    retry_on_status: list[int] = Field(default_factory=lambda: [502, 503, 504])
    retry_on_timeout: bool = True


class Validation(StrictModel):
    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1)
    max_tokens_limit: int = Field(default=32768, ge=1)


class GatewayConfig(ComponentBase):
    auth: Auth = Auth()
    rate_limit: RateLimit = RateLimit()
    routes: list[Route] = Field(default_factory=lambda: [Route(upstreams=["http://127.0.0.1:8200"])], min_length=1)
    upstream_policy: UpstreamPolicy = UpstreamPolicy()
    retry: RetryPolicy = RetryPolicy()
    validation: Validation = Validation()


# ------------------------------------------------------------------------------------------ loading

CONFIG_MODELS: dict[str, type[ComponentBase]] = {
    ComponentKind.ENGINE.value: EngineConfig,
    ComponentKind.FIREWALL.value: FirewallConfig,
    ComponentKind.GATEWAY.value: GatewayConfig,
}
STACK_SECTIONS = (*CONFIG_MODELS, "topology")


def load_component_config(path: str | Path | None, kind: str) -> ComponentBase:
    """``kind``'s config from ``path``: its section of a combined file, or the whole file."""
    model = CONFIG_MODELS[kind]
    if path is None:
        return model()
    data = read_yaml(path)
    if isinstance(data, dict) and any(k in data for k in STACK_SECTIONS):
        if kind not in data:
            present = sorted(k for k in data if k in STACK_SECTIONS)
            raise ConfigError(f"{path}: no top-level {kind!r} section (sections present: {present})")
        return validate(model, data[kind], f"{path} [{kind}]")
    return validate(model, data, str(path))
