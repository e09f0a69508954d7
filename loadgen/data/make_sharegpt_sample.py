"""Writes ``sharegpt_sample.json``: a small ShareGPT-format file made here (no third-party text).

Conversation texts are sentences assembled from fixed phrase lists (loadgen.workloads.text); the lengths of the first human turn
and the first assistant turn follow log-normals fitted to Appendix A.3.2's reference statistics
(input P50 156 / P95 892 tokens; output P50 234 / P95 789 tokens). Some conversations have several
turns and a few have no assistant turn (the loader must filter those, A.3.1).

    python -m loadgen.data.make_sharegpt_sample [N] [SEED]
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np

from deltatap.loadgen.tokens import reference_tokenizer
from deltatap.loadgen.workloads.text import ANSWERS, ASKS, sentences

OUT = Path(__file__).with_name("sharegpt_sample.json")


def make(n: int = 100, seed: int = 2023) -> list[dict]:
    tok = reference_tokenizer()
    rng = np.random.default_rng(seed)
    in_mu, in_sigma = math.log(156), (math.log(892) - math.log(156)) / 1.645
    out_mu, out_sigma = math.log(234), (math.log(789) - math.log(234)) / 1.645
    convs = []
    for i in range(n):
        turns = int(rng.geometric(0.6)) if i % 17 else 0  # every 17th has no assistant turn
        msgs = []
        for t in range(max(1, turns)):
            isl = int(np.clip(np.rint(rng.lognormal(in_mu, in_sigma)), 8, 4000)) if t == 0 else int(rng.integers(10, 80))
            msgs.append({"from": "human", "value": sentences(rng, isl, tok, ASKS)})
            if turns:
                osl = int(np.clip(np.rint(rng.lognormal(out_mu, out_sigma)), 8, 3000))
                msgs.append({"from": "gpt", "value": sentences(rng, osl, tok, ANSWERS)})
        convs.append({"id": f"deltatap-sample-{i:04d}", "conversations": msgs})
    return convs


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else 2023
    OUT.write_text(json.dumps(make(n, seed), indent=0, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {OUT}")
