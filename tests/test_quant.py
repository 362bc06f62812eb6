"""servelab.quant: formats, round trips, packed storage, the CPU kernels against a
dequantized reference, quantize_model on the course model, and bad input."""
import math

import pytest
import torch

from servelab import quant as Q
from servelab.model import LlamaConfig, LlamaModel, load_course_model

SCHEMES = ("int8", "int4-g32", "int4-g128", "mxfp4", "nvfp4")


def _weight(n=64, k=256, seed=0):
    return torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) * 0.02


# ---------------------------------------------------------------- formats and bits

def test_bits_per_weight_counts_the_scales():
    assert Q.bits_per_weight("int4-g128") == 4 + 16 / 128
    assert Q.bits_per_weight("int4") == Q.bits_per_weight("int4-g128")
    assert Q.bits_per_weight("int4-g32") == 4.5
    assert Q.bits_per_weight("mxfp4") == 4.25
    assert Q.bits_per_weight("nvfp4") == 4.5
    assert Q.bits_per_weight("nvfp4", numel=1024) == 4.5 + 32 / 1024
    assert Q.bits_per_weight("int8", in_features=4096) == 8 + 16 / 4096
    with pytest.raises(ValueError, match="in_features"):
        Q.bits_per_weight("int8")


def test_unknown_scheme_names_the_choices():
    with pytest.raises(ValueError, match="unknown quantization scheme 'int3'.*int8"):
        Q.get_format("int3")
    with pytest.raises(TypeError):
        Q.get_format(8)


def test_memory_bound_step():
    assert Q.memory_bound_step_seconds(8e9, 4, 4e12) == pytest.approx(1e-3)
    assert Q.memory_bound_step_seconds(8e9, 16, 4e12, overhead_s=0.002) == pytest.approx(0.006)
    with pytest.raises(ValueError, match="bits"):
        Q.memory_bound_step_seconds(8e9, 0, 4e12)


# ---------------------------------------------------------------- rounding

def test_fp4_grid_rounds_to_nearest_with_ties_to_even():
    x = torch.tensor([0.0, 0.24, 0.25, 0.26, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 5.1, 7.0, 100.0,
                      -0.75, -5.0, -0.1])
    values, codes = Q.round_to_fp4(x)
    expected = [0.0, 0.0, 0.0, 0.5, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0, 6.0, 6.0, -1.0, -4.0, 0.0]
    assert values.tolist() == expected
    # codes decode back to the values and every grid value is its own rounding
    assert Q._fp4_decode(codes).tolist() == expected
    grid = torch.tensor(Q.FP4_E2M1_VALUES)
    assert Q.round_to_fp4(grid)[0].tolist() == list(Q.FP4_E2M1_VALUES)
    assert Q.round_to_fp4(-grid[1:])[0].tolist() == [-v for v in Q.FP4_E2M1_VALUES[1:]]


def test_nibbles_pack_two_per_byte_and_back():
    codes = torch.randint(0, 16, (3, 10), dtype=torch.uint8)
    packed = Q.pack_nibbles(codes)
    assert packed.shape == (3, 5) and packed.dtype == torch.uint8
    assert torch.equal(Q.unpack_nibbles(packed), codes)
    with pytest.raises(ValueError, match="even"):
        Q.pack_nibbles(codes[:, :3])


def test_int4_codes_are_symmetric_in_minus8_to_7_and_the_extremes_survive():
    w = _weight()
    q = Q.quantize_weight(w, "int4-g32")
    assert q["codes"].min() >= -8 and q["codes"].max() <= 7
    # the largest magnitude of each group maps to +-7 and comes back to within its bf16 scale's rounding
    back = Q.dequantize_weight(q)
    g = w.view(64, -1, 32)
    idx = g.abs().argmax(-1, keepdim=True)
    assert torch.allclose(back.view(64, -1, 32).gather(-1, idx), g.gather(-1, idx), rtol=1e-2)
    # every weight is within half a step
    step = q["scales"].float().repeat_interleave(32, 1)
    assert ((back - w).abs() <= step / 2 + 1e-6).all()


def test_int8_error_is_at_most_half_a_step():
    w = _weight()
    q = Q.quantize_weight(w, "int8")
    step = q["scales"].float()[:, None]
    assert ((Q.dequantize_weight(q) - w).abs() <= step / 2 + 1e-7).all()
    assert q["codes"].abs().max() == 127


def test_mxfp4_scales_are_powers_of_two_and_nvfp4_scales_are_e4m3():
    w = _weight()
    mx = Q.quantize_weight(w, "mxfp4")
    assert mx["scales"].dtype == torch.int8 and mx["scales"].shape == (64, 256 // 32)
    block = torch.exp2(mx["scales"].float())
    # the largest element of each block lands in [4, 8) x 2^e before rounding, so it never clips past 6 by more than 2x
    amax = w.view(64, -1, 32).abs().amax(-1)
    assert ((amax / block >= 4) & (amax / block < 8)).all()
    nv = Q.quantize_weight(w, "nvfp4")
    assert nv["scales"].dtype == torch.float8_e4m3fn and nv["scales"].shape == (64, 256 // 16)
    # the second-level scale keeps the largest block scale at the top of E4M3's range
    assert nv["scales"].float().max() == pytest.approx(Q.E4M3_MAX, rel=0.07)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_round_trip_error_is_small_and_ordered_by_bits(scheme):
    w = _weight()
    err = Q.roundtrip_error(w, scheme)
    assert err["relative_rms"] < (0.01 if scheme == "int8" else 0.2)
    assert Q.fake_quantize(w, scheme).shape == w.shape


def test_finer_groups_err_less():
    w = _weight(k=512)
    assert Q.roundtrip_error(w, "int4-g32")["rms"] < Q.roundtrip_error(w, "int4-g128")["rms"]
    assert Q.roundtrip_error(w, "int8")["rms"] < Q.roundtrip_error(w, "int4-g32")["rms"]


def test_zero_matrix_round_trips_to_zero():
    w = torch.zeros(16, 128)
    for scheme in SCHEMES:
        assert torch.equal(Q.fake_quantize(w, scheme), w), scheme


def test_bad_weights_are_refused():
    with pytest.raises(ValueError, match="does not divide in_features=100.*groups that divide"):
        Q.quantize_weight(torch.randn(16, 100), "int4-g32")
    with pytest.raises(ValueError, match="matrix"):
        Q.quantize_weight(torch.randn(16), "int8")
    with pytest.raises(TypeError):
        Q.quantize_weight(torch.ones(4, 4, dtype=torch.int64), "int8")
    with pytest.raises(TypeError):
        Q.quantize_weight([[1.0]], "int8")


# ---------------------------------------------------------------- QuantizedLinear

@pytest.mark.parametrize("scheme", SCHEMES)
def test_quantized_linear_stores_packed_bytes(scheme):
    lin = torch.nn.Linear(256, 64, bias=False)
    mod = Q.QuantizedLinear.from_linear(lin, scheme)
    n, k = 64, 256
    fmt = Q.get_format(scheme)
    expected = {
        "int8": n * k + n * 2,                          # int8 codes + bf16 scale per row
        "int4-g32": n * k // 2 + (k // 32) * n * 2 * 2,  # 2 codes per byte + bf16 scale and zero per group
        "int4-g128": n * k // 2 + (k // 128) * n * 2 * 2,
        "mxfp4": n * k // 2 + n * k // 32,               # + one E8M0 byte per 32
        "nvfp4": n * k // 2 + n * k // 16 + 4,           # + one E4M3 byte per 16, one fp32 per tensor
    }[scheme]
    assert mod.nbytes == expected
    assert mod.nbytes < lin.weight.numel() * 4 / (3.5 if fmt.element_bits == 8 else 6)
    assert torch.equal(mod.dequantized_weight(), Q.fake_quantize(lin.weight, scheme))


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 3, 40])
def test_quantized_linear_matches_the_dequantized_reference(scheme, dtype, rows):
    """Kernels (bf16, few rows) and the dequantize path (fp32 or many rows) against
    x @ W_hat^T computed in fp32. Tolerance: fp32 paths 1e-5 relative to the output's
    scale; bf16 activations are rounded to 8 bits of mantissa before the product, so
    1e-2 of the output's scale (the kernels accumulate in fp32)."""
    torch.manual_seed(1)
    lin = torch.nn.Linear(256, 96, bias=True)
    mod = Q.QuantizedLinear.from_linear(lin, scheme)
    x = torch.randn(2, rows, 256).to(dtype)
    ref = x.float() @ mod.dequantized_weight().T + lin.bias.detach()
    out = mod(x)
    assert out.dtype == dtype and out.shape == (2, rows, 96)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    assert (out.float() - ref).abs().max() <= tol * ref.abs().max()
    expected_path = mod.kernel if (dtype == torch.bfloat16 and 2 * rows <= Q.KERNEL_MAX_ROWS) else "dequantize"
    assert mod.path(2 * rows, dtype) == expected_path


def test_int4_kernel_layout_is_read_back_exactly_for_awkward_widths():
    for n, k in [(16, 32), (48, 128), (96, 64), (208, 256)]:
        lin = torch.nn.Linear(k, n, bias=False)
        mod = Q.QuantizedLinear.from_linear(lin, "int4-g32")
        assert torch.equal(mod.dequantized_weight(), Q.fake_quantize(lin.weight, "int4-g32")), (n, k)


def test_int4_kernel_needs_rows_in_sixteens():
    with pytest.raises(ValueError, match="multiple of 16.*int8"):
        Q.QuantizedLinear.from_linear(torch.nn.Linear(128, 10), "int4-g32")
    assert Q.QuantizedLinear.from_linear(torch.nn.Linear(128, 10, bias=False), "int8").nbytes == 10 * 128 + 20


def test_from_linear_refuses_non_linears():
    mod = Q.QuantizedLinear.from_linear(torch.nn.Linear(64, 16), "int8")
    with pytest.raises(TypeError, match="already quantized"):
        Q.QuantizedLinear.from_linear(mod, "int8")


# ---------------------------------------------------------------- whole models

def _tiny_model(seed=0, **overrides):
    shape = dict(vocab_size=96, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    shape.update(overrides)
    return LlamaModel(LlamaConfig(**shape)).init_weights(seed=seed).eval()


def test_quantize_model_replaces_every_projection_and_keeps_the_head():
    model = _tiny_model()
    before = Q.linear_weight_bytes(model)
    assert Q.quantize_model(model, "int8") is model
    for layer in model.layers:
        for path in Q.PROJECTIONS:
            parent, name = path.split(".")
            assert isinstance(getattr(getattr(layer, parent), name), Q.QuantizedLinear)
    assert isinstance(model.lm_head, torch.nn.Linear) and model.quantization == "int8"
    after = Q.linear_weight_bytes(model)
    assert after["other"] == before["other"]
    assert after["projections"] < before["projections"] / 3.5


def test_quantized_head_is_a_copy_and_the_embedding_stays():
    model = _tiny_model()
    emb = model.embed_tokens.weight.detach().clone()
    Q.quantize_model(model, "int4-g32", lm_head=True)
    assert isinstance(model.lm_head, Q.QuantizedLinear)
    assert torch.equal(model.embed_tokens.weight, emb)


def test_quantize_model_refuses_bad_requests_and_leaves_the_model_alone():
    model = _tiny_model()
    with pytest.raises(ValueError, match="already quantized"):
        Q.quantize_model(Q.quantize_model(_tiny_model(), "int8"), "int4")
    with pytest.raises(ValueError, match="unknown quantization scheme"):
        Q.quantize_model(model, "fp3")
    odd = _tiny_model(hidden_size=96, num_attention_heads=4, num_key_value_heads=2, intermediate_size=160)
    with pytest.raises(ValueError, match="does not divide in_features=96"):
        Q.quantize_model(odd, "int4-g128")
    assert not Q.is_quantized(odd)        # checked every width before replacing anything
    with pytest.raises(TypeError, match="LlamaModel"):
        Q.quantize_model(torch.nn.Linear(4, 4), "int8")


@pytest.mark.parametrize("scheme", SCHEMES)
def test_quantized_course_model_stays_close_to_fp32(scheme):
    torch.manual_seed(0)
    ids = torch.randint(0, 4096, (2, 24))
    model = load_course_model()
    ref = model(ids)
    out = Q.quantize_model(model, scheme)(ids)
    agree = (ref.argmax(-1) == out.argmax(-1)).float().mean().item()
    assert agree > (0.97 if scheme == "int8" else 0.6), agree


def test_quantized_model_decodes_with_a_cache_in_bf16_through_the_kernels():
    model = Q.quantize_model(_tiny_model().to(torch.bfloat16), "int4-g32")
    ids = torch.tensor([[5, 7, 9]])
    cache = model.new_cache(max_len=8)
    with torch.no_grad():
        full = model(torch.tensor([[5, 7, 9, 11]]))
        model(ids, cache=cache)
        step = model(torch.tensor([[11]]), cache=cache)
    assert torch.allclose(step[0, -1].float(), full[0, -1].float(), atol=0.05, rtol=0.05)
    layer = model.layers[0].self_attn.q_proj
    assert layer.path(1, torch.bfloat16) == "int4pack"


# ---------------------------------------------------------------- quality helpers

def test_perplexity_of_a_uniform_model_is_the_vocabulary():
    class Uniform(torch.nn.Module):
        def forward(self, ids):
            return torch.zeros(*ids.shape, 50)
    assert Q.perplexity(Uniform(), torch.arange(41) % 50, seq_len=8) == pytest.approx(50)
    with pytest.raises(ValueError, match="more than seq_len"):
        Q.perplexity(Uniform(), torch.arange(5), seq_len=8)


def test_quality_table_on_a_small_slice():
    rows = Q.quality_table(("fp32", "int8", "int4-g128"), max_tokens=257, seq_len=128)
    fp32, int8, int4 = rows
    assert fp32["top1_agreement"] == 1.0 and fp32["mean_kl"] == pytest.approx(0, abs=1e-6)
    assert int8["top1_agreement"] > 0.95 and int8["mean_kl"] < int4["mean_kl"]
    assert int4["projection_bytes"] < int8["projection_bytes"] < fp32["projection_bytes"]
    assert all(math.isfinite(r["perplexity"]) and r["tokens"] == 256 for r in rows)


def test_outlier_demo_orders_the_fixes():
    demo = Q.outlier_demo()
    e = demo["errors"]
    assert e["per-tensor int8"] > 5 * demo["per_tensor_without_outlier"]
    assert e["rescaled channel, per-channel int8"] < e["per-tensor int8"] / 5
    assert e["channel kept in high precision"] < e["per-tensor int8"] / 5
    assert e["int8, groups of 128"] < e["per-tensor int8"]


def test_a_fused_model_quantizes_to_the_same_logits():
    """Full-precision fused matrices are dropped; int8 groups are fused again (tests/test_quant_fused.py)."""
    ids = torch.tensor([[1, 5, 9, 3]])
    plain = Q.quantize_model(_tiny_model(), "int4-g32")
    fused = Q.quantize_model(_tiny_model().fuse_projections(), "int4-g32")
    assert all(layer.self_attn.fused_qkv is None and layer.mlp.fused_gate_up is None for layer in fused.layers)
    assert torch.allclose(plain(ids), fused(ids), atol=1e-6)
    int8 = Q.quantize_model(_tiny_model().fuse_projections(), "int8")
    assert all(isinstance(layer.self_attn.fused_qkv, Q.FusedQuantizedLinears) for layer in int8.layers)


def test_rotation_spreads_the_outlier():
    """QuaRot-style rotation: (x R)(W R)^T = x W^T, and per-channel int8 of W R beats per-channel int8 of W."""
    e = Q.outlier_demo()["errors"]
    assert e["rotated (Hadamard), per-channel int8"] < e["per-channel int8"] / 3
    gen = torch.Generator().manual_seed(1)
    for n in (8, 6):            # Hadamard path and the QR fallback
        r = Q._random_rotation(n, gen)
        assert torch.allclose(r @ r.T, torch.eye(n), atol=1e-5)


def test_fp8_round_trip_cares_little_about_its_scale():
    """fp8 is a float: per-tensor vs per-row scales barely matter; int8's error shrinks with per-row scales."""
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(64, 128, generator=gen) * torch.logspace(-2, 0, 64).unsqueeze(1)
    e4_t, e4_r = (Q.scaled_roundtrip_error(w, "e4m3", g) for g in ("tensor", "row"))
    i8_t, i8_r = (Q.scaled_roundtrip_error(w, "int8", g) for g in ("tensor", "row"))
    assert e4_r <= e4_t < 1.2 * e4_r
    assert i8_t > 2 * i8_r
    assert Q.scaled_roundtrip_error(w, "e5m2") > e4_t       # fewer mantissa bits
    assert Q.scaled_roundtrip_error(torch.zeros(2, 3)) == 0.0
    for bad in (dict(element="fp4"), dict(granularity="group")):
        with pytest.raises(ValueError):
            Q.scaled_roundtrip_error(w, **bad)
    with pytest.raises(ValueError):
        Q.scaled_roundtrip_error(torch.ones(3))


def test_time_projection_times_every_format():
    ms = Q.time_projection(64, 96, schemes=("int8", "mxfp4"), repeats=1)
    assert list(ms) == ["fp32", "bf16", "int8", "mxfp4", "mxfp4 rebuild"]
    assert all(v > 0 for v in ms.values())
    with pytest.raises(ValueError):
        Q.time_projection(repeats=0)


def test_activation_outliers_favour_e4m3_over_int8():
    x = Q.outlier_activations(tokens=8, features=64, factor=100.0)
    big = x.abs().amax(0)
    assert (big > 20 * big.median()).sum() == 1          # one channel, in every token
    e = Q.activation_outlier_errors(factor=100.0)
    # int8's even levels: a scale set by the outlier leaves ordinary values a few codes
    assert e["int8"]["tensor"] > 0.2
    # per-token scales help only partly: every token holds the outlier
    assert e["int8"]["row"] > 0.1 and e["int8"]["row"] > 4 * e["e4m3"]["row"]
    # E4M3's steps shrink with the value: a few percent either way
    assert e["e4m3"]["tensor"] < 0.06 and e["e4m3"]["row"] < 0.06
    # without an outlier, int8's finer levels win
    clean = Q.activation_outlier_errors(factor=1.0)
    assert clean["int8"]["tensor"] < clean["e4m3"]["tensor"]
    with pytest.raises(ValueError):
        Q.outlier_activations(factor=0)
    with pytest.raises(ValueError):
        Q.outlier_activations(features=1)
