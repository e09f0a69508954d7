"""Chatbot sessions (profiles draft section 5, "Chatbot Workload: Customer Support").

Sessions of Geometric(p=0.12) turns (mean ~8); each user turn LogNormal(4.0, 0.8) tokens in [10, 500],
reply LogNormal(5.0, 1.0) tokens in [20, 1000]; between a reply and the next turn the user thinks for
Exponential(mean 8 s); every turn carries a shared 200-token system prompt and the session's history
(previous user turns and the server's *actual* replies), cut to the last ``history_tokens`` (4000)
tokens: a sliding window. A session's turns run one after another; sessions run side by side (the
profile's "closed loop, 100 concurrent sessions" is ``--concurrency 100``).

The plan fixes every user turn, max_tokens and think time; the replies are whatever the server says.
"""

from __future__ import annotations

import numpy as np
from pydantic import Field

from deltatap.loadgen.tokens import Tokenizer
from deltatap.loadgen.workloads.base import PlannedRequest, WorkloadParams, register
from deltatap.loadgen.workloads.conversation import system_prompt
from deltatap.loadgen.workloads.lengths import MAX_TOKENS, Length, LogNormal
from deltatap.loadgen.workloads.text import sentences


class ChatbotParams(WorkloadParams):
    input: Length = Field(default_factory=lambda: LogNormal(mu=4.0, sigma=0.8, min=10, max=500))
    output: Length = Field(default_factory=lambda: LogNormal(mu=5.0, sigma=1.0, min=20, max=1000))
    turns_p: float = Field(default=0.12, gt=0.0, le=1.0, description="session length ~ Geometric(p), mean 1/p turns")
    think_mean_s: float = Field(default=8.0, ge=0.0, le=86400.0, allow_inf_nan=False, description="think time ~ Exponential(mean)")
    history_tokens: int = Field(default=4000, ge=0, le=MAX_TOKENS, description="sliding window over the session history")
    system_prompt_tokens: int = Field(default=200, ge=0, le=MAX_TOKENS)


@register("chatbot", ChatbotParams, "profiles s5: multi-turn sessions, Exp(8 s) think time, 4000-token sliding history")
def chatbot(p: ChatbotParams, n: int, rng: np.random.Generator, tok: Tokenizer) -> list[PlannedRequest]:
    system = system_prompt(tok, p.system_prompt_tokens) if p.system_prompt_tokens else None
    sys_tokens = tok.count(system) if system else 0
    ins = p.input.sample(rng, n)
    outs = p.output.sample(rng, n)
    reqs: list[PlannedRequest] = []
    session = 0
    while len(reqs) < n:
        turns = int(rng.geometric(p.turns_p))
        for turn in range(min(turns, n - len(reqs))):
            i = len(reqs)
            think = float(rng.exponential(p.think_mean_s)) if turn > 0 and p.think_mean_s > 0 else 0.0
            prompt = sentences(rng, int(ins[i]), tok)
            reqs.append(
                PlannedRequest(
                    index=i, prompt=prompt, system=system, max_tokens=int(outs[i]), input_tokens=int(ins[i]) + sys_tokens,
                    session=session, turn=turn, think_s=think, history_tokens=p.history_tokens,
                    labels={"session": str(session), "turn": str(turn)},
                )
            )
        session += 1
    return reqs
