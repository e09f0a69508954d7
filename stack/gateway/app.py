"""The reference API gateway: auth (401), rate limit (429), validation (400/404/413), routing by
model, upstream timeout and retries with backoff, streaming relay.

Points on its span (``deltatap.stack.<name>``): ``in.arrive`` (t1, first byte of the request
read), ``in.exit`` (t2, last byte of the forwarded request written, on the attempt that answered),
``out.first_in`` / ``out.last_in`` (first / last content token read from the upstream socket),
``out.first_out`` (t11) / ``out.last_out`` (those tokens handed to the kernel downstream),
``timeout`` when the upstream timeout fires and ``downstream.closed`` when the client leaves.
A non-streaming body counts as one token: its first / last byte.
"""

from __future__ import annotations

import asyncio
import math
import random

import aiohttp
from aiohttp import web

from deltatap.core.clock import mono_ns
from deltatap.core.sse import StreamObserver
from deltatap.telemetry.tracer import Telemetry
from deltatap.core.vocab import Attr, ComponentKind, Outcome, Role, TapEvent

from deltatap.stack.config import GatewayConfig
from deltatap.stack.delays import DelaySampler
from deltatap.stack.forward import DownstreamGone, Exchange, session_lifecycle, upstream_headers
from deltatap.stack.gateway.policy import Authenticator, RateLimiter, presented_key
from deltatap.stack.gateway.routing import Pool, Router
from deltatap.stack.metrics import ComponentMetrics, counter
from deltatap.stack.openai import ENDPOINT_KINDS, ApiError, parse_json, parse_request
from deltatap.stack.server import RunningComponent, abandoned, component_app, reject, request_span, start_component
from deltatap.stack.spans import ComponentSpan


class Retry(Exception):
    """This attempt failed in a way the retry policy may retry."""


class GatewayState:
    def __init__(self, cfg: GatewayConfig, telemetry: Telemetry) -> None:
        self.cfg = cfg
        self.name = cfg.name or ComponentKind.GATEWAY.value
        self.telemetry = telemetry
        self.auth = Authenticator(cfg.auth)
        self.limiter = RateLimiter(cfg.rate_limit)
        self.router = Router(cfg.routes)
        self.sampler = DelaySampler(cfg.seed)
        self.backoff_rng = random.Random(cfg.seed + 1)
        self.metrics = ComponentMetrics(self.name, ComponentKind.GATEWAY.value, telemetry)
        self.metrics.add_collector(lambda: [counter("deltatap_stack_gateway_retries", "Upstream retries", self.retries, self.name)])
        self.retries = 0
        self.session: aiohttp.ClientSession | None = None
        self.background: set[asyncio.Task] = set()

    def backoff_s(self, retry: int) -> float:
        r = self.cfg.retry
        ms = min(r.max_backoff_ms, r.backoff_ms * r.backoff_multiplier ** (retry - 1))
        ms *= 1 - r.jitter * self.backoff_rng.random()
        return ms / 1000.0


GATEWAY = web.AppKey("deltatap_gateway", GatewayState)


class Forward:
    """One admitted request relayed upstream, with retries."""

    def __init__(self, st: GatewayState, ex: Exchange, pool: Pool, body: bytes, t_arrive: int) -> None:
        self.st, self.ex, self.pool, self.body, self.t_arrive = st, ex, pool, body, t_arrive
        self.attempt = 0

    async def run(self) -> web.StreamResponse:
        st, ex = self.st, self.ex
        outcome, status, error = Outcome.OK, None, None
        resp: web.StreamResponse | None = None
        try:
            await st.sampler.sleep(st.cfg.delays.inbound)
            headers = upstream_headers(ex.request.headers, ex.span, st.cfg.upstream_policy, st.cfg.correlation_header, ex.rid)
            while True:
                self.attempt += 1
                url = self.pool.acquire()
                try:
                    status = await self._attempt(url, headers)
                    break
                except Retry as why:
                    st.retries += 1
                    error = str(why)
                    await asyncio.sleep(st.backoff_s(self.attempt))
                finally:
                    self.pool.release(url)
            if status >= 400:
                outcome = Outcome.HTTP_ERROR
            resp = ex.downstream
        except TimeoutError:
            outcome, error = Outcome.TIMEOUT, f"upstream timeout after {st.cfg.upstream_policy.timeout_s} s"
            status, resp = self.ex.give_up(504, error, "timeout", "upstream_timeout")
        except (aiohttp.ClientError, OSError) as exc:
            outcome, error = Outcome.UPSTREAM_ERROR, f"{type(exc).__name__}: {exc}"
            status, resp = self.ex.give_up(502, f"upstream failed: {error}", "upstream_error", "bad_gateway")
        except DownstreamGone:
            outcome, error = Outcome.CLIENT_CANCEL, "client closed the connection"
        except asyncio.CancelledError:
            outcome, error = Outcome.CLIENT_CANCEL, "client closed the connection"
            raise
        finally:
            if ex.downstream_gone and outcome is Outcome.OK:  # drained the upstream for nobody
                outcome, error = Outcome.CLIENT_CANCEL, "client closed the connection"
            self._finish(outcome, status, error)
        return resp if resp is not None else web.Response(status=499)

    async def _attempt(self, url: str, headers: dict[str, str]) -> int:
        st, ex = self.st, self.ex
        policy, retry = st.cfg.upstream_policy, st.cfg.retry
        can_retry = self.attempt <= retry.max_retries
        try:
            async with asyncio.timeout(policy.timeout_s):
                resp = await ex.open(st.session, url, self.body, headers)
                if resp.status in retry.retry_on_status and can_retry:
                    resp.close()
                    raise Retry(f"upstream answered {resp.status}")
                await ex.start_downstream(resp.status, resp.headers)
                await self._relay(resp)
                await ex.end_downstream()
                return resp.status
        except TimeoutError:
            ex.span.stamp(TapEvent.TIMEOUT, mono_ns(), overwrite=True)
            ex.close_upstream()
            if can_retry and retry.retry_on_timeout and not ex.started:
                raise Retry("upstream timeout") from None
            raise
        except (aiohttp.ClientConnectionError, OSError) as exc:
            ex.close_upstream()
            if can_retry and not ex.started:
                raise Retry(f"{type(exc).__name__}: {exc}") from None
            raise

    async def _relay(self, resp: aiohttp.ClientResponse) -> None:
        st, ex, span = self.st, self.ex, self.ex.span
        delays = st.cfg.delays
        sse = resp.headers.get("Content-Type", "").startswith("text/event-stream")
        obs = StreamObserver(path=ex.request.path) if sse else None
        async for chunk, pieces in ex.read_upstream():
            before = obs.content_events if obs else 0
            for piece, t in pieces:
                if obs is not None:
                    obs.feed(piece, t)
                else:
                    span.stamp(Role.OUT_FIRST_IN, t)
                    span.stamp(Role.OUT_LAST_IN, t, overwrite=True)
            content = obs is None or obs.content_events > before
            first_ready = obs is None or obs.first_token_mono_ns is not None
            if first_ready and Role.OUT_FIRST_OUT not in span.stamps:
                await st.sampler.sleep(delays.outbound_first)
            elif content:
                await st.sampler.sleep(delays.outbound_chunk)
            t_w = await ex.write(chunk)
            if t_w is None:
                continue  # client gone and we keep draining (cancel_on_disconnect: false)
            if first_ready:
                span.stamp(Role.OUT_FIRST_OUT, t_w)
            if content:
                span.stamp(Role.OUT_LAST_OUT, t_w, overwrite=True)
        if obs is not None:
            obs.finish(mono_ns())
            if obs.first_token_mono_ns is not None:
                span.stamp(Role.OUT_FIRST_IN, obs.first_token_mono_ns)
            if obs.last_token_mono_ns is not None:
                span.stamp(Role.OUT_LAST_IN, obs.last_token_mono_ns, overwrite=True)
            span.set(Attr.STREAM_FORMAT, obs.format)
            span.set(Attr.CONTENT_EVENTS, obs.content_events)
            span.set(Attr.GENAI_INPUT_TOKENS, obs.facts.input_tokens)
            span.set(Attr.GENAI_OUTPUT_TOKENS, obs.facts.output_tokens)

    def _finish(self, outcome: Outcome, status: int | None, error: str | None) -> None:
        span = self.ex.span
        span.set(Attr.ATTEMPT, self.attempt)
        span.set(Attr.RETRIES, max(0, self.attempt - 1))
        if outcome is Outcome.OK:
            error = None
        span.end(outcome, status, error=error)
        self.st.metrics.observe(outcome, status, (mono_ns() - self.t_arrive) / 1e9)


async def handle(request: web.Request) -> web.StreamResponse:
    st = request.app[GATEWAY]
    cfg = st.cfg
    span, rid = request_span(
        request, st.telemetry, st.name, ComponentKind.GATEWAY.value, cfg.correlation_header, Role.IN_ARRIVE,
        {Attr.TIMEOUT_S: cfg.upstream_policy.timeout_s},
    )
    t1 = span.start_mono
    try:
        pool, body = await _admit(st, request, span)
    except ApiError as err:
        return reject(span, st.metrics, err, t1, {cfg.correlation_header: rid})
    except asyncio.CancelledError:
        abandoned(span)
        raise
    ex = Exchange(request, span, cfg.upstream_policy, cfg.correlation_header, rid)
    return await ex.guard(Forward(st, ex, pool, body, t1).run, st.background)


async def _admit(st: GatewayState, request: web.Request, span: ComponentSpan) -> tuple[Pool, bytes]:
    key = presented_key(request.headers)
    if not st.auth.check(key):
        raise ApiError(401, "Invalid or missing API key (send 'Authorization: Bearer KEY')", "authentication_error", "invalid_api_key")
    wait = st.limiter.check(key)
    if wait:
        retry_after = {"Retry-After": str(max(1, math.ceil(wait)))}
        raise ApiError(429, "Rate limit exceeded; retry later", "rate_limit_error", "rate_limit_exceeded", retry_after)
    if request.content_length is not None and request.content_length > st.cfg.validation.max_body_bytes:
        raise ApiError(413, f"request body over {st.cfg.validation.max_body_bytes} bytes")
    try:
        body = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise ApiError(413, f"request body over {st.cfg.validation.max_body_bytes} bytes") from None
    req = parse_request(ENDPOINT_KINDS[request.path], parse_json(body), st.cfg.validation.max_tokens_limit)
    span.set(Attr.GENAI_REQUEST_MODEL, req.model)
    span.set(Attr.STREAMING, req.stream)
    pool = st.router.route(req.model)
    if pool is None:
        raise ApiError(404, f"no route for model {req.model!r}", "invalid_request_error", "model_not_found")
    return pool, body


def build_gateway_app(cfg: GatewayConfig, telemetry: Telemetry) -> web.Application:
    st = GatewayState(cfg, telemetry)
    return component_app(GATEWAY, st, dict.fromkeys(ENDPOINT_KINDS, handle), session_lifecycle(GATEWAY), cfg.validation.max_body_bytes)


async def start_gateway(cfg: GatewayConfig, telemetry: Telemetry, listen: str | None = None) -> RunningComponent:
    """Start the gateway on ``listen`` (default ``cfg.listen``; port 0 picks a free port)."""
    return await start_component(build_gateway_app(cfg, telemetry), GATEWAY, ComponentKind.GATEWAY.value, listen)
