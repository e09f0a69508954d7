"""Cheap, deterministic tokens for the reference stack.

Token rule (documented in docs/stack.md): a token is a run of word characters or one single
non-space symbol, ``re.findall(r"\\w+|[^\\w\\s]", text)``. It is not a real tokenizer; it is
cheap, stable across runs and close enough in count (English text: ~1.0-1.3x of BPE counts)
for queueing, prefill cost and prefix-cache sharing to behave like a real engine.

Output text is drawn from a fixed word list by a generator seeded from the engine seed and the
request (its ``seed`` field if given, else a hash of the prompt), so the same request always
produces the same completion.
"""

from __future__ import annotations

import hashlib
import random
import re
from typing import Any

TOKEN_RE = re.compile(r"\w+|[^\w\s]")

WORDS = (
    "the of and to in is that for it as with was on be by at this from or an are which but not have "
    "they one had all were can we their there been if more when will would who so no time model token "
    "stream latency request engine gateway firewall batch queue prefill decode cache signal measure "
    "trace span delta network client server answer question value system result point data"
).split()


def tokenize(text: str) -> list[str]:
    return TOKEN_RE.findall(text)


def count_tokens(text: str) -> int:
    return sum(1 for _ in TOKEN_RE.finditer(text))


def _content_text(content: Any) -> str:
    """OpenAI message content: a string or a list of parts (only text parts count)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def prompt_text(body: dict[str, Any]) -> str:
    """The text a request feeds the model: chat ``messages`` joined, or completions ``prompt``."""
    if "messages" in body:
        return "\n".join(_content_text(m.get("content")) for m in body["messages"] if isinstance(m, dict))
    prompt = body.get("prompt", "")
    if isinstance(prompt, list):
        return "\n".join(p for p in prompt if isinstance(p, str))
    return prompt if isinstance(prompt, str) else ""


class TextGenerator:
    """Deterministic completion words for one request."""

    def __init__(self, engine_seed: int, request_seed: int | None, prompt: str) -> None:
        key = request_seed if request_seed is not None else hashlib.blake2b(prompt.encode(), digest_size=8).hexdigest()
        self._rng = random.Random(f"{engine_seed}:{key}")
        self.index = 0

    def next_token(self) -> str:
        word = self._rng.choice(WORDS)
        self.index += 1
        return word if self.index == 1 else " " + word
