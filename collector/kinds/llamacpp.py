"""llama.cpp's ``timings``, as the tap in front of the engine states them (``deltatap.engine.*``).

Not a span of its own: what a tap span toward the engine adds (:mod:`deltatap.collector.kinds.tap` includes it).
Prefill took ``prompt_ms`` and ended when the first token came out, so the engine's ``exec_start`` (t6a) is the
tap's first token received minus ``prompt_ms``; ``prompt_n`` / ``predicted_n`` are the engine's token counts,
used when the response's usage stated none.
"""

from __future__ import annotations

from deltatap.collector.kinds.model import MS, RANK_TELEMETRY, Derived, Fact, Into
from deltatap.core.vocab import Attr, Role, TapEvent, point

SOURCE = "llamacpp"
FACTS: tuple[Fact, ...] = (
    Fact(Attr.ENGINE_PROMPT_N, Into.TOKENS_IN_UNLESS_STATED),
    Fact(Attr.ENGINE_PREDICTED_N, Into.TOKENS_OUT_UNLESS_STATED),
)
ATTRS = (Attr.ENGINE_PROMPT_MS, Attr.ENGINE_PROMPT_N, Attr.ENGINE_PREDICTED_N)


def derived(engine: str) -> tuple[Derived, ...]:
    return (Derived(point(engine, Role.EXEC_START), TapEvent.FIRST_TOKEN_RECEIVED, (((Attr.ENGINE_PROMPT_MS, MS, -1),),), SOURCE, RANK_TELEMETRY),)
