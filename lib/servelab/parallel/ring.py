"""Ring attention: attention over a sequence split across processes.

Each rank holds one contiguous slice of the sequence: its queries, keys and
values. The key/value blocks travel round the ring; at each of ``p`` steps a
rank attends its queries to the block it holds, folds the partial result into a
running (max, denominator, numerator) -- the online softmax of
:func:`servelab.attention.tiled_attention` -- and passes the block on. After
``p`` steps every query has seen every key, no rank ever held the whole K/V, and
the result equals full attention.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from servelab.attention import online_softmax_finish, online_softmax_fold, online_softmax_start, repeat_kv
from servelab.parallel.launch import DEFAULT_TIMEOUT_S, launch

__all__ = ["ring_attention", "ring_attention_across"]


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True,
                   group=None) -> tuple[torch.Tensor, dict]:
    """This rank's slice of attention over the whole (split) sequence.

    ``q [batch, heads, t, d]``, ``k, v [batch, kv_heads, t, d]`` are rank
    ``r``'s slice: positions ``[r t, (r + 1) t)`` (every rank holds ``t``
    positions). Returns ``(out [batch, heads, t, d], stats)`` where stats counts
    the blocks received and their bytes.
    """
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    t = q.shape[-2]
    if k.shape[-2] != t or v.shape[-2] != t:
        raise ValueError(f"each rank must hold the same positions for q, k, v; got {t}, {k.shape[-2]}, "
                         f"{v.shape[-2]}")
    groups = q.shape[1] // k.shape[1]
    scale = q.shape[-1] ** -0.5
    qf = q.float()
    state = online_softmax_start(qf)
    q_pos = torch.arange(rank * t, (rank + 1) * t)
    block = torch.stack([k, v]).contiguous()
    right, left = (rank + 1) % world, (rank - 1) % world
    received = 0
    for step in range(world):
        owner = (rank - step) % world  # whose slice this block is
        k_pos = torch.arange(owner * t, (owner + 1) * t)
        if not (causal and owner > rank):  # a later slice is wholly masked: skip the work
            kb, vb = repeat_kv(block[0], groups).float(), repeat_kv(block[1], groups).float()
            state = online_softmax_fold(state, qf, kb, vb, scale, q_pos if causal else None, k_pos)
        if step < world - 1:
            req = dist.isend(block, right, group=group)
            nxt = torch.empty_like(block)
            dist.recv(nxt, left, group=group)
            req.wait()
            block = nxt
            received += nxt.numel() * nxt.element_size()
    return online_softmax_finish(state).to(q.dtype), {"blocks_received": world - 1, "bytes_received": received}


def _ring_worker(rank: int, world: int, q, k, v, causal: bool):
    t = q.shape[-2] // world
    sl = slice(rank * t, (rank + 1) * t)
    out, stats = ring_attention(q[..., sl, :].contiguous(), k[..., sl, :].contiguous(),
                                v[..., sl, :].contiguous(), causal)
    return {"out": out, "stats": stats, "kv_positions_held": t}


def ring_attention_across(q, k, v, world_size: int, causal: bool = True,
                          timeout: float = DEFAULT_TIMEOUT_S) -> tuple[torch.Tensor, list[dict]]:
    """Split the sequence over ``world_size`` processes, run :func:`ring_attention`, reassemble.

    The time dimension must divide by ``world_size``. Returns the full output and each rank's stats.
    """
    if q.shape[-2] % world_size:
        raise ValueError(f"sequence length {q.shape[-2]} must divide by world_size={world_size}; "
                         "pad the sequence or pick another world size")
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"query heads ({q.shape[1]}) must be a multiple of K/V heads ({k.shape[1]})")
    results = launch(_ring_worker, world_size, (q, k, v, causal), timeout)
    return torch.cat([r["out"] for r in results], dim=-2), results
