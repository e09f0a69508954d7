"""Replay an exact request sequence written by a previous run (``requests.jsonl`` in its output dir)."""

from __future__ import annotations

import numpy as np

from deltatap.loadgen.tokens import Tokenizer
from deltatap.loadgen.workloads.base import PlannedRequest, WorkloadParams, read_requests, register


class ReplayParams(WorkloadParams):
    path: str


@register("replay", ReplayParams, "the exact sequence from a requests.jsonl file; n takes the first n (cycling if fewer)")
def replay(p: ReplayParams, n: int, rng: np.random.Generator, tok: Tokenizer) -> list[PlannedRequest]:
    seq = read_requests(p.path)
    if not seq:
        raise ValueError(f"replay: {p.path} holds no requests")
    out = []
    for i in range(n):
        src = seq[i % len(seq)]
        out.append(PlannedRequest.from_dict({**src.__dict__, "index": i, "labels": dict(src.labels)}))
    return out
