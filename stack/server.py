"""Serving a reference component: socket-stamping runner, lifecycle, and what tests get back.

Every component runs on :func:`deltatap.wire.make_stamping_runner` (so its ``in.arrive`` is the
read that carried the request's first byte, and ``last_write_mono_ns`` is when a chunk was handed
to the kernel) with ``handler_cancellation=True``: when a client goes away, the handler is
cancelled at its current await, which is how the engine notices a disconnect and how an
intermediary closes its own upstream request (the timeout cascade).
"""

from __future__ import annotations

import errno

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from deltatap.core.clock import mono_ns
from deltatap.telemetry.tracer import Telemetry
from deltatap.core.config import ConfigError
from deltatap.core.topology import parse_hostport
from deltatap.core.vocab import Attr, Outcome, Role, TapEvent
from deltatap.net.wire import make_stamping_runner, make_stamping_site, request_received_mono_ns

from deltatap.stack.metrics import ComponentMetrics
from deltatap.stack.openai import ApiError
from deltatap.stack.spans import ComponentSpan, request_id

log = logging.getLogger("deltatap.stack")


def arrival_mono(request: web.BaseRequest) -> int:
    """The socket-level arrival of ``request`` (first byte read); the handler's own time only if
    the runner does not stamp (never the case for servers built by :func:`serve`)."""
    t = request_received_mono_ns(request)
    return t if t is not None else mono_ns()



def request_span(
    request: web.BaseRequest,
    telemetry: Telemetry,
    component: str,
    kind: str,
    correlation_header: str,
    arrive_role: Role,
    attributes: dict[str, Any],
) -> tuple[ComponentSpan, str]:
    """The component's span for ``request``, started at its socket-level arrival and stamped there as
    ``arrive_role``, with the request id (correlation header, created if absent), method and path set;
    returns the span and the request id. ``span.start_mono`` is the arrival."""
    t = arrival_mono(request)
    rid = request_id(request.headers, correlation_header)
    attrs = {Attr.REQUEST_ID: rid, Attr.HTTP_METHOD: request.method, Attr.URL_PATH: request.path, **attributes}
    span = ComponentSpan(telemetry, component, kind, request.headers, t, attrs)
    span.stamp(arrive_role, t)
    return span, rid

@dataclass
class RunningComponent:
    """A started component. ``url`` is where it listens (port 0 resolved)."""

    name: str
    kind: str
    url: str
    runner: web.AppRunner
    app: web.Application
    telemetry: Telemetry | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    async def close(self) -> None:
        """Stop accepting, cancel in-flight handlers, run the app's cleanup (scheduler, sessions)."""
        await self.runner.cleanup()


async def serve(app: web.Application, listen: str, name: str, kind: str, telemetry: Telemetry | None) -> RunningComponent:
    host, port = parse_hostport(listen)
    runner = make_stamping_runner(app, handler_cancellation=True, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    site = make_stamping_site(runner, host, port, reuse_address=True)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        label = kind if name == kind else f"{kind} {name!r}"
        hint = " (in use? pick another with --listen, or --ephemeral for `stack all`)" if exc.errno == errno.EADDRINUSE else ""
        raise ConfigError(f"{label}: cannot listen on {listen}: {exc.strerror or exc}{hint}") from None
    bound = runner.addresses[0]
    url = f"http://{host if ':' not in host else f'[{host}]'}:{bound[1]}"
    log.info("%s %s listening on %s", kind, name, url)
    return RunningComponent(name=name, kind=kind, url=url, runner=runner, app=app, telemetry=telemetry)


async def health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def component_app(
    key: web.AppKey,
    state: Any,
    posts: dict[str, Handler],
    lifecycle: Callable[[web.Application], AsyncIterator[None]],
    client_max_size: int,
) -> web.Application:
    """An app holding a component's ``state`` (with ``.metrics``) under ``key``: its POST routes,
    ``/health``, ``/metrics`` and its lifecycle context (scheduler, client session)."""
    app = web.Application(client_max_size=client_max_size)
    app[key] = state
    app.cleanup_ctx.append(lifecycle)
    for path, handler in posts.items():
        app.router.add_post(path, handler)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", state.metrics.handler)
    return app


async def start_component(app: web.Application, key: web.AppKey, kind: str, listen: str | None) -> RunningComponent:
    """Serve a :func:`component_app` on ``listen`` (default: its config's ``listen``)."""
    st = app[key]
    rc = await serve(app, listen or st.cfg.listen, st.name, kind, st.telemetry)
    rc.extra["state"] = st
    return rc


def reject(span: ComponentSpan, metrics: ComponentMetrics, err: ApiError, t_arrive: int, headers: dict[str, str]) -> web.Response:
    """Answer a request the component refuses before any work (400/401/404/413/429...)."""
    span.end(Outcome.HTTP_ERROR, err.status, error=err.message)
    metrics.observe(Outcome.HTTP_ERROR, err.status, (mono_ns() - t_arrive) / 1e9)
    return err.response(headers)


def abandoned(span: ComponentSpan) -> None:
    """The client left while its request was still being read."""
    span.stamp(TapEvent.DOWNSTREAM_CLOSED, mono_ns())
    span.end(Outcome.CLIENT_CANCEL, None)
