"""Outbound inspection of a streamed (SSE) response: buffered, streaming or hybrid.

Events read from the upstream are held until the window they belong to has been inspected:

* ``buffered`` - one window: the whole response (t10 waits for the last token);
* ``streaming`` - windows of ``window_tokens`` content events, each checked before release
  (every check adds its cost to the inter-token latency; a slow check is a pause);
* ``hybrid`` - the first ``hybrid_buffer_tokens`` content events as one window, then streaming.

Events without content (role-only, usage, ``[DONE]``) pass as soon as no content event is held
before them. A window that blocks ends the stream with ``finish_reason: content_filter`` (OpenAI
formats) and ``[DONE]``. ``modify`` rewrites the content text of OpenAI chat / completions events
(matches inside one event; other formats are inspected and may be blocked but not rewritten).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from deltatap.core.sse import ContentStream, Extracted, SseEvent

from deltatap.stack.config import OutboundInspection
from deltatap.stack.delays import DelaySampler
from deltatap.stack.firewall.rules import Decision, RuleSet, Verdict, cost_ms
from deltatap.stack.openai import DONE, RENDERERS

# stream format -> renderer kind, for the content_filter ending and rewriting
_OPENAI_KINDS = {"openai-chat": "chat", "openai-completions": "completions"}


@dataclass(slots=True)
class Held:
    event: SseEvent
    text: str
    tokens: int


def encode(ev: SseEvent) -> bytes:
    out = []
    if ev.event:
        out.append(f"event: {ev.event}\n")
    if ev.id is not None:
        out.append(f"id: {ev.id}\n")
    out.extend(f"data: {line}\n" for line in ev.data.split("\n"))
    out.append("\n")
    return "".join(out).encode()


def _rewrite(ev: SseEvent, kind: str, rules: RuleSet) -> SseEvent:
    try:
        obj = json.loads(ev.data)
    except ValueError:
        return ev
    for ch in obj.get("choices") or ():
        if kind == "chat" and isinstance(ch.get("delta"), dict) and isinstance(ch["delta"].get("content"), str):
            ch["delta"]["content"] = rules.modify(ch["delta"]["content"])
        elif kind == "completions" and isinstance(ch.get("text"), str):
            ch["text"] = rules.modify(ch["text"])
    return SseEvent(json.dumps(obj, separators=(",", ":")), ev.event, ev.id, ev.retry)


class OutboundStream(ContentStream):
    """Per-response state: feed reads, ask what may be released. Classifying the events (format, content text,
    tokens, the first content token, usage) is the :class:`ContentStream`'s; this class holds each event with its
    text until its window is inspected."""

    def __init__(self, cfg: OutboundInspection, rules: RuleSet, sampler: DelaySampler, path: str) -> None:
        super().__init__(path=path)
        self.cfg, self.rules, self.sampler = cfg, rules, sampler
        self.held: list[Held] = []
        self.held_tokens = 0
        self.windows = 0
        self.checks = 0
        self.inspect_ms = 0.0
        self.verdict = Verdict(Decision.ALLOW)
        self.blocked = False

    @property
    def first_in(self) -> int | None:
        """Read stamp of the first non-blank content event (t9)."""
        return self.first_token_mono_ns

    @property
    def last_in(self) -> int | None:
        """Read stamp of the last content event."""
        return self.last_token_mono_ns

    def take(self, ev: SseEvent, t_mono_ns: int, bound_ns: int = 0) -> Extracted:
        got = ContentStream.take(self, ev, t_mono_ns, bound_ns)
        text, tokens = got[0], got[1]
        if text:
            self.held_tokens += max(1, tokens)
        self.held.append(Held(ev, text, tokens))
        return got

    def _window(self) -> int | None:
        mode = self.cfg.mode
        if mode == "buffered":
            return None
        if mode == "hybrid" and self.windows == 0:
            return self.cfg.hybrid_buffer_tokens
        return self.cfg.window_tokens

    def ready(self, end: bool) -> bool:
        """Whether :meth:`release` has something to give now (``end``: the upstream has ended)."""
        if self.blocked or not self.held:
            return False
        if end or not self.cfg.enabled or self.held_tokens == 0:
            return True
        limit = self._window()
        return limit is not None and self.held_tokens >= limit

    def _take(self) -> tuple[list[Held], int]:
        """The held events up to the end of the next window (everything when buffering or when
        inspection is off; at the end of the stream a last, shorter window)."""
        limit = self._window() if self.cfg.enabled else None
        if limit is None or self.held_tokens <= limit:
            held, self.held, tokens, self.held_tokens = self.held, [], self.held_tokens, 0
            return held, tokens
        tokens = 0
        for i, h in enumerate(self.held):
            if h.text:
                tokens += max(1, h.tokens)
                if tokens >= limit:
                    break
        held, self.held = self.held[: i + 1], self.held[i + 1 :]
        self.held_tokens -= tokens
        return held, tokens

    async def release(self) -> tuple[bytes, bool]:
        """Inspect the next window of what is held (sleeping its cost); returns the bytes to write
        downstream and whether they carry content."""
        held, tokens = self._take()
        if not tokens or not self.cfg.enabled:
            return b"".join(encode(h.event) for h in held), tokens > 0
        self.windows += 1
        self.checks += 1
        verdict = self.rules.scan("".join(h.text for h in held))
        ms = cost_ms(self.cfg.cost, tokens, verdict, self.sampler)
        self.inspect_ms += ms
        if ms > 0:
            await self.sampler.sleep_ms(ms)
        if verdict.decision is not Decision.ALLOW:
            self.verdict = verdict
        kind = _OPENAI_KINDS.get(self.format or "")
        if verdict.decision.blocks:
            self.blocked = True
            if kind is None:
                return DONE, False
            r = RENDERERS[kind](self.facts.response_id or "blocked", self.facts.model or "")
            return r.finish("content_filter") + DONE, False
        if kind is not None and verdict.decision in (Decision.MODIFY, Decision.ALLOW_AFTER_ANALYSIS):
            held = [Held(_rewrite(h.event, kind, self.rules), h.text, h.tokens) if h.text else h for h in held]
        return b"".join(encode(h.event) for h in held), True
