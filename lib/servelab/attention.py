"""Attention, written out plainly: the causal mask, RoPE, KV-head sharing.

These are the small functions the decoder in :mod:`servelab.model` is built
from. They are deliberately naive (one matrix of scores, one softmax) so that a
reader can print every intermediate tensor; the model uses PyTorch's fused
``scaled_dot_product_attention`` for speed, and the tests check that both agree.
:func:`tiled_attention` computes the same result one block of keys at a time
with an online softmax, FlashAttention's arithmetic.

Shapes follow the Hugging Face convention:
queries ``[batch, n_heads, time, head_dim]``, keys and values
``[batch, n_kv_heads, kv_time, head_dim]``.
"""
from __future__ import annotations

import math
from typing import Any, Mapping

import torch

__all__ = [
    "causal_mask",
    "mask_from_positions",
    "rope_inv_freq",
    "rope_cos_sin",
    "rotate_half",
    "apply_rope",
    "repeat_kv",
    "decode_attention",
    "attention_scores",
    "attention_probs",
    "naive_attention",
    "tiled_attention",
    "online_softmax_start",
    "online_softmax_fold",
    "online_softmax_finish",
    "time_decode_steps",
    "time_steps_with_and_without_cache",
]


# ---------------------------------------------------------------- masks

def causal_mask(q_len: int, kv_len: int | None = None, device=None) -> torch.Tensor:
    """Boolean ``[q_len, kv_len]`` mask, True where a query may look.

    The queries are taken to be the *last* ``q_len`` positions of the
    ``kv_len`` keys (the usual case with a cache: the new tokens come after
    everything already stored), so query ``i`` sees keys ``0 .. kv_len-q_len+i``.
    """
    kv_len = q_len if kv_len is None else kv_len
    if q_len < 0 or kv_len < q_len:
        raise ValueError(f"need 0 <= q_len <= kv_len, got q_len={q_len}, kv_len={kv_len}")
    q_pos = torch.arange(kv_len - q_len, kv_len, device=device)
    k_pos = torch.arange(kv_len, device=device)
    return k_pos[None, :] <= q_pos[:, None]


def mask_from_positions(q_positions: torch.Tensor, kv_len: int) -> torch.Tensor:
    """Causal mask from explicit query positions: key ``j`` is visible to a
    query at position ``p`` when ``j <= p``.

    ``q_positions`` is ``[time]`` or ``[batch, time]``; the result is
    ``[time, kv_len]`` or ``[batch, 1, time, kv_len]`` (broadcasts over heads).
    This is the general form: it works for a prefill, a single decode step or
    a chunk in the middle of a prompt, as long as the keys are stored in
    position order starting at 0.
    """
    k_pos = torch.arange(kv_len, device=q_positions.device)
    mask = k_pos <= q_positions[..., None]
    if mask.dim() == 3:
        mask = mask[:, None]
    return mask


# ---------------------------------------------------------------- RoPE

_SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


def rope_inv_freq(head_dim: int, rope_theta: float = 10000.0,
                  rope_scaling: Mapping[str, Any] | None = None) -> torch.Tensor:
    """Rotation speed of each pair of dimensions: ``theta ** (-2i / head_dim)``.

    ``rope_scaling`` follows the Hugging Face config: ``None`` or
    ``{"rope_type": "default"}`` leaves the frequencies alone;
    ``{"rope_type": "linear", "factor": f}`` slows every pair by ``f``;
    ``{"rope_type": "llama3", "factor", "low_freq_factor", "high_freq_factor",
    "original_max_position_embeddings"}`` is Llama 3.1's recipe: pairs that
    turn slowly (wavelength longer than the original context) are slowed by
    ``factor``, fast ones are kept, and those in between are blended, so a model
    trained at 8k positions can read 128k without relearning local order.
    """
    if head_dim <= 0 or head_dim % 2:
        raise ValueError(f"head_dim must be a positive even number for RoPE, got {head_dim}")
    inv_freq = 1.0 / (rope_theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    rope_type = "default"
    if rope_scaling:
        rope_type = rope_scaling.get("rope_type", rope_scaling.get("type", "default"))
    if rope_type == "default":
        return inv_freq
    if rope_type == "linear":
        return inv_freq / float(rope_scaling["factor"])
    if rope_type == "llama3":
        try:
            factor = float(rope_scaling["factor"])
            low = float(rope_scaling["low_freq_factor"])
            high = float(rope_scaling["high_freq_factor"])
            old_len = float(rope_scaling["original_max_position_embeddings"])
        except KeyError as err:
            raise ValueError(f"rope_scaling of type 'llama3' is missing the field {err.args[0]!r}") from None
        low_wavelen, high_wavelen = old_len / low, old_len / high
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        blended = (1 - smooth) * scaled / factor + smooth * scaled
        middle = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        return torch.where(middle, blended, scaled)
    raise ValueError(
        f"rope_scaling type {rope_type!r} is not supported; servelab implements {_SUPPORTED_ROPE_TYPES}")


def rope_cos_sin(position_ids: torch.Tensor, inv_freq: torch.Tensor,
                 dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """Cosines and sines for the given positions, shape ``[..., time, head_dim]``.

    Angles are computed in fp32 whatever the model's dtype (positions in the
    thousands times fast frequencies lose their fractional part in bf16), then
    cast. Each frequency appears twice because :func:`rotate_half` pairs
    dimension ``i`` with ``i + head_dim/2`` (the Hugging Face layout).
    """
    angles = position_ids[..., None].float() * inv_freq.to(position_ids.device).float()
    emb = torch.cat((angles, angles), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``(x1, x2) -> (-x2, x1)`` on the two halves of the last dimension."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate queries or keys ``[batch, heads, time, head_dim]`` by position.

    ``cos``/``sin`` are ``[time, head_dim]`` or ``[batch, time, head_dim]`` from
    :func:`rope_cos_sin`. After rotation the dot product of a query at position
    m and a key at position n depends only on m - n: relative position for free.
    """
    if cos.dim() == 3:
        cos, sin = cos[:, None], sin[:, None]
    return x * cos + rotate_half(x) * sin


# ---------------------------------------------------------------- attention

def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """Expand ``[batch, n_kv_heads, time, d]`` to ``[batch, n_kv_heads*n_rep, time, d]``.

    With grouped-query attention several query heads read the same K/V head;
    the cache stores each K/V head once and this expansion happens only at
    compute time. Query head ``h`` uses K/V head ``h // n_rep``.
    """
    if n_rep == 1:
        return x
    b, h, t, d = x.shape
    return x[:, :, None].expand(b, h, n_rep, t, d).reshape(b, h * n_rep, t, d)


def _expand_for_queries(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    n_heads, n_kv = q.shape[1], k.shape[1]
    if n_heads % n_kv:
        raise ValueError(f"query heads ({n_heads}) must be a multiple of KV heads ({n_kv})")
    rep = n_heads // n_kv
    return repeat_kv(k, rep), repeat_kv(v, rep)


def attention_scores(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None = None,
                     causal: bool = True, scale: float | None = None) -> torch.Tensor:
    """Scaled scores ``q . k / sqrt(head_dim)``, masked positions set to -inf.

    Returns ``[batch, n_heads, q_time, kv_time]``. With ``mask=None`` and
    ``causal=True`` the queries are the last ``q_time`` positions of the keys.
    """
    k = repeat_kv(k, q.shape[1] // k.shape[1]) if q.shape[1] != k.shape[1] else k
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = (q @ k.transpose(-1, -2)) * scale
    if mask is None and causal:
        mask = causal_mask(q.shape[-2], k.shape[-2], device=q.device)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return scores


def attention_probs(q, k, mask=None, causal=True, scale=None) -> torch.Tensor:
    """Attention weights (softmax over keys, computed in fp32); rows sum to 1.

    These are the numbers drawn as attention maps.
    """
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"query heads ({q.shape[1]}) must be a multiple of KV heads ({k.shape[1]})")
    scores = attention_scores(q, k, mask=mask, causal=causal, scale=scale)
    return torch.softmax(scores.float(), dim=-1).to(q.dtype)


def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    mask: torch.Tensor | None = None, causal: bool = True,
                    scale: float | None = None) -> torch.Tensor:
    """softmax(q k^T / sqrt(d) + mask) v, one matrix at a time.

    Works for MHA (as many K/V heads as query heads), GQA (fewer) and MQA
    (one). Memory is ``q_time x kv_time`` per head, which is why real kernels
    tile it: see :func:`tiled_attention`.
    Returns ``[batch, n_heads, q_time, head_dim]``.
    """
    k, v = _expand_for_queries(q, k, v)
    probs = attention_probs(q, k, mask=mask, causal=causal, scale=scale)
    return probs @ v


# ---------------------------------------------------------------- tiled ("flash") attention

def tiled_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True,
                    block_size: int = 64, scale: float | None = None) -> torch.Tensor:
    """The same result as :func:`naive_attention`, one block of keys at a time.

    FlashAttention's idea, in plain PyTorch: never hold the whole
    ``q_time x kv_time`` score matrix. Walk over the keys in blocks and keep,
    for every query row, three running values:

    * ``m``: the largest score seen so far (for a numerically safe ``exp``),
    * ``l``: the sum of ``exp(score - m)`` so far (the softmax denominator),
    * ``acc``: the sum of ``exp(score - m) * value`` so far (the numerator).

    When a block raises the maximum from ``m`` to ``m_new``, everything summed
    so far is rescaled by ``exp(m - m_new)``; at the end ``acc / l`` is exactly
    softmax(scores) @ v. Memory per head is ``q_time x block_size``. A real
    kernel also keeps each block in on-chip SRAM, which is where its speed
    comes from; here the point is the arithmetic.

    As in :func:`naive_attention`, the queries are the last ``q_time`` of the
    ``kv_time`` positions when ``causal``. Returns ``[batch, n_heads, q_time, head_dim]``.
    """
    if block_size < 1:
        raise ValueError(f"block_size must be a positive number of keys, got {block_size}")
    k, v, scale = tiled_inputs(q, k, v, causal, scale)
    q_time, kv_time = q.shape[-2], k.shape[-2]
    qf = q.float()
    q_pos = torch.arange(kv_time - q_time, kv_time, device=q.device) if causal else None
    state = online_softmax_start(qf)
    for start in range(0, kv_time, block_size):
        kb, vb = k[..., start:start + block_size, :].float(), v[..., start:start + block_size, :].float()
        k_pos = torch.arange(start, start + kb.shape[-2], device=q.device) if causal else None
        state = online_softmax_fold(state, qf, kb, vb, scale, q_pos, k_pos)
    return online_softmax_finish(state).to(q.dtype)


def tiled_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float | None):
    """``(k, v, scale)`` for a tiled attention loop: K/V heads paired with the query heads, the
    causal shape checked (the queries are the last ``q_time`` of ``kv_time`` positions), and the
    scale defaulted to ``1 / sqrt(head_dim)``. Shared by :func:`tiled_attention` and
    :func:`servelab.kernels.flash_attention`."""
    k, v = _expand_for_queries(q, k, v)
    q_time, kv_time = q.shape[-2], k.shape[-2]
    if causal and q_time > kv_time:
        raise ValueError(f"causal attention needs kv_time >= q_time, got {kv_time} keys for {q_time} queries")
    return k, v, q.shape[-1] ** -0.5 if scale is None else scale


def online_softmax_start(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The online softmax's empty running state for queries ``q [..., q_time, head_dim]``:
    ``m = -inf``, ``l = 0`` (``[..., q_time, 1]``) and ``acc = 0`` (``q``'s shape), all fp32."""
    m = torch.full((*q.shape[:-1], 1), float("-inf"), device=q.device)
    return m, torch.zeros_like(m), torch.zeros(q.shape, dtype=torch.float32, device=q.device)


def online_softmax_fold(state, q: torch.Tensor, kb: torch.Tensor, vb: torch.Tensor, scale: float,
                        q_pos: torch.Tensor | None = None, k_pos: torch.Tensor | None = None):
    """Fold one block of keys ``kb`` and values ``vb`` into the running ``(m, l, acc)``.

    The one online-softmax step of the course (:func:`tiled_attention`,
    :func:`servelab.kernels.flash_attention` and ring attention all call it):
    scores ``q kb^T * scale``, masked where a key's position (``k_pos``, 1-D)
    is after the query's (``q_pos``, 1-D) when both are given; the maximum
    moves from ``m`` to ``m_new`` and what was summed so far is rescaled by
    ``exp(m - m_new)``. A row that has seen no visible key yet keeps
    ``m = -inf`` and is shifted by 0. Returns the new state.
    """
    m, l, acc = state
    scores = (q @ kb.transpose(-1, -2)) * scale
    if q_pos is not None and k_pos is not None:
        scores = scores.masked_fill(k_pos[None, :] > q_pos[:, None], float("-inf"))
    m_new = torch.maximum(m, scores.amax(dim=-1, keepdim=True))
    shift = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
    p = torch.exp(scores - shift)
    rescale = torch.exp(m - shift)
    return m_new, l * rescale + p.sum(dim=-1, keepdim=True), acc * rescale + p @ vb


def online_softmax_finish(state) -> torch.Tensor:
    """``acc / l``: softmax(scores) @ v over every block folded in (fp32)."""
    _, l, acc = state
    return acc / l


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                     scale: float) -> torch.Tensor:
    """One query row per sequence: ``q [B, H, D]`` against ``k, v [B, KVH, L, D]``
    (``mask`` None or broadcastable to ``[B, 1, 1, L]``, True = attend); returns ``[B, H, D]``.

    The ``G = H / KVH`` query heads that share a K/V head (heads ``j*G .. (j+1)*G - 1``
    use K/V head ``j``, as :func:`repeat_kv` pairs them) are passed to SDPA as ``G``
    query rows of that head rather than as ``G`` heads: the same result, and the
    kernel reads each K/V head once for all of them instead of once per query head.
    """
    import torch.nn.functional as F
    B, H, D = q.shape
    KVH = k.shape[1]
    o = F.scaled_dot_product_attention(q.view(B, KVH, H // KVH, D), k, v, attn_mask=mask, scale=scale)
    return o.reshape(B, H, D)


# ---------------------------------------------------------------- timing

def time_decode_steps(model, contexts, rounds: int = 60, seed: int = 0) -> list[float]:
    """CPU seconds of one decode step of ``model`` with each of ``contexts`` tokens cached.

    Each context gets its own KV cache, filled once by a prefill of seeded random
    tokens. A round times one step at every context in turn; ``rounds`` rounds
    interleave the contexts, so a machine drifting slower over the run slows
    them all alike. After each step the new token is cropped from the cache, so
    every timed step of a context is the same step. The clock is this process's
    CPU time (other programs on a busy machine do not count; run with one
    thread), and each context keeps its fastest round: interference only ever
    adds time. Returns one figure per context, in order.
    """
    import time

    contexts = list(contexts)
    limit = model.config.max_position_embeddings
    if not contexts:
        raise ValueError("contexts is empty: pass the cache lengths to time, e.g. [16, 512]")
    for n in contexts:
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n < limit:
            raise ValueError(f"each context must be a whole number in [1, {limit - 1}] (the step "
                             f"adds one token to it and the model has {limit} positions), got {n!r}")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be a whole number >= 1, got {rounds!r}")
    device = model.embed_tokens.weight.device
    g = torch.Generator().manual_seed(seed)
    token = torch.tensor([[1]], device=device)
    caches = []
    with torch.no_grad():
        for n in contexts:
            cache = model.new_cache(max_len=n + 1)
            prompt = torch.randint(0, model.config.vocab_size, (1, n), generator=g)
            model(prompt.to(device), cache=cache)
            caches.append(cache)
        best = [math.inf] * len(contexts)
        for _ in range(rounds):
            for j, (n, cache) in enumerate(zip(contexts, caches)):
                start = time.process_time()
                model(token, cache=cache)
                best[j] = min(best[j], time.process_time() - start)
                cache.crop(n)  # forget the token this step added
    return best


def time_steps_with_and_without_cache(model, contexts, rounds: int = 20,
                                      seed: int = 0) -> tuple[list[float], list[float]]:
    """CPU seconds to write the next token with ``n`` tokens in context, for each ``n``
    in ``contexts``: once by recomputing all ``n`` tokens (no cache), once from a
    KV cache holding the first ``n - 1`` (one new token fed).

    Both ways read the same seeded random tokens. A round times the recompute at
    every context, then the cached step at every context (back to back as in a decode
    loop, after an untimed pass over them, so the weights are back in the CPU's caches); rounds alternate, so slow
    drift on a busy machine hits every figure alike. Each figure keeps its fastest of
    ``rounds`` rounds (interference only adds time).
    The cached step's new token is cropped from its cache after each step, so every
    timed step of a context is the same step. The clock is this process's CPU time
    (run with one thread). Returns ``(uncached, cached)``, one figure per context.
    """
    import time

    contexts = list(contexts)
    limit = model.config.max_position_embeddings
    if not contexts:
        raise ValueError("contexts is empty: pass the context lengths to time, e.g. [16, 128]")
    for n in contexts:
        if isinstance(n, bool) or not isinstance(n, int) or not 2 <= n <= limit:
            raise ValueError(f"each context must be a whole number in [2, {limit}] (the cached "
                             f"step needs at least one cached token and the model has {limit} "
                             f"positions), got {n!r}")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be a whole number >= 1, got {rounds!r}")
    device = model.embed_tokens.weight.device
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, model.config.vocab_size, (1, max(contexts)), generator=g).to(device)
    caches = []
    with torch.no_grad():
        for n in contexts:
            cache = model.new_cache(max_len=n)
            model(tokens[:, :n - 1], cache=cache)
            caches.append(cache)
        best_uncached = [math.inf] * len(contexts)
        best_cached = [math.inf] * len(contexts)
        for _ in range(rounds):
            for j, n in enumerate(contexts):
                start = time.process_time()
                model(tokens[:, :n])
                best_uncached[j] = min(best_uncached[j], time.process_time() - start)
            # the cached steps run back to back, as in a decode loop, after an untimed
            # pass over them: the recomputes just before evict the weights from the
            # CPU's caches
            for timed in (False, True):
                for j, (n, cache) in enumerate(zip(contexts, caches)):
                    start = time.process_time()
                    model(tokens[:, n - 1:n], cache=cache)
                    if timed:
                        best_cached[j] = min(best_cached[j], time.process_time() - start)
                    cache.crop(n - 1)  # forget the token this step added
    return best_uncached, best_cached
