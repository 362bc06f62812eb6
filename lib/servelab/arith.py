"""Chip arithmetic for a model: parameters, bytes, chips, and operations.

Serving starts with three sums a reader can do on a napkin:

* how many numbers the model has (:func:`count_params`, total and active for
  mixture-of-experts models),
* how many bytes those numbers take at 16, 8 or 4 bits (:func:`weights_memory`),
  and therefore how many chips a replica needs (:func:`chips_per_replica`),
* how much arithmetic one token costs (:func:`ops_per_token`, about two
  operations per parameter) and how long reading a prompt takes
  (:func:`prefill_seconds`).

Units are plain numbers: parameters, bytes (decimal GB = 1e9, as vendors
quote), operations, seconds. Pure Python, no torch. Byte sizes per format come
from :mod:`servelab.kvcache` so that there is one table in the library.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from servelab.kvcache import bytes_per_element, kv_room_bytes, weights_bytes
from servelab._checks import check_count as _check_count
from servelab._checks import check_fraction as _check_fraction
from servelab._checks import check_positive as _check_positive
from servelab.specs import Chip, ModelConfig, get_chip, get_model

__all__ = [
    "WEIGHTS_MEMORY_SHARE", "BOX_CHIPS", "MAX_REPLICA_CHIPS", "GROUP_SIZES",
    "ParamCount", "count_params", "embedding_numbers",
    "bytes_per_param", "weights_memory", "weights_share", "max_weights_bytes",
    "chips_for_weights", "round_to_group", "chips_per_replica", "memory_left",
    "attention_ops_per_token", "ops_per_token", "prefill_ops", "prefill_seconds",
]

#: The share of a chip's usable memory the weights may take when planning a
#: replica. The 200B running example uses about 60%: the rest holds every running
#: conversation's KV cache, working buffers, communication buffers and compiled
#: programs. A planning rule of thumb, not a hardware fact.
WEIGHTS_MEMORY_SHARE = 0.6

#: GPUs in one server box, linked at full speed by NVLink (NVIDIA DGX B200 and
#: DGX H100: 8 GPUs each; https://www.nvidia.com/en-us/data-center/dgx-b200/).
BOX_CHIPS = 8

#: The most chips one replica may span: a planning cap taken from the largest
#: NVLink domain, 72 GPUs (NVIDIA GB200 NVL72:
#: https://www.nvidia.com/en-us/data-center/gb200-nvl72/). Boxes of 8 joined by a
#: network have no such hardware limit; the course plans within it.
MAX_REPLICA_CHIPS = 72

#: Chip counts a replica is built from. Inside a box, tensor parallelism splits
#: the attention heads evenly, so 1, 2, 4 or all 8 cards (a power of two); past
#: one box, whole boxes (16, 24, ... 72 chips). A model that needs 3 cards gets
#: 4, one that needs 9 gets two boxes.
GROUP_SIZES: tuple[int, ...] = tuple(
    [2 ** k for k in range(BOX_CHIPS.bit_length() - 1)]
    + list(range(BOX_CHIPS, MAX_REPLICA_CHIPS + 1, BOX_CHIPS)))


# ---------------------------------------------------------------------------
# Parameters
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class ParamCount:
    """A model's parameters by part.

    ``experts`` holds every routed expert of every MoE layer (what must be
    stored); ``active_experts`` the ones one token actually uses (what it
    multiplies). For a dense model both are zero and ``total == active``.
    """

    embedding: int       # the input lookup table, vocab x width
    attention: int       # all layers
    mlp: int             # dense MLPs plus shared experts and routers, all layers
    experts: int         # routed experts, all of them
    active_experts: int  # routed experts one token uses
    norms: int
    lm_head: int         # 0 when tied to the embedding table

    @property
    def total(self) -> int:
        """Everything that must sit in memory."""
        return (self.embedding + self.attention + self.mlp + self.experts
                + self.norms + self.lm_head)

    @property
    def active(self) -> int:
        """What one token touches: the total minus the experts it skips."""
        return self.total - self.experts + self.active_experts

    @property
    def matmul_active(self) -> int:
        """Active parameters used in matrix products (the embedding is a lookup, norms are tiny).

        A tied output head multiplies by the embedding table, so it counts then.
        """
        head = self.lm_head if self.lm_head else self.embedding
        return self.attention + self.mlp + self.active_experts + head

    def as_dict(self) -> dict[str, int]:
        return {"embedding": self.embedding, "attention": self.attention, "mlp": self.mlp,
                "experts": self.experts, "active_experts": self.active_experts,
                "norms": self.norms, "lm_head": self.lm_head,
                "total": self.total, "active": self.active}


def _attention_params_per_layer(c: ModelConfig) -> int:
    d, heads = c.hidden_size, c.num_attention_heads
    if c.attention_kind == "mla":
        # DeepSeek-style latent attention: queries (optionally through a low-rank
        # bottleneck), one shared compressed KV latent plus a rotary key, then
        # per-head up-projections for keys (no-rope part) and values.
        nope, rope = c.qk_nope_head_dim or 0, c.qk_rope_head_dim
        v_dim = c.v_head_dim or c.head_dim
        q_dim = heads * (nope + rope)
        if c.q_lora_rank:
            q = d * c.q_lora_rank + c.q_lora_rank + c.q_lora_rank * q_dim  # down, norm, up
        else:
            q = d * q_dim
        kv = d * (c.kv_lora_rank + rope) + c.kv_lora_rank + c.kv_lora_rank * heads * (nope + v_dim)
        return q + kv + heads * v_dim * d
    q_width = heads * c.head_dim
    kv_width = c.num_key_value_heads * c.head_dim
    params = d * q_width + 2 * d * kv_width + q_width * d
    if c.attention_bias:
        params += q_width + 2 * kv_width
        if c.architecture == "LlamaForCausalLM":  # Llama's o_proj takes the bias too; Qwen2's does not
            params += d
    return params


def _mlp_params(c: ModelConfig, intermediate: int) -> int:
    matrices = 3 if c.mlp_gated else 2
    params = matrices * c.hidden_size * intermediate
    if c.mlp_bias:
        params += (matrices - 1) * intermediate + c.hidden_size
    return params


def count_params(config: ModelConfig | str) -> ParamCount:
    """Count a model's parameters from its config, by part.

    Dense layers: attention (query, key, value, output tables) plus an MLP of
    two or three ``hidden x intermediate`` tables. MoE layers replace the MLP
    with ``num_experts`` routed experts (``num_experts_per_tok`` used per token),
    optional shared experts and a router; the first ``first_k_dense_replace``
    layers stay dense. Checks in the tests: Llama 3 8B = 8.03B, Mixtral 8x7B =
    46.7B total / 12.9B active, DeepSeek-V3 = 671B total / 37B active.
    """
    c = get_model(config)
    d, layers = c.hidden_size, c.num_hidden_layers
    attention = layers * _attention_params_per_layer(c)
    if c.is_moe:
        moe_layers = layers - c.first_k_dense_replace
        if moe_layers < 0:
            raise ValueError(f"{c.name}: first_k_dense_replace={c.first_k_dense_replace} exceeds "
                             f"num_hidden_layers={layers}")
        expert = _mlp_params(c, c.moe_intermediate_size or c.intermediate_size)
        dense_mlp = c.first_k_dense_replace * _mlp_params(c, c.intermediate_size)
        shared = moe_layers * (c.n_shared_experts * expert + d * c.num_experts)  # + router
        experts = moe_layers * c.num_experts * expert
        active_experts = moe_layers * c.num_experts_per_tok * expert
        mlp = dense_mlp + shared
    else:
        mlp = layers * _mlp_params(c, c.intermediate_size)
        experts = active_experts = 0
    embedding = c.vocab_size * d
    lm_head = 0 if c.tie_word_embeddings else c.vocab_size * d
    norms = 2 * d * layers + d
    return ParamCount(embedding=embedding, attention=attention, mlp=mlp, experts=experts,
                      active_experts=active_experts, norms=norms, lm_head=lm_head)


def embedding_numbers(config: ModelConfig | str) -> int:
    """Numbers in the embedding table: one row of ``hidden_size`` per vocabulary entry."""
    c = get_model(config)
    return c.vocab_size * c.hidden_size


# ---------------------------------------------------------------------------
# Bytes and chips
# ---------------------------------------------------------------------------

_BITS_TO_FORMAT = {32: "fp32", 16: "bf16", 8: "fp8", 4: "fp4"}


def _format_name(precision: int | str) -> str:
    if isinstance(precision, bool) or not isinstance(precision, (int, str)):
        raise ValueError(f"precision must be bits (32, 16, 8, 4) or a format name, got {precision!r}")
    if isinstance(precision, int):
        if precision not in _BITS_TO_FORMAT:
            raise ValueError(f"bits per weight must be 32, 16, 8 or 4, got {precision!r}")
        return _BITS_TO_FORMAT[precision]
    return precision


def bytes_per_param(precision: int | str) -> float:
    """Bytes per stored weight, from bits (32, 16, 8, 4) or a format name ('bf16', 'fp8', ...)."""
    return bytes_per_element(_format_name(precision))


def weights_memory(num_params: float, precision: int | str = 16) -> float:
    """Bytes the weights take: parameters x bytes per parameter (200B at 8 bits = 200 GB)."""
    return weights_bytes(num_params, _format_name(precision))








def _usable(chip: Chip | str) -> float:
    return get_chip(chip).usable_memory_bytes


def weights_share(weights: float, chip: Chip | str, num_chips: int = 1) -> float:
    """The fraction of the chips' usable memory the weights take."""
    _check_positive("weights", weights)
    _check_count("num_chips", num_chips)
    return weights / (num_chips * _usable(chip))


def max_weights_bytes(chip: Chip | str, num_chips: int = 1, share: float = WEIGHTS_MEMORY_SHARE) -> float:
    """The most weight bytes ``num_chips`` chips should hold, leaving the rest for serving."""
    _check_count("num_chips", num_chips)
    _check_fraction("share", share)
    return num_chips * _usable(chip) * share


def chips_for_weights(weights: float, chip: Chip | str, share: float = WEIGHTS_MEMORY_SHARE) -> int:
    """The smallest whole number of chips whose memory, at ``share``, holds the weights."""
    _check_positive("weights", weights)
    return math.ceil(weights / max_weights_bytes(chip, 1, share) - 1e-12)


def round_to_group(num_chips: int, group_sizes: tuple[int, ...] = GROUP_SIZES) -> int:
    """Round a chip count up to the next size a replica is built in.

    By default (:data:`GROUP_SIZES`) a power of two up to one 8-chip box, then
    whole boxes: 1 -> 1, 3 -> 4, 8 -> 8, 9 -> 16, 17 -> 24, 65 -> 72.
    Replicas follow how chips are wired, not exact arithmetic. Beyond the
    largest size (72 chips, the planning cap) this refuses.
    """
    _check_count("num_chips", num_chips)
    sizes = sorted(group_sizes)
    if not sizes or any(isinstance(s, bool) or not isinstance(s, int) or s <= 0 for s in sizes):
        raise ValueError(f"group_sizes must be positive whole numbers, got {group_sizes!r}")
    for size in sizes:
        if num_chips <= size:
            return size
    raise ValueError(f"{num_chips} chips exceed the largest group ({sizes[-1]}): use lower precision, "
                     "a chip with more memory, or split the model across groups (pipeline parallelism)")


def chips_per_replica(weights: float, chip: Chip | str, share: float = WEIGHTS_MEMORY_SHARE,
                      group_sizes: tuple[int, ...] = GROUP_SIZES) -> int:
    """Chips one replica needs: enough for the weights at ``share``, rounded up to a group.

    The 200B running example's 200 GB on B200s (180 GB usable, 60% share = 108 GB each)
    needs 2 chips; Llama 3 70B in bf16 (141 GB) on H100s (48 GB each at 60%) needs
    3 and gets 4; 1,700 GB on H100s needs 36 and gets five boxes, 40 chips.
    """
    return round_to_group(chips_for_weights(weights, chip, share), group_sizes)


def memory_left(weights: float, chip: Chip | str, num_chips: int = 1, margin: float = 0.0,
                usable: bool = False) -> float:
    """Bytes left over for KV cache and buffers once the weights are loaded.

    Uses the chip's raw memory unless ``usable=True``; ``margin`` keeps a share
    of what is left unused (as :func:`servelab.kvcache.kv_room_bytes`). A 70B
    model in bf16 (140 GB) on two 80 GB cards leaves 20 GB, 19 GB at a 5% margin.
    """
    _check_count("num_chips", num_chips)
    c = get_chip(chip)
    per_chip = c.usable_memory_bytes if usable else c.memory_bytes
    return kv_room_bytes(num_chips * per_chip, weights, margin)


# ---------------------------------------------------------------------------
# Operations
# ---------------------------------------------------------------------------

def attention_ops_per_token(config: ModelConfig | str, context_tokens: int) -> float:
    """Operations one new token spends attending to ``context_tokens`` earlier tokens.

    In every layer its query meets each cached key (a dot product of
    ``heads x head_dim`` numbers) and blends as many values: two multiply-adds
    per context token per query number, ``4 x layers x heads x head_dim x
    context`` operations in all. It grows with the conversation, unlike the
    ``2 x parameters`` part.
    """
    c = get_model(config)
    if isinstance(context_tokens, bool) or not isinstance(context_tokens, int) or context_tokens < 0:
        raise ValueError(f"context_tokens must be a whole number >= 0, got {context_tokens!r}")
    if c.attention_kind == "mla":
        qk = (c.qk_nope_head_dim or 0) + c.qk_rope_head_dim
        v = c.v_head_dim or c.head_dim
        width = c.num_attention_heads * (qk + v) / 2
    else:
        width = c.num_attention_heads * c.head_dim
    return 4.0 * c.num_hidden_layers * width * context_tokens


def ops_per_token(num_params: float, config: ModelConfig | str | None = None,
                  context_tokens: int = 0) -> float:
    """Operations to produce one token: about 2 per parameter (a multiply and an add).

    With a ``config`` and a ``context_tokens`` > 0 the attention work over the
    earlier tokens is added. For MoE models pass the *active* parameter count.
    200B parameters -> 4e11 operations per token.
    """
    _check_positive("num_params", num_params)
    ops = 2.0 * num_params
    if context_tokens:
        if config is None:
            raise ValueError("attention work depends on the model's shape: pass config= with context_tokens")
        ops += attention_ops_per_token(config, context_tokens)
    return ops


def prefill_ops(num_params: float, prompt_tokens: int, config: ModelConfig | str | None = None,
                cached_tokens: int = 0) -> float:
    """Operations to read a prompt: 2 x parameters per new token, plus attention if ``config``.

    ``cached_tokens`` at the start of the prompt are already in the KV cache and
    cost nothing here (prefix caching). The attention part sums each new token's
    context (causal: token i sees i earlier tokens). 3,000 tokens on 200B = 1.2e15.
    """
    _check_positive("num_params", num_params)
    _check_count("prompt_tokens", prompt_tokens)
    if isinstance(cached_tokens, bool) or not isinstance(cached_tokens, int) or not 0 <= cached_tokens <= prompt_tokens:
        raise ValueError(f"cached_tokens must be a whole number in [0, prompt_tokens={prompt_tokens}], "
                         f"got {cached_tokens!r}")
    new = prompt_tokens - cached_tokens
    ops = 2.0 * num_params * new
    if config is not None and new:
        # sum of contexts cached..prompt-1 = new x (cached + prompt - 1) / 2
        per_context_token = attention_ops_per_token(config, 1)
        ops += per_context_token * new * (cached_tokens + prompt_tokens - 1) / 2
    return ops


def prefill_seconds(ops: float, chip: Chip | str, num_chips: int = 1, efficiency: float = 0.5,
                    dtype: str = "fp8") -> float:
    """Time to do ``ops`` operations on ``num_chips`` chips at ``efficiency`` of peak.

    Prefill multiplies many prompt tokens by each weight it reads, so it is
    limited by arithmetic, not memory: 1.2e15 operations on 8 B200s at 50% of
    the 8-bit peak take about 67 ms.
    """
    _check_positive("ops", ops)
    _check_count("num_chips", num_chips)
    _check_fraction("efficiency", efficiency)
    return ops / (num_chips * get_chip(chip).peak_flops(dtype) * efficiency)

