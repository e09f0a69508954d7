"""OpenAI-compatible request parsing and response rendering shared by the stack's components.

:func:`parse_request` validates a ``/v1/chat/completions`` or ``/v1/completions`` body into a
:class:`GenRequest` (or raises :class:`ApiError`, a 400 with an OpenAI-style error body).
:data:`RENDERERS` turn tokens into SSE chunks / whole responses for each endpoint kind; the engine
and the firewall's 200-refusal both use them.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from deltatap.stack.tokens import prompt_text

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
DONE = b"data: [DONE]\n\n"


class ApiError(Exception):
    def __init__(
        self, status: int, message: str, type_: str = "invalid_request_error", code: str | None = None, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.code = status, message, type_, code
        self.headers = headers or {}

    def response(self, headers: dict[str, str] | None = None) -> web.Response:
        h = {**self.headers, **(headers or {})}
        return web.json_response(error_body(self.message, self.type, self.code), status=self.status, headers=h)


def error_body(message: str, type_: str, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "code": code}}


def parse_json(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise ApiError(400, f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ApiError(400, "request body must be a JSON object")
    return body


ENDPOINT_KINDS = {"/v1/chat/completions": "chat", "/v1/completions": "completions"}


@dataclass
class GenRequest:
    kind: str  # "chat" | "completions"
    model: str
    stream: bool
    include_usage: bool
    max_tokens: int | None
    seed: int | None
    text: str  # the prompt text the model sees


def parse_request(kind: str, body: dict[str, Any], max_tokens_limit: int | None = None) -> GenRequest:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ApiError(400, "'model' is required and must be a non-empty string")
    if kind == "chat":
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs or not all(isinstance(m, dict) and "role" in m for m in msgs):
            raise ApiError(400, "'messages' must be a non-empty list of {role, content} objects")
    elif not isinstance(body.get("prompt"), (str, list)):
        raise ApiError(400, "'prompt' is required (a string or a list of strings)")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise ApiError(400, "'stream' must be true or false")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1):
        raise ApiError(400, "'max_tokens' must be a positive integer")
    if max_tokens is not None and max_tokens_limit is not None and max_tokens > max_tokens_limit:
        raise ApiError(400, f"'max_tokens' {max_tokens} exceeds the limit {max_tokens_limit}")
    opts = body.get("stream_options") or {}
    if not isinstance(opts, dict):
        raise ApiError(400, "'stream_options' must be an object")
    seed = body.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise ApiError(400, "'seed' must be an integer")
    return GenRequest(
        kind=kind,
        model=model,
        stream=stream,
        include_usage=bool(opts.get("include_usage")),
        max_tokens=max_tokens,
        seed=seed,
        text=prompt_text(body),
    )


def sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def usage(prompt: int, completion: int, cached: int = 0) -> dict[str, Any]:
    u: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    if cached:
        u["prompt_tokens_details"] = {"cached_tokens": cached}
    return u


class ChatRenderer:
    object_chunk = "chat.completion.chunk"

    def __init__(self, rid: str, model: str) -> None:
        self.base = {"id": rid, "object": self.object_chunk, "created": int(time.time()), "model": model}

    def _chunk(self, choice: dict[str, Any] | None) -> dict[str, Any]:
        return {**self.base, "choices": [choice] if choice else []}

    def start(self) -> bytes:
        """Role-only first chunk (no content), as vLLM and OpenAI send it."""
        return sse(self._chunk({"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}))

    def token(self, text: str) -> bytes:
        return sse(self._chunk({"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": None}))

    def finish(self, reason: str) -> bytes:
        return sse(self._chunk({"index": 0, "delta": {}, "logprobs": None, "finish_reason": reason}))

    def usage(self, u: dict[str, Any]) -> bytes:
        return sse({**self._chunk(None), "usage": u})

    def whole(self, text: str, reason: str, u: dict[str, Any]) -> dict[str, Any]:
        return {
            "id": self.base["id"],
            "object": "chat.completion",
            "created": self.base["created"],
            "model": self.base["model"],
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None, "finish_reason": reason}],
            "usage": u,
        }


class CompletionsRenderer(ChatRenderer):
    object_chunk = "text_completion"

    def start(self) -> bytes:
        return b""  # the completions stream has no role chunk

    def token(self, text: str) -> bytes:
        return sse(self._chunk({"index": 0, "text": text, "logprobs": None, "finish_reason": None}))

    def finish(self, reason: str) -> bytes:
        return sse(self._chunk({"index": 0, "text": "", "logprobs": None, "finish_reason": reason}))

    def whole(self, text: str, reason: str, u: dict[str, Any]) -> dict[str, Any]:
        return {
            "id": self.base["id"],
            "object": "text_completion",
            "created": self.base["created"],
            "model": self.base["model"],
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": reason}],
            "usage": u,
        }


RENDERERS: dict[str, type[ChatRenderer]] = {"chat": ChatRenderer, "completions": CompletionsRenderer}
