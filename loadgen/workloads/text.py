"""Natural-language-looking text of an exact reference-token length, from fixed phrase lists.

Used where a workload wants sentences rather than random tokens (conversation sample, chatbot turns,
firewall prompts). Deterministic for a given generator state.
"""

from __future__ import annotations

import numpy as np

from deltatap.loadgen.tokens import Tokenizer

SUBJECTS = ["the service", "my team", "our database", "this function", "the new release", "a small cache", "the scheduler",
            "the user interface", "the deployment", "my manager", "the test suite", "the client library", "the gateway",
            "the model", "the weekly report", "the recipe", "the garden", "my bicycle", "the travel plan", "the budget"]
VERBS = ["keeps failing when", "works well unless", "becomes slow after", "needs a review because", "was rewritten so that",
         "should be documented before", "behaves differently when", "is easier to explain if", "returns an error whenever",
         "improves a lot once"]
OBJECTS = ["the load increases", "someone restarts the server", "we add more users", "the input is very long",
           "the weather changes", "the network is busy", "the configuration is missing", "two requests arrive together",
           "the cache is cold", "the deadline moves", "the data is incomplete", "nobody watches the logs"]
ASKS = ["Can you help me understand why", "Could you explain how", "I would like to know whether", "Please describe why",
        "What is the best way to check if", "Is it normal that"]
ANSWERS = ["In most cases", "A common reason is that", "One way to look at it is that", "It helps to remember that",
           "A practical approach is to check whether", "Usually"]
STEPS = ["First, measure the current behaviour.", "Then change one thing at a time.", "Write down what you observe.",
         "Compare the results with the baseline.", "Keep the configuration under version control.",
         "Ask a colleague to review the plan.", "Repeat the measurement on a quiet machine."]


def _pick(rng: np.random.Generator, xs: list[str]) -> str:
    return xs[int(rng.integers(len(xs)))]


def sentence(rng: np.random.Generator, opener: list[str] = ASKS) -> str:
    s = f"{_pick(rng, opener)} {_pick(rng, SUBJECTS)} {_pick(rng, VERBS)} {_pick(rng, OBJECTS)}."
    if rng.random() < 0.4:
        s += " " + _pick(rng, STEPS)
    return s


def sentences(rng: np.random.Generator, tokens: int, tok: Tokenizer, opener: list[str] = ASKS) -> str:
    """Whole sentences totalling exactly ``tokens`` reference tokens (the last one may be cut)."""
    if tokens <= 0:
        return ""
    parts: list[str] = []
    have = 0
    while have < tokens:
        batch = [sentence(rng, opener) for _ in range(max(1, (tokens - have) // 14))]
        parts.extend(batch)
        have = tok.count(" ".join(parts))
    return tok.truncate(" ".join(parts), tokens)
