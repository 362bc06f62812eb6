import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from servelab.kvquant import (FORMATS, QuantizedKVCache, calibrate_kv_scales, dequantize_kv,
                              logit_agreement, quantize_kv, roundtrip_error)
from servelab.model import LlamaConfig, LlamaModel


def _kv(shape=(2, 4, 16, 32), seed=0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("fmt", sorted(FORMATS))
@pytest.mark.parametrize("granularity", ["token", "head", "tensor"])
def test_roundtrip_error_is_within_half_a_step(fmt, granularity):
    x = _kv()
    q = quantize_kv(x, fmt, granularity)
    back = dequantize_kv(q)
    assert back.shape == x.shape and back.dtype == torch.float32
    if fmt == "fp8":  # e4m3 keeps 3 mantissa bits: relative error <= 2^-4
        assert torch.all((back - x).abs() <= x.abs() * 2 ** -4 + q.scale * 2 ** -9 + 1e-7)
    else:
        assert torch.all((back - x).abs() <= q.scale / 2 + 1e-6)


@pytest.mark.parametrize("granularity, scale_shape", [("token", (2, 4, 16, 1)), ("head", (2, 4, 1, 1)),
                                                      ("tensor", (1, 1, 1, 1))])
def test_scale_shapes(granularity, scale_shape):
    q = quantize_kv(_kv(), "int8", granularity)
    assert tuple(q.scale.shape) == scale_shape
    assert q.codes.dtype == torch.int8
    assert q.codes.abs().max().item() == 127  # the largest magnitude maps to the largest code


def test_finer_scales_are_more_accurate_on_uneven_rows():
    x = _kv()
    x[:, :, ::4] *= 20  # some tokens with much larger keys, as real outlier tokens have
    errs = [roundtrip_error(x, "int8", g)["rel_rms"] for g in ("token", "head", "tensor")]
    assert errs[0] < errs[1] <= errs[2]


def test_int4_is_coarser_than_int8_and_packs_two_per_byte():
    x = _kv()
    assert roundtrip_error(x, "int4")["rel_rms"] > 4 * roundtrip_error(x, "int8")["rel_rms"]
    q8, q4 = quantize_kv(x, "int8"), quantize_kv(x, "int4")
    assert q4.codes.abs().max().item() == 7
    assert q8.nbytes - q4.nbytes == x.numel() / 2


def test_zero_rows_survive():
    x = torch.zeros(1, 2, 3, 8)
    for fmt in FORMATS:
        assert torch.equal(dequantize_kv(quantize_kv(x, fmt)), x)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-1e4, 1e4, allow_nan=False, width=32), min_size=1, max_size=64))
def test_int8_roundtrip_property(values):
    x = torch.tensor(values, dtype=torch.float32).reshape(1, 1, 1, -1)
    q = quantize_kv(x, "int8", "token")
    assert torch.all((dequantize_kv(q) - x).abs() <= q.scale / 2 * (1 + 1e-5) + 1e-30)


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="unknown KV format"):
        quantize_kv(_kv(), "int3")
    with pytest.raises(ValueError, match="granularity"):
        quantize_kv(_kv(), "int8", "channel")
    with pytest.raises(TypeError, match="floating-point"):
        quantize_kv(torch.ones(2, 2, dtype=torch.int64))
    with pytest.raises(TypeError, match="torch.Tensor"):
        quantize_kv([1.0, 2.0])
    with pytest.raises(ValueError, match="inf or nan"):
        quantize_kv(torch.tensor([[1.0, float("nan")]]))
    with pytest.raises(ValueError, match="at least 2 dims"):
        quantize_kv(torch.ones(4), "int8", "head")
    with pytest.raises(TypeError, match="QuantizedKV"):
        dequantize_kv(torch.ones(2))


def _tiny_model():
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return LlamaModel(cfg).init_weights(seed=0, std=0.2).eval()


def _run_with(model, ids, cache, prefill=20):
    with torch.no_grad():
        parts = [model(ids[:, :prefill], cache=cache)]
        parts += [model(ids[:, t:t + 1], cache=cache) for t in range(prefill, ids.shape[1])]
    return torch.cat(parts, dim=1)


def test_quantized_cache_runs_the_model_and_error_follows_the_bits():
    model = _tiny_model()
    ids = torch.randint(0, 64, (1, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = model(ids)
    plain = logit_agreement(ref, _run_with(model, ids, model.new_cache(1, 32)))
    assert plain["max_abs_diff"] < 1e-4 and plain["top1_agreement"] == 1.0
    stats = {}
    for fmt in ("int8", "fp8", "int4"):
        cache = QuantizedKVCache(model.config, max_len=32, fmt=fmt)
        stats[fmt] = logit_agreement(ref, _run_with(model, ids, cache))
        assert cache.length == 24
    spread = (ref.max() - ref.min()).item()
    assert 0 < stats["int8"]["max_abs_diff"] < 0.05 * spread
    assert stats["int8"]["max_abs_diff"] < stats["fp8"]["max_abs_diff"] < stats["int4"]["max_abs_diff"]
    assert 0 <= stats["int8"]["mean_kl"] < stats["fp8"]["mean_kl"] < stats["int4"]["mean_kl"]


def test_quantized_cache_bytes_and_errors():
    cfg = _tiny_model().config
    cache = QuantizedKVCache(cfg, batch_size=1, max_len=10, fmt="int8")
    numbers = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * 10 * cfg.head_dim
    scales = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * 10
    assert cache.nbytes == numbers * 1 + scales * 4
    assert QuantizedKVCache(cfg, max_len=10, fmt="int4").nbytes == numbers / 2 + scales * 4
    with pytest.raises(ValueError, match="full"):
        cache.update(0, torch.zeros(1, 2, 11, cfg.head_dim), torch.zeros(1, 2, 11, cfg.head_dim))
    with pytest.raises(ValueError, match="max_len"):
        QuantizedKVCache(cfg, max_len=0)
    with pytest.raises(ValueError, match="unknown KV format"):
        QuantizedKVCache(cfg, fmt="bf16")
    with pytest.raises(ValueError, match="crop"):
        cache.crop(3)


def test_logit_agreement():
    a = torch.tensor([[2.0, 0.0, -1.0], [0.0, 1.0, 0.0]])
    same = logit_agreement(a, a.clone())
    assert same == {"max_abs_diff": 0.0, "mean_kl": pytest.approx(0.0, abs=1e-7), "top1_agreement": 1.0}
    b = a.clone(); b[1, 0] = 5.0
    diff = logit_agreement(a, b)
    assert diff["max_abs_diff"] == 5.0 and diff["top1_agreement"] == 0.5 and diff["mean_kl"] > 0
    with pytest.raises(ValueError, match="same shape"):
        logit_agreement(a, a[:1])
    with pytest.raises(ValueError, match="empty"):
        logit_agreement(torch.zeros(0, 3), torch.zeros(0, 3))


def test_fp8_barely_notices_a_coarse_scale_int8_does():
    # fp8's relative error comes from its 3 mantissa bits wherever a number sits in its
    # range; int8's comes from one even step, so a loud token widens every other's step.
    x = _kv()
    x[:, :, ::4] *= 20
    fp8 = [roundtrip_error(x, "fp8", g)["rel_rms"] for g in ("token", "tensor")]
    int8 = [roundtrip_error(x, "int8", g)["rel_rms"] for g in ("token", "tensor")]
    assert fp8[1] < 1.5 * fp8[0]        # a fifth worse
    assert int8[1] > 3 * int8[0]        # three times worse


def _calibrated(model, ids, fmt="fp8", granularity="tensor"):
    cal = model.new_cache(ids.shape[0], ids.shape[1])
    with torch.no_grad():
        model(ids, cache=cal)
    return cal, calibrate_kv_scales(cal, fmt, granularity)


@pytest.mark.parametrize("granularity", ["tensor", "head"])
def test_calibrate_kv_scales_shapes_and_values(granularity):
    model = _tiny_model()
    cfg = model.config
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(2))
    cal, (ks, vs) = _calibrated(model, ids, "int8", granularity)
    heads = cfg.num_key_value_heads if granularity == "head" else 1
    assert ks.shape == vs.shape == (cfg.num_hidden_layers, 1, heads, 1, 1)
    layer0 = cal.k[0, :, :, :cal.length]
    want = layer0.abs().amax() if granularity == "tensor" else layer0.abs().amax(dim=(0, 2, 3))
    assert torch.allclose(ks[0].flatten(), want.flatten() / 127)


def test_static_scales_cache_matches_per_tensor_quantization_and_counts_saturation():
    model = _tiny_model()
    cfg = model.config
    ids = torch.randint(0, 64, (1, 16), generator=torch.Generator().manual_seed(3))
    cal, scales = _calibrated(model, ids, "fp8")
    cache = QuantizedKVCache(cfg, max_len=16, fmt="fp8", granularity="tensor", scales=scales)
    with torch.no_grad():
        model(ids, cache=cache)
    # layer 0 sees the same inputs in both runs: its codes are the per-tensor round trip
    want = dequantize_kv(quantize_kv(cal.k[0, :, :, :16], "fp8", "tensor"))
    assert torch.equal(cache.k[0].float() * cache.k_scale[0], want)
    scales_bytes = 2 * cfg.num_hidden_layers * 4
    assert cache.nbytes == 2 * cache.k.numel() + scales_bytes
    # scales a quarter too small: the loudest numbers saturate, and are counted
    tight = tuple(t / 4 for t in scales)
    small = QuantizedKVCache(cfg, max_len=16, fmt="int8", granularity="tensor", scales=tight)
    with torch.no_grad():
        model(ids, cache=small)
    assert small.saturated > 0 and small.k.abs().max().item() == 127
    assert cache.saturated == 0 or cache.saturated < small.saturated


def test_static_scales_bad_inputs_raise():
    model = _tiny_model()
    cfg = model.config
    ids = torch.randint(0, 64, (1, 8), generator=torch.Generator().manual_seed(4))
    cal, scales = _calibrated(model, ids)
    with pytest.raises(ValueError, match="needs static scales"):
        QuantizedKVCache(cfg, max_len=8, fmt="fp8", granularity="tensor")
    with pytest.raises(ValueError, match="only with granularity"):
        QuantizedKVCache(cfg, max_len=8, fmt="fp8", scales=scales)
    with pytest.raises(ValueError, match="shape"):
        QuantizedKVCache(cfg, max_len=8, fmt="fp8", granularity="head", scales=scales)
    with pytest.raises(ValueError, match="positive"):
        QuantizedKVCache(cfg, max_len=8, fmt="fp8", granularity="tensor",
                         scales=(scales[0] * 0, scales[1]))
    with pytest.raises(TypeError, match="pair of tensors"):
        QuantizedKVCache(cfg, max_len=8, fmt="fp8", granularity="tensor", scales=scales[0])
    with pytest.raises(ValueError, match="calibrate 'tensor' or 'head'"):
        calibrate_kv_scales(cal, "fp8", "token")
    with pytest.raises(ValueError, match="empty"):
        calibrate_kv_scales(model.new_cache(1, 8))
    with pytest.raises(TypeError, match="full-precision"):
        calibrate_kv_scales(QuantizedKVCache(cfg, max_len=8))
