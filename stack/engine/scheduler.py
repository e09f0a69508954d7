"""The engine's scheduler: one asyncio loop stepping a model of a continuous-batching engine.

Each iteration is one model *step* on an absolute timeline: the step starts where the previous one
ended (or when work arrives after idling), its duration comes from the cost model, and the loop
sleeps until that absolute deadline; then every sequence in the step gets its token. Nothing
sleeps per request.

* waiting queue, FCFS; admission while ``running < max_batch`` and the KV cache has room;
* without chunked prefill a step that has prompts to prefill prefills only (decodes stall, as in
  vLLM V0); with chunked prefill each step carries every decode plus prefill chunks up to
  ``max_batched_tokens``;
* decode step time ``decode_base_ms + decode_per_seq_ms * (batch - 1)``; prefill
  ``prefill_base_ms + prefill_per_token_ms * tokens``;
* KV capacity in tokens: when the next step would not fit, the most recently admitted sequence
  is preempted (its KV freed; it re-queues at the front and recomputes prompt + output so far);
* prefix cache over hashed blocks of prompt tokens (LRU), so shared prefixes skip prefill;
* policy ``priority``: the waiting queue is served lowest ``priority`` first (arrival order within a
  priority) and preemption picks the newest sequence of the lowest priority (vLLM's priority policy).
"""

from __future__ import annotations

import asyncio
import collections
import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from deltatap.net.aio import sleep_until
from deltatap.core.clock import mono_ns

from deltatap.stack.config import EngineModel
from deltatap.stack.tokens import TextGenerator

log = logging.getLogger("deltatap.stack.engine")

MS = 1_000_000
LATE_RESET_NS = 5 * MS  # woke later than this past a deadline: restart the timeline from now


class SeqState(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    ABORTED = "aborted"


@dataclass(eq=False)
class Sequence:
    """One request inside the engine. Times are ``mono_ns`` model times (``*_mono``)."""

    prompt_tokens: int
    max_tokens: int
    gen: TextGenerator
    block_hashes: list[int]
    queue_mono: int
    output: list[str] = field(default_factory=list)
    state: SeqState = SeqState.WAITING
    computed: int = 0  # context tokens whose KV exists (prefix-cache hits count)
    kv_tokens: int = 0  # KV allocated
    cached_tokens: int = 0  # prefix-cache hit at first admission
    preemptions: int = 0
    exec_start_mono: int | None = None  # t6a: first step that computed this sequence
    first_token_mono: int | None = None  # model time the first token was produced
    last_token_mono: int | None = None
    finish_mono: int | None = None
    finish_reason: str | None = None
    admitted_order: int = 0
    priority: int = 0  # policy "priority": lower is admitted first
    first_batch: int = 0  # sequences running when the first token was produced
    on_finish: list[Callable[[Sequence], None]] = field(default_factory=list)
    _ready: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def context_len(self) -> int:
        return self.prompt_tokens + len(self.output)

    @property
    def done(self) -> bool:
        return self.state in (SeqState.FINISHED, SeqState.ABORTED)

    async def wait(self) -> None:
        """Until a new token or the end (the caller then reads ``output``/``done``)."""
        await self._ready.wait()
        self._ready.clear()


class PrefixCache:
    """LRU set of prompt-block hashes; a hit is the longest run of leading blocks present."""

    def __init__(self, capacity_blocks: int) -> None:
        self.capacity = capacity_blocks
        self._blocks: collections.OrderedDict[int, None] = collections.OrderedDict()

    def match(self, hashes: list[int]) -> int:
        n = 0
        for h in hashes:
            if h not in self._blocks:
                break
            self._blocks.move_to_end(h)
            n += 1
        return n

    def insert(self, hashes: list[int]) -> None:
        for h in hashes:
            self._blocks[h] = None
            self._blocks.move_to_end(h)
        while len(self._blocks) > self.capacity:
            self._blocks.popitem(last=False)


def block_hashes(tokens: list[str], block: int) -> list[int]:
    """Chained hashes of each full block of ``block`` tokens (a block's hash covers its prefix)."""
    out, h = [], 0
    for i in range(0, len(tokens) - block + 1, block):
        h = hash((h, tuple(tokens[i : i + block])))
        out.append(h)
    return out


@dataclass
class SchedulerStats:
    steps: int = 0
    prefill_tokens: int = 0
    cached_tokens: int = 0
    generated_tokens: int = 0
    preemptions: int = 0
    late_resets: int = 0
    finished: int = 0
    aborted: int = 0


class Scheduler:
    def __init__(self, model: EngineModel) -> None:
        self.m = model
        self.waiting: collections.deque[Sequence] = collections.deque()
        self.running: list[Sequence] = []
        self.cache = PrefixCache(model.prefix_cache_blocks) if model.prefix_cache else None
        self.stats = SchedulerStats()
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._admit_counter = 0
        self._deadline = 0  # mono_ns end of the last step

    # ---- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="deltatap-engine-scheduler")

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        for seq in [*self.running, *self.waiting]:
            self._finish(seq, SeqState.ABORTED, "abort", mono_ns())

    # ---- API for the HTTP layer --------------------------------------------------------------
    @property
    def kv_used(self) -> int:
        return sum(s.kv_tokens for s in self.running)

    def submit(self, seq: Sequence) -> None:
        self.waiting.append(seq)
        self._wake.set()

    def abort(self, seq: Sequence) -> None:
        """The client went away and the engine cancels: free the sequence now."""
        if seq.done:
            return
        if seq.state is SeqState.WAITING:
            if seq in self.waiting:  # not yet submitted when the client left: nothing to remove
                self.waiting.remove(seq)
        else:
            self.running.remove(seq)
            seq.kv_tokens = 0
        self._finish(seq, SeqState.ABORTED, "abort", mono_ns())

    # ---- the loop ------------------------------------------------------------------------------
    async def _loop(self) -> None:
        while True:
            idle = not self.running and not self.waiting
            if idle:
                self._wake.clear()
                await self._wake.wait()
            now = mono_ns()
            start = self._deadline
            if idle or now - start > LATE_RESET_NS:
                if not idle and self.stats.steps:
                    self.stats.late_resets += 1
                start = max(start, now)
            work = self._plan(start)
            if work is None:  # nothing admissible (nothing fits the KV cache): wait for a change
                self._wake.clear()
                await self._wake.wait()
                self._deadline = mono_ns()
                continue
            duration_ns, emit = work
            self._deadline = start + duration_ns
            await sleep_until(self._deadline)
            self._complete(emit, self._deadline)

    def _plan(self, start: int) -> tuple[int, list[Sequence]] | None:
        """Admit, preempt if KV runs short, and cost one step. Returns (duration, sequences that
        produce a token at the end of the step)."""
        m = self.m
        self._admit(start)
        if not self.running:
            return None
        if not m.chunked_prefill:
            prefilling = [s for s in self.running if s.computed < s.context_len]
            if prefilling:
                tokens = sum(s.context_len - s.computed for s in prefilling)
                for s in prefilling:
                    self._mark_exec(s, start)
                    s.computed = s.context_len
                self.stats.prefill_tokens += tokens
                return self._ms(m.prefill_base_ms + m.prefill_per_token_ms * tokens), prefilling
            self._ensure_kv(start)
            return self._ms(m.decode_ms(len(self.running))), list(self.running)
        # chunked prefill: all decodes + prefill chunks within the token budget
        self._ensure_kv(start)
        decoders = [s for s in self.running if s.computed >= s.context_len]
        budget = max(0, m.max_batched_tokens - len(decoders))
        emit, chunk_tokens = list(decoders), 0
        for s in self.running:
            need = s.context_len - s.computed
            if need <= 0 or budget <= 0:
                continue
            take = min(need, budget)
            budget -= take
            chunk_tokens += take
            self._mark_exec(s, start)
            s.computed += take
            if s.computed >= s.context_len:
                emit.append(s)
        self.stats.prefill_tokens += chunk_tokens
        ms = m.decode_ms(len(decoders)) + (m.prefill_base_ms + m.prefill_per_token_ms * chunk_tokens if chunk_tokens else 0.0)
        return self._ms(ms), emit

    @staticmethod
    def _ms(ms: float) -> int:
        return max(1, int(ms * MS))

    @staticmethod
    def _mark_exec(seq: Sequence, start: int) -> None:
        if seq.exec_start_mono is None:
            seq.exec_start_mono = max(start, seq.queue_mono)

    def _admit(self, start: int) -> None:
        m = self.m
        if m.policy == "priority" and len(self.waiting) > 1:
            self.waiting = collections.deque(sorted(self.waiting, key=lambda s: s.priority))  # stable: arrival order within a priority
        while self.waiting and len(self.running) < m.max_batch:
            seq = self.waiting[0]
            need = seq.context_len + 1
            if self.kv_used + need > m.kv_capacity_tokens and self.running:
                break
            self.waiting.popleft()
            seq.state = SeqState.RUNNING
            self._admit_counter += 1
            seq.admitted_order = self._admit_counter
            seq.kv_tokens = seq.context_len
            seq.computed = 0
            if self.cache is not None and seq.preemptions == 0 and seq.block_hashes:
                hit = self.cache.match(seq.block_hashes) * m.prefix_block_tokens
                seq.cached_tokens = min(hit, seq.prompt_tokens - 1)
                seq.computed = seq.cached_tokens
                self.stats.cached_tokens += seq.cached_tokens
            self.running.append(seq)

    def _ensure_kv(self, start: int) -> None:
        """Every decoding sequence needs one more KV slot this step; preempt newest until it fits."""
        while self.running and self.kv_used + len(self.running) > self.m.kv_capacity_tokens and len(self.running) > 1:
            victim = max(self.running, key=(lambda s: (s.priority, s.admitted_order)) if self.m.policy == "priority" else (lambda s: s.admitted_order))
            self.running.remove(victim)
            victim.kv_tokens = 0
            victim.computed = 0
            victim.state = SeqState.WAITING
            victim.preemptions += 1
            self.stats.preemptions += 1
            self.waiting.appendleft(victim)

    def _complete(self, emit: list[Sequence], t: int) -> None:
        self.stats.steps += 1
        for seq in emit:
            if seq.state is not SeqState.RUNNING:
                continue  # aborted or preempted during the step
            if self.cache is not None and not seq.output and seq.preemptions == 0:
                self.cache.insert(seq.block_hashes)  # the prompt's KV now exists: share it
            seq.output.append(seq.gen.next_token())
            seq.kv_tokens += 1
            seq.computed = seq.context_len
            self.stats.generated_tokens += 1
            if seq.first_token_mono is None:
                seq.first_token_mono = t
                seq.first_batch = len(self.running)
            seq.last_token_mono = t
            if len(seq.output) >= seq.max_tokens:
                self.running.remove(seq)
                seq.kv_tokens = 0
                self._finish(seq, SeqState.FINISHED, "length", t)
            else:
                seq._ready.set()

    def _finish(self, seq: Sequence, state: SeqState, reason: str, t: int) -> None:
        seq.state = state
        seq.finish_reason = reason
        seq.finish_mono = t
        if state is SeqState.FINISHED:
            self.stats.finished += 1
        else:
            self.stats.aborted += 1
        seq._ready.set()
        self._wake.set()
        for cb in seq.on_finish:
            try:
                cb(seq)
            except Exception:  # a broken callback must not stop the scheduler
                log.exception("engine: on_finish callback failed")
