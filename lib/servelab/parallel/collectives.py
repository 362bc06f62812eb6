"""Collectives written by hand on ``send``/``recv``, and timed beside gloo's own.

:func:`ring_all_reduce` is the textbook ring: the tensor is cut into ``p``
chunks; in ``p - 1`` *reduce-scatter* steps each rank passes one chunk to its
right neighbour, which adds it to its own copy, until every rank holds one chunk
summed over all ranks; in ``p - 1`` *all-gather* steps the finished chunks go
round once more. Each rank sends ``2 (p - 1) / p`` of the tensor in
``2 (p - 1)`` exchanges -- the numbers :func:`servelab.comm.allreduce_seconds`
charges for ``algorithm="ring"``.
"""
from __future__ import annotations

import statistics

import torch
import torch.distributed as dist

from servelab.parallel.launch import DEFAULT_TIMEOUT_S, launch
from servelab.timing import call_seconds

__all__ = ["ring_all_reduce", "measure_collectives", "compare_ring_with_gloo"]


def ring_all_reduce(tensor: torch.Tensor, group=None) -> dict:
    """Sum ``tensor`` over all ranks in place, by a ring of sends and receives.

    Returns ``{"steps": 2 (p - 1), "bytes_sent": ...}`` for this rank.
    """
    world = dist.get_world_size(group)
    rank = dist.get_rank(group)
    if world == 1:
        return {"steps": 0, "bytes_sent": 0}
    if not tensor.is_contiguous():
        raise ValueError("ring_all_reduce needs a contiguous tensor; call .contiguous() first")
    flat = tensor.view(-1)
    pad = (-flat.numel()) % world
    work = torch.cat([flat, flat.new_zeros(pad)]) if pad else flat
    chunks = list(work.chunk(world))
    right, left = (rank + 1) % world, (rank - 1) % world
    sent = 0
    for step in range(world - 1):  # reduce-scatter
        send_i, recv_i = (rank - step) % world, (rank - step - 1) % world
        req = dist.isend(chunks[send_i].contiguous(), right, group=group)
        buf = torch.empty_like(chunks[recv_i])
        dist.recv(buf, left, group=group)
        req.wait()
        chunks[recv_i] += buf
        sent += chunks[send_i].numel() * chunks[send_i].element_size()
    for step in range(world - 1):  # all-gather: pass the finished chunks round
        send_i, recv_i = (rank - step + 1) % world, (rank - step) % world
        req = dist.isend(chunks[send_i].contiguous(), right, group=group)
        buf = torch.empty_like(chunks[recv_i])
        dist.recv(buf, left, group=group)
        req.wait()
        chunks[recv_i].copy_(buf)
        sent += chunks[send_i].numel() * chunks[send_i].element_size()
    if pad:
        flat.copy_(work[: flat.numel()])
    return {"steps": 2 * (world - 1), "bytes_sent": sent}


def _timed(fn) -> float:
    """Seconds of one call of ``fn``, every rank lined up by a barrier first (untimed)."""
    return call_seconds(fn, 1, warmup=0, before=dist.barrier)[0]


def _measure_worker(rank: int, world: int, sizes: list[int], repeats: int) -> list[dict]:
    out = []
    for nbytes in sizes:
        n = world * max(1, -(-nbytes // (4 * world)))  # whole fp32 numbers, a multiple of world
        x = torch.full((n,), float(rank + 1))
        y = x.clone()
        a2a_in, a2a_out = x.clone(), torch.empty_like(x)
        # interleave the three so drift on a shared machine hits them alike
        row = {"bytes": n * 4, "gloo": [], "ring": [], "all_to_all": []}
        for _ in range(repeats):
            row["gloo"].append(_timed(lambda: dist.all_reduce(x)))
            row["ring"].append(_timed(lambda: ring_all_reduce(y)))
            row["all_to_all"].append(_timed(lambda: dist.all_to_all_single(a2a_out, a2a_in)))
        entry = {"bytes": n * 4}
        for name in ("gloo", "ring", "all_to_all"):
            entry[f"{name}_s"] = statistics.median(row[name])
            entry[f"{name}_min_s"] = min(row[name])
        out.append(entry)
    return out


def _check_worker(rank: int, world: int, shapes: list[tuple]) -> list[bool]:
    ok = []
    gen = torch.Generator().manual_seed(rank)
    for shape in shapes:
        x = torch.randint(-50, 50, shape, generator=gen).float()  # integers: sums are exact in any order
        a, b = x.clone(), x.clone()
        dist.all_reduce(a)
        stats = ring_all_reduce(b)
        ok.append((torch.equal(a, b), stats))
    return ok


def measure_collectives(sizes_bytes=(4_096, 65_536, 1_048_576, 4_194_304), world_size: int = 2,
                        repeats: int = 5, timeout: float = DEFAULT_TIMEOUT_S) -> list[dict]:
    """Seconds of gloo's all-reduce, :func:`ring_all_reduce` and all-to-all, per message size.

    Runs on ``world_size`` local processes over loopback, the three interleaved
    ``repeats`` times; rank 0's median (``gloo_s``...) and fastest
    (``gloo_min_s``...) run. On a busy machine the fastest run is the better
    estimate of what the link can do.
    """
    sizes = [int(s) for s in sizes_bytes]
    if not sizes or any(s <= 0 for s in sizes):
        raise ValueError(f"sizes_bytes must be positive byte counts, got {sizes_bytes!r}")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a positive integer, got {repeats!r}")
    return launch(_measure_worker, world_size, (sizes, repeats), timeout)[0]


def compare_ring_with_gloo(world_size: int = 4, shapes=((10,), (1000,), (64, 64)),
                           timeout: float = DEFAULT_TIMEOUT_S) -> list[dict]:
    """Sum integer-valued random tensors with gloo's all-reduce and with :func:`ring_all_reduce`.

    Returns, per shape, whether every rank got identical sums, the ring's steps
    and the bytes rank 0 sent (``2 (p - 1) / p`` of the tensor).
    """
    shapes = [tuple(s) for s in shapes]
    results = launch(_check_worker, world_size, (shapes,), timeout)
    rows = []
    for i, shape in enumerate(shapes):
        numel = 1
        for d in shape:
            numel *= d
        rows.append({"shape": shape, "bytes": numel * 4, "equal": all(r[i][0] for r in results),
                     "steps": results[0][i][1]["steps"], "bytes_sent": results[0][i][1]["bytes_sent"]})
    return rows
