"""Appendix A.1, A.2 and A.5: synthetic-uniform, synthetic-skewed and long-context.

Content is random tokens (A.1.1: no semantic meaning): words drawn from the reference vocabulary so
that the prompt re-tokenizes to exactly the planned length (see :meth:`Tokenizer.filler`).
"""

from __future__ import annotations

import numpy as np
from pydantic import Field

from deltatap.loadgen.tokens import Tokenizer
from deltatap.loadgen.workloads.base import PlannedRequest, WorkloadParams, register
from deltatap.loadgen.workloads.lengths import MAX_TOKENS, Choice, Fixed, Length, LogNormal, Uniform


class SyntheticParams(WorkloadParams):
    input: Length
    output: Length


class UniformParams(SyntheticParams):
    input: Length = Field(default_factory=lambda: Uniform(min=128, max=512))
    output: Length = Field(default_factory=lambda: Uniform(min=64, max=256))


class SkewedParams(SyntheticParams):
    input: Length = Field(default_factory=lambda: LogNormal(mu=5.5, sigma=1.0, min=32, max=4096))
    output: Length = Field(default_factory=lambda: LogNormal(mu=4.5, sigma=1.2, min=16, max=2048))


def _random_token_requests(p: SyntheticParams, n: int, rng: np.random.Generator, tok: Tokenizer) -> list[PlannedRequest]:
    ins = p.input.sample(rng, n)
    outs = p.output.sample(rng, n)
    return [
        PlannedRequest(index=i, prompt=tok.filler(int(ins[i]), rng), max_tokens=int(outs[i]), input_tokens=int(ins[i]))
        for i in range(n)
    ]


@register("synthetic-uniform", UniformParams, "A.1: input Uniform(128,512), output Uniform(64,256), random tokens")
def synthetic_uniform(p: UniformParams, n: int, rng: np.random.Generator, tok: Tokenizer) -> list[PlannedRequest]:
    return _random_token_requests(p, n, rng, tok)


@register("synthetic-skewed", SkewedParams, "A.2: input LogNormal(5.5,1.0) in [32,4096], output LogNormal(4.5,1.2) in [16,2048]")
def synthetic_skewed(p: SkewedParams, n: int, rng: np.random.Generator, tok: Tokenizer) -> list[PlannedRequest]:
    return _random_token_requests(p, n, rng, tok)


QUESTION = (
    " Question: read the document above carefully and answer in detail. Which topics does it mention most often, "
    "in what order do they first appear, and what single sentence would best summarise the whole document for a reader "
    "who has not seen it? List the three most frequent words, say how the beginning differs from the end, and "
    "explain your reasoning step by step before giving the final answer."
)


class LongContextParams(WorkloadParams):
    input: Length = Field(default_factory=lambda: Choice(values=[8192, 16384, 32768, 65536, 131072]))
    output: Length = Field(default_factory=lambda: Fixed(value=256))
    question_tokens: int = Field(default=100, gt=0, le=MAX_TOKENS, description="the fixed question after the document (A.5.1)")


@register("long-context", LongContextParams, "A.5: [document][~100-token question], target lengths 8k..128k, output 256")
def long_context(p: LongContextParams, n: int, rng: np.random.Generator, tok: Tokenizer) -> list[PlannedRequest]:
    question = tok.truncate(QUESTION * 4, p.question_tokens)
    q_tokens = tok.count(question)
    targets = p.input.sample(rng, n)
    outs = p.output.sample(rng, n)
    reqs = []
    for i in range(n):
        doc_len = max(1, int(targets[i]) - q_tokens)
        prompt = " Document:" + tok.filler(max(1, doc_len - 3), rng) + "\n\n" + question
        reqs.append(PlannedRequest(index=i, prompt=prompt, max_tokens=int(outs[i]), input_tokens=tok.count(prompt)))
    return reqs
