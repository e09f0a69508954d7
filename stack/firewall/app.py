"""The reference AI firewall: inbound inspection before forwarding, outbound inspection of the
response (buffered / streaming / hybrid), allow / block / modify with a configured cost model.

Points on its span (``deltatap.stack.<name>``): ``in.arrive`` (t3, first byte read),
``in.decision`` (t4, inbound inspection done), ``in.exit`` (t5, last byte of the forwarded request
written), ``out.first_in`` (t9, read of the first content token from the upstream socket),
``out.first_out`` (t10, the release carrying it handed to the kernel), ``out.last_in`` /
``out.last_out``, ``timeout``, ``downstream.closed``. A non-streaming body counts as one token.
Attributes: ``deltatap.firewall.decision`` (inbound decision), ``deltatap.outcome`` ``refused``
when it blocked (inbound or outbound).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import Counter

from deltatap.core.clock import mono_ns
from deltatap.telemetry.tracer import Telemetry
from deltatap.core.vocab import Attr, ComponentKind, Outcome, Role, TapEvent
from deltatap.net.wire import last_write_mono_ns

from deltatap.stack.config import FirewallConfig
from deltatap.stack.delays import DelaySampler
from deltatap.stack.firewall.outbound import OutboundStream
from deltatap.stack.firewall.rules import Decision, RuleSet, Verdict, cost_ms
from deltatap.stack.forward import DownstreamGone, Exchange, session_lifecycle, upstream_headers
from deltatap.stack.metrics import ComponentMetrics
from deltatap.stack.openai import DONE, ENDPOINT_KINDS, RENDERERS, SSE_HEADERS, ApiError, GenRequest, error_body, parse_json, parse_request, usage
from deltatap.stack.server import RunningComponent, abandoned, component_app, reject, request_span, start_component
from deltatap.stack.tokens import count_tokens


class FirewallState:
    def __init__(self, cfg: FirewallConfig, telemetry: Telemetry) -> None:
        self.cfg = cfg
        self.name = cfg.name or ComponentKind.FIREWALL.value
        self.telemetry = telemetry
        self.inbound_rules = RuleSet(cfg.inbound.rules)
        self.outbound_rules = RuleSet(cfg.outbound.rules)
        self.sampler = DelaySampler(cfg.seed)
        self.metrics = ComponentMetrics(self.name, ComponentKind.FIREWALL.value, telemetry)
        self.decisions = Counter(
            "deltatap_stack_firewall_decisions",
            "Inspection decisions by direction",
            ["component", "direction", "decision"],
            registry=self.metrics.registry,
        )
        self.session: aiohttp.ClientSession | None = None
        self.background: set[asyncio.Task] = set()


FIREWALL = web.AppKey("deltatap_firewall", FirewallState)


def _modify_body(body: dict[str, Any], rules: RuleSet) -> dict[str, Any]:
    if isinstance(body.get("messages"), list):
        for m in body["messages"]:
            if isinstance(m, dict) and isinstance(m.get("content"), str):
                m["content"] = rules.modify(m["content"])
            elif isinstance(m, dict) and isinstance(m.get("content"), list):
                for part in m["content"]:
                    if isinstance(part, dict) and isinstance(part.get("text"), str):
                        part["text"] = rules.modify(part["text"])
    elif isinstance(body.get("prompt"), str):
        body["prompt"] = rules.modify(body["prompt"])
    elif isinstance(body.get("prompt"), list):
        body["prompt"] = [rules.modify(p) if isinstance(p, str) else p for p in body["prompt"]]
    return body


class Relay:
    def __init__(self, st: FirewallState, ex: Exchange, req: GenRequest, body: dict[str, Any], raw: bytes, t_arrive: int) -> None:
        self.st, self.ex, self.req, self.body, self.raw, self.t_arrive = st, ex, req, body, raw, t_arrive
        self.refused = False

    async def run(self) -> web.StreamResponse:
        st, ex, span = self.st, self.ex, self.ex.span
        policy = st.cfg.upstream_policy
        outcome, status, error = Outcome.OK, None, None
        try:
            verdict = await self._inbound()
            if verdict.decision.blocks:
                resp = await self._block(f"inbound {verdict.decision}: {','.join(verdict.rules)}")
                status = resp.status
                return resp
            data = self.raw
            if verdict.decision in (Decision.MODIFY, Decision.ALLOW_AFTER_ANALYSIS) and verdict.rules:
                data = json.dumps(_modify_body(self.body, st.inbound_rules)).encode()
            await st.sampler.sleep(st.cfg.delays.inbound)
            headers = upstream_headers(ex.request.headers, span, policy, st.cfg.correlation_header, ex.rid)
            headers["Content-Type"] = "application/json"
            try:
                async with asyncio.timeout(policy.timeout_s):
                    resp = await ex.open(st.session, st.cfg.upstream, data, headers)
                    status = resp.status
                    if resp.headers.get("Content-Type", "").startswith("text/event-stream"):
                        await ex.start_downstream(resp.status, resp.headers)
                        await self._relay_stream(resp)
                        await ex.end_downstream()
                    else:
                        status = await self._relay_whole(resp)
            except TimeoutError:
                span.stamp(TapEvent.TIMEOUT, mono_ns())
                raise
            if self.refused:
                outcome = Outcome.REFUSED
            elif status is not None and status >= 400:
                outcome = Outcome.HTTP_ERROR
            return ex.downstream or web.Response(status=499)
        except TimeoutError:
            outcome, error = Outcome.TIMEOUT, f"upstream timeout after {policy.timeout_s} s"
            status, resp = ex.give_up(504, error, "timeout", "upstream_timeout")
            return resp
        except (aiohttp.ClientError, OSError) as exc:
            outcome, error = Outcome.UPSTREAM_ERROR, f"{type(exc).__name__}: {exc}"
            status, resp = ex.give_up(502, f"upstream failed: {error}", "upstream_error", "bad_gateway")
            return resp
        except DownstreamGone:
            outcome, error = Outcome.CLIENT_CANCEL, "client closed the connection"
            return web.Response(status=499)
        except asyncio.CancelledError:
            outcome, error = Outcome.CLIENT_CANCEL, "client closed the connection"
            raise
        finally:
            if self.refused and outcome is Outcome.OK:
                outcome = Outcome.REFUSED
            if ex.downstream_gone and outcome is Outcome.OK:  # drained the upstream for nobody
                outcome, error = Outcome.CLIENT_CANCEL, "client closed the connection"
            span.end(outcome, status, error=None if outcome in (Outcome.OK, Outcome.REFUSED) else error)
            st.metrics.observe(outcome, status, (mono_ns() - self.t_arrive) / 1e9)

    async def _inbound(self) -> Verdict:
        st, span = self.st, self.ex.span
        cfg = st.cfg.inbound
        verdict = Verdict(Decision.ALLOW)
        if cfg.enabled:
            tokens = count_tokens(self.req.text)
            verdict = st.inbound_rules.scan(self.req.text)
            ms = cost_ms(cfg.cost, tokens, verdict, st.sampler)
            span.set(Attr.FIREWALL_INBOUND_MS, round(ms, 3))
            await st.sampler.sleep_ms(ms)
        span.stamp(Role.IN_DECISION, mono_ns())
        span.set(Attr.FIREWALL_DECISION, verdict.decision.value)
        st.decisions.labels(st.name, "inbound", verdict.decision.value).inc()
        return verdict

    async def _block(self, cause: str) -> web.StreamResponse:
        """Answer a block like real firewalls: 403 JSON, or a 200 refusal in the request's format."""
        st, ex, span, req = self.st, self.ex, self.ex.span, self.req
        self.refused = True
        span.set(Attr.ERROR_CAUSE, cause)
        block = st.cfg.block
        request = ex.request
        if block.style == "error_403":
            resp: web.StreamResponse = web.json_response(
                error_body(block.message, "content_policy_violation", "content_filter"),
                status=403,
                headers={st.cfg.correlation_header: ex.rid},
            )
            await resp.prepare(request)
            await resp.write_eof()
            return resp
        r = RENDERERS[req.kind](f"fw-{ex.rid}", req.model)
        u = usage(count_tokens(req.text), count_tokens(block.message))
        if req.stream:
            resp = web.StreamResponse(headers={**SSE_HEADERS, st.cfg.correlation_header: ex.rid})
            await resp.prepare(request)
            await resp.write(r.start() + r.token(block.message))
            t = last_write_mono_ns(request) or mono_ns()
            span.stamp(Role.OUT_FIRST_OUT, t)
            span.stamp(Role.OUT_LAST_OUT, t)
            await resp.write(r.finish("stop") + (r.usage(u) if req.include_usage else b"") + DONE)
            await resp.write_eof()
            return resp
        resp = web.json_response(r.whole(block.message, "stop", u), headers={st.cfg.correlation_header: ex.rid})
        await resp.prepare(request)
        await resp.write_eof()
        t = last_write_mono_ns(request) or mono_ns()
        span.stamp(Role.OUT_FIRST_OUT, t)
        span.stamp(Role.OUT_LAST_OUT, t)
        return resp

    async def _relay_stream(self, resp: aiohttp.ClientResponse) -> None:
        st, ex, span = self.st, self.ex, self.ex.span
        out = OutboundStream(st.cfg.outbound, st.outbound_rules, st.sampler, ex.request.path)
        async for _chunk, pieces in ex.read_upstream():
            for piece, t in pieces:
                out.feed(piece, t)
            await self._release(out, end=False)
            if out.blocked:
                break
        if not out.blocked:
            out.finish(mono_ns())
            await self._release(out, end=True)
        if out.blocked:
            self.refused = True
            ex.close_upstream()
            span.set(Attr.ERROR_CAUSE, f"outbound {out.verdict.decision}: {','.join(out.verdict.rules)}")
        if out.first_in is not None:
            span.stamp(Role.OUT_FIRST_IN, out.first_in)
        if out.last_in is not None:
            span.stamp(Role.OUT_LAST_IN, out.last_in, overwrite=True)
        span.set(Attr.STREAM_FORMAT, out.format)
        span.set(Attr.CONTENT_EVENTS, out.content_events)
        span.set(Attr.GENAI_INPUT_TOKENS, out.facts.input_tokens)
        span.set(Attr.GENAI_OUTPUT_TOKENS, out.facts.output_tokens)
        span.set(Attr.FIREWALL_OUTBOUND_CHECKS, out.checks)
        span.set(Attr.FIREWALL_OUTBOUND_MS, round(out.inspect_ms, 3))
        span.set(Attr.FIREWALL_OUTBOUND_DECISION, out.verdict.decision.value)
        st.decisions.labels(st.name, "outbound", out.verdict.decision.value).inc()

    async def _release(self, out: OutboundStream, end: bool) -> None:
        span, delays = self.ex.span, self.st.cfg.delays
        while out.ready(end):
            data, content = await out.release()
            first = content and out.first_in is not None and Role.OUT_FIRST_OUT not in span.stamps
            if first:
                await self.st.sampler.sleep(delays.outbound_first)
            elif content:
                await self.st.sampler.sleep(delays.outbound_chunk)
            t = await self.ex.write(data)
            if t is not None and first:
                span.stamp(Role.OUT_FIRST_OUT, t)
            if t is not None and content:
                span.stamp(Role.OUT_LAST_OUT, t, overwrite=True)

    async def _relay_whole(self, resp: aiohttp.ClientResponse) -> int:
        """A non-streaming answer: read it all, inspect its text, then release or block it."""
        st, ex, span = self.st, self.ex, self.ex.span
        body = await resp.read()
        up = ex.stamps
        t_last = (up.arrival_mono_ns(len(body)) if up else None) or mono_ns()
        t_first = (up.arrival_mono_ns(1) if up and body else None) or t_last
        span.stamp(Role.OUT_FIRST_IN, t_first)
        span.stamp(Role.OUT_LAST_IN, t_last)
        cfg = st.cfg.outbound
        if cfg.enabled and resp.status < 400:
            text = _response_text(body)
            verdict = st.outbound_rules.scan(text)
            ms = cost_ms(cfg.cost, count_tokens(text), verdict, st.sampler)
            span.set(Attr.FIREWALL_OUTBOUND_MS, round(ms, 3))
            span.set(Attr.FIREWALL_OUTBOUND_CHECKS, 1)
            span.set(Attr.FIREWALL_OUTBOUND_DECISION, verdict.decision.value)
            await st.sampler.sleep_ms(ms)
            st.decisions.labels(st.name, "outbound", verdict.decision.value).inc()
            if verdict.decision.blocks:
                ex.close_upstream()
                blocked = await self._block(f"outbound {verdict.decision}: {','.join(verdict.rules)}")
                ex.downstream = blocked
                return blocked.status
        await st.sampler.sleep(st.cfg.delays.outbound_first)
        await ex.start_downstream(resp.status, resp.headers)
        t = await ex.write(body)
        await ex.end_downstream()
        if t is not None:
            span.stamp(Role.OUT_FIRST_OUT, t)
            span.stamp(Role.OUT_LAST_OUT, t)
        return resp.status


def _response_text(body: bytes) -> str:
    try:
        obj = json.loads(body)
    except ValueError:
        return body.decode("utf-8", "replace")
    parts = []
    for ch in obj.get("choices") or () if isinstance(obj, dict) else ():
        msg = ch.get("message") if isinstance(ch, dict) else None
        if isinstance(msg, dict) and isinstance(msg.get("content"), str):
            parts.append(msg["content"])
        elif isinstance(ch, dict) and isinstance(ch.get("text"), str):
            parts.append(ch["text"])
    return "\n".join(parts)


async def handle(request: web.Request) -> web.StreamResponse:
    st = request.app[FIREWALL]
    cfg = st.cfg
    span, rid = request_span(
        request, st.telemetry, st.name, ComponentKind.FIREWALL.value, cfg.correlation_header, Role.IN_ARRIVE,
        {Attr.TIMEOUT_S: cfg.upstream_policy.timeout_s},
    )
    t3 = span.start_mono
    try:
        raw = await request.read()
        body = parse_json(raw)
        req = parse_request(ENDPOINT_KINDS[request.path], body)
    except ApiError as err:
        return reject(span, st.metrics, err, t3, {cfg.correlation_header: rid})
    except asyncio.CancelledError:
        abandoned(span)
        raise
    span.set(Attr.GENAI_REQUEST_MODEL, req.model)
    span.set(Attr.STREAMING, req.stream)
    ex = Exchange(request, span, cfg.upstream_policy, cfg.correlation_header, rid)
    return await ex.guard(Relay(st, ex, req, body, raw, t3).run, st.background)


def build_firewall_app(cfg: FirewallConfig, telemetry: Telemetry) -> web.Application:
    st = FirewallState(cfg, telemetry)
    return component_app(FIREWALL, st, dict.fromkeys(ENDPOINT_KINDS, handle), session_lifecycle(FIREWALL), 16 * 1024 * 1024)


async def start_firewall(cfg: FirewallConfig, telemetry: Telemetry, listen: str | None = None) -> RunningComponent:
    """Start the firewall on ``listen`` (default ``cfg.listen``; port 0 picks a free port)."""
    return await start_component(build_firewall_app(cfg, telemetry), FIREWALL, ComponentKind.FIREWALL.value, listen)
