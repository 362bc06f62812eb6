"""Exercise 12 · Shrinking the cache: KV heads, latents, windows and 8-bit storage. Hidden tests.

Q1's expected values come from :mod:`servelab.kvcache` and Q3's from
:mod:`servelab.kvquant` (per-token int8, as the library computes it in float32),
so the exercise and the library can never disagree. The library has no
sliding-window helper, so Q2's come from the short reference below.
"""
import numpy as np
import torch

from servelab import kvquant
from servelab.grading import Case, Question
from servelab.grading.hidden._configs import hf_config as _hf, kv_bytes as _bpt, kv_case as _kv_case


# MHA written the way older configs do it (no num_key_value_heads, no head_dim),
# and a DeepSeek-V2-Lite-sized MLA config (27 layers, same latent and rotary key).
_MHA_IMPLICIT = _hf("Llama-2-70B", drop=("num_key_value_heads", "head_dim"), num_key_value_heads=64)
_MLA_SMALL = dict(num_hidden_layers=27, kv_lora_rank=512, qk_rope_head_dim=64)
_MLA_NARROW = dict(kv_lora_rank=256, qk_rope_head_dim=32)

Q1 = Question(
    id="q1", title="KV bytes per token, MLA included", function="kv_bytes_per_token", points=3, level="easy",
    minutes=8,
    visible=[Case(args=(_hf("Llama-3-8B"), 2), expected=131_072, label="Llama-3-8B config, 2 bytes"),
             Case(args=(_hf("DeepSeek-V3"), 2), expected=70_272, label="DeepSeek-V3 config (MLA), 2 bytes")],
    hidden=[
        _kv_case("Llama-3-70B", 2, "Llama-3-70B config (GQA 8:1)"),
        _kv_case("Llama-3-8B", 1, "Llama-3-8B config, fp8"),
        _kv_case("Llama-3-8B", 2, "an MQA config (1 KV head)", num_key_value_heads=1),
        Case(args=(_MHA_IMPLICIT, 2), expected=_bpt("Llama-2-70B", 2, num_key_value_heads=64),
             label="MHA config without num_key_value_heads or head_dim"),
        _kv_case("DeepSeek-V3", 1, "DeepSeek-V3 (MLA) in fp8: no factor of 2, heads ignored"),
        _kv_case("DeepSeek-V3", 2, "an MLA config with 27 layers", **_MLA_SMALL),
        _kv_case("DeepSeek-V3", 4, "MLA with kv_lora_rank=256, qk_rope_head_dim=32, fp32", **_MLA_NARROW),
        _kv_case("GPT-3-175B", 2, "GPT-3 175B config (MHA)"),
    ],
)


def _slots(seq_len, layer_windows):
    """Reference for Q2: token slots summed over layers (None = full attention)."""
    if seq_len < 0:
        raise ValueError("seq_len cannot be negative")
    total = 0
    for w in layer_windows:
        if w is None:
            total += seq_len
        elif w <= 0:
            raise ValueError("a window must be a positive number of tokens")
        else:
            total += min(seq_len, w)
    return total


def _slots_case(seq_len, layer_windows, label):
    return Case(args=(seq_len, layer_windows), expected=_slots(seq_len, layer_windows), label=label)


_GEMMA2_LIKE = [4096, None] * 21                  # 42 layers, local and global alternating
_GEMMA3_LIKE = ([1024] * 5 + [None]) * 10 + [1024] * 2   # 62 layers, five local to one global

Q2 = Question(
    id="q2", title="Token slots with sliding-window layers", function="cache_token_slots", points=4,
    level="medium", minutes=10,
    visible=[Case(args=(10_000, [4096, None, 4096, None]), expected=28_192, label="10,000 tokens, [4096, None] x 2")],
    hidden=[
        _slots_case(131_072, _GEMMA2_LIKE, "128k tokens, 42 layers alternating 4096-window and full"),
        _slots_case(100_000, _GEMMA3_LIKE, "100k tokens, 62 layers, five 1024-window layers per full one"),
        _slots_case(500, _GEMMA2_LIKE, "conversation shorter than the window"),
        _slots_case(4096, [4096] * 3 + [None], "conversation exactly as long as the window"),
        _slots_case(7000, [1] * 8, "window 1 on every layer"),
        _slots_case(32_768, [None] * 32, "all full attention"),
        _slots_case(32_768, [4096] * 32, "all sliding (Mistral-7B-v0.1 style)"),
        _slots_case(9000, [None, 2048, 512, 8192], "a different window on each layer"),
        _slots_case(0, [4096, None], "an empty conversation"),
        Case(args=(1000, []), expected=0, label="no layers"),
        Case(args=(1000, [4096, 0, None]), raises=ValueError, label="a window of 0"),
        Case(args=(1000, [None, -128]), raises=ValueError, label="a negative window"),
        Case(args=(-1, [4096, None]), raises=ValueError, label="a negative seq_len"),
    ],
)


# The library works in float32; a float64 answer differs only in the last bits
# (a relative 1e-6), never by a whole code.
TOL = dict(rel=1e-6, abs=1e-9)


def _int8_ref(x):
    """Q3's expected answer: servelab.kvquant per-token int8, quantized and read back."""
    q = kvquant.quantize_kv(torch.tensor(x, dtype=torch.float32), "int8", "token")
    return kvquant.dequantize_kv(q, torch.float32).tolist()


def _rand(seed, *shape, scale=1.0):
    return np.round(np.random.default_rng(seed).normal(size=shape) * scale, 4).tolist()


def _int8_case(x, label):
    return Case(args=(x,), expected=_int8_ref(x), **TOL, label=label)


_OUTLIER = [[0.01, -0.02, 0.015, 0.03], [0.01, -0.02, 0.015, 50.0]]
_VISIBLE = [[0.3, -1.1, 0.07, 0.85], [2.0, 0.5, -0.25, 1.2]]

Q3 = Question(
    id="q3", title="Per-row int8 round trip", function="int8_roundtrip", points=4, level="medium", minutes=12,
    visible=[_int8_case(_VISIBLE, "two rows of four")],
    hidden=[
        _int8_case(_rand(1, 6, 16), "6 random rows of 16"),
        _int8_case(_rand(2, 3, 64, scale=20.0), "3 random rows of 64, values up to about 60"),
        _int8_case(_OUTLIER, "one row with a 50.0 outlier: only that row's scale stretches"),
        _int8_case([[0.0, 0.0, 0.0], [1.0, -2.0, 0.5]], "a row of zeros (no division by zero)"),
        _int8_case([[-0.5, -2.0, -1.25, -0.01]], "a negative-only row (max of |x|, not of x)"),
        _int8_case([[3.0, -3.0, 1.5], [-7.25, 7.25, 0.0]], "+max and -max both come back exactly"),
        _int8_case([[127.0, 0.5, 1.5, 2.5, -0.5, -2.5]], "ties round to the even code (scale 1)"),
        _int8_case([[1e-6, -3e-7, 2e-7]], "tiny values keep their own tiny scale"),
        Case(args=([[1.0, float("inf")]],), raises=ValueError, label="an infinite value"),
        Case(args=([[1.0, 2.0], [float("nan"), 0.0]],), raises=ValueError, label="a NaN"),
    ],
)

QUESTIONS = [Q1, Q2, Q3]
