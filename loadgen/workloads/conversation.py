"""Appendix A.3: conversation prompts from a local ShareGPT-format file.

The file is a JSON list of ``{"id", "conversations": [{"from": "human"|"gpt", "value": TEXT}, ...]}``
(the vicuna_cleaned layout). Conversations without an assistant turn are dropped (A.3.1). Each request
takes a conversation at random (seeded, with replacement): its first human turn is the prompt and the
length of its first assistant turn, in reference tokens, is ``max_tokens`` (the empirical output
distribution). ``system_prompt_share`` of the requests carry one shared system prompt of
``system_prompt_tokens`` tokens (A: 50% share a 200-token system prompt).

The bundled sample (``loadgen/data/sharegpt_sample.json``) was made here; see make_sharegpt_sample.py.
Point ``path`` at a real ShareGPT file to use it, and report its version (``dataset_version``).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
from pydantic import Field

from deltatap.core.config import ConfigError
from deltatap.loadgen.tokens import Tokenizer
from deltatap.loadgen.workloads.base import PlannedRequest, WorkloadParams, register
from deltatap.loadgen.workloads.lengths import MAX_TOKENS

SAMPLE = Path(__file__).resolve().parent.parent / "data" / "sharegpt_sample.json"

SYSTEM_TEXT = (
    "You are a helpful, careful and friendly assistant working for a software company. Answer the user's questions "
    "clearly and accurately, explain your reasoning when it helps, and say so when you are not sure. Keep answers "
    "focused on what was asked, use short paragraphs and lists where they make the answer easier to read, and never "
    "invent facts, names, numbers or sources. If a request is ambiguous, ask one short clarifying question before "
    "answering. Be polite, do not repeat the question back, and prefer concrete examples over abstract advice. "
)


def system_prompt(tok: Tokenizer, tokens: int) -> str:
    """A fixed natural-language system prompt of exactly ``tokens`` reference tokens."""
    text = SYSTEM_TEXT * (tokens // 60 + 2)
    return tok.truncate(text, tokens)


class ConversationParams(WorkloadParams):
    path: str = Field(default=str(SAMPLE), description="ShareGPT-format JSON file")
    dataset_version: str = "deltatap sharegpt_sample (generated, seed 2023)"
    system_prompt_share: float = Field(default=0.5, ge=0.0, le=1.0)
    system_prompt_tokens: int = Field(default=200, ge=0, le=MAX_TOKENS)
    max_output_tokens: int = Field(default=4096, gt=0, le=MAX_TOKENS, description="cap on max_tokens taken from the data")


@functools.cache
def load_sharegpt(path: str) -> tuple[tuple[str, str], ...]:
    """(first human turn, first assistant reply) of every usable conversation in ``path``."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"conversation workload: cannot read {path} ({exc.strerror or exc})") from None
    except ValueError as exc:
        raise ConfigError(f"conversation workload: {path} is not JSON ({exc})") from None
    if not isinstance(data, list):
        raise ConfigError(f"conversation workload: {path} must hold a JSON list of ShareGPT conversations")
    pairs = []
    for conv in data:
        turns = conv.get("conversations") if isinstance(conv, dict) else None
        if not isinstance(turns, list):
            continue
        human = next((t.get("value") for t in turns if isinstance(t, dict) and t.get("from") == "human"), None)
        gpt = next((t.get("value") for t in turns if isinstance(t, dict) and t.get("from") == "gpt"), None)
        if isinstance(human, str) and isinstance(gpt, str) and human.strip() and gpt.strip():
            pairs.append((human, gpt))
    if not pairs:
        raise ConfigError(f"conversation workload: {path} has no conversation with both a human and an assistant turn")
    return tuple(pairs)


@register("conversation", ConversationParams, "A.3: ShareGPT prompts and reply lengths, 50% with a shared 200-token system prompt")
def conversation(p: ConversationParams, n: int, rng: np.random.Generator, tok: Tokenizer) -> list[PlannedRequest]:
    pairs = load_sharegpt(p.path)
    counts: dict[int, tuple[int, int]] = {}
    system = system_prompt(tok, p.system_prompt_tokens) if p.system_prompt_tokens else None
    sys_tokens = tok.count(system) if system else 0
    picks = rng.integers(0, len(pairs), size=n)
    shared = rng.random(size=n) < p.system_prompt_share
    reqs = []
    for i in range(n):
        k = int(picks[i])
        if k not in counts:
            counts[k] = (tok.count(pairs[k][0]), tok.count(pairs[k][1]))
        isl, osl = counts[k]
        use_sys = bool(shared[i]) and system is not None
        reqs.append(
            PlannedRequest(
                index=i,
                prompt=pairs[k][0],
                system=system if use_sys else None,
                max_tokens=max(1, min(osl, p.max_output_tokens)),
                input_tokens=isl + (sys_tokens if use_sys else 0),
                labels={"system_prompt": "shared" if use_sys else "none"},
            )
        )
    return reqs
