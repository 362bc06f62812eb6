"""servelab.model against transformers: same logits, prefill and cached decode."""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch

transformers = pytest.importorskip("transformers")
from safetensors.torch import load_file, save_file  # noqa: E402

from servelab.model import (  # noqa: E402
    KVCache, LlamaConfig, LlamaModel, count_parameters_from_config, load_config, load_pretrained,
    save_pretrained,
)

VOCAB = 97
LLAMA3_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                  "high_freq_factor": 4.0, "original_max_position_embeddings": 16}

CONFIGS = {
    "mha": dict(num_attention_heads=4, num_key_value_heads=4),
    "gqa_tied": dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True),
    "mqa_headdim": dict(num_attention_heads=4, num_key_value_heads=1, head_dim=24),
    "gqa_llama3_rope": dict(num_attention_heads=8, num_key_value_heads=2, rope_theta=500000.0,
                            rope_scaling=LLAMA3_SCALING),
    "linear_rope_bias": dict(num_attention_heads=2, num_key_value_heads=1, attention_bias=True,
                             mlp_bias=True, rope_scaling={"rope_type": "linear", "factor": 2.0}),
}


def hf_model(seed=0, **overrides):
    torch.manual_seed(seed)
    kwargs = dict(vocab_size=VOCAB, hidden_size=48, intermediate_size=80, num_hidden_layers=2,
                  max_position_embeddings=64, rms_norm_eps=1e-5, num_attention_heads=4)
    kwargs.update(overrides)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**kwargs)).eval()


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def pair(request, tmp_path_factory):
    hf = hf_model(**CONFIGS[request.param])
    folder = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(folder)
    return hf, load_pretrained(folder), folder


def test_prefill_logits_match_transformers(pair):
    hf, ours, _ = pair
    ids = torch.randint(0, VOCAB, (2, 23), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = hf(ids).logits
        got = ours(ids)
    assert got.shape == (2, 23, VOCAB)
    assert (got - expected).abs().max().item() < 1e-4


def test_cached_decode_matches_transformers(pair):
    hf, ours, _ = pair
    ids = torch.randint(0, VOCAB, (2, 30), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = hf(ids).logits
        cache = ours.new_cache(batch_size=2, max_len=40)
        pieces = [ours(ids[:, :7], cache=cache)]
        pieces.append(ours(ids[:, 7:12], cache=cache))       # a chunk after a prefix
        for i in range(12, 30):                                # then one token at a time
            pieces.append(ours(ids[:, i:i + 1], cache=cache))
    assert cache.length == 30
    assert (torch.cat(pieces, dim=1) - expected).abs().max().item() < 1e-4


def test_explicit_position_ids_equal_default(pair):
    _, ours, _ = pair
    ids = torch.randint(0, VOCAB, (1, 9), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        a = ours(ids)
        b = ours(ids, position_ids=torch.arange(9))
        c = ours(ids, position_ids=torch.arange(9)[None])
    assert torch.allclose(a, b, atol=1e-6) and torch.allclose(a, c, atol=1e-6)


def test_tied_head_shares_storage(tmp_path):
    hf = hf_model(tie_word_embeddings=True)
    hf.save_pretrained(tmp_path)
    m = load_pretrained(tmp_path)
    assert m.lm_head.weight is m.embed_tokens.weight
    assert m.num_parameters() == sum(p.numel() for p in hf.parameters())


def test_sharded_checkpoint_loads(tmp_path):
    hf = hf_model(num_attention_heads=4, num_key_value_heads=2)
    hf.save_pretrained(tmp_path, max_shard_size="40KB")
    assert (tmp_path / "model.safetensors.index.json").exists()
    assert len(list(tmp_path.glob("model-*.safetensors"))) > 1
    ids = torch.arange(10)[None]
    with torch.no_grad():
        assert (load_pretrained(tmp_path)(ids) - hf(ids).logits).abs().max() < 1e-4


def test_classic_config_fields_and_bf16(tmp_path):
    """Old-style config.json (rope_theta + rope_scaling, torch_dtype) as Llama 3.1 ships it."""
    hf = hf_model(num_attention_heads=4, num_key_value_heads=2, rope_theta=500000.0,
                  rope_scaling=LLAMA3_SCALING)
    hf.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    rope = cfg.pop("rope_parameters")
    cfg["rope_theta"] = rope.pop("rope_theta")
    cfg["rope_scaling"] = rope
    cfg["torch_dtype"] = cfg.pop("dtype")
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    ids = torch.arange(12)[None]
    with torch.no_grad():
        expected = hf(ids).logits
        assert (load_pretrained(tmp_path)(ids) - expected).abs().max() < 1e-4
        bf16 = load_pretrained(tmp_path, dtype="bfloat16")
        assert bf16.lm_head.weight.dtype == torch.bfloat16
        assert bf16.rotary.inv_freq.dtype == torch.float32
        assert (bf16(ids).float() - expected).abs().max() < 0.1


def test_save_pretrained_roundtrips_through_transformers(tmp_path):
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                      rope_scaling=LLAMA3_SCALING, max_position_embeddings=64)
    ours = LlamaModel(cfg).init_weights(seed=0).eval()
    save_pretrained(ours, tmp_path)
    hf = transformers.LlamaForCausalLM.from_pretrained(tmp_path).eval()
    ids = torch.arange(20)[None]
    with torch.no_grad():
        assert (hf(ids).logits - ours(ids)).abs().max() < 1e-4
    assert load_config(tmp_path) == dataclasses.replace(cfg, torch_dtype="float32")


def test_parameter_count_from_config_matches_tensors():
    for extra in CONFIGS.values():
        hf = hf_model(**extra)
        cfg = LlamaConfig.from_hf_dict(hf.config.to_dict())
        assert count_parameters_from_config(cfg)["total"] == sum(p.numel() for p in hf.parameters())


def test_kv_cache_bounds_and_crop():
    cfg = LlamaConfig(vocab_size=11, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2)
    m = LlamaModel(cfg).init_weights(seed=0)
    cache = KVCache(cfg, batch_size=1, max_len=4)
    assert cache.nbytes == 2 * 1 * 1 * 2 * 4 * 8 * 4
    with torch.no_grad():
        m(torch.tensor([[1, 2, 3]]), cache=cache)
        cache.crop(2)
        m(torch.tensor([[4, 5]]), cache=cache)
        with pytest.raises(ValueError, match="full"):
            m(torch.tensor([[6]]), cache=cache)
    with pytest.raises(ValueError, match="crop"):
        cache.crop(9)


# ------------------------------------------------------------------ errors

@pytest.fixture()
def saved(tmp_path):
    hf_model(num_attention_heads=4, num_key_value_heads=2).save_pretrained(tmp_path)
    return tmp_path


def _edit_tensors(folder, fn):
    tensors = load_file(str(folder / "model.safetensors"))
    fn(tensors)
    save_file(tensors, str(folder / "model.safetensors"))


def test_missing_tensor_is_named(saved):
    _edit_tensors(saved, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(ValueError, match=r"missing.*model\.layers\.1\.mlp\.up_proj\.weight"):
        load_pretrained(saved)


def test_unexpected_tensor_is_named(saved):
    _edit_tensors(saved, lambda t: t.update({"model.layers.0.self_attn.q_norm.weight": torch.ones(12)}))
    with pytest.raises(ValueError, match=r"unexpected.*layers\.0\.self_attn\.q_norm\.weight"):
        load_pretrained(saved)


def test_wrong_shape_is_named(saved):
    cfg = json.loads((saved / "config.json").read_text())
    cfg["intermediate_size"] = 96
    (saved / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"layers\.0\.mlp\.gate_proj\.weight has shape"):
        load_pretrained(saved)


@pytest.mark.parametrize("field,value", [("architectures", ["MistralForCausalLM"]),
                                         ("model_type", "qwen2"), ("hidden_act", "gelu")])
def test_unsupported_architecture_names_the_field(saved, field, value):
    cfg = json.loads((saved / "config.json").read_text())
    cfg[field] = value
    (saved / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=field):
        load_pretrained(saved)


def test_missing_config_field_and_bad_rope(saved):
    cfg = json.loads((saved / "config.json").read_text())
    del cfg["num_hidden_layers"]
    (saved / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="num_hidden_layers"):
        load_pretrained(saved)
    with pytest.raises(ValueError, match="yarn"):
        LlamaModel(LlamaConfig(vocab_size=8, hidden_size=8, intermediate_size=8, num_hidden_layers=1,
                               num_attention_heads=2, rope_scaling={"rope_type": "yarn", "factor": 4.0}))
    with pytest.raises(ValueError, match="num_key_value_heads"):
        LlamaConfig(vocab_size=8, hidden_size=12, intermediate_size=8, num_hidden_layers=1,
                    num_attention_heads=3, num_key_value_heads=2)


def test_pickle_only_folder_is_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(hf_model().config.to_dict()))
    (tmp_path / "pytorch_model.bin").write_bytes(b"not read")
    with pytest.raises(ValueError, match="safetensors"):
        load_pretrained(tmp_path)
    with pytest.raises(FileNotFoundError):
        load_pretrained(tmp_path / "nope")


# ------------------------------------------------------------------ training helpers

def test_train_schedule_batches_and_presets():
    from servelab.train import PRESETS, TrainPreset, loss_on, lr_at, random_batch

    p = TrainPreset("t", hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                    num_key_value_heads=1, steps=100, warmup_steps=10, lr=1e-3)
    assert lr_at(0, p) == pytest.approx(1e-4) and lr_at(9, p) == pytest.approx(1e-3)
    assert lr_at(99, p) == pytest.approx(1e-4, rel=0.01)          # decays to min_lr_ratio * lr
    tokens = torch.arange(1000, dtype=torch.int32)
    x, y = random_batch(tokens, 4, 16, torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (4, 16) and torch.equal(x[:, 1:], y[:, :-1])
    assert {"main", "draft"} <= set(PRESETS)
    # a few optimizer steps on a repeating pattern lower the loss
    cfg = LlamaConfig(vocab_size=8, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1)
    model = LlamaModel(cfg).init_weights(seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    pattern = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7] * 4])
    first = None
    for _ in range(30):
        loss = loss_on(model, pattern[:, :-1], pattern[:, 1:], autocast=False)
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < first / 2


# ---------------------------------------------------------------- fused projections

def _small(seed=3, **overrides):
    kwargs = dict(vocab_size=VOCAB, hidden_size=48, intermediate_size=80, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    kwargs.update(overrides)
    return LlamaModel(LlamaConfig(**kwargs)).init_weights(seed=seed).eval()


def _prefill_then_decode(model, ids):
    cache = model.new_cache(batch_size=ids.shape[0], max_len=ids.shape[1] + 4)
    with torch.inference_mode():
        first = model(ids, cache=cache)
        step = model(ids[:, -1:], cache=cache)
    return first, step


def _linear_calls(model, ids):
    calls = []
    handles = [m.register_forward_hook(lambda *a: calls.append(1)) for m in model.modules()
               if isinstance(m, torch.nn.Linear)]
    with torch.inference_mode():
        model(ids)
    for h in handles:
        h.remove()
    return len(calls)


@pytest.mark.parametrize("bias", [False, True])
def test_fused_projections_change_the_matmul_count_not_the_answer(bias):
    plain = _small(attention_bias=bias, mlp_bias=bias)
    fused = _small(attention_bias=bias, mlp_bias=bias).fuse_projections()
    ids = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(0))
    for a, b in zip(_prefill_then_decode(plain, ids), _prefill_then_decode(fused, ids)):
        assert (a - b).abs().max().item() < 1e-5
    # q, k, v, gate and up no longer run as modules: o_proj and down_proj per layer, then the head
    layers = plain.config.num_hidden_layers
    assert _linear_calls(plain, ids) == 7 * layers + 1
    assert _linear_calls(fused, ids) == 2 * layers + 1
    # names and values in the state dict are the Hugging Face ones
    assert plain.state_dict().keys() == fused.state_dict().keys()
    for name, t in plain.state_dict().items():
        assert torch.equal(t, fused.state_dict()[name]), name


def test_fused_weights_are_views_so_updates_reach_both(tmp_path):
    model = _small().fuse_projections()
    attn = model.layers[0].self_attn
    assert attn.fused_qkv.weight.shape == (4 * 12 + 2 * 2 * 12, 48)
    assert attn.k_proj.weight.data_ptr() == attn.fused_qkv.weight[attn.q_proj.out_features].data_ptr()
    fresh = _small()
    with torch.no_grad():
        for p in fresh.parameters():
            p.mul_(-1.5)
    model.load_state_dict(fresh.state_dict())  # copies into the views, so the fused matrix follows
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.inference_mode():
        assert (model(ids) - fresh(ids)).abs().max().item() < 1e-5
    save_pretrained(model, tmp_path)  # shared storage must not trip safetensors
    with torch.inference_mode():
        assert (load_pretrained(tmp_path)(ids) - fresh(ids)).abs().max().item() < 1e-5


def test_fused_model_still_trains_each_weight():
    model = _small().fuse_projections().train()
    model(torch.tensor([[1, 2, 3, 4, 5]])).sum().backward()
    attn, mlp = model.layers[0].self_attn, model.layers[0].mlp
    for linear in (attn.q_proj, attn.k_proj, attn.v_proj, mlp.gate_proj, mlp.up_proj):
        assert linear.weight.grad is not None and linear.weight.grad.abs().sum() > 0


def _fused_is_current(model):
    a, m = model.layers[0].self_attn, model.layers[0].mlp
    return (a.fused_qkv.is_current((a.q_proj, a.k_proj, a.v_proj))
            and m.fused_gate_up.is_current((m.gate_proj, m.up_proj)))


def test_dtype_change_rebuilds_a_stale_fusion():
    model = _small().fuse_projections().to(torch.bfloat16)
    reference = _small().to(torch.bfloat16)
    ids = torch.tensor([[5, 6, 7]])
    assert not _fused_is_current(model)       # .to() made new tensors ...
    with torch.inference_mode():
        out = model(ids)
    assert _fused_is_current(model)           # ... and the next call fused them again
    assert model.layers[0].self_attn.fused_qkv.weight.dtype == torch.bfloat16
    with torch.inference_mode():
        assert (out.float() - reference(ids).float()).abs().max().item() < 0.05


def test_load_state_dict_and_weight_swaps_never_use_stale_fused_weights():
    ids = torch.tensor([[5, 6, 7, 8]])
    model, other = _small().fuse_projections(), _small(seed=9)
    with torch.inference_mode():
        expected = other(ids)
    model.load_state_dict(other.state_dict())            # copies into the views: still current
    assert _fused_is_current(model)
    with torch.inference_mode():
        assert torch.allclose(model(ids), expected, atol=1e-5)
    model = _small().fuse_projections()
    model.load_state_dict(other.state_dict(), assign=True)  # new tensors: rebuilt at the next call
    with torch.inference_mode():
        assert torch.allclose(model(ids), expected, atol=1e-5)
    assert _fused_is_current(model)
    model = _small().fuse_projections()
    for layer, src in zip(model.layers, other.layers):      # a weight swap, one projection at a time
        layer.self_attn.k_proj.weight = torch.nn.Parameter(src.self_attn.k_proj.weight.detach().clone())
        layer.mlp.up_proj.weight = torch.nn.Parameter(src.mlp.up_proj.weight.detach().clone())
    mixed = _small()
    for layer, src in zip(mixed.layers, other.layers):
        layer.self_attn.k_proj.weight.data.copy_(src.self_attn.k_proj.weight)
        layer.mlp.up_proj.weight.data.copy_(src.mlp.up_proj.weight)
    with torch.inference_mode():
        assert torch.allclose(model(ids), mixed(ids), atol=1e-5)


class _Wrapped(torch.nn.Module):
    """A stand-in for a quantized or tensor-parallel projection: not a plain nn.Linear."""

    def __init__(self, linear):
        super().__init__()
        self.inner = linear

    def forward(self, x):
        return self.inner(x)


def test_a_group_holding_a_non_linear_runs_one_by_one():
    ids = torch.tensor([[5, 6, 7, 8]])
    reference = _small()
    with torch.inference_mode():
        expected = reference(ids)
    model = _small().fuse_projections()
    for layer in model.layers:   # wrapped after fusing: the stale group must not be used
        layer.self_attn.v_proj = _Wrapped(layer.self_attn.v_proj)
        layer.self_attn.o_proj = _Wrapped(layer.self_attn.o_proj)
        layer.mlp.down_proj = _Wrapped(layer.mlp.down_proj)
    with torch.inference_mode():
        assert torch.allclose(model(ids), expected, atol=1e-5)
    fresh = _small()
    for layer in fresh.layers:   # wrapped before fusing: the group is never fused
        layer.mlp.gate_proj = _Wrapped(layer.mlp.gate_proj)
    fresh.fuse_projections()
    assert fresh.layers[0].mlp.fused_gate_up is None and fresh.layers[0].self_attn.fused_qkv is not None
    with torch.inference_mode():
        assert torch.allclose(fresh(ids), expected, atol=1e-5)


@pytest.mark.parametrize("attention_bias,mlp_bias,tied", [(False, False, True), (True, False, False),
                                                          (True, True, False), (False, True, True)])
def test_the_one_parameter_counter_matches_tensors_with_biases(attention_bias, mlp_bias, tied):
    """model.count_parameters_from_config is servelab.arith.count_params; biases included."""
    from servelab import arith
    cfg = LlamaConfig(vocab_size=11, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, attention_bias=attention_bias,
                      mlp_bias=mlp_bias, tie_word_embeddings=tied)
    real = LlamaModel(cfg).num_parameters()
    assert arith.count_params(cfg).total == real == count_parameters_from_config(cfg)["total"]


def test_fuse_projections_keeps_a_quantized_fusion():
    """LLM(quantization="int8") quantizes (fusing int8 Q/K/V and gate/up), then the
    runner calls fuse_projections: the int8 groups must stay fused, not be dropped."""
    from servelab import quant
    model = LlamaModel(LlamaConfig(vocab_size=96, hidden_size=128, intermediate_size=256,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2)).init_weights(seed=0).eval()
    quant.quantize_model(model.to(torch.bfloat16), "int8")
    fused = [(l.self_attn.fused_qkv, l.mlp.fused_gate_up) for l in model.layers]
    model.fuse_projections(column_major=True)
    for layer, (qkv, gu) in zip(model.layers, fused):
        assert layer.self_attn.fused_qkv is qkv and layer.mlp.fused_gate_up is gu
        assert isinstance(qkv, quant.FusedQuantizedLinears)
    # a fusion that no longer holds the layer's modules is dropped, never used stale
    layer = model.layers[0]
    layer.self_attn.q_proj = torch.nn.Identity()
    layer.self_attn.fuse(column_major=True)
    assert layer.self_attn.fused_qkv is None


@pytest.mark.parametrize("scheme", ["int8", "int4-g32", "mxfp4"])
def test_a_model_in_the_serving_layout_can_still_be_quantized(scheme):
    """The engine stores weights column-major (fuse_projections(column_major=True));
    quantizing such a model afterwards must give the same codes as the plain layout."""
    from servelab import quant
    cfg = LlamaConfig(vocab_size=96, hidden_size=128, intermediate_size=256,
                      num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2)
    plain = LlamaModel(cfg).init_weights(seed=0).eval()
    served = LlamaModel(cfg).init_weights(seed=0).eval().fuse_projections(column_major=True)
    w_plain = plain.layers[0].mlp.down_proj.weight
    w_served = served.layers[0].mlp.down_proj.weight
    assert not w_served.is_contiguous() and torch.equal(w_plain, w_served)
    a, b = quant.quantize_weight(w_plain, scheme), quant.quantize_weight(w_served, scheme)
    assert torch.equal(a["codes"], b["codes"]) and torch.equal(a["scales"], b["scales"])
