"""One request over HTTP: build the body, send, read the SSE stream with socket-level stamps.

Every stamp comes from :mod:`deltatap.net.wire`'s stamping connector (taken in the connection's
``data_received`` / ``write``), so a busy event loop delays our *processing* of a chunk, never its
timestamp. The only stamp taken in this module is ``send_mono_ns``, immediately before the request
call (no await in between). Failures never raise out of :func:`execute`: they become the record's
``status`` / ``error_kind``.
"""

from __future__ import annotations

import asyncio
import errno as _errno
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from deltatap.core.clock import mono_ns
from deltatap.core.vocab import DEFAULT_CORRELATION_HEADER, ClientEvent, Outcome
from deltatap.net.wire import make_stamping_connector, upstream_stamps
from deltatap.loadgen.records import ErrorKind, RequestRecord
from deltatap.loadgen.stream import ClientStream

ERROR_BODY_LIMIT = 64 * 1024
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

    def request_headers(self, rec: RequestRecord, traceparent: str) -> dict[str, str]:
        h = {
            "Content-Type": "application/json",
            "Accept": "text/event-stream",
            self.correlation_header: rec.request_id,
            "traceparent": traceparent,
        }
        h.update(self.headers)
        return h


def resolve_url(target: str, endpoint: str) -> tuple[str, Endpoint]:
    """``--target`` may be a base URL (the endpoint's path is appended) or a full URL with a path."""
    try:
        ep = ENDPOINTS[endpoint]
    except KeyError:
        raise ValueError(f"--endpoint {endpoint!r}: choose one of {', '.join(ENDPOINTS)}") from None
    if not target.startswith(("http://", "https://")):
        raise ValueError(f"--target {target!r}: expected an http:// or https:// URL")
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
    os_err = getattr(exc, "os_error", None)
    code = getattr(os_err, "errno", None)
    if isinstance(exc, getattr(aiohttp, "ClientConnectorDNSError", ())) or code in (-2, -3, -5, -8):
        why = "host name not found"
    elif code == _errno.ECONNREFUSED:
        why = "connection refused"
    elif isinstance(code, int) and code > 0:
        why = os.strerror(code).lower()
    else:
        why = str(os_err or exc) or type(exc).__name__
    host = exc.host if ":" not in (exc.host or "") else f"[{exc.host}]"
    return f"cannot connect to {host}:{exc.port} ({why})"


def make_session(target: Target) -> aiohttp.ClientSession:
    """One session per worker: its own connection pool (unlimited), stamping every read and write; no
    cookie jar, so no request is shaped by an earlier response (methodology 4.2.5, request isolation)."""
    connector = make_stamping_connector(limit=0, force_close=False, enable_cleanup_closed=False)
    timeout = aiohttp.ClientTimeout(total=target.timeout_s, sock_connect=min(target.timeout_s, 10.0))
    return aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=False, cookie_jar=aiohttp.DummyCookieJar())


def _fail(rec: RequestRecord, status: Outcome, kind: str, message: str) -> None:
    rec.status = status
    rec.error_kind = kind
    rec.error = message[:300]


async def execute(session: aiohttp.ClientSession, target: Target, rec: RequestRecord, body: bytes, headers: dict[str, str]) -> ClientStream | None:
    """Send one request and fill ``rec``; returns the parsed stream (None if there was none)."""
    stream: ClientStream | None = None
    rec.send_mono_ns = mono_ns()
    try:
        async with session.post(target.url, data=body, headers=headers) as resp:
            stamps = upstream_stamps(resp)
            rec.headers_mono_ns = stamps.head_mono_ns if stamps else mono_ns()
            if stamps is not None:
                rec.written_mono_ns = stamps.request_written_mono_ns
                rec.stamp_bounds[ClientEvent.SEND] = (0, stamps.request_written_bound_ns)
            rec.http_status = resp.status
            ctype = resp.headers.get("Content-Type", "")
            if resp.status >= 400:
                raw = await _drain(resp, keep=True)
                rec.end_mono_ns = mono_ns()
                rec.server_message = server_message(raw)
                if resp.status in target.refusal_statuses:
                    _fail(rec, Outcome.REFUSED, ErrorKind.REFUSED, f"HTTP {resp.status} (refusal status)")
                else:
                    _fail(rec, Outcome.HTTP_ERROR, ErrorKind.HTTP_STATUS, f"HTTP {resp.status} {resp.reason or ''}".strip())
                return None
            if "text/event-stream" not in ctype:
                await _drain(resp)
                rec.end_mono_ns = mono_ns()
                _fail(rec, Outcome.UPSTREAM_ERROR, ErrorKind.NON_SSE, f"HTTP {resp.status} with Content-Type {ctype or 'none'!r}, not an event stream")
                return None
            stream = ClientStream(path=None, format=target.endpoint.stream_format)
            consumed = 0
            async for chunk in resp.content.iter_any():
                start = consumed
                consumed += len(chunk)
                if stamps is None:
                    stream.feed(chunk, mono_ns())
                    continue
                for s, e, t, bound in stamps.slices(start, consumed, bounds=True):
                    stream.feed(chunk[s - start : e - start], t, bound)
            t_end = stamps.arrival_mono_ns(consumed) if stamps is not None and consumed else mono_ns()
            stream.finish(t_end, stamps.bound_at(consumed) if stamps is not None and consumed else 0)
            rec.end_mono_ns = t_end
    except asyncio.CancelledError:
        rec.end_mono_ns = mono_ns()
        _fail(rec, Outcome.CLIENT_CANCEL, ErrorKind.CANCELLED, "the run ended before the response did")
        _take_stream(rec, stream)
        raise
    except aiohttp.ConnectionTimeoutError:
        rec.end_mono_ns = mono_ns()
        parts = urlsplit(target.url)
        _fail(rec, Outcome.UPSTREAM_ERROR, ErrorKind.UNREACHABLE,
              f"cannot connect to {parts.hostname}:{parts.port or (443 if parts.scheme == 'https' else 80)} (connect timed out)")
    except (asyncio.TimeoutError, aiohttp.ServerTimeoutError):
        rec.end_mono_ns = mono_ns()
        _fail(rec, Outcome.TIMEOUT, ErrorKind.TIMEOUT, f"no complete answer within {target.timeout_s:g} s")
    except aiohttp.ClientConnectorError as exc:
        rec.end_mono_ns = mono_ns()
        _fail(rec, Outcome.UPSTREAM_ERROR, ErrorKind.UNREACHABLE, connect_error(exc))
    except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError, aiohttp.ClientOSError, ConnectionError) as exc:
        rec.end_mono_ns = mono_ns()
        _fail(rec, Outcome.UPSTREAM_ERROR, ErrorKind.DISCONNECTED, f"{type(exc).__name__}: {exc}")
    except aiohttp.ClientError as exc:
        rec.end_mono_ns = mono_ns()
        _fail(rec, Outcome.UPSTREAM_ERROR, ErrorKind.DISCONNECTED, f"{type(exc).__name__}: {exc}")
    _take_stream(rec, stream)
    if stream is not None and rec.status == Outcome.OK:
        _judge_stream(rec, stream)
    return stream


async def _drain(resp: aiohttp.ClientResponse, keep: bool = False) -> bytes:
    """Read (at most ``ERROR_BODY_LIMIT`` of) the body; with ``keep``, return what was read."""
    read = 0
    kept: list[bytes] = []
    async for chunk in resp.content.iter_any():
        read += len(chunk)
        if keep:
            kept.append(chunk)
        if read > ERROR_BODY_LIMIT:
            break
    return b"".join(kept)[:ERROR_BODY_LIMIT]


def _take_stream(rec: RequestRecord, stream: ClientStream | None) -> None:
    if stream is None:
        return
    rec.stream_format = stream.format
    rec.transport_chunks = stream.chunks
    rec.sse_events = stream.events
    rec.content_events = len(stream.event_times)
    rec.malformed_events = stream.malformed
    rec.leading_whitespace_events = stream.leading_whitespace
    rec.chunk_mono_ns = stream.event_times
    rec.first_token_mono_ns = stream.first_token_mono_ns
    rec.last_token_mono_ns = stream.event_times[-1] if stream.event_times else None
    if stream.first_token_mono_ns is not None:
        rec.stamp_bounds[ClientEvent.FIRST_TOKEN] = (stream.first_token_bound_ns, 0)
        rec.stamp_bounds[ClientEvent.LAST_TOKEN] = (stream.last_bound_ns, 0)
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
