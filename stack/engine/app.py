"""The reference engine's HTTP layer: OpenAI-compatible endpoints over the scheduler.

Points on the engine's span (``deltatap.stack.<name>``):

* ``queue`` (t6): the read that carried the request's first byte (the request has reached the
  engine; vLLM's arrival time);
* ``exec_start`` (t6a): start of the first scheduler step that computed it (model time);
* ``first_token`` (t7) / ``last_token`` (t8): streaming - when the chunk carrying the first / last
  content token was handed to the kernel; non-streaming, or tokens produced after the client left
  - the model time the token was produced;
* ``downstream.closed``: the client went away.

The ``gen_ai.latency.*`` attributes (seconds) are derived from the same points, as vLLM defines
them: time_in_queue t6a-t6, time_to_first_token t7-t6, time_in_model_prefill t7-t6a,
time_in_model_decode t8-t7, time_in_model_inference t8-t6a, e2e end-t6.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from aiohttp import web

from deltatap.core.clock import mono_ns
from deltatap.telemetry.tracer import Telemetry
from deltatap.core.vocab import Attr, ComponentKind, Outcome, Role, TapEvent
from deltatap.net.wire import last_write_mono_ns

from deltatap.stack.config import EngineConfig
from deltatap.stack.delays import DelaySampler
from deltatap.stack.engine.scheduler import Scheduler, Sequence, SeqState, block_hashes
from deltatap.stack.metrics import ComponentMetrics, counter, gauge
from deltatap.stack.openai import ENDPOINT_KINDS, RENDERERS, SSE_HEADERS, ApiError, DONE, GenRequest, parse_json, parse_request, usage
from deltatap.stack.server import RunningComponent, abandoned, component_app, reject, request_span, start_component
from deltatap.stack.spans import ComponentSpan
from deltatap.stack.tokens import TextGenerator, tokenize


class EngineState:
    def __init__(self, cfg: EngineConfig, telemetry: Telemetry) -> None:
        self.cfg = cfg
        self.name = cfg.name or ComponentKind.ENGINE.value
        self.telemetry = telemetry
        self.scheduler = Scheduler(cfg.scheduler)
        self.sampler = DelaySampler(cfg.seed)
        self.metrics = ComponentMetrics(self.name, ComponentKind.ENGINE.value, telemetry)
        self.metrics.add_collector(self._engine_metrics)
        self.tokens_after_disconnect = 0

    def _engine_metrics(self) -> Iterable:
        s, st, n = self.scheduler, self.scheduler.stats, self.name
        yield gauge("deltatap_stack_engine_waiting", "Sequences waiting", len(s.waiting), n)
        yield gauge("deltatap_stack_engine_running", "Sequences in the running batch", len(s.running), n)
        yield gauge("deltatap_stack_engine_kv_used_tokens", "KV cache tokens in use", s.kv_used, n)
        yield gauge("deltatap_stack_engine_kv_capacity_tokens", "KV cache capacity", self.cfg.scheduler.kv_capacity_tokens, n)
        yield counter("deltatap_stack_engine_steps", "Scheduler steps", st.steps, n)
        yield counter("deltatap_stack_engine_prefill_tokens", "Tokens prefilled", st.prefill_tokens, n)
        yield counter("deltatap_stack_engine_prefix_cache_hit_tokens", "Prompt tokens served by the prefix cache", st.cached_tokens, n)
        yield counter("deltatap_stack_engine_generated_tokens", "Output tokens generated", st.generated_tokens, n)
        yield counter("deltatap_stack_engine_preemptions", "Sequences preempted for KV space", st.preemptions, n)
        yield counter("deltatap_stack_engine_late_steps", "Steps that started late (event loop behind)", st.late_resets, n)
        yield counter(
            "deltatap_stack_engine_tokens_after_disconnect", "Tokens generated after the client went away", self.tokens_after_disconnect, n
        )


ENGINE = web.AppKey("deltatap_engine", EngineState)


class Job:
    """One request: its sequence, span and the writing of its response."""

    def __init__(self, st: EngineState, span: ComponentSpan, seq: Sequence, req: GenRequest, rid: str) -> None:
        self.st, self.span, self.seq, self.req, self.rid = st, span, seq, req, rid
        self.render = RENDERERS[req.kind](f"cmpl-{rid}", req.model)
        self.detached_at: int | None = None  # tokens generated when the client went away

    async def stream(self, request: web.Request) -> web.StreamResponse:
        st, seq, span = self.st, self.seq, self.span
        resp = web.StreamResponse(headers={**SSE_HEADERS, st.cfg.correlation_header: self.rid})
        await resp.prepare(request)
        start = self.render.start()
        if start:
            await resp.write(start)
        sent = 0
        while True:
            if sent >= len(seq.output) and not seq.done:
                await seq.wait()
            if sent < len(seq.output):
                await st.sampler.sleep(st.cfg.delays.outbound_first if sent == 0 else st.cfg.delays.outbound_chunk)
                n = len(seq.output)
                await resp.write(b"".join(self.render.token(t) for t in seq.output[sent:n]))
                t = last_write_mono_ns(request) or mono_ns()
                if sent == 0:
                    span.stamp(Role.FIRST_TOKEN, t)
                span.stamp(Role.LAST_TOKEN, t, overwrite=True)
                sent = n
            elif seq.done:
                break
        if seq.state is SeqState.ABORTED:  # engine shutting down: cut the stream
            self.finish(Outcome.UPSTREAM_ERROR, 200, "engine stopped")
            return resp
        tail = self.render.finish(seq.finish_reason or "length")
        if self.req.include_usage:
            tail += self.render.usage(self._usage())
        await resp.write(tail + DONE)
        await resp.write_eof()
        self.finish(Outcome.OK, 200)
        return resp

    async def whole(self, request: web.Request) -> web.StreamResponse:
        seq = self.seq
        while not seq.done:
            await seq.wait()
        if seq.state is SeqState.ABORTED:
            self.finish(Outcome.UPSTREAM_ERROR, 503, "engine stopped")
            return ApiError(503, "the engine stopped", "server_error").response()
        text = "".join(seq.output)
        resp = web.json_response(self.render.whole(text, seq.finish_reason or "length", self._usage()))
        resp.headers[self.st.cfg.correlation_header] = self.rid
        await resp.prepare(request)
        await resp.write_eof()
        self.finish(Outcome.OK, 200)
        return resp

    def _usage(self) -> dict:
        return usage(self.seq.prompt_tokens, len(self.seq.output), self.seq.cached_tokens)

    def disconnected(self) -> None:
        """The client went away: cancel, or keep generating and end the span when the sequence does."""
        self.span.stamp(TapEvent.DOWNSTREAM_CLOSED, mono_ns())
        self.detached_at = len(self.seq.output)
        if self.seq.done:
            self.finish(Outcome.CLIENT_CANCEL, None)
            return
        self.seq.on_finish.append(lambda _seq: self.finish(Outcome.CLIENT_CANCEL, None))
        if self.st.cfg.cancel_on_disconnect:
            self.st.scheduler.abort(self.seq)

    def finish(self, outcome: Outcome, status: int | None, error: str | None = None) -> None:
        if self.span.ended:
            return
        seq, span, st = self.seq, self.span, self.st
        end = mono_ns() if self.detached_at is None else (seq.finish_mono or mono_ns())
        if seq.exec_start_mono is not None:
            span.stamp(Role.EXEC_START, seq.exec_start_mono)
        if seq.first_token_mono is not None:
            span.stamp(Role.FIRST_TOKEN, seq.first_token_mono)
        if seq.last_token_mono is not None and (self.detached_at is not None or Role.LAST_TOKEN not in span.stamps):
            span.stamp(Role.LAST_TOKEN, max(seq.last_token_mono, span.stamps.get(Role.LAST_TOKEN, 0)), overwrite=True)
        after = len(seq.output) - self.detached_at if self.detached_at is not None else 0
        st.tokens_after_disconnect += after
        s = span.stamps
        t6, t6a, t7, t8 = s.get(Role.QUEUE), s.get(Role.EXEC_START), s.get(Role.FIRST_TOKEN), s.get(Role.LAST_TOKEN)
        sec = lambda a, b: (b - a) / 1e9 if a is not None and b is not None else None  # noqa: E731
        attrs = {
            Attr.GENAI_RESPONSE_MODEL: self.req.model,
            Attr.GENAI_RESPONSE_ID: self.render.base["id"],
            Attr.GENAI_INPUT_TOKENS: seq.prompt_tokens,
            Attr.GENAI_OUTPUT_TOKENS: len(seq.output),
            Attr.GENAI_FINISH_REASONS: [seq.finish_reason] if seq.finish_reason else None,
            Attr.ENGINE_PROMPT_N: seq.prompt_tokens,
            Attr.ENGINE_CACHE_N: seq.cached_tokens,
            Attr.ENGINE_PREDICTED_N: len(seq.output),
            Attr.ENGINE_PROMPT_MS: (t7 - t6a) / 1e6 if t7 and t6a else None,
            Attr.ENGINE_PREDICTED_MS: (t8 - t7) / 1e6 if t8 and t7 else None,
            Attr.ENGINE_PREEMPTIONS: seq.preemptions,
            Attr.ENGINE_BATCH_SIZE: seq.first_batch or None,
            Attr.ENGINE_TOKENS_AFTER_DISCONNECT: after if self.detached_at is not None else None,
            Attr.VLLM_TIME_IN_QUEUE: sec(t6, t6a),
            Attr.VLLM_TTFT: sec(t6, t7),
            Attr.VLLM_PREFILL: sec(t6a, t7),
            Attr.VLLM_DECODE: sec(t7, t8),
            Attr.VLLM_INFERENCE: sec(t6a, t8),
            Attr.VLLM_E2E: sec(t6, end),
        }
        for k, v in attrs.items():
            span.set(k, v)
        span.end(outcome, status, end, error)
        st.metrics.observe(outcome, status, (end - span.start_mono) / 1e9)


def _prepare(st: EngineState, kind: str, body: bytes, headers: Any = None) -> tuple[GenRequest, list[str], int]:
    headers = headers or {}
    req = parse_request(kind, parse_json(body))
    if req.model not in st.cfg.models:
        raise ApiError(404, f"The model {req.model!r} does not exist; served: {st.cfg.models}", "NotFoundError", "model_not_found")
    tokens = tokenize(req.text)
    if not tokens:
        raise ApiError(400, "the prompt is empty (no tokens)")
    max_tokens = req.max_tokens or st.cfg.default_max_tokens
    m = st.cfg.scheduler
    if m.policy == "priority":
        try:
            int(headers.get(m.priority_header, 0))
        except ValueError:
            raise ApiError(400, f"header {m.priority_header}: {headers.get(m.priority_header)!r} is not an integer priority") from None
    limit = min(m.max_model_len, m.kv_capacity_tokens)
    if len(tokens) + max_tokens > limit:
        raise ApiError(
            400,
            f"This model's maximum context length is {limit} tokens. However, you requested "
            f"{len(tokens) + max_tokens} tokens ({len(tokens)} in the messages, {max_tokens} in the completion).",
        )
    return req, tokens, max_tokens


def _handler(kind: str):
    async def generate(request: web.Request) -> web.StreamResponse:
        st = request.app[ENGINE]
        span, rid = request_span(
            request, st.telemetry, st.name, ComponentKind.ENGINE.value, st.cfg.correlation_header, Role.QUEUE,
            {Attr.GENAI_SYSTEM: "deltatap-ref", Attr.GENAI_OPERATION: "chat" if kind == "chat" else "text_completion"},
        )
        t_arrive = span.start_mono
        try:
            req, tokens, max_tokens = _prepare(st, kind, await request.read(), request.headers)
        except ApiError as err:
            return reject(span, st.metrics, err, t_arrive, {st.cfg.correlation_header: rid})
        except asyncio.CancelledError:
            abandoned(span)
            raise
        span.set(Attr.GENAI_REQUEST_MODEL, req.model)
        span.set(Attr.GENAI_REQUEST_MAX_TOKENS, max_tokens)
        span.set(Attr.STREAMING, req.stream)
        seq = Sequence(
            prompt_tokens=len(tokens),
            max_tokens=max_tokens,
            gen=TextGenerator(st.cfg.seed, req.seed, req.text),
            block_hashes=block_hashes(tokens, st.cfg.scheduler.prefix_block_tokens) if st.cfg.scheduler.prefix_cache else [],
            queue_mono=t_arrive,
            priority=int(request.headers.get(st.cfg.scheduler.priority_header, 0)) if st.cfg.scheduler.policy == "priority" else 0,
        )
        job = Job(st, span, seq, req, rid)
        try:
            await st.sampler.sleep(st.cfg.delays.inbound)
            st.scheduler.submit(seq)
            return await (job.stream(request) if req.stream else job.whole(request))
        except ConnectionResetError:
            job.disconnected()
            return web.Response(status=499)  # never sent: the client is gone
        except asyncio.CancelledError:
            job.disconnected()  # cancelled because the client went away (or the server stops)
            raise

    return generate


async def models(request: web.Request) -> web.Response:
    st = request.app[ENGINE]
    data = [{"id": m, "object": "model", "created": 0, "owned_by": "deltatap"} for m in st.cfg.models]
    return web.json_response({"object": "list", "data": data})


async def _scheduler_ctx(app: web.Application):
    st = app[ENGINE]
    st.scheduler.start()
    yield
    await st.scheduler.stop()


def build_engine_app(cfg: EngineConfig, telemetry: Telemetry) -> web.Application:
    st = EngineState(cfg, telemetry)
    posts = {path: _handler(kind) for path, kind in ENDPOINT_KINDS.items()}
    app = component_app(ENGINE, st, posts, _scheduler_ctx, 16 * 1024 * 1024)
    app.router.add_get("/v1/models", models)
    return app


async def start_engine(cfg: EngineConfig, telemetry: Telemetry, listen: str | None = None) -> RunningComponent:
    """Start the engine on ``listen`` (default ``cfg.listen``; port 0 picks a free port)."""
    return await start_component(build_engine_app(cfg, telemetry), ENGINE, ComponentKind.ENGINE.value, listen)


__all__ = ["ENGINE", "EngineState", "build_engine_app", "start_engine"]
