"""What the gateway and the firewall share: calling an upstream and relaying its answer.

:class:`Exchange` is one downstream request being served through an upstream. It owns

* the upstream headers (hop-by-hop dropped, ``traceparent`` injected as a child of the
  component's span and the correlation header set - or both stripped when
  ``propagate_trace`` is off);
* the downstream response, written chunk by chunk, with the socket write stamp of each chunk;
* the disconnect semantics: when the downstream goes away the upstream request is closed at once
  (``cancel_on_disconnect: true``), or the exchange keeps reading the upstream to its end with
  nobody to write to (``false``: the draft's "firewall still waiting");
* the per-attempt deadline of ``timeout_s`` (whole upstream exchange), after which the upstream
  connection is closed and the caller answers 504 - or cuts the stream if it had begun.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web

from deltatap.core.clock import mono_ns
from deltatap.core.vocab import Role, TapEvent
from deltatap.net.wire import StampingResponseHandler, UpstreamStamps, last_write_mono_ns, make_stamping_connector, upstream_stamps

from deltatap.stack.config import UpstreamPolicy
from deltatap.stack.openai import error_body
from deltatap.stack.spans import TRACE_HEADERS, ComponentSpan

HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer", "transfer-encoding", "upgrade"}
)
NOT_FORWARDED = HOP_BY_HOP | {"host", "content-length"}
NOT_RETURNED = HOP_BY_HOP | {"content-length", "content-encoding", "date", "server"}


def response_stamps(resp: aiohttp.ClientResponse) -> UpstreamStamps | None:
    """:func:`deltatap.wire.upstream_stamps`, also for a response whose connection aiohttp has
    already released (a small body read in full with the head): its protocol is still the one
    that read it, and nothing else can have used the connection before we return here."""
    up = upstream_stamps(resp)
    if up is None:
        proto = getattr(resp, "_protocol", None)
        if isinstance(proto, StampingResponseHandler):
            up = UpstreamStamps(proto)
    return up


class DownstreamGone(Exception):
    """The client went away and the exchange cancels (``cancel_on_disconnect: true``)."""


async def _on_body_chunk(session: Any, ctx: Any, params: Any) -> None:
    # runs synchronously just before aiohttp hands the chunk to the transport
    exchange = ctx.trace_request_ctx
    if isinstance(exchange, Exchange):
        exchange.body_sent_mono = mono_ns()


def make_session(policy: UpstreamPolicy) -> aiohttp.ClientSession:
    timeout = aiohttp.ClientTimeout(total=None, connect=policy.connect_timeout_s)
    trace = aiohttp.TraceConfig()
    trace.on_request_chunk_sent.append(_on_body_chunk)
    return aiohttp.ClientSession(
        connector=make_stamping_connector(limit=0, force_close=False),
        timeout=timeout,
        auto_decompress=False,
        skip_auto_headers=("User-Agent", "Accept-Encoding"),
        trace_configs=[trace],
    )


def upstream_headers(incoming: Any, span: ComponentSpan, policy: UpstreamPolicy, corr_header: str, rid: str) -> dict[str, str]:
    drop = NOT_FORWARDED | set(TRACE_HEADERS) | {corr_header.lower()}
    out = {k: v for k, v in incoming.items() if k.lower() not in drop}
    if policy.propagate_trace:
        span.inject(out)
        out[corr_header] = rid
    return out


class Exchange:
    """One request relayed to an upstream; see the module docstring."""

    def __init__(self, request: web.Request, span: ComponentSpan, policy: UpstreamPolicy, corr_header: str, rid: str) -> None:
        self.request, self.span, self.policy = request, span, policy
        self.corr_header, self.rid = corr_header, rid
        self.downstream: web.StreamResponse | None = None
        self.downstream_gone = False
        self.upstream: aiohttp.ClientResponse | None = None
        self.stamps: UpstreamStamps | None = None  # socket stamps of the upstream response
        self.body_sent_mono: int | None = None

    # ---- upstream ------------------------------------------------------------------------------
    async def open(self, session: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str]) -> aiohttp.ClientResponse:
        """POST upstream; stamps in.exit (last byte of the request written) from the socket - or,
        when no response head ever came (timeout, reset), from aiohttp's last body-chunk hook."""
        self.body_sent_mono = None
        try:
            resp = await session.request(self.request.method, url + self.request.path_qs, data=body, headers=headers, trace_request_ctx=self)
        except BaseException:
            if self.body_sent_mono is not None:
                self.span.stamp(Role.IN_EXIT, self.body_sent_mono, overwrite=True)
            raise
        self.upstream = resp
        self.stamps = response_stamps(resp)
        if self.stamps is not None and self.stamps.request_written_mono_ns is not None:
            self.span.stamp(Role.IN_EXIT, self.stamps.request_written_mono_ns, overwrite=True)
        return resp

    async def read_upstream(self) -> AsyncIterator[tuple[bytes, list[tuple[bytes, int]]]]:
        """The upstream body as it arrives: each chunk, and its pieces split at socket reads, each
        with the ``mono_ns`` of the read that delivered it."""
        assert self.upstream is not None
        consumed = 0
        async for chunk in self.upstream.content.iter_any():
            base, consumed = consumed, consumed + len(chunk)
            if self.stamps is None:
                yield chunk, [(chunk, mono_ns())]
            else:
                yield chunk, [(chunk[s - base : e - base], t) for s, e, t in self.stamps.slices(base, consumed)]

    def give_up(self, status: int, message: str, type_: str, code: str) -> tuple[int | None, web.StreamResponse]:
        """The upstream failed or timed out: close it, and answer ``status`` - or cut the
        downstream stream if it had begun, as a proxy does."""
        self.close_upstream()
        if self.downstream is not None:
            self.cut_downstream()
            return self.downstream.status, self.downstream
        return status, self.error_response(status, message, type_, code)

    def close_upstream(self) -> None:
        if self.upstream is not None:
            self.upstream.close()  # drops the connection: the upstream sees the disconnect

    # ---- downstream ----------------------------------------------------------------------------
    async def start_downstream(self, status: int, headers: Any) -> None:
        if self.downstream_gone or self.downstream is not None:
            return
        h = {k: v for k, v in headers.items() if k.lower() not in NOT_RETURNED}
        h[self.corr_header] = self.rid
        self.downstream = web.StreamResponse(status=status, headers=h)
        try:
            await self.downstream.prepare(self.request)
        except ConnectionResetError:
            self._gone()

    async def write(self, data: bytes) -> int | None:
        """Write ``data`` downstream; returns the socket write stamp, or None if the client is gone."""
        if self.downstream_gone or not data:
            return None
        assert self.downstream is not None
        try:
            await self.downstream.write(data)
        except ConnectionResetError:
            self._gone()
            return None
        return last_write_mono_ns(self.request) or mono_ns()

    async def end_downstream(self) -> None:
        if self.downstream is not None and not self.downstream_gone:
            try:
                await self.downstream.write_eof()
            except ConnectionResetError:
                self._gone()

    def cut_downstream(self) -> None:
        """Abort the downstream connection mid-stream (what a proxy does when its timeout fires)."""
        tr = self.request.transport
        if tr is not None:
            tr.abort()
        self.downstream_gone = True

    def _gone(self) -> None:
        if not self.downstream_gone:
            self.span.stamp(TapEvent.DOWNSTREAM_CLOSED, mono_ns())
        self.downstream_gone = True
        if self.policy.cancel_on_disconnect:
            self.close_upstream()
            raise DownstreamGone()

    @property
    def started(self) -> bool:
        return self.downstream is not None

    def error_response(self, status: int, message: str, type_: str, code: str) -> web.Response:
        return web.json_response(error_body(message, type_, code), status=status, headers={self.corr_header: self.rid})

    # ---- running with disconnect semantics -----------------------------------------------------
    async def guard(self, work: Callable[[], Awaitable[web.StreamResponse]], background: set[asyncio.Task]) -> web.StreamResponse:
        """Run ``work`` as its own task so a downstream disconnect (handler cancellation) either
        cancels it (closing the upstream) or leaves it draining the upstream to the end (kept in
        ``background``, which the app's cleanup cancels)."""
        task = asyncio.get_running_loop().create_task(work())
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if not task.done():
                if not self.downstream_gone:
                    self.span.stamp(TapEvent.DOWNSTREAM_CLOSED, mono_ns())
                self.downstream_gone = True
                if self.policy.cancel_on_disconnect:
                    task.cancel()
                    self.close_upstream()
                else:
                    background.add(task)
                    task.add_done_callback(background.discard)
            raise


def session_lifecycle(key: web.AppKey) -> Callable[[web.Application], AsyncIterator[None]]:
    """Cleanup context of an intermediary: its upstream session, and on shutdown the exchanges
    still draining an upstream (``state.background``)."""

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        st = app[key]
        st.session = make_session(st.cfg.upstream_policy)
        yield
        for task in list(st.background):
            task.cancel()
        if st.background:
            await asyncio.gather(*st.background, return_exceptions=True)
        await st.session.close()

    return lifecycle


def deadline_after(timeout_s: float | None) -> float | None:
    return None if timeout_s is None else asyncio.get_running_loop().time() + timeout_s
