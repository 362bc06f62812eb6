"""The model runner: turns a scheduled step into one forward pass over a paged cache.

The scheduler's plan is a list of (sequence, how many new tokens). The runner
flattens it into one **ragged batch**: every scheduled token of every sequence,
one after another, each with its explicit position and the pool slot its K/V
goes to. Prefill chunks and decodes are just rows of different lengths:

    input_ids   [t0 t1 t2 t3 | d | d | c0 c1]   (a prompt, two decodes, a chunk)
    positions   [0  1  2  3  | 57| 9 | 32 33]
    slot_map    where each row's K/V is written in the pool

Matmuls (projections, MLP) see one [T, hidden] matrix regardless of who the rows
belong to; only attention needs to know, and reads each sequence's past through
its block table. Logits are computed only for rows that end a sequence's
missing tokens: a chunk in the middle of a prompt samples nothing.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from servelab.engine.scheduler import SchedulerOutput
from servelab.attention import rotate_half
from servelab.model import rms_norm
from servelab.paged import PagedAttentionMetadata, paged_attention, write_kv

__all__ = ["StepInput", "prepare_step", "ModelRunner"]


@dataclass
class StepInput:
    input_ids: list[int]
    positions: list[int]
    slot_mapping: list[int]
    query_lens: list[int]
    context_lens: list[int]
    block_tables: list[list[int]]
    sample_rows: list[int]  # row of the last token of each sequence that samples

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)


def prepare_step(out: SchedulerOutput) -> StepInput:
    """Flatten the scheduler's plan into a ragged batch (no tensors yet)."""
    step = StepInput([], [], [], [], [], [], [])
    for s in out.scheduled:
        seq, start, n = s.seq, s.start, s.num_new_tokens
        end = start + n
        step.input_ids.extend(seq.token_ids[start:end])
        step.positions.extend(range(start, end))
        step.slot_mapping.extend(seq.block_table.slots(start, end))
        step.query_lens.append(n)
        step.context_lens.append(end)
        step.block_tables.append(list(seq.block_table.block_ids))
        if s.samples:
            step.sample_rows.append(len(step.input_ids) - 1)
    return step


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE for rows laid out [T, heads, head_dim] with cos/sin [T, 1, head_dim]."""
    return x * cos + rotate_half(x) * sin


class ModelRunner:
    """Runs a :class:`servelab.model.LlamaModel` over a paged KV pool.

    The pool is one K and one V tensor per layer, each
    ``[num_blocks, block_size, num_key_value_heads, head_dim]``.

    The forward pass uses the model's own weights and RoPE tables, with two
    standard serving tricks: the Q, K and V projections are fused into one
    matrix (one matmul instead of three), and so are the MLP's gate and up
    projections (``LlamaModel.fuse_projections``, done when the runner is built;
    the model's own weights become views of the fused matrices, nothing is copied).
    Attention is replaced by the gather through block tables. The tests check
    the logits against the model's own forward pass.
    """

    def __init__(self, model, num_blocks: int, block_size: int, kv_dtype: torch.dtype | None = None):
        self.model = model.eval()
        cfg = model.config
        self.config = cfg
        self.block_size = block_size
        self.dtype = model.embed_tokens.weight.dtype
        kv_dtype = kv_dtype or self.dtype
        shape = (num_blocks, block_size, cfg.num_key_value_heads, cfg.head_dim)
        self.k_cache = [torch.zeros(shape, dtype=kv_dtype) for _ in range(cfg.num_hidden_layers)]
        self.v_cache = [torch.zeros(shape, dtype=kv_dtype) for _ in range(cfg.num_hidden_layers)]
        model.fuse_projections()  # views of one matrix each: no copy of the weights
        self.scale = cfg.head_dim ** -0.5

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def kv_pool_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k_cache + self.v_cache)

    @torch.inference_mode()
    def execute(self, step: StepInput) -> torch.Tensor:
        """Write every scheduled token's K/V; return logits [len(sample_rows), vocab]."""
        model, cfg = self.model, self.config
        T = step.num_tokens
        H, KVH, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        eps = cfg.rms_norm_eps
        ids = torch.as_tensor(step.input_ids, dtype=torch.long)
        positions = torch.as_tensor(step.positions, dtype=torch.long)
        slots = torch.as_tensor(step.slot_mapping, dtype=torch.long)
        meta = PagedAttentionMetadata.build(step.block_tables, step.query_lens,
                                            step.context_lens, self.block_size)
        h = F.embedding(ids, model.embed_tokens.weight)             # [T, hidden]
        cos, sin = model.rotary(positions, h.dtype)                 # [T, head_dim]
        cos, sin = cos[:, None], sin[:, None]
        for layer, k_cache, v_cache in zip(model.layers, self.k_cache, self.v_cache):
            attn, mlp = layer.self_attn, layer.mlp
            q, k, v = attn.fused_qkv(rms_norm(h, layer.input_layernorm.weight, eps))
            q = _rope(q.view(T, H, D), cos, sin)
            k = _rope(k.view(T, KVH, D), cos, sin)
            write_kv(k_cache, slots, k)
            write_kv(v_cache, slots, v.view(T, KVH, D))
            o = self._attention(q, k_cache, v_cache, meta)
            h = h + attn.o_proj(o.reshape(T, H * D))
            gate, up = mlp.fused_gate_up(rms_norm(h, layer.post_attention_layernorm.weight, eps))
            h = h + mlp.down_proj(F.silu(gate) * up)
        rows = torch.as_tensor(step.sample_rows, dtype=torch.long)
        return model.logits(h[rows]).float()

    def _attention(self, q, k_cache, v_cache, meta):
        if k_cache.dtype != q.dtype:  # a lower-precision pool: compute in q's dtype
            k_cache, v_cache = k_cache.to(q.dtype), v_cache.to(q.dtype)
        return paged_attention(q, k_cache, v_cache, meta, scale=self.scale)
