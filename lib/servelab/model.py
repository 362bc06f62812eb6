"""A Llama-architecture decoder in plain PyTorch, and a loader for Hugging Face checkpoints.

This file holds the whole model so it can be read top to bottom:

    token ids -> embed_tokens -> [ layer ] x N -> norm -> lm_head -> logits
    layer:  h = h + self_attn(input_layernorm(h))      (RoPE, GQA, causal)
            h = h + mlp(post_attention_layernorm(h))   (SwiGLU)

Parameter names match Hugging Face's ``LlamaForCausalLM`` with the ``model.``
prefix dropped, so a checkpoint maps onto this module name for name. Any
Llama-family checkpoint (TinyLlama, SmolLM, Llama 3.x) loads with
:func:`load_pretrained`; the tests check that logits match ``transformers`` to
1e-4 in fp32. Two jobs live beside it: fused projections in
:mod:`servelab.fusion`, config and checkpoint I/O in :mod:`servelab.checkpoint`
(neither imports this module); their names are importable from here too.

The pieces are public: ``model.embed(ids)``, ``model.rotary(position_ids)`` for
cos/sin at any positions, ``layer.self_attn.project(x, cos, sin)`` for a layer's
Q, K, V, ``layer.self_attn.attend(q, k, v, mask)`` and ``model.logits(h)``.

There is one forward path. Attention reads its keys and values through what
it is given as ``cache``: nothing (a plain prompt), a contiguous
:class:`KVCache` (``generate``), or the serving engine's *step context*, a
paged pool with block tables and slot mapping (``ragged`` rows of many
sequences; :mod:`servelab.engine.model_runner`). The engine runs these very
layers; only the attention core differs.
"""
from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from servelab.attention import apply_rope, decode_attention, mask_from_positions, rope_cos_sin, rope_inv_freq
from servelab.checkpoint import (  # noqa: F401  (re-exported: checkpoints and configs live there)
    COURSE_MODELS_DIR, SUPPORTED_ARCHITECTURES, SUPPORTED_MODEL_TYPES, LlamaConfig, _checkpoint_files,
    _hf_to_servelab_name, _resolve_dtype, check_llama_config, checkpoint_tensors, count_parameters_from_config,
    course_model_folder, load_config, load_state_dict, save_pretrained,
)
from servelab.fusion import (  # noqa: F401  (re-exported: the fused projections live there)
    FusedLinears, _apply_linears, _current_fusion, _fused_output, _refused, fusable, is_column_major,
    store_column_major,
)

__all__ = [
    "LlamaConfig", "check_llama_config", "RMSNorm", "rms_norm", "RotaryEmbedding", "Attention", "MLP", "DecoderLayer",
    "LlamaModel", "KVCache", "FusedLinears", "fusable", "load_pretrained", "save_pretrained", "load_config",
    "load_state_dict", "count_parameters_from_config", "load_course_model", "COURSE_MODELS_DIR",
    "store_column_major", "is_column_major",
]


# ====================================================================== layers

def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x / sqrt(mean(x**2) + eps) * weight`` over the last dimension, statistics in fp32.

    In fp32 this is PyTorch's single fused kernel; other dtypes are upcast for
    the statistics and cast back before the weight, as Hugging Face's Llama does.
    """
    if x.dtype == torch.float32 and weight.dtype == torch.float32:
        return F.rms_norm(x, weight.shape, weight, eps)
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


class RMSNorm(nn.Module):
    """x / rms(x) * weight (:func:`rms_norm`). Statistics in fp32 even when the model runs in bf16."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


class RotaryEmbedding(nn.Module):
    """Holds RoPE's per-pair frequencies; call it with position ids to get cos/sin.

    ``rotary(position_ids)`` -> ``(cos, sin)`` of shape ``[..., time, head_dim]``,
    for any positions at all (a prefill chunk, one decode step per sequence...).
    Positions below ``max_position_embeddings`` (at most :attr:`TABLE_LIMIT`) are
    looked up in a table computed once (the same fp32 arithmetic, so the same
    values); others are computed.
    """

    TABLE_LIMIT = 8192

    def __init__(self, config: LlamaConfig):
        super().__init__()
        inv_freq = rope_inv_freq(config.head_dim, config.rope_theta, config.rope_scaling)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.max_positions = min(config.max_position_embeddings, self.TABLE_LIMIT)
        self._table = None  # (key, cos [max, head_dim] fp32, sin) built on first use

    def table(self) -> tuple[torch.Tensor, torch.Tensor]:
        """fp32 cos and sin for positions ``0 .. max_position_embeddings - 1`` (rebuilt if
        ``inv_freq`` was replaced or moved)."""
        key = (self.inv_freq.data_ptr(), self.inv_freq.device, self.inv_freq.dtype)
        if self._table is None or self._table[0] != key:
            with torch.inference_mode(False), torch.no_grad():
                positions = torch.arange(self.max_positions, device=self.inv_freq.device)
                cos, sin = rope_cos_sin(positions, self.inv_freq, torch.float32)
            self._table = (key, cos, sin)
        return self._table[1], self._table[2]

    def forward(self, position_ids: torch.Tensor, dtype: torch.dtype = torch.float32,
                max_position: int | None = None):
        """cos/sin at ``position_ids``; ``max_position`` (the largest id, if the caller
        knows it) saves a look at the tensor."""
        if torch.compiler.is_compiling() and max_position is not None and self._table is not None:
            # a compiled engine step: its runner called table() and checked the positions
            # before the step (data pointers and Python ints have no place in a graph)
            return self._table[1][position_ids].to(dtype), self._table[2][position_ids].to(dtype)
        if max_position is None:
            if torch.compiler.is_compiling():
                # no data-dependent Python int in a compiled graph: compute (the same values)
                return rope_cos_sin(position_ids, self.inv_freq, dtype)
            max_position = int(position_ids.max()) if position_ids.numel() else 0
        if max_position < self.max_positions:
            cos, sin = self.table()
            return cos[position_ids].to(dtype), sin[position_ids].to(dtype)
        return rope_cos_sin(position_ids, self.inv_freq, dtype)


def _signed_sin(sin: torch.Tensor) -> torch.Tensor:
    """``sin`` with its first half negated: ``rotate_half(x) * sin == x.roll(half) * signed``."""
    half = sin.shape[-1] // 2
    return torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)


def _rope_roll(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """RoPE in three operations: ``x * cos + roll(x, half) * signed_sin`` (the same
    rotation as :func:`servelab.attention.apply_rope`: ``roll`` swaps the halves)."""
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, -1), signed_sin)


def _step_signed_sin(cache, sin: torch.Tensor) -> torch.Tensor:
    """:func:`_signed_sin` of this step's ``sin``, computed by the first layer and kept
    on the step context for the others (in a compiled step: computed, and the
    compiler shares it)."""
    if torch.compiler.is_compiling():
        return _signed_sin(sin)
    memo = getattr(cache, "_signed_sin", None)
    if memo is None or memo[0] is not sin:
        memo = (sin, _signed_sin(sin))
        try:
            cache._signed_sin = memo
        except AttributeError:  # a context that takes no attributes: compute per layer
            pass
    return memo[1]


# A compiled engine step (``ModelRunner(..., compile=True)``) traces the model's own
# forward into one graph, except attention: the paged step context is Python (block
# tables, groups of rows), so the graph calls it as one opaque operator that reads
# the context of the step being run, as vLLM's compiled models call their attention.
# The operator also writes the rows' K/V into the pool, which is not one of its
# arguments (declared: no mutation), as vLLM's does: the compiler cannot move or drop
# it, because each layer's attention output feeds the next layer, and the pool is
# read only by attention operators of the same layer, in order.
_STEP_CONTEXTS: list = []


@torch.library.custom_op("servelab::step_attend", mutates_args=())
def step_attend(q: torch.Tensor, kv: torch.Tensor, layer_idx: int, scale: float) -> torch.Tensor:
    """``attend(layer_idx, q, kv, scale)`` of the running step's context (see :meth:`Attention.forward`)."""
    if not _STEP_CONTEXTS:
        raise RuntimeError("servelab::step_attend runs only inside a compiled engine step")
    return _STEP_CONTEXTS[-1].attend(layer_idx, q, kv, scale)


@step_attend.register_fake
def _step_attend_shape(q, kv, layer_idx, scale):
    return torch.empty_like(q)


class Attention(nn.Module):
    """Causal self-attention with RoPE and any number of K/V heads.

    ``q_proj`` is ``hidden -> num_attention_heads * head_dim``; ``k_proj`` and
    ``v_proj`` are ``hidden -> num_key_value_heads * head_dim`` (narrower under
    GQA/MQA, which is the whole point: the cache stores only K and V).
    """

    def __init__(self, config: LlamaConfig, layer_idx: int = 0):
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.kv_groups = config.kv_groups
        self.scale = self.head_dim ** -0.5
        bias = config.attention_bias
        self.q_proj = nn.Linear(config.hidden_size, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=bias)
        self.fused_qkv: FusedLinears | None = None

    def fuse(self, column_major: bool = False) -> None:
        """Store Q, K and V as one matrix and project with one matmul at inference
        (left unfused if a projection is not a plain ``nn.Linear``)."""
        linears = [self.q_proj, self.k_proj, self.v_proj]
        self.fused_qkv = _refused(self.fused_qkv, linears, column_major)

    def project(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """Q, K, V for ``x [batch, time, hidden]``, RoPE already applied to Q and K.

        Returns ``q [batch, num_heads, time, head_dim]`` and
        ``k, v [batch, num_kv_heads, time, head_dim]`` -- the K and V are
        exactly what a KV cache stores for these tokens.
        """
        return self._project(x, cos, sin)

    def _project(self, x, cos, sin, signed_sin=None):
        b, t, _ = x.shape
        H, KVH, D = self.num_heads, self.num_kv_heads, self.head_dim
        linears = (self.q_proj, self.k_proj, self.v_proj)
        qkv = _fused_output(self, "fused_qkv", linears, x)
        if qkv is not None and cos.dim() in (2, 3):
            # fused: rotate Q and K together, in the [b, t, heads, d] rows the matmul wrote
            cos_rows = cos[..., None, :]                     # [(b,) t, 1, d]
            signed = _signed_sin(sin) if signed_sin is None else signed_sin
            qk = _rope_roll(qkv[..., :(H + KVH) * D].view(b, t, H + KVH, D), cos_rows, signed[..., None, :])
            v = qkv[..., (H + KVH) * D:].view(b, t, KVH, D)
            return qk[:, :, :H].transpose(1, 2), qk[:, :, H:].transpose(1, 2), v.transpose(1, 2)
        if qkv is not None:
            q, k, v = qkv.split((H * D, KVH * D, KVH * D), -1)
        else:
            q, k, v = _apply_linears(self, "fused_qkv", linears, x)
        q = q.view(b, t, H, D).transpose(1, 2)
        k = k.view(b, t, KVH, D).transpose(1, 2)
        v = v.view(b, t, KVH, D).transpose(1, 2)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               mask: torch.Tensor | None = None, is_causal: bool = False) -> torch.Tensor:
        """softmax(q k^T / sqrt(d)) v, then ``o_proj``; returns ``[batch, time, hidden]``.

        ``mask`` is boolean, True = may attend, broadcastable to
        ``[batch, heads, q_time, kv_time]``. Each K/V head serves ``kv_groups``
        query heads; SDPA's ``enable_gqa`` does that pairing without copying K/V
        (:func:`servelab.attention.repeat_kv` spells the same pairing out).
        """
        b, _, t, _ = q.shape
        G = self.kv_groups
        one_row_mask = mask is None or (mask.shape[-2] == 1 and (mask.dim() < 4 or mask.shape[1] == 1))
        if t == 1 and G > 1 and not is_causal and one_row_mask:  # one new token: each K/V head read once
            out = decode_attention(q[:, :, 0], k, v, mask, self.scale)[:, :, None]
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal and mask is None,
                                                 scale=self.scale, enable_gqa=G > 1)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, self.num_heads * self.head_dim))

    def forward(self, x, cos, sin, mask=None, cache=None, is_causal=False):
        """Attention for ``x [batch, time, hidden]`` over a contiguous ``cache`` (or none),
        or for ragged rows ``x [T, hidden]`` over a *step context* (``cache.ragged``).

        A step context (the engine's paged pool: :class:`servelab.engine.model_runner.PagedStepContext`)
        stores the rows' K/V where they belong and attends each row to its own
        sequence's past: ``cache.attend(layer_idx, q, kv, scale) -> [T, heads, head_dim]``
        with ``q [T, heads, head_dim]`` and ``kv [T, 2, kv_heads, head_dim]`` (K then V
        of each row, as the pool stores them), RoPE applied.
        Everything else (projections, RoPE, ``o_proj``) is this layer's own code.
        """
        if getattr(cache, "ragged", False):
            T, H, KVH, D = x.shape[0], self.num_heads, self.num_kv_heads, self.head_dim
            linears = (self.q_proj, self.k_proj, self.v_proj)
            qkv = _fused_output(self, "fused_qkv", linears, x)
            signed = _step_signed_sin(cache, sin)
            if qkv is not None:
                # fused: Q and K sit side by side in one fresh output, so one RoPE call rotates
                # both, written back in place; K and V then lie side by side as the pool stores them
                qk = qkv[:, :(H + KVH) * D].view(T, H + KVH, D)
                if torch.compiler.is_compiling():  # graphs take no strided out=; the compiler fuses
                    qk = _rope_roll(qk, cos, signed)
                    q = qk[:, :H]
                    kv = torch.cat((qk[:, H:], qkv[:, (H + KVH) * D:].view(T, KVH, D)), 1).view(T, 2, KVH, D)
                else:
                    torch.addcmul(qk * cos, qk.roll(D // 2, -1), signed, out=qk)
                    q, kv = qk[:, :H], qkv[:, H * D:].view(T, 2, KVH, D)
            else:
                q, k, v = _apply_linears(self, "fused_qkv", linears, x)
                q = _rope_roll(q.view(T, H, D), cos, signed)
                k = _rope_roll(k.view(T, KVH, D), cos, signed)
                kv = torch.stack((k, v.view(T, KVH, D)), dim=1)
            if torch.compiler.is_compiling() and not getattr(cache, "lone", False):
                # attention stays out of the graph (vLLM's split), except for a request
                # decoding alone, whose context attends inside it
                o = torch.ops.servelab.step_attend(q, kv, self.layer_idx, self.scale)
            else:
                o = cache.attend(self.layer_idx, q, kv, self.scale)
            return self.o_proj(o.reshape(T, self.num_heads * self.head_dim))
        q, k, v = self._project(x, cos, sin, None if cache is None else _step_signed_sin(cache, sin))
        if cache is not None:
            k, v = cache.update(self.layer_idx, k, v)
        return self.attend(q, k, v, mask=mask, is_causal=is_causal)


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)). Three matrices of hidden x intermediate."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        bias = config.mlp_bias
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=bias)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=bias)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=bias)
        self.fused_gate_up: FusedLinears | None = None

    def fuse(self, column_major: bool = False) -> None:
        """Store gate and up as one matrix and multiply once at inference
        (left unfused if either is not a plain ``nn.Linear``)."""
        linears = [self.gate_proj, self.up_proj]
        self.fused_gate_up = _refused(self.fused_gate_up, linears, column_major)

    def forward(self, x):
        linears = (self.gate_proj, self.up_proj)
        gate_up = _fused_output(self, "fused_gate_up", linears, x)
        if gate_up is not None:
            gate, up = gate_up.chunk(2, -1)  # two equal halves: no size list to check
        else:
            gate, up = _apply_linears(self, "fused_gate_up", linears, x)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    """Pre-norm block: attention then MLP, each added back to the residual stream."""

    def __init__(self, config: LlamaConfig, layer_idx: int = 0):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, layer_idx)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    @property
    def attn(self) -> Attention:
        """Short alias for ``self_attn`` (the Hugging Face name)."""
        return self.self_attn

    def forward(self, h, cos, sin, mask=None, cache=None, is_causal=False):
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, mask=mask, cache=cache, is_causal=is_causal)
        return h + self.mlp(self.post_attention_layernorm(h))


# ====================================================================== cache

class KVCache:
    """A contiguous KV cache: one preallocated ``[batch, kv_heads, max_len, head_dim]``
    tensor per layer for K and one for V, filled left to right.

    Simple and wasteful -- every sequence reserves ``max_len`` slots up front --
    which is exactly what the paged cache of the engine chapter fixes.
    Protocol used by the model: ``update(layer_idx, k, v)`` stores the new
    tokens' K/V at ``[length, length + t)`` and returns everything stored so far
    for that layer; the model calls ``advance(t)`` once all layers are done.
    """

    def __init__(self, config: LlamaConfig, batch_size: int = 1, max_len: int | None = None,
                 dtype: torch.dtype = torch.float32, device=None):
        max_len = config.max_position_embeddings if max_len is None else max_len
        shape = (config.num_hidden_layers, batch_size, config.num_key_value_heads, max_len, config.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.max_len = max_len
        self.length = 0
        self._k_layers, self._v_layers = self.k.unbind(0), self.v.unbind(0)  # per-layer views, made once

    def update(self, layer_idx: int, k: torch.Tensor, v: torch.Tensor):
        end = self.length + k.shape[2]
        if end > self.max_len:
            raise ValueError(f"KV cache is full: {end} tokens would exceed max_len={self.max_len}")
        k_layer, v_layer = self._k_layers[layer_idx], self._v_layers[layer_idx]
        k_layer[:, :, self.length:end] = k
        v_layer[:, :, self.length:end] = v
        return k_layer[:, :, :end], v_layer[:, :, :end]

    def advance(self, n: int) -> None:
        self.length += n

    def crop(self, length: int) -> None:
        """Forget everything after ``length`` tokens (e.g. rejected draft tokens)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"crop length must be in [0, {self.length}], got {length}")
        self.length = length

    @property
    def nbytes(self) -> int:
        """Bytes reserved (not used): the whole preallocated K and V."""
        return self.k.numel() * self.k.element_size() * 2


# ====================================================================== model

class LlamaModel(nn.Module):
    """The whole decoder: ``forward(input_ids) -> logits [batch, time, vocab]``.

    Attributes: ``embed_tokens``, ``layers`` (each with ``self_attn``/``attn``,
    ``mlp`` and two norms), ``norm``, ``lm_head`` (the same Parameter as
    ``embed_tokens.weight`` when ``tie_word_embeddings``), ``rotary``.
    """

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.config = check_llama_config(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.rotary = RotaryEmbedding(config)

    # -- pieces ---------------------------------------------------------
    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Look up each token's row of the embedding table: the start of the residual stream."""
        return self.embed_tokens(input_ids)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Final norm then the output head: residual stream -> a score per vocabulary entry."""
        return self.lm_head(self.norm(h))

    # -- forward --------------------------------------------------------
    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None,
                cache: KVCache | None = None, logits_rows: torch.Tensor | None = None) -> torch.Tensor:
        """Logits ``[batch, time, vocab]`` for ``input_ids [batch, time]``.

        ``position_ids`` default to the next positions after what ``cache``
        holds (0, 1, ... without a cache). With a cache the new K/V are stored
        and the cache advances by ``time``.

        The engine's form: ``input_ids [T]`` ragged rows of many sequences, their
        ``position_ids [T]`` and a step context as ``cache`` (see
        :meth:`Attention.forward`); ``logits_rows`` picks the rows that need
        logits (the others skip the output head). Returns ``[len(logits_rows), vocab]``.
        """
        h = self._run(input_ids, position_ids, cache)[-1]
        if logits_rows is not None:
            h = h[logits_rows]
        return self.logits(h)

    def hidden_states(self, input_ids: torch.Tensor, position_ids=None, cache=None) -> list[torch.Tensor]:
        """The residual stream after the embedding and after each layer (before the final norm)."""
        return self._run(input_ids, position_ids, cache, keep_all=True)

    def _run(self, input_ids, position_ids, cache, keep_all=False):
        if getattr(cache, "ragged", False):  # the engine's ragged rows over a step context
            h = self.embed(input_ids)
            cos, sin = self.rotary(position_ids, h.dtype, getattr(cache, "max_position", None))
            cos, sin = cos[:, None], sin[:, None]
            states = [h] if keep_all else None
            for layer in self.layers:
                h = layer(h, cos, sin, cache=cache)
                if keep_all:
                    states.append(h)
            return states if keep_all else [h]
        if input_ids.dim() == 1:
            input_ids = input_ids[None]
        b, t = input_ids.shape
        start = cache.length if cache is not None else 0
        default_positions = position_ids is None
        if default_positions:
            position_ids = torch.arange(start, start + t, device=input_ids.device)
        h = self.embed(input_ids)
        cos, sin = self.rotary(position_ids, h.dtype)
        if default_positions and (start == 0 or t == 1):
            # a prompt from the start needs only the causal flag, and one new token
            # after the cache sees every cached key: no mask tensor either way
            mask, is_causal = None, start == 0
        else:
            mask, is_causal = mask_from_positions(position_ids, start + t if cache is not None else t), False
        states = [h] if keep_all else None
        for layer in self.layers:
            h = layer(h, cos, sin, mask=mask, cache=cache, is_causal=is_causal)
            if keep_all:
                states.append(h)
        if cache is not None:
            cache.advance(t)
        return states if keep_all else [h]

    # -- helpers --------------------------------------------------------
    def new_cache(self, batch_size: int = 1, max_len: int | None = None) -> KVCache:
        p = self.embed_tokens.weight
        return KVCache(self.config, batch_size, max_len, dtype=p.dtype, device=p.device)

    def fuse_projections(self, column_major: bool = False) -> "LlamaModel":
        """Fuse every layer's Q/K/V and gate/up projections (see :class:`FusedLinears`).

        Same outputs, fewer and longer matmuls: the usual serving layout. A
        fusion made stale by ``.to(dtype)`` or a weight swap is rebuilt at the next
        inference call; groups holding other modules than plain ``nn.Linear``
        (quantized, tensor-parallel) stay unfused. Returns the model.

        ``column_major=True`` also stores every plain linear's matrix (fused ones,
        ``o_proj``, ``down_proj``, the head; a tied embedding with it) transposed
        in memory (:func:`store_column_major`): same shapes, values and
        ``state_dict``, faster mat-vecs on the CPUs measured. The serving engine's
        runner asks for it. Code that calls ``.view`` on a weight must then use
        ``.reshape``.
        """
        for layer in self.layers:
            layer.self_attn.fuse(column_major)
            layer.mlp.fuse(column_major)
            if column_major:
                for lin in (layer.self_attn.o_proj, layer.mlp.down_proj):
                    if type(lin) is nn.Linear:
                        store_column_major(lin)
        if column_major and type(self.lm_head) is nn.Linear:
            tied = self.lm_head.weight is self.embed_tokens.weight
            store_column_major(self.lm_head)
            if tied:
                self.embed_tokens.weight = self.lm_head.weight
        return self

    def refresh_fusions(self) -> None:
        """Rebuild any fused projection made stale (by ``.to(dtype)`` or a weight swap).

        Eager calls check their fusion themselves; a compiled engine step cannot
        (data pointers have no place in a graph), so its runner calls this first.
        """
        for layer in self.layers:
            attn, mlp = layer.self_attn, layer.mlp
            _current_fusion(attn, "fused_qkv", (attn.q_proj, attn.k_proj, attn.v_proj))
            _current_fusion(mlp, "fused_gate_up", (mlp.gate_proj, mlp.up_proj))

    def num_parameters(self) -> int:
        """Distinct parameters (a tied head is counted once)."""
        return sum(p.numel() for p in self.parameters())

    def init_weights(self, std: float = 0.02, seed: int | None = None) -> "LlamaModel":
        """Normal(0, std) matrices, ones for norms -- the usual Llama initialisation."""
        gen = torch.Generator().manual_seed(seed) if seed is not None else None
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("norm.weight"):
                    p.fill_(1.0)
                elif name.endswith(".bias"):
                    p.zero_()
                else:
                    p.copy_(torch.randn(p.shape, generator=gen) * std)
        return self


# ====================================================================== loading

def load_pretrained(path: str | Path, dtype: torch.dtype | str = torch.float32,
                    device: str | torch.device = "cpu") -> LlamaModel:
    """Build a :class:`LlamaModel` from a Hugging Face checkpoint folder.

    Reads ``config.json`` and ``model.safetensors`` (or the shards listed in
    ``model.safetensors.index.json``). Every tensor must be accounted for:
    missing, unexpected or wrongly shaped tensors raise ``ValueError`` naming
    them (:func:`servelab.checkpoint.checkpoint_tensors`). Returns the model in eval mode.
    """
    folder = Path(path)
    if not folder.is_dir():
        raise FileNotFoundError(f"checkpoint folder {folder} does not exist")
    config = load_config(folder)
    dtype = _resolve_dtype(dtype)
    with torch.device("meta"):
        model = LlamaModel(config).to(dtype)
    tensors = checkpoint_tensors(folder, config, {name: p.shape for name, p in model.state_dict().items()})
    model = model.to_empty(device=device)
    model.load_state_dict({k: v.to(dtype) for k, v in tensors.items()}, strict=False)
    if config.tie_word_embeddings:  # to_empty gave the head its own storage; share it again
        model.lm_head.weight = model.embed_tokens.weight
    # RoPE frequencies are computed, not stored, and kept in fp32 whatever the weights' dtype.
    model.rotary.inv_freq = rope_inv_freq(config.head_dim, config.rope_theta, config.rope_scaling).to(device)
    return model.eval()


def load_course_model(name: str = "main", dtype: torch.dtype | str = torch.float32) -> LlamaModel:
    """The course's tiny trained model: ``"main"`` (~6M parameters) or ``"draft"`` (~1M).

    Both use the course tokenizer (``servelab.bpe.load_course_tokenizer()``) and
    were trained by ``python -m servelab.train --preset main|draft``.
    """
    return load_pretrained(course_model_folder(name), dtype=dtype)
