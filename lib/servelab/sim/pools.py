"""Many replicas: a pool behind a router, and disaggregated prefill and decode pools.

* :func:`route` - which replica serves each request (:data:`ROUTERS`: ``random``,
  ``round_robin``, ``least_outstanding``, ``prefix_affinity``); the course's one
  router, which :mod:`servelab.fleet` uses too.
* :func:`simulate_pool` - ``replicas`` identical replicas; requests are split by
  the router before they run, so each replica is simulated on its own share and
  the results are merged. (A random split of a Poisson stream is again Poisson,
  at rate / replicas.)
* :func:`simulate_disaggregated` - prompts run on a prefill pool (each request's
  first token comes from there), the K/V travels to a decode pool
  (``kv_bytes_per_token x prompt / link_bandwidth`` seconds) and the answer is
  decoded there. Every step of a decode replica is a pure decode step, so a
  long prompt never stalls anyone's stream; the price is two pools to balance.
"""
from __future__ import annotations

import heapq
import math
import zlib
from dataclasses import dataclass

import numpy as np

from servelab.sim.core import ReplicaConfig, simulate
from servelab.sim.metrics import SimResult
from servelab.sim.step_model import StepModel
from servelab.sim.workload import Trace

__all__ = ["ROUTERS", "route", "merge_results", "simulate_routed", "simulate_pool", "simulate_disaggregated", "DisaggregatedResult",
           "largest_chunk", "best_split"]

#: The routers :func:`route` knows: stateless (``random``, ``round_robin``) and load-aware
#: (``least_outstanding``, ``prefix_affinity``: these need the step model to guess each request's time).
ROUTERS = ("random", "round_robin", "least_outstanding", "prefix_affinity")


def _estimate_seconds(trace: Trace, step_model: StepModel, seats: int) -> np.ndarray:
    """The router's own guess of each request's time in the replica: its prefill at full
    speed plus its answer at the pace of a replica with every seat busy."""
    from servelab.sim.step_model import StepShape
    step = step_model.step_s(StepShape(decode_rows=seats, decode_context=seats * int(np.mean(trace.prompt_tokens))))
    prefill = np.array([step_model.step_s(StepShape(prefill_tokens=int(p), prefill_seqs=1)) for p in
                        np.unique(trace.prompt_tokens)])
    lookup = dict(zip(np.unique(trace.prompt_tokens).tolist(), prefill.tolist()))
    return np.array([lookup[p] for p in trace.prompt_tokens.tolist()]) + trace.output_tokens * step


def route(trace: Trace, replicas: int, router: str = "round_robin", *, step_model: StepModel | None = None,
          seats: int = 64, slack: int = 4, seed: int = 0) -> np.ndarray:
    """Replica index per request: the course's one router.

    ``random`` and ``round_robin`` ignore load. ``least_outstanding`` sends each
    request to the replica with the fewest requests in flight, as the router
    itself counts them (each request's finish guessed from ``step_model`` with
    ``seats`` busy seats); ``prefix_affinity`` sends a prefix group's requests
    to the replica that holds its prefix, unless that replica is ``slack``
    requests busier than the least loaded: cache hits traded against balance.
    """
    if isinstance(replicas, bool) or not isinstance(replicas, (int, np.integer)) or replicas <= 0:
        raise ValueError(f"replicas must be a positive whole number, got {replicas!r}")
    n = len(trace)
    if router == "round_robin":
        return np.arange(n) % replicas
    if router == "random":
        return np.random.default_rng(seed).integers(0, replicas, n)
    if router not in ROUTERS:
        raise ValueError(f"router must be one of {ROUTERS}, got {router!r}")
    if step_model is None:
        raise ValueError(f"the {router} router estimates load: pass step_model=")
    est = _estimate_seconds(trace, step_model, seats)
    out = np.empty(n, dtype=np.int64)
    busy_until: list[list[float]] = [[] for _ in range(replicas)]  # finish estimates in flight
    home: dict[int, int] = {}
    for i, (t, g) in enumerate(zip(trace.arrival_s.tolist(), trace.prefix_group.tolist())):
        loads = []
        for h in busy_until:
            while h and h[0] <= t:
                heapq.heappop(h)
            loads.append(len(h))
        least = min(range(replicas), key=loads.__getitem__)
        k = least
        if router == "prefix_affinity" and g >= 0:
            want = home.setdefault(g, zlib.crc32(str(g).encode()) % replicas)
            k = want if loads[want] <= loads[least] + slack else least
        out[i] = k
        heapq.heappush(busy_until[k], t + float(est[i]))
    return out


def merge_results(parts: list[tuple[np.ndarray, SimResult]], trace: Trace) -> SimResult:
    """One result from per-replica results (``(request indices, result)`` pairs)."""
    n = len(trace)
    first, finish = np.full(n, np.nan), np.full(n, np.nan)
    pre, cached = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
    for idx, r in parts:
        first[idx], finish[idx] = r.first_token_s, r.finish_s
        pre[idx], cached[idx] = r.preemptions, r.cached_tokens
    cat = lambda name: np.concatenate([getattr(r, name) for _, r in parts])  # noqa: E731
    busy = sum(r.busy_s for _, r in parts)
    return SimResult(
        arrival_s=trace.arrival_s.copy(), first_token_s=first, finish_s=finish,
        prompt_tokens=trace.prompt_tokens.copy(), output_tokens=trace.output_tokens.copy(),
        preemptions=pre, cached_tokens=cached, gap_first=cat("gap_first"), gap_last=cat("gap_last"),
        gap_steps=cat("gap_steps"), gap_rows=cat("gap_rows"), busy_s=busy / len(parts),
        num_steps=sum(r.num_steps for _, r in parts), num_preemptions=sum(r.num_preemptions for _, r in parts),
        timeline_t=parts[0][1].timeline_t, timeline_waiting=parts[0][1].timeline_waiting,
        timeline_running=parts[0][1].timeline_running, timeline_blocks=parts[0][1].timeline_blocks,
        max_blocks=max(r.max_blocks for _, r in parts), num_kv_blocks=parts[0][1].num_kv_blocks)


def simulate_routed(trace: Trace, step_model: StepModel, config: ReplicaConfig | None, where: np.ndarray,
                    replicas: int, **kw) -> list[tuple[np.ndarray, SimResult]]:
    """Each replica simulated on the requests ``where`` sends it: ``(request indices, result)``
    pairs for :func:`merge_results` (per-request ``prefilled`` and ``priority`` are split too)."""
    parts = []
    for k in range(replicas):
        idx = np.flatnonzero(where == k)
        if len(idx):
            sub = {name: (np.asarray(v)[idx] if name in ("prefilled", "priority") and v is not None else v)
                   for name, v in kw.items()}
            parts.append((idx, simulate(trace.subset(idx), step_model, config, **sub)))
    return parts


def simulate_pool(trace: Trace, step_model: StepModel, config: ReplicaConfig | None = None, *,
                  replicas: int = 1, router: str = "round_robin", seed: int = 0, slack: int = 4,
                  **kw) -> SimResult:
    """``replicas`` identical replicas behind a router (:func:`route`; ``busy_s`` is per replica, averaged)."""
    seats = (config or ReplicaConfig()).max_num_seqs
    where = route(trace, replicas, router, step_model=step_model, seats=seats, slack=slack, seed=seed)
    return merge_results(simulate_routed(trace, step_model, config, where, replicas, **kw), trace)


@dataclass
class DisaggregatedResult:
    """A disaggregated run: the whole requests, and each pool's own view."""

    result: SimResult          # TTFT from the prefill pool, finish from the decode pool
    prefill: SimResult
    decode: SimResult
    transfer_s: np.ndarray     # K/V transfer time per request

    def summary(self) -> dict:
        s = self.result.summary()
        s.update(prefill_utilisation=self.prefill.utilisation, decode_utilisation=self.decode.utilisation)
        return s


def simulate_disaggregated(trace: Trace, step_model: StepModel, *, prefill_replicas: int, decode_replicas: int,
                           prefill_config: ReplicaConfig | None = None,
                           decode_config: ReplicaConfig | None = None,
                           kv_bytes_per_token: float = 0.0, link_bandwidth: float = 50e9,
                           decode_step_model: StepModel | None = None) -> DisaggregatedResult:
    """Prefill pool -> K/V transfer -> decode pool. ``link_bandwidth`` in bytes/s (50 GB/s by default,
    the order of a 400 Gb/s network link); ``kv_bytes_per_token`` 0 means a free transfer."""
    if kv_bytes_per_token < 0 or not link_bandwidth > 0:
        raise ValueError("kv_bytes_per_token must be >= 0 and link_bandwidth > 0 (bytes per second)")
    pre_trace = Trace(trace.arrival_s, trace.prompt_tokens, np.ones(len(trace), dtype=np.int64),
                      trace.prefix_group, trace.prefix_tokens)
    pre = simulate_pool(pre_trace, step_model, prefill_config, replicas=prefill_replicas)
    transfer = trace.prompt_tokens * kv_bytes_per_token / link_bandwidth
    ready = pre.first_token_s + transfer
    order = np.argsort(ready, kind="stable")
    dec_trace = Trace(ready[order], trace.prompt_tokens[order], trace.output_tokens[order])
    dec_sorted = simulate_pool(dec_trace, decode_step_model or step_model, decode_config,
                               replicas=decode_replicas, prefilled=np.ones(len(trace), dtype=bool))
    finish = np.empty(len(trace))
    finish[order] = dec_sorted.finish_s
    whole = SimResult(
        arrival_s=trace.arrival_s.copy(), first_token_s=pre.first_token_s.copy(), finish_s=finish,
        prompt_tokens=trace.prompt_tokens.copy(), output_tokens=trace.output_tokens.copy(),
        preemptions=pre.preemptions, cached_tokens=pre.cached_tokens, gap_first=dec_sorted.gap_first,
        gap_last=dec_sorted.gap_last, gap_steps=dec_sorted.gap_steps, gap_rows=dec_sorted.gap_rows,
        busy_s=(pre.busy_s * prefill_replicas + dec_sorted.busy_s * decode_replicas)
        / (prefill_replicas + decode_replicas),
        num_steps=pre.num_steps + dec_sorted.num_steps,
        num_preemptions=pre.num_preemptions + dec_sorted.num_preemptions,
        timeline_t=dec_sorted.timeline_t, timeline_waiting=dec_sorted.timeline_waiting,
        timeline_running=dec_sorted.timeline_running, timeline_blocks=dec_sorted.timeline_blocks,
        max_blocks=dec_sorted.max_blocks, num_kv_blocks=dec_sorted.num_kv_blocks)
    return DisaggregatedResult(whole, pre, dec_sorted, transfer)


# ---------------------------------------------------------------------------
# Balancing prefill against decode
# ---------------------------------------------------------------------------

def largest_chunk(itl_target_s: float, base_s: float, per_prompt_token_s: float, per_decode_row_s: float,
                  decode_rows: int) -> int:
    """The largest prompt chunk a mixed step may carry and still finish within ``itl_target_s``.

    A mixed step costs ``base + per_decode_row x rows + per_prompt_token x chunk``
    (the linear step model); every running stream waits that long for its next
    token. Rounded down: a chunk one token larger would miss the target.
    """
    for name, v in (("itl_target_s", itl_target_s), ("per_prompt_token_s", per_prompt_token_s)):
        if not v > 0:
            raise ValueError(f"{name} must be positive, got {v!r}")
    if base_s < 0 or per_decode_row_s < 0 or decode_rows < 0:
        raise ValueError("base_s, per_decode_row_s and decode_rows must be >= 0")
    room = itl_target_s - base_s - per_decode_row_s * decode_rows
    chunk = math.floor(room / per_prompt_token_s + 1e-9)
    if chunk < 1:
        raise ValueError(f"the decodes alone take {base_s + per_decode_row_s * decode_rows:.4g} s, leaving no "
                         f"room for a prompt token within {itl_target_s:.4g} s: fewer rows or a looser target")
    return chunk


def best_split(gpus: int, prefill_load: float, decode_load: float) -> int:
    """Prefill GPUs (1 .. gpus - 1) that minimise the busier pool's load per GPU.

    ``prefill_load`` and ``decode_load`` are GPU-seconds of work per second in
    each phase (arrivals x prompt tokens / one GPU's prefill rate, and the same
    for output tokens at its decode rate). Ties go to fewer prefill GPUs.
    """
    if isinstance(gpus, bool) or not isinstance(gpus, (int, np.integer)) or gpus < 2:
        raise ValueError(f"a split needs at least 2 GPUs, got {gpus!r}")
    if not prefill_load > 0 or not decode_load > 0:
        raise ValueError("prefill_load and decode_load must be positive")
    return min(range(1, gpus), key=lambda p: (max(prefill_load / p, decode_load / (gpus - p)), p))
