"""The facts every deltatap observer (tap, load generator, reference component) and vLLM state on their spans."""

from __future__ import annotations

from deltatap.collector.kinds.model import Fact, Into
from deltatap.core.vocab import Attr

FACTS: tuple[Fact, ...] = (
    Fact(Attr.REQUEST_ID, Into.REQUEST_ID),
    Fact(Attr.HTTP_STATUS, Into.HTTP_STATUS),
    Fact(Attr.OUTCOME, Into.OUTCOME),
    Fact(Attr.FIREWALL_DECISION, Into.DECISION),
    Fact(Attr.LABEL_PREFIX, Into.LABELS),
    Fact(Attr.RUN_ID, Into.RUN_ID),
    Fact(Attr.GENAI_INPUT_TOKENS, Into.TOKENS_IN),
    Fact(Attr.GENAI_OUTPUT_TOKENS, Into.TOKENS_OUT),
)
