"""Kernel arithmetic without torch: bytes an element-wise sequence moves, on-chip tile bytes, a decode grid.

:func:`bytes_moved` counts what a sequence of element-wise ops reads and writes,
unfused and fused (:data:`SEQUENCES`: RMSNorm with its residual add, SwiGLU);
:func:`tile_bytes` the on-chip bytes one FlashAttention step keeps live, next to an
H100 SM's memory (:data:`H100_SMEM_PER_SM`); :func:`decode_attention_grid` how a
decode step's attention fills a GPU before and after split-KV. Importing it loads
no torch; :mod:`servelab.kernels` re-exports every name.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

__all__ = [
    "Op", "SEQUENCES", "bytes_moved", "tile_bytes", "decode_attention_grid", "H100_SMS",
    "H100_L1_SMEM_PER_SM", "H100_SMEM_PER_SM", "H100_REGISTERS_PER_SM", "H100_MAX_REGISTERS_PER_THREAD",
]

# ---------------------------------------------------------------- on-chip memory (public figures)

#: NVIDIA H100 SXM5: 132 streaming multiprocessors (SMs). Source: NVIDIA H100 Tensor Core GPU
#: Architecture whitepaper (2022), "H100 SXM5 ... 132 SMs".
H100_SMS = 132
#: Combined L1 cache / shared memory per SM: 256 KB. Source: the same whitepaper and NVIDIA's
#: Hopper Tuning Guide ("the combined L1 cache and shared memory capacity of 256 KB per SM").
H100_L1_SMEM_PER_SM = 256 * 1024
#: Shared memory one SM can give its thread blocks: up to 228 KB (227 KB usable by one block).
#: Source: NVIDIA Hopper Tuning Guide, section "Unified Shared Memory/L1/Texture Cache".
H100_SMEM_PER_SM = 228 * 1024
#: Register file per SM: 65,536 32-bit registers = 256 KB. Source: the H100 whitepaper's SM table.
H100_REGISTERS_PER_SM = 256 * 1024
#: Most 32-bit registers one thread may use: 255 (compute capability 9.0). Source: CUDA C++
#: Programming Guide, "Technical Specifications per Compute Capability" table.
H100_MAX_REGISTERS_PER_THREAD = 255


# ---------------------------------------------------------------- fusion: bytes

@dataclass(frozen=True)
class Op:
    """One element-wise kernel: how many full-size tensors it reads and writes."""

    name: str
    reads: int
    writes: int


#: Each sequence as eager PyTorch runs it (one kernel per op), and as a fused kernel would:
#: ``fused_reads``/``fused_writes`` count the tensors a single kernel must touch (its inputs,
#: and the outputs used later). Sizes are in full tensors of the activation's shape; the
#: norm's weight vector and per-row statistics are ignored (one number per row or column).
SEQUENCES: dict[str, dict[str, Any]] = {
    "rmsnorm_residual": {
        "ops": (Op("h = x + residual", 2, 1), Op("h * h", 1, 1), Op("mean over the row", 1, 0),
                Op("h * rsqrt(mean + eps)", 1, 1), Op("* weight", 1, 1)),
        "fused_reads": 2, "fused_writes": 2,   # reads x and residual; writes h (the new residual) and y
    },
    "swiglu": {
        "ops": (Op("silu(gate)", 1, 1), Op("silu(gate) * up", 2, 1)),
        "fused_reads": 2, "fused_writes": 1,
    },
}


def bytes_moved(sequence: str | Sequence[Op], numel: int, bytes_per_element: float = 4,
                fused: bool = False, fused_reads: int | None = None, fused_writes: int | None = None) -> float:
    """Bytes a sequence of element-wise ops moves to and from memory for tensors of ``numel`` elements.

    ``sequence`` is a :data:`SEQUENCES` name or a list of :class:`Op`. Unfused,
    every op reads and writes full tensors; fused (``fused=True``), only the
    sequence's own inputs are read and its kept outputs written.
    """
    if isinstance(numel, bool) or not isinstance(numel, int) or numel < 0:
        raise ValueError(f"numel must be a whole number >= 0, got {numel!r}")
    if not bytes_per_element > 0:
        raise ValueError(f"bytes_per_element must be positive, got {bytes_per_element!r}")
    if isinstance(sequence, str):
        if sequence not in SEQUENCES:
            raise ValueError(f"unknown sequence {sequence!r}; choose from {sorted(SEQUENCES)} or pass Ops")
        spec = SEQUENCES[sequence]
        ops = spec["ops"]
        fused_reads = spec["fused_reads"] if fused_reads is None else fused_reads
        fused_writes = spec["fused_writes"] if fused_writes is None else fused_writes
    else:
        ops = tuple(sequence)
    if fused:
        if fused_reads is None or fused_writes is None:
            raise ValueError("a custom sequence needs fused_reads and fused_writes to count its fused form")
        tensors = fused_reads + fused_writes
    else:
        tensors = sum(op.reads + op.writes for op in ops)
    return tensors * numel * bytes_per_element


# ---------------------------------------------------------------- FlashAttention's tiling

def tile_bytes(block_q: int, block_k: int, head_dim: int, bytes_per_element: float = 2,
               accumulator_bytes: float = 4) -> dict[str, float]:
    """On-chip bytes one (query block, key block) step of FlashAttention keeps live.

    The Q tile, the K and V tiles (input precision), the score/probability tile
    and the output accumulator (``accumulator_bytes``, fp32), plus the running
    max and sum per query row. This is what one thread block must hold in an
    SM's shared memory and registers.
    """
    for name, v in (("block_q", block_q), ("block_k", block_k), ("head_dim", head_dim)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive whole number, got {v!r}")
    parts = {"q": block_q * head_dim * bytes_per_element,
             "k": block_k * head_dim * bytes_per_element,
             "v": block_k * head_dim * bytes_per_element,
             "scores": block_q * block_k * accumulator_bytes,
             "output": block_q * head_dim * accumulator_bytes,
             "row_stats": 2 * block_q * accumulator_bytes}
    parts["total"] = sum(parts.values())
    return parts


def decode_attention_grid(batch: int, query_heads: int, kv_heads: int, context: int,
                          sms: int = H100_SMS, block_q: int = 128,
                          block_k: int = 128) -> dict[str, float]:
    """How one decode step's attention fills a GPU, before and after split-KV.

    A FlashAttention-style kernel gives a thread block to each (sequence, KV
    head, query tile). At decode each sequence brings one new query per head;
    packing the ``query_heads // kv_heads`` heads that share a KV head (GQA)
    as the rows of one tile gives ``batch * kv_heads`` thread blocks, each
    using that many of the tile's ``block_q`` rows. Flash-Decoding (split-KV)
    also splits the ``context`` keys into chunks, each its own thread block,
    and merges the partial outputs with their softmax statistics: ``splits``
    is the fewest chunks that give each of ``sms`` SMs a block, at most one
    per key block. Pure arithmetic: no GPU needed.
    """
    for name, v in (("batch", batch), ("query_heads", query_heads), ("kv_heads", kv_heads),
                    ("context", context), ("sms", sms), ("block_q", block_q),
                    ("block_k", block_k)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive whole number, got {v!r}")
    if query_heads % kv_heads:
        raise ValueError(f"query_heads ({query_heads}) must be a multiple of kv_heads "
                         f"({kv_heads}): each KV head serves a whole group of query heads")
    rows = query_heads // kv_heads
    blocks = batch * kv_heads
    splits = max(1, min(-(-sms // blocks), -(-context // block_k)))
    return {"blocks": blocks, "query_rows": rows, "tile_rows_used": min(rows, block_q) / block_q,
            "splits": splits, "blocks_split": blocks * splits,
            "keys_per_split": -(-context // splits)}
