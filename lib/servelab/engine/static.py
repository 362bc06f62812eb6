"""The static-batching baseline: fixed waves that wait for their longest member.

This is how batched ``generate`` works in a training-style library, and how
early servers worked:

1. Take up to ``max_num_seqs`` waiting requests: a **wave**. Reserve, for every
   member, room for the longest prompt plus the largest ``max_tokens`` in the
   wave (the padded rectangle a batched tensor would occupy).
2. Prefill all prompts in one step, then decode every member every step.
3. A member that finishes early keeps its seat: it is fed a padding token each
   step (real compute, thrown away) until the **last** member finishes.
4. Only then does the next wave start. Requests arriving meanwhile wait.

It reuses the continuous engine's model runner, sampler and stop rules, so a
benchmark between the two measures the scheduling policy and nothing else.
Prompts are padded to the wave's longest, as in a batched tensor: each short
prompt's pad rows are computed after it, in slots of its own reservation that
its decode steps overwrite before reading them, so the padding costs compute
but never changes an answer.
"""
from __future__ import annotations

import time
from collections import deque

from servelab.engine.config import EngineConfig
from servelab.engine.engine import LLMEngine, StepStats
from servelab.engine.model_runner import StepInput
from servelab.engine.sequence import Sequence, SequenceStatus
from servelab.paged import KVCacheManager

__all__ = ["StaticScheduler", "StaticBatchEngine"]

PAD_TOKEN = 0


class StaticScheduler:
    """Waves instead of a running set. Same ``add``/``finish`` interface as the
    continuous scheduler, so the engine's stop logic works unchanged."""

    def __init__(self, config: EngineConfig):
        self.config = config
        self.kv = KVCacheManager(config.num_kv_blocks, config.block_size, enable_prefix_caching=False)
        self.waiting: deque[Sequence] = deque()
        self.wave: list[Sequence] = []
        self.prefilled = False
        self.padding_positions: dict[str, int] = {}
        self.num_padding_tokens = 0  # decode rows computed for finished members
        self.num_prompt_padding_tokens = 0  # prefill rows computed to pad short prompts
        self.num_preemptions = 0

    @property
    def running(self) -> list[Sequence]:
        return [s for s in self.wave if not s.is_finished]

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.wave)

    @staticmethod
    def _reserve(members: list[Sequence]) -> int:
        longest_prompt = max(s.num_prompt_tokens for s in members)
        most_tokens = max(getattr(s.sampling_params, "max_tokens", 16) or 16 for s in members)
        return min(longest_prompt + most_tokens, members[0].max_len)

    def start_wave(self) -> None:
        members: list[Sequence] = []
        while self.waiting and len(members) < self.config.max_num_seqs:
            trial = members + [self.waiting[0]]
            need = self._reserve(trial)
            if -(-need // self.config.block_size) * len(trial) > self.config.num_kv_blocks and members:
                break  # the rectangle would not fit: a smaller wave
            members.append(self.waiting.popleft())
        need = self._reserve(members)
        now = time.perf_counter()
        for s in members:
            if not self.kv.allocate(s.block_table, need):  # cannot happen: need <= max_len <= pool
                raise RuntimeError("static wave does not fit in the KV pool")
            s.status = SequenceStatus.RUNNING
            s.metrics.first_scheduled_time = now
        self.wave = members
        self.prefilled = False

    def finish(self, seq: Sequence, reason: str, stop_reason=None) -> None:
        if seq.is_finished:
            return
        if seq in self.waiting:
            self.waiting.remove(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        seq.stop_reason = stop_reason
        seq.metrics.finished_time = time.perf_counter()
        self.padding_positions[seq.request_id] = seq.num_tokens - 1
        if self.wave and all(s.is_finished for s in self.wave):
            for s in self.wave:
                self.kv.free(s.block_table)
            self.wave = []
            self.padding_positions.clear()

    def kv_usage(self):
        return self.kv.usage(s.block_table for s in self.wave)


class StaticBatchEngine(LLMEngine):
    """Same API as :class:`LLMEngine` (add_request / step / run_to_completion)."""

    def __init__(self, runner, config: EngineConfig | None = None, tokenizer=None,
                 eos_token_ids=(), seed: int = 0, keep_step_log: bool = True):
        super().__init__(runner, config, tokenizer, eos_token_ids, seed, keep_step_log)
        self.scheduler = StaticScheduler(self.config)

    def step(self):
        t0 = time.perf_counter()
        sched = self.scheduler
        if not sched.wave:
            if not sched.waiting:
                return []
            sched.start_wave()
        wave = sched.wave
        step = StepInput([], [], [], [], [], [], [])
        active = []
        for s in wave:
            if not sched.prefilled:
                start, ids = 0, s.token_ids
            elif s.is_finished:  # a padding row: computed, then thrown away
                start = sched.padding_positions[s.request_id] + 1
                if start >= s.block_table.capacity:
                    start = s.block_table.capacity - 1  # keep writing the last reserved slot
                sched.padding_positions[s.request_id] = start
                ids = None
                sched.num_padding_tokens += 1
            else:
                start, ids = s.num_computed_tokens, s.token_ids
            n = len(ids) - start if ids is not None else 1
            step.input_ids.extend(ids[start:] if ids is not None else [PAD_TOKEN])
            step.positions.extend(range(start, start + n))
            step.slot_mapping.extend(s.block_table.slots(start, start + n))
            step.query_lens.append(n)
            step.context_lens.append(start + n)
            step.block_tables.append(list(s.block_table.block_ids))
            step.sample_rows.append(len(step.input_ids) - 1)
            if not s.is_finished:
                active.append((len(step.sample_rows) - 1, s, n))
        if not sched.prefilled:
            self._pad_prompts(step, wave)
        logits = self.runner.execute(step)
        sched.prefilled = True
        for _, s, n in active:
            s.num_computed_tokens += n
            s.block_table.num_tokens = s.num_computed_tokens
        seqs = [s for _, s, _ in active]
        tokens = self.sampler(logits[[row for row, _, _ in active]], seqs) if active else []
        now = time.perf_counter()
        outputs = [self._append_token(s, t, now) for s, t in zip(seqs, tokens)]
        self.num_steps += 1
        if self.keep_step_log:
            prefill = sum(n for _, _, n in active if n > 1)
            self.step_log.append(StepStats(
                num_seqs=len(wave), num_batched_tokens=step.num_tokens, num_prefill_tokens=prefill,
                num_decodes=len(wave) - sum(1 for _, _, n in active if n > 1), num_preempted=0,
                num_waiting=len(sched.waiting), kv_blocks_used=sched.kv.allocator.num_used,
                duration=now - t0))
        return outputs

    def _pad_prompts(self, step: StepInput, wave: list[Sequence]) -> None:
        """Add the pad rows that bring every prompt up to the wave's longest.

        They sit right after the real prompt (positions len..longest-1), in slots the
        member reserved anyway; its first decode steps overwrite them before any query
        can attend to them, so they cost compute without changing outputs.
        """
        longest = max(s.num_prompt_tokens for s in wave)
        for s in wave:
            start, pad = s.num_prompt_tokens, longest - s.num_prompt_tokens
            if pad <= 0:
                continue
            step.input_ids.extend([PAD_TOKEN] * pad)
            step.positions.extend(range(start, longest))
            step.slot_mapping.extend(s.block_table.slots(start, longest))
            step.query_lens.append(pad)
            step.context_lens.append(longest)
            step.block_tables.append(list(s.block_table.block_ids))
            step.sample_rows.append(len(step.input_ids) - 1)
            self.scheduler.num_prompt_padding_tokens += pad
