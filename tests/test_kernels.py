"""servelab.kernels: fusion byte counts, op counting, FlashAttention tiled over queries and keys
(equal to naive attention), tile bytes, and the measurements' shapes (no timing asserted)."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from servelab import kernels as K
from servelab.attention import naive_attention
from servelab.model import LlamaConfig, LlamaModel


def test_unfused_and_fused_bytes():
    n = 1000
    # rmsnorm + residual: 2+1, 1+1, 1+0, 1+1, 1+1 = 10 tensors unfused; 2 reads + 2 writes fused
    assert K.bytes_moved("rmsnorm_residual", n, 4) == 10 * n * 4
    assert K.bytes_moved("rmsnorm_residual", n, 4, fused=True) == 4 * n * 4
    assert K.bytes_moved("swiglu", n, 2) == 5 * n * 2
    assert K.bytes_moved("swiglu", n, 2, fused=True) == 3 * n * 2
    ops = [K.Op("a", 1, 1), K.Op("b", 2, 1)]
    assert K.bytes_moved(ops, 10, 1) == 50
    assert K.bytes_moved(ops, 10, 1, fused=True, fused_reads=2, fused_writes=1) == 30
    assert K.bytes_moved("swiglu", 0) == 0


def test_bad_fusion_inputs():
    with pytest.raises(ValueError, match="unknown sequence 'gelu'"):
        K.bytes_moved("gelu", 10)
    with pytest.raises(ValueError, match="fused_reads"):
        K.bytes_moved([K.Op("a", 1, 1)], 10, fused=True)
    with pytest.raises(ValueError, match="numel"):
        K.bytes_moved("swiglu", -1)


def test_reference_functions_compute_the_textbook_formulas():
    x, r, w = torch.randn(3, 8), torch.randn(3, 8), torch.rand(8)
    y, h = K.rmsnorm_residual(x, r, w, 1e-6)
    assert torch.allclose(h, x + r)
    assert torch.allclose(y, torch.nn.functional.rms_norm(x + r, (8,), w, 1e-6), atol=1e-6)
    g, u = torch.randn(4), torch.randn(4)
    assert torch.allclose(K.swiglu(g, u), g * torch.sigmoid(g) * u)


def test_fusion_measurement_without_compile_reports_bytes():
    out = K.fusion_measurement("rmsnorm_residual", rows=4, width=64, repeats=2, compile=False)
    assert out["unfused_bytes"] == 10 * 256 * 4 and out["fused_bytes"] == 4 * 256 * 4
    assert out["eager_s"] > 0 and "fused_s" not in out


def test_count_ops_sees_every_aten_call():
    x = torch.randn(4)
    counts = K.count_ops(lambda: (x + 1).mul(2).sum())
    assert counts["add"] == 1 and counts["mul"] == 1 and counts["sum"] == 1


def _tiny():
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2)
    return LlamaModel(cfg).init_weights(seed=0).eval()


def test_step_overhead_counts_a_decode_step():
    out = K.step_overhead(_tiny(), repeats=2, op_seconds=1e-6)
    assert out["ops"] > 2 * 10            # at least a dozen ops per layer
    assert 0 < out["overhead_share"] <= 1
    assert K.op_overhead_seconds(repeats=40) > 0
    with pytest.raises(ValueError, match="repeats"):
        K.op_overhead_seconds(repeats=5)


def test_step_overhead_counts_the_steady_step_not_the_first_call():
    model = _tiny()
    step = K.decode_step(model)
    first = sum(K.count_ops(step).values())
    steady = sum(K.count_ops(step).values())
    assert sum(K.count_ops(step).values()) == steady   # repeatable after the first call
    assert first >= steady
    assert K.step_overhead(_tiny(), repeats=2, op_seconds=1e-6)["ops"] == steady


def test_graph_capture_alone_runs_the_same_step():
    model = _tiny()
    ref = K.decode_step(model)()
    cap = K.compiled_step(model, repeats=2, backend="eager")
    assert torch.allclose(cap["out"], ref, atol=1e-5)
    assert cap["step_s"] > 0 and cap["first_call_s"] > 0


def test_cuda_is_refused_cleanly_without_a_gpu():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(ValueError, match="no CUDA GPU"):
        K.op_overhead_seconds(device="cuda")


def test_tile_bytes():
    t = K.tile_bytes(128, 64, 128, bytes_per_element=2)
    assert t["q"] == 128 * 128 * 2 and t["k"] == t["v"] == 64 * 128 * 2
    assert t["scores"] == 128 * 64 * 4 and t["output"] == 128 * 128 * 4
    assert t["total"] == sum(v for key, v in t.items() if key != "total")
    assert t["total"] < K.H100_SMEM_PER_SM + K.H100_REGISTERS_PER_SM
    with pytest.raises(ValueError, match="block_q"):
        K.tile_bytes(0, 64, 128)


def test_h100_on_chip_totals_match_the_published_33_mb():
    # 132 SMs x 256 KB of L1/shared memory = about 33 MB across the chip (and as much in registers)
    assert K.H100_SMS * K.H100_L1_SMEM_PER_SM / 1e6 == pytest.approx(34.6, abs=0.1)


@settings(max_examples=25, deadline=None)
@given(q_time=st.integers(1, 19), extra_kv=st.integers(0, 9), block_q=st.integers(1, 8),
       block_k=st.integers(1, 8), gqa=st.sampled_from([1, 2, 4]), causal=st.booleans())
def test_flash_attention_equals_naive(q_time, extra_kv, block_q, block_k, gqa, causal):
    g = torch.Generator().manual_seed(q_time * 100 + extra_kv)
    kv_time = q_time + extra_kv
    q = torch.randn(2, 4, q_time, 8, generator=g)
    k = torch.randn(2, 4 // gqa, kv_time, 8, generator=g)
    v = torch.randn(2, 4 // gqa, kv_time, 8, generator=g)
    out = K.flash_attention(q, k, v, causal=causal, block_q=block_q, block_k=block_k)
    assert torch.allclose(out, naive_attention(q, k, v, causal=causal), atol=1e-5)


def test_causal_flash_attention_skips_future_blocks():
    q = k = v = torch.randn(1, 1, 64, 8)
    out, stats = K.flash_attention(q, k, v, causal=True, block_q=16, block_k=16, return_stats=True)
    assert stats["blocks_computed"] == 1 + 2 + 3 + 4 and stats["blocks_skipped"] == 6
    assert stats["largest_tile_elements"] == 256
    _, full = K.flash_attention(q, k, v, causal=False, block_q=16, block_k=16, return_stats=True)
    assert full["blocks_computed"] == 16 and full["blocks_skipped"] == 0
    with pytest.raises(ValueError, match="block_k"):
        K.flash_attention(q, k, v, block_k=0)
    with pytest.raises(ValueError, match="kv_time >= q_time"):
        K.flash_attention(torch.randn(1, 1, 5, 8), torch.randn(1, 1, 3, 8), torch.randn(1, 1, 3, 8))


def test_overlap_measurement_shape():
    out = K.overlap_measurement(n=64, copy_mb=1, repeats=2)
    assert out["sum_s"] == pytest.approx(out["compute_s"] + out["copy_s"])
    assert out["together_s"] > 0 and math.isfinite(out["hidden"])


def test_decode_attention_grid_llama_70b_on_h100():
    g = K.decode_attention_grid(1, 64, 8, 8192)
    assert g["blocks"] == 8 and g["query_rows"] == 8
    assert g["tile_rows_used"] == 8 / 128
    assert g["splits"] == 17 and g["blocks_split"] == 136 >= K.H100_SMS
    assert g["keys_per_split"] == -(-8192 // 17)


def test_decode_attention_grid_no_split_when_the_batch_fills_the_chip():
    g = K.decode_attention_grid(32, 64, 8, 4096)
    assert g["blocks"] == 256 and g["splits"] == 1 and g["keys_per_split"] == 4096


def test_decode_attention_grid_splits_at_most_one_per_key_block():
    g = K.decode_attention_grid(1, 8, 8, 200, block_k=128)
    assert g["splits"] == 2


@pytest.mark.parametrize("bad", [dict(batch=0), dict(kv_heads=3), dict(context=1.5),
                                 dict(sms=True)])
def test_decode_attention_grid_rejects_bad_input(bad):
    args = dict(batch=1, query_heads=64, kv_heads=8, context=8192)
    args.update(bad)
    with pytest.raises(ValueError):
        K.decode_attention_grid(**args)
