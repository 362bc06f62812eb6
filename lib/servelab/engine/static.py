"""The static-batching baselines: fixed waves that wait for their longest member.

This is how batched ``generate`` works in a training-style library, and how
early servers worked:

1. Take up to ``max_num_seqs`` waiting requests: a **wave**. Reserve, for every
   member, room for the longest prompt plus the largest ``max_tokens`` in the
   wave (the padded rectangle a batched tensor would occupy). A wave whose
   rectangle would not fit in the pool is cut short.
2. Prefill all prompts in one step (no token budget, no chunking), then decode
   every unfinished member every step.
3. Only when the **last** member finishes does the next wave start. Requests
   arriving meanwhile wait, and so does every seat whose member finished early.

Two variants, the same waves (same members, same reservations, same steps):

* ``padded=True`` (default) computes what one batched tensor computes, as
  ``transformers``' ``generate`` does: every prompt is padded to the wave's
  longest, and a member that finished early keeps its row, fed a padding token
  each step (real compute, thrown away) until the wave ends.
* ``padded=False`` (*ragged*) computes only useful rows: each prompt at its own
  length, and a finished member leaves the compute at once. Against the
  continuous engine only the waiting differs (and that continuous batching
  splits long prefills into chunks under its token budget).

Both go through the continuous engine's own step preparation
(:func:`servelab.engine.model_runner.prepare_step`), model runner, sampler and
stop rules. Padding rows are described to ``prepare_step`` as rows of the
member they pad: they sit after its real tokens, in slots of its own
reservation that its decode steps overwrite before any query reads them, so
they cost compute but never change an answer.
"""
from __future__ import annotations

import time
from collections import deque

from servelab.engine.config import EngineConfig
from servelab.engine.engine import LLMEngine, StepStats
from servelab.engine.model_runner import prepare_step
from servelab.engine.scheduler import ScheduledSequence, SchedulerOutput
from servelab.engine.sequence import Sequence, SequenceStatus
from servelab.paged import KVCacheManager

__all__ = ["StaticScheduler", "StaticBatchEngine", "PAD_TOKEN"]

PAD_TOKEN = 0


class _PadIds:
    """Token ids that are all ``PAD_TOKEN``, at any position."""

    def __getitem__(self, key):
        if isinstance(key, slice):
            return [PAD_TOKEN] * len(range(*key.indices(1 << 62)))
        return PAD_TOKEN


class _PadRows:
    """``n`` padding rows of one wave member from position ``start``, shaped like a
    sequence for ``prepare_step``: the member's block table, ids that are all padding."""

    def __init__(self, seq: Sequence, start: int, n: int):
        self.seq = seq
        self.token_ids = _PadIds()
        self.num_computed_tokens = start
        self.num_tokens = start + n
        self.block_table = seq.block_table

    def __getattr__(self, name):  # anything else (ids, lengths, salt) is the member's
        return getattr(self.seq, name)


def _is_padding(s: ScheduledSequence) -> bool:
    return isinstance(s.seq, _PadRows)


class StaticScheduler:
    """Waves instead of a running set. Same ``add``/``schedule``/``commit``/``finish``
    interface as the continuous scheduler, so the engine's stop logic works unchanged."""

    def __init__(self, config: EngineConfig, padded: bool = True, reserve: str = "rectangle"):
        if not isinstance(padded, bool):
            raise TypeError(f"padded must be True or False, got {padded!r}")
        if reserve not in ("rectangle", "own"):
            raise ValueError(f"reserve must be 'rectangle' or 'own', got {reserve!r}")
        if reserve == "own" and padded:
            raise ValueError("reserve='own' needs padded=False: padding rows fill the rectangle")
        self.config = config
        self.padded = padded
        self.reserve = reserve
        self.kv = KVCacheManager(config.num_kv_blocks, config.block_size, enable_prefix_caching=False)
        self.waiting: deque[Sequence] = deque()
        self.wave: list[Sequence] = []
        self.prefilled = False
        self.num_waves = 0
        self._pad_position: dict[str, int] = {}
        self.num_padding_tokens = 0  # decode rows computed for finished members (padded only)
        self.num_prompt_padding_tokens = 0  # prefill rows computed to pad short prompts (padded only)
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

    def _needs(self, members: list[Sequence]) -> list[int]:
        """Token slots reserved per member: the padded rectangle's row, or (``reserve='own'``,
        paged memory) each member's own prompt plus its own ``max_tokens``."""
        if self.reserve == "own":
            return [self._reserve([s]) for s in members]
        return [self._reserve(members)] * len(members)

    def start_wave(self) -> None:
        members: list[Sequence] = []
        bs = self.config.block_size
        while self.waiting and len(members) < self.config.max_num_seqs:
            trial = members + [self.waiting[0]]
            if sum(-(-n // bs) for n in self._needs(trial)) > self.config.num_kv_blocks and members:
                break  # the reservations would not fit: a smaller wave
            members.append(self.waiting.popleft())
        now = time.perf_counter()
        for s, need in zip(members, self._needs(members)):
            if not self.kv.allocate(s.block_table, need):  # cannot happen: need <= max_len <= pool
                raise RuntimeError("static wave does not fit in the KV pool")
            s.status = SequenceStatus.RUNNING
            s.metrics.first_scheduled_time = now
        self.wave = members
        self.prefilled = False
        self.num_waves += 1

    def schedule(self) -> SchedulerOutput:
        """The rows of this step: a whole prefill, or one decode row per seat."""
        out = SchedulerOutput()
        if not self.wave:
            if not self.waiting:
                return out
            self.start_wave()
        if not self.prefilled:
            longest = max(s.num_prompt_tokens for s in self.wave)
            for s in self.wave:
                out.scheduled.append(ScheduledSequence(s, s.num_tokens - s.num_computed_tokens))
            if self.padded:
                for s in self.wave:
                    pad = longest - s.num_prompt_tokens
                    if pad > 0:  # the row's padding: computed, no token sampled from it
                        rows = ScheduledSequence(_PadRows(s, s.num_prompt_tokens, pad), pad)
                        rows.samples, rows.num_logits = False, 0
                        out.scheduled.append(rows)
                        self.num_prompt_padding_tokens += pad
            return out
        for s in self.wave:
            if not s.is_finished:
                out.scheduled.append(ScheduledSequence(s, s.num_tokens - s.num_computed_tokens))
            elif self.padded:  # a finished row of the tensor: computed, its logits thrown away
                start = min(self._pad_position[s.request_id], s.block_table.capacity - 1)
                self._pad_position[s.request_id] = start + 1
                out.scheduled.append(ScheduledSequence(_PadRows(s, start, 1), 1))
                self.num_padding_tokens += 1
        return out

    def commit(self, out: SchedulerOutput) -> None:
        """The runner wrote K/V for every scheduled row: advance the real members."""
        self.prefilled = True
        for s in out.scheduled:
            if _is_padding(s):
                continue
            seq = s.seq
            seq.num_computed_tokens += s.num_new_tokens
            self.kv.commit(seq.block_table, seq.token_ids, seq.num_computed_tokens, seq.cache_salt)

    def finish(self, seq: Sequence, reason: str, stop_reason=None) -> None:
        if seq.is_finished:
            return
        if seq in self.waiting:
            self.waiting.remove(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        seq.stop_reason = stop_reason
        seq.metrics.finished_time = time.perf_counter()
        # its last token was sampled but never fed: padding rows start there
        self._pad_position[seq.request_id] = max(seq.num_tokens - 1, 0)
        if seq not in self.wave:  # aborted while waiting
            self.kv.free(seq.block_table)
        elif all(s.is_finished for s in self.wave):
            for s in self.wave:
                self.kv.free(s.block_table)
            self.wave = []
            self._pad_position.clear()

    def kv_usage(self):
        return self.kv.usage(s.block_table for s in self.wave)


class StaticBatchEngine(LLMEngine):
    """Same API as :class:`LLMEngine` (add_request / step / run_to_completion).

    ``padded=True`` (default): a batched tensor's compute (prompts padded to the
    wave's longest, finished members kept as padding rows). ``padded=False``:
    the same waves, ragged (only useful rows computed).

    ``reserve="rectangle"`` (default): every member reserves the wave's padded
    rectangle row up front. ``reserve="own"`` (ragged only): static waves over
    paged memory, each member reserving only its own prompt plus its own
    ``max_tokens``, so more members fit in a tight pool.
    """

    def __init__(self, runner, config: EngineConfig | None = None, *args, padded: bool = True,
                 reserve: str = "rectangle", **kwargs):
        super().__init__(runner, config, *args, **kwargs)
        self.scheduler = StaticScheduler(self.config, padded=padded, reserve=reserve)

    @property
    def padded(self) -> bool:
        return self.scheduler.padded

    def step(self):
        t0 = time.perf_counter()
        sched = self.scheduler
        plan = sched.schedule()
        if plan.is_empty:
            return []
        rows = len(sched.wave) if sched.padded else len(sched.running)  # before anyone finishes
        step = prepare_step(plan)
        logits = self.runner.execute(step)
        sched.commit(plan)
        # logits come back one row per item that asks for one, in plan order
        sampled = [s for s in plan.scheduled if getattr(s, "num_logits", int(s.samples))]
        keep = [i for i, s in enumerate(sampled) if not _is_padding(s)]
        seqs = [sampled[i].seq for i in keep]
        tokens = self.sampler(logits[keep], seqs) if seqs else []
        now = time.perf_counter()
        # as in LLMEngine.step: a request aborted by a streaming callback during this
        # step is reported by the step (through _step_outputs) and gets no further token
        outputs = self._step_outputs = []
        try:
            for s, t in zip(seqs, tokens):
                if not s.is_finished:
                    outputs.append(self._append_token(s, t, now))
        finally:
            self._step_outputs = None
        self.num_steps += 1
        if self.keep_step_log:
            real = [s for s in plan.scheduled if not _is_padding(s)]
            decodes = sum(1 for s in real if s.num_new_tokens == 1 and s.start >= s.seq.num_prompt_tokens)
            self.step_log.append(StepStats(  # num_seqs: rows of the batch (padded: every seat)
                num_seqs=rows, num_batched_tokens=step.num_tokens,
                num_prefill_tokens=sum(s.num_new_tokens for s in real) - decodes, num_decodes=decodes,
                num_preempted=0, num_waiting=len(sched.waiting), kv_blocks_used=sched.kv.allocator.num_used,
                duration=now - t0))
        return outputs
