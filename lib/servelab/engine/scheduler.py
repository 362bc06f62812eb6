"""The continuous-batching scheduler: who computes which tokens this step.

Every step, in this order:

1. **Running sequences first**, oldest first. Each gets the tokens it is
   missing - one for a decode, a chunk for an unfinished prompt - within the
   step's token budget. If the pool has no block for it, the *newest* running
   sequence is preempted (its blocks freed, its progress dropped: it will be
   recomputed later) until there is room. The newest loses because it has the
   least work to throw away and the oldest have waited longest.
2. **Then waiting sequences**, first come first served, while there is budget,
   a free seat (``max_num_seqs``) and memory for their first chunk. A waiting
   sequence first looks up its prompt in the prefix cache; cached blocks cost
   no compute. No one jumps the queue: if the head cannot start, nobody does.
   After a preemption nobody is admitted in that step (memory is tight).

Prefill chunks and decodes end up in the same step: that is chunked prefill,
and it is why a long prompt arriving no longer freezes everyone's stream.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from servelab.engine.config import EngineConfig
from servelab.engine.sequence import Sequence, SequenceStatus
from servelab.paged import KVCacheManager
from servelab.prefix_cache import max_cacheable_blocks

__all__ = ["ScheduledSequence", "SchedulerOutput", "Scheduler"]


@dataclass
class ScheduledSequence:
    """``num_new_tokens`` of ``seq`` are computed this step, from position ``start``.

    ``samples``: this step completes the sequence's tokens, so a new token is
    sampled from its last row (a chunk in the middle of a prompt samples nothing).
    Both are fixed when the plan is made, before the step changes the sequence.
    ``num_logits``: how many trailing rows get logits from the runner (default:
    1 if it samples, else 0; speculative decoding asks for one per draft token
    to verify them all in one step).
    """

    seq: Sequence
    num_new_tokens: int
    num_logits: int | None = None
    start: int = field(init=False)
    samples: bool = field(init=False)

    def __post_init__(self):
        self.start = self.seq.num_computed_tokens
        self.samples = self.start + self.num_new_tokens == self.seq.num_tokens
        if self.num_logits is None:
            self.num_logits = 1 if self.samples else 0
        if not 0 <= self.num_logits <= self.num_new_tokens:
            raise ValueError(f"num_logits must be in [0, {self.num_new_tokens}], got {self.num_logits}")


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSequence] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_batched_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


class Scheduler:
    def __init__(self, config: EngineConfig):
        self.config = config
        self.kv = KVCacheManager(config.num_kv_blocks, config.block_size,
                                 enable_prefix_caching=config.enable_prefix_caching)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # admission order: newest last
        self.num_preemptions = 0

    # -- queue --------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def _chunk(self, tokens_left: int, budget: int) -> int:
        """Tokens to compute this step: what is left, within the budget and the chunk cap."""
        n = min(tokens_left, budget)
        cap = self.config.long_prefill_token_threshold
        if cap is not None and n > 1 and self.config.enable_chunked_prefill:
            n = min(n, cap)
        return n

    # -- the plan for one step ----------------------------------------------
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        kv = self.kv

        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = self._chunk(seq.num_uncomputed_tokens, budget)
            while not kv.allocate(seq.block_table, seq.num_computed_tokens + n):
                victim = self.running.pop()  # the newest
                self._preempt(victim)
                out.preempted.append(victim)
                if victim is seq:
                    break
            else:
                out.scheduled.append(ScheduledSequence(seq, n))
                budget -= n
                i += 1
                continue
            break  # ``seq`` preempted itself: it was the last one

        if out.preempted:
            return out

        now = time.perf_counter()
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            hit = kv.match_prefix(seq.token_ids, seq.cache_salt, keys=self._block_keys(seq))
            cached = len(hit) * self.config.block_size
            left = seq.num_tokens - cached
            # Without chunked prefill a new prompt waits for a step with room for all of it.
            # (A preempted sequence's recompute may still be split: it could outgrow the budget.)
            if not self.config.enable_chunked_prefill and seq.num_output_tokens == 0 and left > budget:
                break
            n = self._chunk(left, budget)
            if not kv.allocate(seq.block_table, cached + n, hit):
                break
            self.waiting.popleft()
            if kv.prefix_cache is not None:  # statistics once per admission, not per retry
                kv.prefix_cache.record(max_cacheable_blocks(seq.num_tokens, self.config.block_size),
                                       len(hit))
            seq.num_computed_tokens = cached
            if seq.metrics.first_scheduled_time is None:
                seq.metrics.first_scheduled_time = now
                seq.metrics.num_cached_tokens = cached
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            out.scheduled.append(ScheduledSequence(seq, n))
            budget -= n
        return out

    def _block_keys(self, seq: Sequence):
        """The sequence's chained block keys (its block table's one chain), hashed
        once and extended as it grows: tokens are only appended, so earlier keys
        never change, and a preempted sequence keeps them."""
        if self.kv.prefix_cache is None:
            return None
        full = seq.num_tokens // self.config.block_size
        return seq.block_table.extend_keys(seq.token_ids, full, seq.cache_salt)

    def _preempt(self, seq: Sequence) -> None:
        """Preemption by recompute: drop the K/V, keep the tokens, queue at the front."""
        self.kv.free(seq.block_table)
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.WAITING
        seq.metrics.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    # -- after the model ran ------------------------------------------------
    def commit(self, out: SchedulerOutput) -> None:
        """The runner wrote K/V for every scheduled token: advance and cache them."""
        for s in out.scheduled:
            seq = s.seq
            seq.num_computed_tokens += s.num_new_tokens
            self.kv.commit(seq.block_table, seq.token_ids, seq.num_computed_tokens, seq.cache_salt)

    def truncate(self, seq: Sequence, num_tokens: int) -> None:
        """Roll a running sequence back to its first ``num_tokens`` tokens (e.g. draft
        tokens a verifier rejected): tokens, computed count and KV blocks alike.
        At most ``num_tokens - 1`` tokens stay computed, so the next step runs the
        last kept token and samples from its logits. Emptied blocks are freed;
        rolled-back full blocks leave the prefix cache."""
        if not seq.num_prompt_tokens <= num_tokens <= seq.num_tokens:
            raise ValueError(f"can only roll back to a length in [{seq.num_prompt_tokens}, "
                             f"{seq.num_tokens}] (prompt kept), got {num_tokens}")
        # the last kept token is fed again next step: its row gives the logits to go on from
        computed = min(seq.num_computed_tokens, num_tokens - 1)
        self.kv.truncate(seq.block_table, computed)
        del seq.token_ids[num_tokens:]
        seq.num_computed_tokens = computed

    def finish(self, seq: Sequence, reason: str, stop_reason=None) -> None:
        """Retire a sequence (finished or aborted) and free its blocks."""
        if seq.is_finished:
            return
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.kv.free(seq.block_table)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        seq.stop_reason = stop_reason
        seq.metrics.finished_time = time.perf_counter()

    def kv_usage(self):
        return self.kv.usage(s.block_table for s in self.running)
