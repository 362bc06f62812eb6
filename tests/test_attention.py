"""servelab.attention: mask, RoPE and GQA expansion, checked against direct formulas."""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from servelab.attention import (
    apply_rope, attention_probs, causal_mask, mask_from_positions, naive_attention, repeat_kv,
    rope_cos_sin, rope_inv_freq, tiled_attention,
)


def test_causal_mask_square_and_with_past():
    m = causal_mask(3)
    assert m.tolist() == [[True, False, False], [True, True, False], [True, True, True]]
    m = causal_mask(2, 4)  # two new tokens after two cached ones
    assert m.tolist() == [[True, True, True, False], [True, True, True, True]]
    assert torch.equal(mask_from_positions(torch.tensor([2, 3]), 4), m)
    assert mask_from_positions(torch.tensor([[0, 1], [5, 6]]), 7).shape == (2, 1, 2, 7)
    with pytest.raises(ValueError):
        causal_mask(5, 3)


def test_rope_matches_complex_rotation():
    """RoPE with the half-split layout is a rotation of (x_i, x_{i+d/2}) by pos * freq_i."""
    d, pos = 8, torch.arange(5)
    x = torch.randn(1, 1, 5, d, generator=torch.Generator().manual_seed(0))
    inv = rope_inv_freq(d, 10000.0)
    cos, sin = rope_cos_sin(pos, inv)
    got = apply_rope(x, cos, sin)
    z = torch.complex(x[..., : d // 2], x[..., d // 2:]) * torch.polar(torch.ones(5, d // 2), pos[:, None] * inv)
    assert torch.allclose(got, torch.cat([z.real, z.imag], dim=-1), atol=1e-6)
    assert torch.allclose(got.norm(dim=-1), x.norm(dim=-1), atol=1e-5)  # rotations keep length


@settings(max_examples=25, deadline=None)
@given(m=st.integers(0, 200), n=st.integers(0, 200), shift=st.integers(0, 500))
def test_rope_scores_depend_only_on_relative_position(m, n, shift):
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(1, 1, 1, 16, generator=g), torch.randn(1, 1, 1, 16, generator=g)
    inv = rope_inv_freq(16, 10000.0)

    def score(a, b):
        cq, sq = rope_cos_sin(torch.tensor([a]), inv, torch.float64)
        ck, sk = rope_cos_sin(torch.tensor([b]), inv, torch.float64)
        return (apply_rope(q.double(), cq, sq) * apply_rope(k.double(), ck, sk)).sum().item()

    # angles are computed in fp32 (as in transformers), so allow fp32 rounding of pos * freq
    assert math.isclose(score(m, n), score(m + shift, n + shift), rel_tol=1e-4, abs_tol=1e-4)


def test_llama3_scaling_keeps_fast_and_slows_slow_frequencies():
    base = rope_inv_freq(128, 500000.0)
    scaled = rope_inv_freq(128, 500000.0, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                           "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})
    assert torch.equal(scaled[:10], base[:10])                 # short wavelengths untouched
    assert torch.allclose(scaled[-5:], base[-5:] / 8)          # long wavelengths / factor
    assert (scaled <= base).all()
    with pytest.raises(ValueError, match="low_freq_factor"):
        rope_inv_freq(16, 1e4, {"rope_type": "llama3", "factor": 8.0})
    with pytest.raises(ValueError, match="even"):
        rope_inv_freq(7)


def test_repeat_kv_maps_query_head_to_group():
    kv = torch.arange(2 * 3).float().view(1, 2, 3, 1)
    out = repeat_kv(kv, 3)
    assert out.shape == (1, 6, 3, 1)
    for h in range(6):
        assert torch.equal(out[0, h], kv[0, h // 3])


@pytest.mark.parametrize("n_heads,n_kv", [(4, 4), (4, 2), (4, 1)])
def test_naive_attention_equals_sdpa(n_heads, n_kv):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, n_heads, 6, 8, generator=g)
    k = torch.randn(2, n_kv, 6, 8, generator=g)
    v = torch.randn(2, n_kv, 6, 8, generator=g)
    rep = n_heads // n_kv
    ref = torch.nn.functional.scaled_dot_product_attention(q, repeat_kv(k, rep), repeat_kv(v, rep),
                                                           is_causal=True)
    assert torch.allclose(naive_attention(q, k, v), ref, atol=1e-5)
    probs = attention_probs(q, k)
    assert torch.allclose(probs.sum(-1), torch.ones(2, n_heads, 6))
    assert (probs[..., 0, 1:] == 0).all()  # the first token sees only itself


def test_decode_step_attention_equals_last_row_of_prefill():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 5, 4, generator=g) for _ in range(3))
    full = naive_attention(q, k, v)
    step = naive_attention(q[:, :, -1:], k, v)  # one query at the end, all keys
    assert torch.allclose(full[:, :, -1:], step, atol=1e-6)


def test_bad_head_ratio():
    with pytest.raises(ValueError, match="multiple"):
        naive_attention(torch.randn(1, 3, 2, 4), torch.randn(1, 2, 2, 4), torch.randn(1, 2, 2, 4))


@settings(max_examples=60, deadline=None)
@given(q_time=st.integers(1, 20), extra=st.integers(0, 20), block=st.integers(1, 9),
       kv_heads=st.sampled_from([1, 2, 4]), causal=st.booleans(), seed=st.integers(0, 10_000))
def test_tiled_attention_equals_naive(q_time, extra, block, kv_heads, causal, seed):
    g = torch.Generator().manual_seed(seed)
    kv_time = q_time + extra
    q = torch.randn(2, 4, q_time, 8, generator=g) * 3  # large scores exercise the running max
    k = torch.randn(2, kv_heads, kv_time, 8, generator=g)
    v = torch.randn(2, kv_heads, kv_time, 8, generator=g)
    want = naive_attention(q, k, v, causal=causal)
    got = tiled_attention(q, k, v, causal=causal, block_size=block)
    assert got.shape == want.shape
    assert torch.allclose(got, want, atol=1e-5)


def test_tiled_attention_keeps_dtype_and_refuses_bad_input():
    q = torch.randn(1, 2, 4, 8, dtype=torch.bfloat16)
    assert tiled_attention(q, q, q, block_size=3).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="block_size"):
        tiled_attention(q, q, q, block_size=0)
    with pytest.raises(ValueError, match="kv_time >= q_time"):
        tiled_attention(q, q[:, :, :2], q[:, :, :2])


def test_decode_attention_matches_sdpa_with_grouped_heads():
    import torch.nn.functional as F

    from servelab.attention import decode_attention
    g = torch.Generator().manual_seed(0)
    B, H, KVH, L, D = 3, 8, 2, 11, 16
    q, k, v = (torch.randn(*s, generator=g) for s in ((B, H, D), (B, KVH, L, D), (B, KVH, L, D)))
    mask = (torch.arange(L) < torch.tensor([11, 7, 4])[:, None])[:, None, None, :]
    ref = F.scaled_dot_product_attention(q[:, :, None], k, v, attn_mask=mask, scale=0.3, enable_gqa=True)
    torch.testing.assert_close(decode_attention(q, k, v, mask, 0.3), ref[:, :, 0])
    plain = F.scaled_dot_product_attention(q[:, :, None], k, v, scale=0.3, enable_gqa=True)[:, :, 0]
    torch.testing.assert_close(decode_attention(q, k, v, None, 0.3), plain)


def test_time_decode_steps_one_figure_per_context_and_checks_inputs():
    from servelab.attention import time_decode_steps
    from servelab.model import LlamaConfig, LlamaModel

    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16)
    model = LlamaModel(config).init_weights(seed=0).eval()
    seconds = time_decode_steps(model, [1, 8, 15], rounds=2)
    assert len(seconds) == 3 and all(s >= 0 for s in seconds)
    for bad in ([], [0], [16], [2.5], [True]):
        with pytest.raises(ValueError):
            time_decode_steps(model, bad, rounds=1)
    with pytest.raises(ValueError):
        time_decode_steps(model, [4], rounds=0)


def test_time_steps_with_and_without_cache_one_pair_per_context_and_checks_inputs():
    from servelab.attention import time_steps_with_and_without_cache
    from servelab.model import LlamaConfig, LlamaModel

    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16)
    model = LlamaModel(config).init_weights(seed=0).eval()
    uncached, cached = time_steps_with_and_without_cache(model, [2, 9, 16], rounds=2)
    assert len(uncached) == len(cached) == 3
    assert all(s >= 0 for s in uncached + cached)
    for bad in ([], [1], [17], [2.5], [True]):
        with pytest.raises(ValueError):
            time_steps_with_and_without_cache(model, bad, rounds=1)
    with pytest.raises(ValueError):
        time_steps_with_and_without_cache(model, [4], rounds=0)


def test_the_online_softmax_folds_key_blocks_in_any_order():
    """One fold serves tiled, flash and ring attention: blocks folded in any order give softmax(qk) v."""
    from servelab.attention import naive_attention, online_softmax_finish, online_softmax_fold, online_softmax_start

    gen = torch.Generator().manual_seed(3)
    q = torch.randn(1, 2, 6, 8, generator=gen)
    k, v = (torch.randn(1, 2, 10, 8, generator=gen) for _ in range(2))
    q_pos, scale = torch.arange(4, 10), 8 ** -0.5     # queries are the last 6 of 10 positions
    state = online_softmax_start(q)
    for start in (8, 0, 4):                            # a ring's order, not the positions' order
        k_pos = torch.arange(start, min(start + 4, 10))
        state = online_softmax_fold(state, q, k[..., k_pos, :], v[..., k_pos, :], scale, q_pos, k_pos)
    torch.testing.assert_close(online_softmax_finish(state), naive_attention(q, k, v, causal=True))
