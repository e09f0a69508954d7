"""One request over HTTP: build the body, send, read the SSE stream with socket-level stamps.

Requests go through :mod:`deltatap.loadgen.h1client` (a keep-alive pool on deltatap.net.conn's stamped
protocols and deltatap.net.h1's framing): every read and write stamp is taken at the socket (the kernel's
where it gives them), so a busy event loop delays our *processing* of a chunk, never its timestamp; the
stream's payload slices reach :class:`~deltatap.loadgen.stream.ClientStream` in the read callback itself.
The only stamp taken in this module is ``send_mono_ns``, immediately before the request is written (no
await in between; on a timed send the runner takes it, and writes, in the send clock's callback). Failures never raise out of :func:`execute`: they become the record's ``status`` /
``error_kind``. ``GET /v1/models`` (:func:`list_models`, not on the request path) uses aiohttp.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from deltatap.core.clock import mono_ns
from deltatap.core.vocab import DEFAULT_CORRELATION_HEADER, ClientEvent, Outcome
from deltatap.loadgen.h1client import BODY_LIMIT, ConnectFailed, Exchange, H1Pool, cannot_connect, connect_reason
from deltatap.loadgen.records import ErrorKind, RequestRecord
from deltatap.loadgen.stream import ClientStream
from deltatap.net.h1 import Head
from deltatap.net.wire import request_written_bound

ERROR_BODY_LIMIT = BODY_LIMIT
SERVER_MESSAGE_LIMIT = 200  # characters of a non-2xx body kept as the record's server_message
REFUSAL_FINISH_REASONS = frozenset({"content_filter"})


@dataclass(frozen=True)
class Endpoint:
    name: str
    path: str
    stream_format: str
    build: Callable[[str, str | None, list[dict[str, str]], str, int], dict[str, Any]]


def _chat_body(model: str, system: str | None, history: list[dict[str, str]], prompt: str, max_tokens: int) -> dict[str, Any]:
    messages = ([{"role": "system", "content": system}] if system else []) + history + [{"role": "user", "content": prompt}]
    return {"model": model, "messages": messages, "max_tokens": max_tokens}


def _completions_body(model: str, system: str | None, history: list[dict[str, str]], prompt: str, max_tokens: int) -> dict[str, Any]:
    parts = ([system] if system else []) + [f"{m['role']}: {m['content']}" for m in history] + [prompt]
    return {"model": model, "prompt": "\n\n".join(parts), "max_tokens": max_tokens}


ENDPOINTS: dict[str, Endpoint] = {
    "chat": Endpoint("chat", "/v1/chat/completions", "openai-chat", _chat_body),
    "completions": Endpoint("completions", "/v1/completions", "openai-completions", _completions_body),
}


@dataclass
class Target:
    """Where and how requests go. ``url`` is the full endpoint URL."""

    url: str
    endpoint: Endpoint
    model: str = "default"
    headers: dict[str, str] = field(default_factory=dict)  # extra headers on every request
    timeout_s: float = 600.0
    refusal_statuses: frozenset[int] = frozenset({403, 451})
    ignore_eos: bool = False
    correlation_header: str = DEFAULT_CORRELATION_HEADER

    def body(self, system: str | None, history: list[dict[str, str]], prompt: str, max_tokens: int) -> bytes:
        obj = self.endpoint.build(self.model, system, history, prompt, max_tokens)
        obj.update(stream=True, stream_options={"include_usage": True}, temperature=0.0)
        if self.ignore_eos:
            obj["ignore_eos"] = True
        return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()

    def header_names(self) -> tuple[str, ...]:
        return ("Content-Type", "Accept", self.correlation_header, "traceparent", *self.headers)

    def new_stream(self, head: Head) -> ClientStream | None:
        """The parser for a response with this head: an event stream's (a 2xx with ``text/event-stream``), else None."""
        if head.status >= 400:
            return None
        ctype = head.get(b"content-type")
        if ctype is None or b"text/event-stream" not in ctype:
            return None
        return ClientStream(path=None, format=self.endpoint.stream_format)

    def request_headers(self, rec: RequestRecord, traceparent: str) -> dict[str, str]:
        h = {
            "Content-Type": "application/json",
            "Accept": "text/event-stream",
            self.correlation_header: rec.request_id,
            "traceparent": traceparent,
        }
        h.update(self.headers)
        return h


def check_http_url(value: str, flag: str) -> None:
    """An http:// or https:// URL with a host and a valid port, without user:password@ (the load generator sends no
    credentials from a URL: use --header Authorization:...). Raises ValueError naming ``flag``."""
    if not value.startswith(("http://", "https://")):
        raise ValueError(f"{flag} {value!r}: expected an http:// or https:// URL")
    try:
        parts = urlsplit(value)
        parts.port  # (a port past 65535 or not a number raises here)
    except ValueError as exc:
        raise ValueError(f"{flag} {value!r}: not a URL ({exc})") from None
    if not parts.hostname:
        raise ValueError(f"{flag} {value!r}: no host; e.g. http://127.0.0.1:9100")
    if "@" in parts.netloc:
        raise ValueError(f"{flag}: {parts.scheme}://{parts.netloc.rpartition('@')[2]} with user:password@ is not sent as "
                         f"credentials; give --header Authorization:... instead")


def resolve_url(target: str, endpoint: str) -> tuple[str, Endpoint]:
    """``--target`` may be a base URL (the endpoint's path is appended) or a full URL with a path."""
    try:
        ep = ENDPOINTS[endpoint]
    except KeyError:
        raise ValueError(f"--endpoint {endpoint!r}: choose one of {', '.join(ENDPOINTS)}") from None
    check_http_url(target, "--target")
    rest = target.split("://", 1)[1]
    path = rest[rest.find("/") :] if "/" in rest else ""
    if path in ("", "/"):
        return target.rstrip("/") + ep.path, ep
    return target, ep


def models_url(url: str) -> str:
    """The target's ``GET /v1/models`` URL: the part before ``/v1/`` (a base URL or an OpenAI-style
    endpoint URL under a prefix), else the URL's origin."""
    if "/v1/" in url:
        return url.split("/v1/", 1)[0] + "/v1/models"
    scheme, _, rest = url.partition("://")
    return f"{scheme}://{rest.split('/', 1)[0]}/v1/models"


async def list_models(url: str, headers: dict[str, str] | None = None, timeout_s: float = 10.0) -> list[str]:
    """Model ids the target lists at ``GET /v1/models`` (OpenAI ``{"data": [{"id": ...}]}``), in its
    order. Raises :class:`ModelListError` with a one-line reason when it cannot get them."""
    murl = models_url(url)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    try:
        async with aiohttp.ClientSession(timeout=timeout) as s, s.get(murl, headers=headers or {}) as resp:
            raw = await resp.content.read(ERROR_BODY_LIMIT)
            if resp.status >= 400:
                msg = server_message(raw)
                raise ModelListError(f"GET {murl}: HTTP {resp.status}" + (f": {msg}" if msg else ""))
    except aiohttp.ClientConnectorError as exc:
        raise ModelListError(f"GET {murl}: {connect_error(exc)}") from None
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
        raise ModelListError(f"GET {murl}: {type(exc).__name__} {exc}".strip()) from None
    try:
        data = json.loads(raw)["data"]
        ids = [str(m["id"]) for m in data if isinstance(m, dict) and m.get("id")]
    except (ValueError, KeyError, TypeError):
        raise ModelListError(f"GET {murl}: not an OpenAI model list") from None
    if not ids:
        raise ModelListError(f"GET {murl}: lists no model")
    return ids


class ModelListError(Exception):
    """``GET /v1/models`` failed or listed nothing; the message says why, in one line."""


def server_message(raw: bytes, limit: int = SERVER_MESSAGE_LIMIT) -> str | None:
    """The server's own message in an error body: OpenAI-style ``{"error": {"message": ...}}`` (or
    ``{"error": "..."}``, ``{"message": ...}``, ``{"detail": ...}``), else the first ``limit`` characters of
    the text, whitespace collapsed; None for an empty body."""
    text = raw.decode("utf-8", "replace").strip()
    if not text:
        return None
    msg: Any = None
    try:
        obj = json.loads(text)
    except ValueError:
        obj = None
    if isinstance(obj, dict):
        err = obj.get("error")
        if isinstance(err, dict):
            msg = err.get("message") or err.get("msg")
        elif isinstance(err, str):
            msg = err
        if not msg:
            msg = obj.get("message") or obj.get("detail")
    if not isinstance(msg, str) or not msg.strip():
        msg = text
    msg = " ".join(msg.split())
    return msg if len(msg) <= limit else msg[: limit - 3].rstrip() + "..."


def connect_error(exc: aiohttp.ClientConnectorError) -> str:
    """``cannot connect to HOST:PORT (why)``, the why in a few plain words (connection refused, ...)."""
    if isinstance(exc, getattr(aiohttp, "ClientConnectorDNSError", ())):
        why = "host name not found"
    else:
        why = connect_reason(getattr(exc, "os_error", None) or exc)
    return cannot_connect(exc.host or "", exc.port or 0, why)


def make_session(target: Target) -> H1Pool:
    """One connection pool per worker (unlimited keep-alive connections on deltatap.net.conn's stamped
    protocols, loadgen/h1client.py); no cookies, so no request is shaped by an earlier response
    (methodology 4.2.5, request isolation)."""
    return H1Pool(target.url, connect_timeout=min(target.timeout_s, 10.0), header_names=target.header_names())


class _Deadline:
    """What ``asyncio.timeout(delay_s)`` does around one exchange, without its context manager's steps: one loop
    timer that cancels the task when the time is up; :meth:`timed_out` says, for a cancel the task received, whether
    it was this one (and takes it back, as ``asyncio.timeout`` does before raising TimeoutError)."""

    __slots__ = ("task", "handle", "expired", "cancelling")

    def __init__(self, delay_s: float) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.task = task
        self.expired = False
        self.cancelling = task.cancelling()
        self.handle = task.get_loop().call_later(delay_s, self._expire)

    def _expire(self) -> None:
        self.expired = True
        self.task.cancel()

    def timed_out(self) -> bool:
        return self.expired and self.task.uncancel() <= self.cancelling


def _fail(rec: RequestRecord, status: Outcome, kind: str, message: str) -> None:
    rec.status = status
    rec.error_kind = kind
    rec.error = message[:300]


def prepare(session: H1Pool, target: Target, body: bytes, headers: dict[str, str]) -> tuple[Exchange, bytes]:
    """The exchange and the serialised request, made before the send instant so that the send only writes."""
    return Exchange(target.new_stream), session.serialise(headers, body)


async def execute(session: H1Pool, target: Target, rec: RequestRecord, body: bytes, headers: dict[str, str],
                  prepared: tuple[Exchange, bytes] | None = None, started: Any = None, retried: bool = False) -> ClientStream | None:
    """Send one request and fill ``rec``; returns the parsed stream (None if there was none). ``prepared``:
    :func:`prepare`'s result; ``started``: the connection :meth:`H1Pool.start_now` already wrote it on (with
    ``rec.send_mono_ns`` stamped just before that write); else the send is stamped and written here. ``retried``:
    the one retry of a request whose reused connection the server had closed (:meth:`H1Pool.exchange`)."""
    ex, data = prepared if prepared is not None else prepare(session, target, body, headers)
    ex.on_end = None  # (awaited here)
    if rec.send_mono_ns is None:
        rec.send_mono_ns = mono_ns()
    deadline = _Deadline(target.timeout_s)
    try:
        await session.exchange(ex, data, started=started, retried=retried)
    except asyncio.CancelledError:
        if deadline.timed_out():
            fail_unfinished(rec, ex, target, timed_out=True)
            return ex.sink  # type: ignore[return-value]
        fail_unfinished(rec, ex, target, timed_out=False)
        raise
    except ConnectFailed as exc:
        rec.end_mono_ns = mono_ns()
        _fail(rec, Outcome.UPSTREAM_ERROR, ErrorKind.UNREACHABLE, str(exc))
        return None
    finally:
        deadline.handle.cancel()
    return settle(rec, ex, target)


def fail_unfinished(rec: RequestRecord, ex: Exchange, target: Target, timed_out: bool) -> None:
    """``rec`` of an exchange that did not end: its time ran out (``--request-timeout``) or the run ended first (what
    its head and stream had got so far is kept)."""
    rec.end_mono_ns = mono_ns()
    _head(rec, ex)
    if timed_out:
        _fail(rec, Outcome.TIMEOUT, ErrorKind.TIMEOUT, f"no complete answer within {target.timeout_s:g} s")
    else:
        _fail(rec, Outcome.CLIENT_CANCEL, ErrorKind.CANCELLED, "the run ended before the response did")
    _take_stream(rec, ex.sink)  # type: ignore[arg-type]


def settle(rec: RequestRecord, ex: Exchange, target: Target) -> ClientStream | None:
    """Fill ``rec`` from an exchange that ended (its response complete, or the connection's end or error); returns the
    parsed stream (None if there was none)."""
    stream: ClientStream | None = ex.sink  # type: ignore[assignment]
    _head(rec, ex)
    if ex.error is not None:
        rec.end_mono_ns = mono_ns()
        _fail(rec, Outcome.UPSTREAM_ERROR, ErrorKind.DISCONNECTED, ex.error)
        _take_stream(rec, stream)
        return stream
    status = ex.head.status if ex.head is not None else 0  # (ex.status, without the property's step)
    if status >= 400:
        rec.end_mono_ns = mono_ns()
        rec.server_message = server_message(ex.body)
        if status in target.refusal_statuses:
            _fail(rec, Outcome.REFUSED, ErrorKind.REFUSED, f"HTTP {status} (refusal status)")
        else:
            _fail(rec, Outcome.HTTP_ERROR, ErrorKind.HTTP_STATUS, f"HTTP {status} {ex.head.reason.decode('latin-1') if ex.head else ''}".strip())
        return None
    if stream is None:
        rec.end_mono_ns = mono_ns()
        ctype = ex.header(b"content-type")
        _fail(rec, Outcome.UPSTREAM_ERROR, ErrorKind.NON_SSE, f"HTTP {status} with Content-Type {ctype or 'none'!r}, not an event stream")
        return None
    if ex.last_mono_ns is not None:
        t_end, bound = ex.last_mono_ns, ex.last_bound_ns
    else:
        t_end, bound = mono_ns(), 0
    stream.finish(t_end, bound)
    rec.end_mono_ns = t_end
    _take_stream(rec, stream)
    if rec.status == Outcome.OK:
        _judge_stream(rec, stream)
    return stream


def _head(rec: RequestRecord, ex: Exchange) -> None:
    """The response head's stamps, and the request's written point with its bound, once the head came."""
    if ex.head is None:
        return
    rec.headers_mono_ns = ex.head_mono_ns
    rec.written_mono_ns = ex.written_mono_ns
    rec.stamp_bounds[ClientEvent.SEND] = (0, request_written_bound(ex.written_mono_ns, ex.written_bound_ns, ex.head_mono_ns))
    rec.http_status = ex.head.status


def _take_stream(rec: RequestRecord, stream: ClientStream | None) -> None:
    if stream is None:
        return
    rec.stream_format = stream.format
    rec.transport_chunks = stream.chunks
    rec.sse_events = stream.events
    rec.content_events = len(stream.event_times)
    rec.malformed_events = stream.malformed
    rec.leading_whitespace_events = stream.leading_whitespace_events
    rec.chunk_mono_ns = stream.event_times
    rec.first_token_mono_ns = stream.first_token_mono_ns
    rec.last_token_mono_ns = stream.event_times[-1] if stream.event_times else None
    if stream.first_token_mono_ns is not None:
        rec.stamp_bounds[ClientEvent.FIRST_TOKEN] = (stream.first_token_bound_ns, 0)
        rec.stamp_bounds[ClientEvent.LAST_TOKEN] = (stream.last_token_bound_ns, 0)
    rec.usage_input_tokens = stream.facts.input_tokens
    rec.usage_output_tokens = stream.facts.output_tokens
    rec.finish_reason = ",".join(stream.facts.finish_reasons) or None
    rec.output_text = stream.text


def _judge_stream(rec: RequestRecord, stream: ClientStream) -> None:
    facts = stream.facts
    if REFUSAL_FINISH_REASONS.intersection(facts.finish_reasons):
        _fail(rec, Outcome.REFUSED, ErrorKind.REFUSED, "finish_reason content_filter")
    elif facts.error:
        _fail(rec, Outcome.UPSTREAM_ERROR, ErrorKind.STREAM_ERROR, f"error event in the stream ({facts.error})")
    elif stream.events == 0 or (stream.malformed and not stream.event_times):
        _fail(rec, Outcome.UPSTREAM_ERROR, ErrorKind.MALFORMED_SSE, f"{stream.events} SSE events, {stream.malformed} malformed, no content")
    elif not stream.done and not facts.finish_reasons:
        _fail(rec, Outcome.UPSTREAM_ERROR, ErrorKind.TRUNCATED, "the stream ended without [DONE] or a finish reason")
    elif stream.malformed:
        rec.error_kind = ErrorKind.MALFORMED_SSE  # counted, but the request still produced its answer
        rec.error = f"{stream.malformed} malformed SSE events ignored"
