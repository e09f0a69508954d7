"""LLM stream formats for :mod:`deltatap.core.sse`: one small class per wire format, registered by name.

Each format (names are the values of ``Attr.STREAM_FORMAT``) has ``detect(obj, event_name) -> bool``
and ``extract(obj, event_name, facts) -> (text, tokens, done)``: the content text a decoded event
carries (``""`` when none), how many tokens it stands for, whether it ends the stream; usage,
engine timings, model, ids, finish reasons and in-stream error types go into :class:`StreamFacts`.
Add a format by subclassing :class:`StreamFormat` and decorating it with :func:`register_format`.
Everything here is re-exported by :mod:`deltatap.core.sse`, the module to import from.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

# --------------------------------------------------------------------------------------------
# What a stream tells us besides its tokens
# --------------------------------------------------------------------------------------------

TIMING_KEYS = ("prompt_n", "prompt_ms", "predicted_n", "predicted_ms", "cache_n")


@dataclass
class StreamFacts:
    model: str | None = None
    response_id: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    finish_reasons: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)  # llama.cpp: prompt_n, prompt_ms, predicted_n, predicted_ms, cache_n
    error: str | None = None  # type/code of an error reported inside the stream (never its message text)

    def take_usage(self, usage: Any, input_key: str, output_key: str) -> None:
        if not isinstance(usage, dict):
            return
        if isinstance(usage.get(input_key), int):
            self.input_tokens = usage[input_key]
        if isinstance(usage.get(output_key), int):
            self.output_tokens = usage[output_key]

    def take_timings(self, timings: Any) -> None:
        if isinstance(timings, dict):
            for k in TIMING_KEYS:
                v = timings.get(k)
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    self.timings[k] = v

    def take_finish(self, reason: Any) -> None:
        if isinstance(reason, str) and reason and reason not in self.finish_reasons:
            self.finish_reasons.append(reason)

    def take_error(self, err: Any) -> None:
        if isinstance(err, dict):
            self.error = str(err.get("type") or err.get("code") or "error")
        elif err is not None:
            self.error = "error"


# --------------------------------------------------------------------------------------------
# Formats: one small class each, registered by name
# --------------------------------------------------------------------------------------------

Extracted = tuple[str, int, bool]  # (content text, tokens, ends the stream)
_NONE: Extracted = ("", 0, False)


class StreamFormat(ABC):
    name: str = ""
    paths: tuple[str, ...] = ()  # request path suffixes that usually carry this format

    @abstractmethod
    def detect(self, obj: Any, event: str) -> bool:
        """Does this parsed event belong to this format?"""

    @abstractmethod
    def extract(self, obj: Any, event: str, facts: StreamFacts) -> Extracted:
        """Content text, token count and end-of-stream flag of one event; usage/timings go into ``facts``."""


FORMATS: dict[str, StreamFormat] = {}
_PATH_FORMATS: dict[str, str | None] = {}  # format_for_path's answers, per path (emptied when a format registers)
_PATH_FORMATS_MAX = 1024  # distinct paths remembered (a tap sees the same few; emptied when full)


def register_format(cls: type[StreamFormat]) -> type[StreamFormat]:
    FORMATS[cls.name] = cls()
    _PATH_FORMATS.clear()
    return cls


def get_format(name: str) -> StreamFormat:
    try:
        return FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown stream format {name!r}; known: {sorted(FORMATS)}") from None


def format_for_path(path: str | None) -> str | None:
    """The format whose path suffixes ``path`` (its part before any ``?``, without trailing ``/``) ends with, in
    registration order (the answer is remembered per path until a format registers)."""
    if not path:
        return None
    try:
        return _PATH_FORMATS[path]
    except KeyError:
        pass
    p = path.split("?", 1)[0].rstrip("/")
    name = None
    for fmt in FORMATS.values():
        if any(p.endswith(s) for s in fmt.paths):
            name = fmt.name
            break
    if len(_PATH_FORMATS) >= _PATH_FORMATS_MAX:
        _PATH_FORMATS.clear()
    _PATH_FORMATS[path] = name
    return name


def detect_format(obj: Any, event: str = "", hint: str | None = None) -> str | None:
    """Name of the format whose ``detect`` accepts this decoded event (``hint`` tried first)."""
    order = list(FORMATS.values())
    if hint in FORMATS:
        order.insert(0, FORMATS[hint])
    for fmt in order:
        if fmt.detect(obj, event):
            return fmt.name
    return None


def _text(v: Any) -> str:
    return v if isinstance(v, str) else ""


def _model_and_id(obj: dict, facts: StreamFacts) -> None:
    if facts.model is None and isinstance(obj.get("model"), str):
        facts.model = obj["model"]
    if facts.response_id is None and isinstance(obj.get("id"), str):
        facts.response_id = obj["id"]


_CHAT_TEXT_KEYS = ("content", "reasoning_content", "reasoning", "refusal")  # delta fields that carry content


@register_format
class OpenAIChat(StreamFormat):
    name = "openai-chat"
    paths = ("/chat/completions",)

    def detect(self, obj: Any, event: str) -> bool:
        if not isinstance(obj, dict):
            return False
        if obj.get("object") == "chat.completion.chunk":
            return True
        choices = obj.get("choices")
        return isinstance(choices, list) and bool(choices) and isinstance(choices[0], dict) and "delta" in choices[0]

    def extract(self, obj: Any, event: str, facts: StreamFacts) -> Extracted:
        # called for every event of a stream: look up only what is there
        if not isinstance(obj, dict):
            return _NONE
        if facts.model is None or facts.response_id is None:
            _model_and_id(obj, facts)
        if "usage" in obj:
            facts.take_usage(obj["usage"], "prompt_tokens", "completion_tokens")
        if "timings" in obj:
            facts.take_timings(obj["timings"])
        if "error" in obj:
            facts.take_error(obj["error"])
        parts: list[str] = []
        choices = obj.get("choices")
        for ch in choices if isinstance(choices, list) else ():
            if not isinstance(ch, dict):
                continue
            reason = ch.get("finish_reason")
            if reason is not None:
                facts.take_finish(reason)
            d = ch.get("delta")
            if not isinstance(d, dict):
                continue
            for key in _CHAT_TEXT_KEYS:
                v = d.get(key)
                if v and type(v) is str:
                    parts.append(v)
            for tc in d.get("tool_calls") or ():
                if isinstance(tc, dict) and isinstance(tc.get("function"), dict):
                    parts.append(_text(tc["function"].get("arguments")))
        text = "".join(parts) if parts else ""
        return text, (1 if text else 0), False


@register_format
class OpenAICompletions(StreamFormat):
    name = "openai-completions"
    paths = ("/v1/completions", "/completions")

    def detect(self, obj: Any, event: str) -> bool:
        if not isinstance(obj, dict):
            return False
        if obj.get("object") == "text_completion":
            return True
        choices = obj.get("choices")
        return isinstance(choices, list) and bool(choices) and isinstance(choices[0], dict) and "text" in choices[0]

    def extract(self, obj: Any, event: str, facts: StreamFacts) -> Extracted:
        if not isinstance(obj, dict):
            return _NONE
        _model_and_id(obj, facts)
        facts.take_usage(obj.get("usage"), "prompt_tokens", "completion_tokens")
        facts.take_timings(obj.get("timings"))
        facts.take_error(obj.get("error"))
        parts = []
        choices = obj.get("choices")
        for ch in choices if isinstance(choices, list) else ():
            if isinstance(ch, dict):
                facts.take_finish(ch.get("finish_reason"))
                parts.append(_text(ch.get("text")))
        text = "".join(parts)
        return text, (1 if text else 0), False


_RESPONSES_DELTAS = frozenset(
    {
        "response.output_text.delta",
        "response.reasoning_text.delta",
        "response.reasoning_summary_text.delta",
        "response.refusal.delta",
        "response.function_call_arguments.delta",
        "response.audio_transcript.delta",
    }
)
_RESPONSES_END = frozenset({"response.completed", "response.failed", "response.incomplete"})


@register_format
class Responses(StreamFormat):
    name = "responses"
    paths = ("/responses",)

    def detect(self, obj: Any, event: str) -> bool:
        t = obj.get("type") if isinstance(obj, dict) else None
        return (isinstance(t, str) and t.startswith("response.")) or event.startswith("response.")

    def extract(self, obj: Any, event: str, facts: StreamFacts) -> Extracted:
        if not isinstance(obj, dict):
            return _NONE
        t = obj.get("type") or event
        if t in _RESPONSES_DELTAS:
            text = _text(obj.get("delta"))
            return text, (1 if text else 0), False
        resp = obj.get("response")
        if isinstance(resp, dict):
            _model_and_id(resp, facts)
            facts.take_usage(resp.get("usage"), "input_tokens", "output_tokens")
            facts.take_error(resp.get("error"))
            if t in _RESPONSES_END:
                status = resp.get("status")
                facts.take_finish(status if isinstance(status, str) else t.rsplit(".", 1)[-1])
        if t == "error":
            facts.take_error(obj)
        return "", 0, t in _RESPONSES_END


_ANTHROPIC_TYPES = frozenset(
    {"message_start", "content_block_start", "content_block_delta", "content_block_stop", "message_delta", "message_stop", "ping"}
)


@register_format
class Anthropic(StreamFormat):
    name = "anthropic"
    paths = ("/messages",)

    def detect(self, obj: Any, event: str) -> bool:
        t = obj.get("type") if isinstance(obj, dict) else None
        return t in _ANTHROPIC_TYPES or event in _ANTHROPIC_TYPES

    def extract(self, obj: Any, event: str, facts: StreamFacts) -> Extracted:
        if not isinstance(obj, dict):
            return _NONE
        t = obj.get("type") or event
        if t == "content_block_delta":
            d = obj.get("delta")
            if isinstance(d, dict):
                text = _text(d.get("text")) + _text(d.get("thinking")) + _text(d.get("partial_json"))
                return text, (1 if text else 0), False
            return _NONE
        if t == "message_start" and isinstance(obj.get("message"), dict):
            msg = obj["message"]
            _model_and_id(msg, facts)
            facts.take_usage(msg.get("usage"), "input_tokens", "output_tokens")
        elif t == "message_delta":
            facts.take_usage(obj.get("usage"), "input_tokens", "output_tokens")
            if isinstance(obj.get("delta"), dict):
                facts.take_finish(obj["delta"].get("stop_reason"))
        elif t == "error":
            facts.take_error(obj.get("error"))
        return "", 0, t == "message_stop"


@register_format
class LlamaCpp(StreamFormat):
    """llama.cpp's native ``/completion`` stream: ``{"content": "...", "stop": false, ...}``."""

    name = "llamacpp"
    paths = ("/completion",)

    def detect(self, obj: Any, event: str) -> bool:
        return isinstance(obj, dict) and "content" in obj and "stop" in obj and "choices" not in obj

    def extract(self, obj: Any, event: str, facts: StreamFacts) -> Extracted:
        if not isinstance(obj, dict):
            return _NONE
        if facts.model is None and isinstance(obj.get("model"), str):
            facts.model = obj["model"]
        facts.take_timings(obj.get("timings"))
        facts.take_error(obj.get("error"))
        if isinstance(obj.get("tokens_evaluated"), int):
            facts.input_tokens = obj["tokens_evaluated"]
        if isinstance(obj.get("tokens_predicted"), int):
            facts.output_tokens = obj["tokens_predicted"]
        stop = obj.get("stop") is True
        if stop:
            facts.take_finish(obj.get("stop_type") or "stop")
        text = _text(obj.get("content"))
        toks = obj.get("tokens")
        n = len(toks) if isinstance(toks, list) and toks else (1 if text else 0)
        return text, n, stop
