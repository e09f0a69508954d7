"""The engine's scheduler model on its own: batching, queueing, chunked prefill, preemption, prefix cache."""

from __future__ import annotations

import asyncio

import pytest

from deltatap.core.clock import mono_ns

from deltatap.stack.config import EngineModel
from deltatap.stack.engine.scheduler import Scheduler, Sequence, SeqState, block_hashes
from deltatap.stack.tokens import TextGenerator, tokenize

MS = 1_000_000


def seq(prompt: str, max_tokens: int, block: int = 16) -> Sequence:
    toks = tokenize(prompt)
    return Sequence(len(toks), max_tokens, TextGenerator(0, None, prompt), block_hashes(toks, block), mono_ns())


async def run_all(model: EngineModel, seqs: list[Sequence], timeout_s: float = 10.0) -> Scheduler:
    sched = Scheduler(model)
    sched.start()
    try:
        for s in seqs:
            sched.submit(s)
        async with asyncio.timeout(timeout_s):
            while not all(s.done for s in seqs):
                await asyncio.sleep(0.005)
    finally:
        await sched.stop()
    return sched


async def test_continuous_batching_shares_steps() -> None:
    m = EngineModel(max_batch=8, decode_base_ms=4, decode_per_seq_ms=0.5, prefill_base_ms=1, prefill_per_token_ms=0.0)
    seqs = [seq(f"request number {i}", 10) for i in range(8)]
    sched = await run_all(m, seqs)
    assert all(s.state is SeqState.FINISHED and len(s.output) == 10 for s in seqs)
    # one prefill step for all eight, then 9 shared decode steps: far fewer than 8 * 10 steps
    assert sched.stats.steps <= 12
    assert max(s.first_batch for s in seqs) == 8
    # decode steps of a batch of 8 take base + 7 * per_seq, exactly in model time (a wake more than
    # 5 ms late on a loaded machine restarts the timeline from "now", which can only lengthen them)
    s0 = seqs[0]
    per_token = (s0.last_token_mono - s0.first_token_mono) / 9 / MS
    if sched.stats.late_resets == 0:
        assert per_token == pytest.approx(m.decode_ms(8), abs=1e-3)
    else:
        assert per_token >= m.decode_ms(8) - 1e-3


async def test_max_batch_queues_the_rest() -> None:
    m = EngineModel(max_batch=2, decode_base_ms=3, decode_per_seq_ms=0, prefill_base_ms=1, prefill_per_token_ms=0)
    seqs = [seq(f"queued request {i}", 5) for i in range(4)]
    await run_all(m, seqs)
    first_two = max(s.finish_mono for s in seqs[:2])
    for s in seqs[2:]:
        assert s.exec_start_mono >= first_two  # admitted only when a slot freed
        assert s.exec_start_mono - s.queue_mono >= 4 * 3 * MS  # waited at least the first pair's decodes
    assert all(s.first_batch <= 2 for s in seqs)


async def test_prefill_cost_per_token_and_decode_stalls_without_chunking() -> None:
    m = EngineModel(max_batch=4, prefill_base_ms=1, prefill_per_token_ms=0.1, decode_base_ms=2, decode_per_seq_ms=0)
    long = seq("word " * 200, 2)
    sched = await run_all(m, [long])
    assert abs((long.first_token_mono - long.exec_start_mono) / MS - (1 + 0.1 * 200)) < 0.5
    assert sched.stats.prefill_tokens == 200


async def test_chunked_prefill_keeps_decoding() -> None:
    m = EngineModel(max_batch=4, chunked_prefill=True, max_batched_tokens=64, prefill_base_ms=0, prefill_per_token_ms=0.05,
                    decode_base_ms=2, decode_per_seq_ms=0)
    short = seq("short one", 30)
    sched = Scheduler(m)
    sched.start()
    try:
        sched.submit(short)
        await asyncio.sleep(0.01)
        long = seq("word " * 600, 2)
        sched.submit(long)
        async with asyncio.timeout(10):
            while not (short.done and long.done):
                await asyncio.sleep(0.005)
    finally:
        await sched.stop()
    # the 600-token prompt took ceil(600/63) steps of prefill, while the short sequence kept getting tokens
    assert sched.stats.steps >= 30
    assert long.first_token_mono - long.exec_start_mono > 9 * 2 * MS
    assert short.state is SeqState.FINISHED and long.state is SeqState.FINISHED


async def test_kv_exhaustion_preempts_and_everyone_finishes() -> None:
    m = EngineModel(max_batch=8, kv_capacity_tokens=120, decode_base_ms=1, decode_per_seq_ms=0, prefill_base_ms=0.5,
                    prefill_per_token_ms=0.0, prefix_cache=False)
    seqs = [seq(f"prompt {i} " + "x " * 10, 30) for i in range(4)]  # 12 prompt tokens + 30 out each: 168 > 120
    sched = await run_all(m, seqs)
    assert sched.stats.preemptions > 0
    assert sum(s.preemptions for s in seqs) == sched.stats.preemptions
    assert all(s.state is SeqState.FINISHED and len(s.output) == 30 for s in seqs)
    assert sched.kv_used == 0
    # a preempted sequence recomputes prompt + output: more prefill than the prompts alone
    assert sched.stats.prefill_tokens > sum(s.prompt_tokens for s in seqs)


async def test_prefix_cache_skips_shared_prefix() -> None:
    m = EngineModel(prefill_base_ms=0.5, prefill_per_token_ms=0.05, decode_base_ms=1, prefix_block_tokens=16)
    prefix = "shared system prompt " * 40  # 120 tokens
    a = seq(prefix + "first question", 2)
    sched = await run_all(m, [a])
    b = seq(prefix + "second question", 2)
    sched2 = Scheduler(m)
    sched2.cache = sched.cache  # same engine cache
    sched2.start()
    try:
        sched2.submit(b)
        async with asyncio.timeout(5):
            while not b.done:
                await asyncio.sleep(0.002)
    finally:
        await sched2.stop()
    assert a.cached_tokens == 0
    assert b.cached_tokens >= 112  # 7 full blocks of the shared 120-token prefix
    assert (b.first_token_mono - b.exec_start_mono) < (a.first_token_mono - a.exec_start_mono) - 4 * MS


async def test_abort_frees_the_slot() -> None:
    m = EngineModel(max_batch=1, decode_base_ms=2, decode_per_seq_ms=0, prefill_base_ms=0.5, prefill_per_token_ms=0)
    sched = Scheduler(m)
    sched.start()
    try:
        a, b = seq("first", 1000), seq("second", 3)
        sched.submit(a)
        sched.submit(b)
        await asyncio.sleep(0.02)
        assert b.exec_start_mono is None  # waiting behind a
        sched.abort(a)
        async with asyncio.timeout(5):
            while not b.done:
                await asyncio.sleep(0.002)
        assert a.state is SeqState.ABORTED and len(a.output) < 1000
        assert b.state is SeqState.FINISHED
    finally:
        await sched.stop()
