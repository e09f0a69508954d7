"""Appendix A.4: code completion with repository-context prefix sharing.

``contexts`` (10) repository contexts of Uniform(512, 1024) tokens each, in Python, JavaScript or
TypeScript, are built once per seed. ``shared_fraction`` (80%) of the requests start with one of them,
chosen by a Zipf law with exponent ``zipf_s`` (1.5) over the context ranks (p_k proportional to
k^-s, truncated to the 10 contexts); the others get a context of their own. Every prompt ends with a
function to complete. Output: LogNormal(4.0, 1.5) tokens.

The Stack is not bundled: code is generated from templates, so the *lengths and sharing pattern* follow
A.4 while the content is synthetic (reported as such in the workload spec).
"""

from __future__ import annotations

import numpy as np
from pydantic import Field

from deltatap.loadgen.tokens import Tokenizer
from deltatap.loadgen.workloads.base import PlannedRequest, WorkloadParams, register
from deltatap.loadgen.workloads.lengths import Length, LogNormal, Uniform

NOUNS = ["user", "order", "invoice", "session", "token", "record", "item", "cache", "queue", "event", "report", "account",
         "payment", "message", "file", "config", "request", "response", "metric", "job"]
VERBS = ["load", "save", "parse", "validate", "merge", "format", "compute", "fetch", "update", "delete", "render", "sort"]

TEMPLATES = {
    "python": (
        "def {v}_{n}({n}s, limit=10):\n    \"\"\"{V} the {n}s and return at most limit of them.\"\"\"\n"
        "    result = []\n    for {n} in {n}s:\n        if len(result) >= limit:\n            break\n"
        "        if {n} is not None and {n}.get(\"id\") != {k}:\n            result.append({n})\n    return result\n\n\n"
    ),
    "javascript": (
        "function {v}{N}({n}s, limit = 10) {{\n  // {V} the {n}s and return at most limit of them.\n  const out = [];\n"
        "  for (const {n} of {n}s) {{\n    if (out.length >= limit) break;\n    if ({n} && {n}.id !== {k}) out.push({n});\n"
        "  }}\n  return out;\n}}\n\n"
    ),
    "typescript": (
        "export function {v}{N}({n}s: {N}[], limit: number = 10): {N}[] {{\n  // {V} the {n}s, at most limit.\n"
        "  const out: {N}[] = [];\n  for (const {n} of {n}s) {{\n    if (out.length >= limit) break;\n"
        "    if ({n}.id !== {k}) out.push({n});\n  }}\n  return out;\n}}\n\n"
    ),
}
TASKS = {
    "python": "\ndef {v}_{n}_batch({n}s, size={k}):\n    \"\"\"{V} {n}s in batches of size; complete this function.\"\"\"\n",
    "javascript": "\nfunction {v}{N}Batch({n}s, size = {k}) {{\n  // {V} {n}s in batches of size; complete this function.\n",
    "typescript": "\nexport function {v}{N}Batch({n}s: {N}[], size: number = {k}): {N}[][] {{\n  // complete this function.\n",
}


def _code(lang: str, tokens: int, rng: np.random.Generator, tok: Tokenizer) -> str:
    parts: list[str] = []
    have = 0
    while have < tokens:
        n, v = NOUNS[int(rng.integers(len(NOUNS)))], VERBS[int(rng.integers(len(VERBS)))]
        parts.append(TEMPLATES[lang].format(n=n, N=n.capitalize(), v=v, V=v.capitalize(), k=int(rng.integers(1000))))
        have += 75  # rough size of one template; trimmed exactly below
    text = f"# repository context ({lang})\n" + "".join(parts)
    while tok.count(text) < tokens:
        text += text
    return tok.truncate(text, tokens)


def zipf_probabilities(k: int, s: float) -> np.ndarray:
    w = np.arange(1, k + 1, dtype=float) ** -s
    return w / w.sum()


class CodeParams(WorkloadParams):
    contexts: int = Field(default=10, gt=0, le=100_000)
    context_tokens: Length = Field(default_factory=lambda: Uniform(min=512, max=1024))
    shared_fraction: float = Field(default=0.8, ge=0.0, le=1.0)
    zipf_s: float = Field(default=1.5, gt=0.0)
    output: Length = Field(default_factory=lambda: LogNormal(mu=4.0, sigma=1.5, min=4, max=2048))
    languages: list[str] = Field(default_factory=lambda: ["python", "javascript", "typescript"], min_length=1)


@register("code-completion", CodeParams, "A.4: 10 repo contexts of 512-1024 tokens, 80% share one (Zipf s=1.5), output LogNormal(4.0,1.5)")
def code_completion(p: CodeParams, n: int, rng: np.random.Generator, tok: Tokenizer) -> list[PlannedRequest]:
    bad = [lang for lang in p.languages if lang not in TEMPLATES]
    if bad:
        raise ValueError(f"code-completion: unknown language(s) {bad}; choose from {sorted(TEMPLATES)}")
    ctx_lens = p.context_tokens.sample(rng, p.contexts)
    ctx_langs = [p.languages[int(rng.integers(len(p.languages)))] for _ in range(p.contexts)]
    contexts = [_code(ctx_langs[i], int(ctx_lens[i]), rng, tok) for i in range(p.contexts)]
    probs = zipf_probabilities(p.contexts, p.zipf_s)
    shared = rng.random(size=n) < p.shared_fraction
    which = rng.choice(p.contexts, size=n, p=probs)
    outs = p.output.sample(rng, n)
    reqs = []
    for i in range(n):
        if shared[i]:
            k = int(which[i])
            ctx, lang, label = contexts[k], ctx_langs[k], f"repo-{k}"
        else:
            lang = p.languages[int(rng.integers(len(p.languages)))]
            ctx, label = _code(lang, int(p.context_tokens.sample(rng, 1)[0]), rng, tok), "unique"
        nn, v = NOUNS[int(rng.integers(len(NOUNS)))], VERBS[int(rng.integers(len(VERBS)))]
        task = TASKS[lang].format(n=nn, N=nn.capitalize(), v=v, V=v.capitalize(), k=int(rng.integers(2, 64)))
        prompt = ctx + task
        reqs.append(
            PlannedRequest(
                index=i, prompt=prompt, max_tokens=int(outs[i]), input_tokens=tok.count(prompt),
                labels={"prefix": label, "language": lang},
            )
        )
    return reqs
