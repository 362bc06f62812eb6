"""The discrete-event simulation of one replica serving a request stream.

Time moves from event to event (arrivals, steps); there are no threads. Each
step is planned the way :class:`servelab.engine.Scheduler` plans it:

1. every decoding sequence gets its one row (decodes first, then running
   prompt chunks oldest first, within the token budget ``max_num_batched_tokens``;
   the engine orders running sequences by age instead, which differs only when a
   prompt chunk would take the whole budget);
2. if the KV pool has no block for a sequence, the newest running sequence is
   preempted (its blocks freed, its work recomputed later as one longer prompt)
   and nobody is admitted in that step;
3. waiting requests are admitted first come first served while there is budget,
   a seat (``max_num_seqs``) and memory for their first chunk; a prompt whose
   group prefix is cached skips those full blocks (at least one token is always
   computed); without chunked prefill a prompt waits for a step with room for all
   of it.

The step's duration comes from a :mod:`step model <servelab.sim.step_model>`.
When nothing can change but the decodes' context (no prompt work, no admission
possible), whole runs of decode steps are summed in closed form up to the next
event (an arrival, a finish, a block the pool may not have): that is what makes
a million requests fast.

Policies: ``"continuous"`` (the engine), ``"static"`` (waves: a wave is admitted
only into an empty replica and runs until its longest member finishes; its
prompts are prefilled in one step).
Memory is counted in KV blocks of ``block_size`` tokens, as in the engine.
"""
from __future__ import annotations

import heapq
import math
from collections import OrderedDict, deque
from dataclasses import dataclass

import numpy as np

from servelab.sim.step_model import StepModel, StepShape, chunk_pairs
from servelab.sim.workload import Trace

__all__ = ["ReplicaConfig", "simulate", "POLICIES"]

POLICIES = ("continuous", "static")


@dataclass(frozen=True)
class ReplicaConfig:
    """The scheduler's knobs (named as in :class:`servelab.engine.EngineConfig`)."""

    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    block_size: int = 16
    num_kv_blocks: int = 2048
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int | None = None
    enable_prefix_caching: bool = True
    policy: str = "continuous"

    def __post_init__(self):
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size", "num_kv_blocks"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v <= 0:
                raise ValueError(f"ReplicaConfig.{name} must be a positive whole number, got {v!r}")
        t = self.long_prefill_token_threshold
        if t is not None and (isinstance(t, bool) or not isinstance(t, (int, np.integer)) or t <= 0):
            raise ValueError(f"ReplicaConfig.long_prefill_token_threshold must be a positive whole number "
                             f"or None, got {t!r}")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be at least "
                             f"max_num_seqs ({self.max_num_seqs}) so every seat's decode fits a step")
        if self.policy not in POLICIES:
            raise ValueError(f"ReplicaConfig.policy must be one of {POLICIES}, got {self.policy!r}")

    @classmethod
    def from_engine(cls, config, **overrides) -> "ReplicaConfig":
        """The same knobs as an :class:`servelab.engine.EngineConfig` (or anything with them)."""
        kw = {k: getattr(config, k) for k in ("max_num_seqs", "max_num_batched_tokens", "block_size",
                                              "num_kv_blocks", "enable_chunked_prefill",
                                              "long_prefill_token_threshold", "enable_prefix_caching")}
        kw.update(overrides)
        return cls(**kw)

    @property
    def pool_tokens(self) -> int:
        return self.block_size * self.num_kv_blocks


def _blocks(tokens: int, bs: int) -> int:
    return -(-tokens // bs)


def simulate(trace: Trace, step_model: StepModel, config: ReplicaConfig | None = None, *,
             prefilled=None, priority=None, progress: bool | None = None, timeline_points: int = 2000):
    """Run ``trace`` through one replica; returns a :class:`servelab.sim.metrics.SimResult`.

    ``prefilled``: optional boolean array; a prefilled request arrives with its
    prompt's K/V already made and its first token sampled (a disaggregated
    decode pool): it needs blocks but no prompt compute.
    ``priority``: optional array, 0 = interactive, 1 = batch; a batch request
    is admitted only when no interactive request is waiting (it fills the gaps).
    ``progress``: show a progress bar (default: for more than 200,000 requests).
    """
    from servelab.sim.metrics import SimResult
    if not isinstance(trace, Trace):
        raise TypeError(f"trace must be a servelab.sim.Trace, got {type(trace).__name__}")
    if not isinstance(step_model, StepModel):
        raise TypeError(f"step_model must be a StepModel (LinearStepModel, RooflineStepModel), "
                        f"got {type(step_model).__name__}")
    cfg = config or ReplicaConfig()
    if not isinstance(cfg, ReplicaConfig):
        raise TypeError(f"config must be a ReplicaConfig, got {type(cfg).__name__}")
    bs = cfg.block_size
    n = len(trace)
    arrival = trace.arrival_s.tolist()
    prompt = trace.prompt_tokens.tolist()
    out_len = trace.output_tokens.tolist()
    group = trace.prefix_group.tolist()
    pre_tok = trace.prefix_tokens.tolist()
    pre_filled = [False] * n if prefilled is None else [bool(x) for x in np.asarray(prefilled)]
    if len(pre_filled) != n:
        raise ValueError(f"prefilled has {len(pre_filled)} rows but the trace has {n}")
    low = [False] * n if priority is None else [bool(x) for x in np.asarray(priority)]
    if len(low) != n:
        raise ValueError(f"priority has {len(low)} rows but the trace has {n}")

    longest = int(np.argmax(trace.prompt_tokens + trace.output_tokens))
    if _blocks(prompt[longest] + out_len[longest], bs) > cfg.num_kv_blocks:
        i = longest
        raise ValueError(f"request {i} needs {prompt[i]:,} prompt + {out_len[i]:,} output tokens but the KV "
                         f"pool (num_kv_blocks={cfg.num_kv_blocks} x block_size={bs}) holds only "
                         f"{cfg.pool_tokens:,}: raise num_kv_blocks, or this policy can never admit it")
    if not cfg.enable_chunked_prefill and cfg.policy == "continuous":
        big = np.flatnonzero(trace.prompt_tokens > cfg.max_num_batched_tokens)
        if len(big):
            i = int(big[0])
            raise ValueError(f"request {i} has a {prompt[i]:,}-token prompt, more than max_num_batched_tokens="
                             f"{cfg.max_num_batched_tokens} with chunked prefill off: it could never start; "
                             f"enable chunked prefill or raise the budget")

    if progress is None:
        progress = n > 200_000
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=n, desc="simulate", unit="req", mininterval=1.0)

    seats = cfg.max_num_seqs
    budget0 = cfg.max_num_batched_tokens
    chunked = cfg.enable_chunked_prefill
    static = cfg.policy == "static"
    cap = cfg.long_prefill_token_threshold if (chunked and not static) else None
    total_blocks = cfg.num_kv_blocks
    caching = cfg.enable_prefix_caching and not static
    step_s = step_model.step_s
    dec_run = step_model.decode_run_s
    steps_to_reach = step_model.steps_to_reach
    step_at = step_model.decode_step_at
    carryover = step_model.carryover_s
    prev_prompt = 0  # prompt tokens of the latest step with them (the decode steps after one cost more)
    since_prompt = 0  # steps since that step
    n_after = step_model.aftermath_steps
    noisy = step_model.noisy
    step_model.reset_noise()

    # ---- per-request state ----------------------------------------------
    tokens = prompt[:]            # prompt + generated (for decoders: at the time decoding (re)started)
    gen = [0] * n                 # output tokens generated (for decoders: at the time decoding started)
    computed = [0] * n            # tokens with K/V (prefilling sequences)
    shared = [0] * n              # leading blocks held through the group's cached prefix
    reserved = [0] * n            # static waves reserve prompt + output up front
    dj = [0] * n                  # step counter when decoding (re)started
    version = [0] * n             # invalidates heap entries after a preemption
    stamp_of = [0] * n            # admission stamp (the newest is preempted first)
    is_running = [False] * n
    is_dec = [False] * n
    first_t = [math.nan] * n
    finish_t = [math.nan] * n
    preempts = [0] * n
    cached_at_admit = [0] * n
    own_base = [0] * n             # group blocks it held when preempted (its own cached blocks follow)

    st = {"used": 0, "lru_blocks": 0}
    t = 0.0
    D = 0                         # steps executed so far
    next_arr = 0
    waiting: deque[int] = deque()     # interactive (or all) requests, first come first served
    waiting_lo: deque[int] = deque()  # batch requests: admitted only when no interactive one waits
    prefilling: list[int] = []    # running, still computing prompt tokens, admission order
    running_order: list = []      # (stamp, i), lazily cleaned
    n_running = 0
    n_dec = 0
    k_const = 0                   # decode context at step D = k_const + n_dec * D
    finish_heap: list = []        # (D when finished, version, i)
    cross_heap: list = []         # (D of the step that needs one more block, version, i)
    groups: dict[int, list] = {}  # prefix group -> [references, blocks]
    lru: OrderedDict[int, int] = OrderedDict()  # cached, unreferenced groups (evictable)
    stamp = 0
    done = 0

    gap_first: list[float] = []
    gap_last: list[float] = []
    gap_k: list[int] = []
    gap_rows: list[int] = []
    busy = 0.0
    n_steps = 0
    n_preempt = 0
    span = arrival[-1] - arrival[0]
    tl_every = span / timeline_points if timeline_points and span > 0 else math.inf
    tl_next = 0.0
    tl_t: list[float] = []
    tl_wait: list[int] = []
    tl_run: list[int] = []
    tl_used: list[int] = []
    max_used = 0

    def take_blocks(k: int) -> bool:
        """Take ``k`` blocks: truly free ones first, then evict cached chains (oldest first, tail first)."""
        free = total_blocks - st["used"] - st["lru_blocks"]
        while free < k and lru:
            gid = next(iter(lru))
            nb = lru[gid]
            take = min(nb, k - free)
            if take == nb:  # the whole chain goes
                del lru[gid]
                del groups[gid]
            else:  # tail blocks are reused first (as the engine frees them): the head stays matchable
                lru[gid] = nb - take
                groups[gid][1] = nb - take
            st["lru_blocks"] -= take
            free += take
        if free < k:
            return False
        st["used"] += k
        return True

    def release_group(i: int) -> None:
        if shared[i]:
            g = groups[group[i]]
            g[0] -= 1
            if g[0] == 0:
                st["used"] -= g[1]
                lru[group[i]] = g[1]
                st["lru_blocks"] += g[1]
            shared[i] = 0

    def private_blocks(i: int) -> int:
        if static:
            return reserved[i]
        c = tokens[i] + (D - dj[i]) - 1 if is_dec[i] else computed[i]
        return _blocks(c, bs) - shared[i]

    def make_decoder(i: int, have: int) -> None:
        nonlocal n_dec, k_const
        is_dec[i] = True
        n_dec += 1
        dj[i] = D
        k_const += tokens[i] - D
        v = version[i]
        heapq.heappush(finish_heap, (D + out_len[i] - gen[i], v, i))
        if not static:  # step D' needs blocks for tokens + (D' - D) tokens
            heapq.heappush(cross_heap, (D + have * bs + 1 - tokens[i], v, i))

    def leave_running(i: int) -> None:
        nonlocal n_running, n_dec, k_const
        st["used"] -= private_blocks(i)
        release_group(i)
        if is_dec[i]:
            is_dec[i] = False
            n_dec -= 1
            k_const -= tokens[i] - dj[i]
        is_running[i] = False
        n_running -= 1
        version[i] += 1
        reserved[i] = 0

    def retire(i: int, now: float) -> None:
        nonlocal done
        leave_running(i)
        finish_t[i] = now
        done += 1
        if bar is not None:
            bar.update(1)

    def preempt(i: int) -> None:
        """Preemption by recompute: drop its K/V, keep its tokens, queue it at the front."""
        nonlocal n_preempt
        base = shared[i]
        if is_dec[i]:
            g_now = gen[i] + (D - dj[i])
            full = (tokens[i] + (D - dj[i]) - 1) // bs
            leave_running(i)
            gen[i] = g_now
            tokens[i] = prompt[i] + g_now
        else:
            full = computed[i] // bs
            leave_running(i)
            prefilling.remove(i)
        if caching and not static and full > base:
            # its full blocks stay cached (evictable) and can be matched when it comes back
            key = -(i + 2)
            if key in groups:
                st["lru_blocks"] -= lru.pop(key)
            groups[key] = [0, full - base]
            lru[key] = full - base
            st["lru_blocks"] += full - base
            own_base[i] = base
        computed[i] = 0
        preempts[i] += 1
        n_preempt += 1
        (waiting_lo if low[i] else waiting).appendleft(i)

    def newest_running() -> int:
        while True:
            s, i = running_order[-1]
            if is_running[i] and stamp_of[i] == s:
                return i
            running_order.pop()

    def prefix_hit(i: int) -> tuple[int, int]:
        """(usable cached full blocks, group) for a request about to start."""
        g = group[i]
        if not caching or g < 0:
            return 0, g
        entry = groups.get(g)
        if entry is None:
            return 0, g
        pb = min(pre_tok[i] // bs, (tokens[i] - 1) // bs, entry[1])
        return max(pb, 0), g

    while done < n:
        while next_arr < n and arrival[next_arr] <= t:
            (waiting_lo if low[next_arr] else waiting).append(next_arr)
            next_arr += 1
        if n_running == 0 and not waiting and not waiting_lo:
            t = arrival[next_arr]
            continue
        if t >= tl_next:
            tl_t.append(t)
            tl_wait.append(len(waiting) + len(waiting_lo))
            tl_run.append(n_running)
            tl_used.append(st["used"])
            tl_next = t + tl_every

        # ---- plan one step ---------------------------------------------
        budget = budget0 - n_dec
        crossing = []
        while cross_heap and cross_heap[0][0] <= D:
            e = heapq.heappop(cross_heap)
            if e[1] == version[e[2]]:
                crossing.append(e)
        chunks = []  # [i, start, n]
        new_blocks = len(crossing)
        for i in prefilling:
            if budget <= 0:
                break
            c = tokens[i] - computed[i]
            if not static:
                if c > budget:
                    c = budget
                if cap is not None and c > cap:
                    c = cap
            chunks.append((i, computed[i], c))
            new_blocks += _blocks(computed[i] + c, bs) - _blocks(computed[i], bs)
            budget -= c
        preempted_now = False
        while new_blocks > total_blocks - st["used"] and n_running:
            victim = newest_running()
            if is_dec[victim]:
                before = len(crossing)
                crossing = [e for e in crossing if e[2] != victim]
                new_blocks -= before - len(crossing)
            else:
                for j, (ci, s0, c) in enumerate(chunks):
                    if ci == victim:
                        new_blocks -= _blocks(s0 + c, bs) - _blocks(s0, bs)
                        budget += c
                        del chunks[j]
                        break
            preempt(victim)
            preempted_now = True
        if not take_blocks(new_blocks):
            raise RuntimeError("simulator bug: blocks counted free could not be taken")
        for e in crossing:
            heapq.heappush(cross_heap, (e[0] + bs, e[1], e[2]))

        admitted_any = False
        if not preempted_now and (not static or n_running == 0):
            while (waiting or waiting_lo) and (budget > 0 or static) and n_running < seats:
                queue = waiting if waiting else waiting_lo
                i = queue[0]
                if pre_filled[i] and gen[i] == 0:
                    need = _blocks(tokens[i] + 1, bs)
                    if need > total_blocks - st["used"]:
                        break
                    take_blocks(need)
                    queue.popleft()
                    gen[i] = 1
                    tokens[i] += 1
                    computed[i] = tokens[i] - 1
                    is_running[i] = True
                    n_running += 1
                    stamp += 1
                    stamp_of[i] = stamp
                    running_order.append((stamp, i))
                    admitted_any = True
                    budget -= 1
                    if out_len[i] == 1:
                        retire(i, t)
                    else:
                        make_decoder(i, need)
                    continue
                if static:
                    need = _blocks(prompt[i] + out_len[i], bs)
                    if need > total_blocks - st["used"]:
                        break
                    take_blocks(need)
                    reserved[i] = need
                    hit, cached, c, revive = 0, 0, tokens[i], 0
                else:
                    hit, g = prefix_hit(i)
                    cached = hit * bs
                    left = tokens[i] - cached
                    if not chunked and gen[i] == 0 and left > budget:
                        break
                    c = left if left < budget else budget
                    if cap is not None and c > cap:
                        c = cap
                    own_key = -(i + 2)
                    own = groups.get(own_key) if preempts[i] else None
                    hit_own = 0
                    if own is not None and hit == own_base[i]:
                        hit_own = max(min(own[1], (tokens[i] - 1) // bs - hit), 0)
                        if hit_own:
                            cached = (hit + hit_own) * bs
                            left = tokens[i] - cached
                            c = left if left < budget else budget
                            if cap is not None and c > cap:
                                c = cap
                    entry = groups.get(g) if hit else None
                    revive = entry[1] if (entry is not None and entry[0] == 0) else 0
                    need = _blocks(cached + c, bs) - hit + revive
                    if need > total_blocks - st["used"]:
                        break
                    if revive:
                        del lru[g]
                        st["lru_blocks"] -= revive
                        st["used"] += revive
                    if own is not None and hit_own:
                        st["lru_blocks"] -= lru.pop(own_key)
                        del groups[own_key]
                        st["used"] += hit_own
                        need -= hit_own
                    take_blocks(need - revive)
                    if hit:
                        entry[0] += 1
                        shared[i] = hit
                queue.popleft()
                is_running[i] = True
                n_running += 1
                stamp += 1
                stamp_of[i] = stamp
                running_order.append((stamp, i))
                if preempts[i] == 0:
                    cached_at_admit[i] = cached
                computed[i] = cached
                prefilling.append(i)
                chunks.append((i, cached, c))
                budget -= c
                admitted_any = True

        if not chunks and n_dec == 0:
            if n_running == 0 and (waiting or waiting_lo):
                raise RuntimeError("simulator bug: an empty replica could not admit the head of the queue")
            continue

        # ---- run: one mixed step, or a whole run of pure decode steps --------
        R = n_dec
        if not chunks and not preempted_now and not noisy:
            while finish_heap and finish_heap[0][1] != version[finish_heap[0][2]]:
                heapq.heappop(finish_heap)
            k = finish_heap[0][0] - D
            if not static:
                k_mem = 1 + bs * ((total_blocks - st["used"]) // R)
                if k_mem < k:
                    k = k_mem
            K0 = k_const + R * D
            dear = []  # the run's first steps still in a prompt step's aftermath, one by one
            if prev_prompt and since_prompt < n_after:
                for j in range(min(n_after - since_prompt, k)):
                    line = step_at(R, K0 + R * j)
                    dear.append(line + carryover(prev_prompt, since_prompt + j + 1, line))
            if (next_arr < n and not waiting and not waiting_lo and n_running < seats and not static and k > 1):
                dt = arrival[next_arr] - t
                acc, hit = 0.0, 0
                for j, c in enumerate(dear):
                    acc += c
                    if acc >= dt:
                        hit = j + 1
                        break
                if hit:
                    k = hit
                elif k > len(dear):
                    k = len(dear) + steps_to_reach(R, K0 + R * len(dear), dt - acc, k - len(dear))
            if k < 1:
                k = 1
            del dear[k:]
            first = len(dear)
            dur = sum(dear) + dec_run(R, K0 + R * first, k - first)
            for c in dear:  # each dearer step is a gap of its own
                gap_first.append(c)
                gap_last.append(c)
                gap_k.append(1)
                gap_rows.append(R)
            if k > first:
                gap_first.append(step_at(R, K0 + R * first))
                gap_last.append(step_at(R, K0 + R * (k - 1)))
                gap_k.append(k - first)
                gap_rows.append(R)
            since_prompt += k
            t += dur
            busy += dur
            D += k
            n_steps += k
            grown = 0
            while cross_heap and cross_heap[0][0] < D:
                e = heapq.heappop(cross_heap)
                if e[1] == version[e[2]]:
                    grown += 1
                    heapq.heappush(cross_heap, (e[0] + bs, e[1], e[2]))
            if grown and not take_blocks(grown):
                raise RuntimeError("simulator bug: a decode run outgrew the free blocks")
        else:
            P = 0
            pairs = 0.0
            pctx = 0
            for (i, s0, c) in chunks:
                P += c
                pairs += chunk_pairs(s0, c)
                pctx += s0 + c
            dur = step_s(StepShape(P, R, k_const + R * D, pairs, len(chunks), pctx, prev_prompt,
                                   since_prompt + 1 if prev_prompt else 0))
            if P:
                prev_prompt, since_prompt = P, 0
            else:
                since_prompt += 1
            if R:
                gap_first.append(dur)
                gap_last.append(dur)
                gap_k.append(1)
                gap_rows.append(R)
            t += dur
            busy += dur
            D += 1
            n_steps += 1
            for (i, s0, c) in chunks:
                computed[i] = s0 + c
                g = group[i]
                if caching and g >= 0 and not shared[i] and g not in groups:
                    pb = min(pre_tok[i] // bs, (tokens[i] - 1) // bs)
                    if pb > 0 and computed[i] >= pb * bs:
                        groups[g] = [1, pb]
                        shared[i] = pb
                if computed[i] == tokens[i]:
                    prefilling.remove(i)
                    if gen[i] == 0:
                        first_t[i] = t
                    gen[i] += 1
                    tokens[i] += 1
                    if gen[i] >= out_len[i]:
                        is_dec[i] = False
                        retire(i, t)
                    else:
                        have = reserved[i] if static else _blocks(tokens[i] - 1, bs)
                        make_decoder(i, have)
        used_now = st["used"]
        if used_now > max_used:
            max_used = used_now
        while finish_heap and finish_heap[0][0] <= D:
            _, v, i = heapq.heappop(finish_heap)
            if v == version[i]:
                retire(i, t)

    if bar is not None:
        bar.close()
    return SimResult(
        arrival_s=trace.arrival_s.copy(), first_token_s=np.array(first_t), finish_s=np.array(finish_t),
        prompt_tokens=trace.prompt_tokens.copy(), output_tokens=trace.output_tokens.copy(),
        preemptions=np.array(preempts), cached_tokens=np.array(cached_at_admit),
        gap_first=np.array(gap_first), gap_last=np.array(gap_last), gap_steps=np.array(gap_k, dtype=np.int64),
        gap_rows=np.array(gap_rows, dtype=np.int64), busy_s=busy, num_steps=n_steps,
        num_preemptions=n_preempt, timeline_t=np.array(tl_t), timeline_waiting=np.array(tl_wait),
        timeline_running=np.array(tl_run), timeline_blocks=np.array(tl_used), max_blocks=max_used,
        num_kv_blocks=total_blocks, prefilled=np.array(pre_filled))
