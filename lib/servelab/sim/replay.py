"""The engine's own scheduler on a virtual clock: the reference the simulator is checked against.

:func:`replay_scheduler` feeds a :class:`~servelab.sim.workload.Trace` to the
real :class:`servelab.engine.Scheduler` (same admission, budget, chunking,
prefix cache by block hashes, preemption), but instead of running a model it
advances a clock by the step model's time for each planned step. Comparing it
with :func:`servelab.sim.simulate` tests the simulator's scheduling logic alone;
comparing the real engine with it tests the step model alone.

:func:`trace_prompts` turns a trace into token ids: members of a prefix group
share their first ``prefix_tokens`` ids, everything else is random.
Imports the engine (and so torch) when called, not at import time.
"""
from __future__ import annotations

import math

import numpy as np

from servelab.sim.step_model import StepModel, StepShape, chunk_pairs
from servelab.workload import Trace, trace_prompts  # noqa: F401 (trace_prompts: re-exported)

__all__ = ["trace_prompts", "plan_shape", "decode_groups", "replay_scheduler"]


def plan_shape(plan) -> StepShape:
    """The :class:`StepShape` of an engine scheduler plan (decode rows as the engine counts them)."""
    P = R = Kd = S = pctx = 0
    pairs = 0.0
    for s in plan.scheduled:
        n, start = s.num_new_tokens, s.start
        if n == 1 and start >= s.seq.num_prompt_tokens:
            R += 1
            Kd += start + 1
        else:
            P += n
            S += 1
            pairs += chunk_pairs(start, n)
            pctx += start + n
    return StepShape(P, R, Kd, pairs, S, pctx)


def decode_groups(plan, block_size: int = 16) -> int:
    """How many groups the engine gathers a plan's decode rows in (rows of similar context
    share one attention pass per layer: :func:`servelab.paged.group_decode_rows`)."""
    from servelab.paged import group_decode_rows
    ctx = sorted(s.start + 1 for s in plan.scheduled if s.num_new_tokens == 1)
    return len(group_decode_rows(range(len(ctx)), ctx, block_size)) if ctx else 0


def replay_scheduler(trace: Trace, step_model: StepModel, config, *, vocab_size: int = 4096, seed: int = 0):
    """Run the engine's scheduler over ``trace`` on a virtual clock; returns a SimResult."""
    from servelab.engine.config import EngineConfig
    from servelab.engine.scheduler import Scheduler
    from servelab.engine.sequence import Sequence
    from servelab.sim.core import ReplicaConfig
    from servelab.sim.metrics import SimResult

    if isinstance(config, ReplicaConfig):
        if config.policy != "continuous":
            raise ValueError("the engine's scheduler replays the continuous policy only")
        longest = int((trace.prompt_tokens + trace.output_tokens).max())
        config = EngineConfig(block_size=config.block_size, num_kv_blocks=config.num_kv_blocks,
                              max_num_seqs=config.max_num_seqs,
                              max_num_batched_tokens=config.max_num_batched_tokens,
                              enable_chunked_prefill=config.enable_chunked_prefill,
                              long_prefill_token_threshold=config.long_prefill_token_threshold,
                              enable_prefix_caching=config.enable_prefix_caching,
                              max_model_len=longest + 1)
    sched = Scheduler(config)
    prompts = trace_prompts(trace, vocab_size, seed)
    n = len(trace)
    arrival = trace.arrival_s.tolist()
    out_len = trace.output_tokens.tolist()
    first = [math.nan] * n
    finish = [math.nan] * n
    seqs = []
    t, nxt, done, steps, busy, prev_prompt, since_prompt = 0.0, 0, 0, 0, 0.0, 0, 0
    gaps, rows = [], []
    rng = np.random.default_rng(seed + 1)
    while done < n:
        while nxt < n and arrival[nxt] <= t:
            seq = Sequence(str(nxt), prompts[nxt], None, config.block_size, arrival_time=arrival[nxt])
            seq.index = nxt
            seqs.append(seq)
            sched.add(seq)
            nxt += 1
        plan = sched.schedule()
        if plan.is_empty:
            if sched.has_unfinished():
                raise RuntimeError("the engine's scheduler planned nothing while requests wait")
            t = arrival[nxt]
            continue
        shape = plan_shape(plan)._replace(after_prompt_tokens=prev_prompt,
                                          steps_after_prompt=since_prompt + 1 if prev_prompt else 0)
        if shape.prefill_tokens:
            prev_prompt, since_prompt = shape.prefill_tokens, 0
        else:
            since_prompt += 1
        dur = step_model.step_s(shape)
        t += dur
        busy += dur
        steps += 1
        if shape.decode_rows:
            gaps.append(dur)
            rows.append(shape.decode_rows)
        sched.commit(plan)
        for s in plan.scheduled:
            if not s.samples:
                continue
            seq = s.seq
            seq.token_ids.append(int(rng.integers(vocab_size)))
            if math.isnan(first[seq.index]):
                first[seq.index] = t
            if seq.num_output_tokens >= out_len[seq.index]:
                sched.finish(seq, "length")
                finish[seq.index] = t
                done += 1
    g = np.array(gaps)
    return SimResult(
        arrival_s=trace.arrival_s.copy(), first_token_s=np.array(first), finish_s=np.array(finish),
        prompt_tokens=trace.prompt_tokens.copy(), output_tokens=trace.output_tokens.copy(),
        preemptions=np.array([s.metrics.num_preemptions for s in seqs]),
        cached_tokens=np.array([s.metrics.num_cached_tokens for s in seqs]),
        gap_first=g, gap_last=g, gap_steps=np.ones(len(g), dtype=np.int64),
        gap_rows=np.array(rows, dtype=np.int64), busy_s=busy, num_steps=steps,
        num_preemptions=sched.num_preemptions, timeline_t=np.zeros(0), timeline_waiting=np.zeros(0),
        timeline_running=np.zeros(0), timeline_blocks=np.zeros(0), max_blocks=0,
        num_kv_blocks=config.num_kv_blocks)
