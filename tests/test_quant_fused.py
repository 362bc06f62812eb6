"""servelab.quant's fused int8 groups: Q/K/V and gate/up as one int8 matrix, one kernel call
per group, the same numbers as the projections one by one, nothing held twice, never stale."""
import copy

import pytest
import torch

from servelab import quant as Q
from servelab.kernels import count_ops
from servelab.model import LlamaConfig, LlamaModel


def _model(dtype=torch.bfloat16, **overrides):
    shape = dict(vocab_size=96, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2)
    shape.update(overrides)
    return LlamaModel(LlamaConfig(**shape)).init_weights(seed=0).eval().to(dtype)


def _step(model, ids=(3, 9, 4), new=7):
    cache = model.new_cache(max_len=8)
    with torch.inference_mode():
        model(torch.tensor([list(ids)]), cache=cache)
        return model(torch.tensor([[new]]), cache=cache)


def test_int8_groups_are_fused_and_their_layers_are_views():
    model = _model()
    before = Q.quantize_model(_model(), "int8", fuse=False)
    Q.quantize_model(model, "int8")
    for layer in model.layers:
        qkv, gu = layer.self_attn.fused_qkv, layer.mlp.fused_gate_up
        assert isinstance(qkv, Q.FusedQuantizedLinears) and isinstance(gu, Q.FusedQuantizedLinears)
        assert qkv.codes.shape == (128 + 2 * 64, 128) and gu.codes.shape == (512, 128)
        attn = layer.self_attn
        assert attn.k_proj.codes.data_ptr() == qkv.codes.data_ptr() + 128 * 128
        assert qkv.is_current((attn.q_proj, attn.k_proj, attn.v_proj))
    # nothing is held twice: the bytes are the unfused model's
    assert Q.linear_weight_bytes(model) == Q.linear_weight_bytes(before)


def test_fused_int8_step_equals_the_projections_one_by_one_with_fewer_kernel_calls():
    fused = Q.quantize_model(_model(), "int8")
    plain = Q.quantize_model(_model(), "int8", fuse=False)
    assert torch.equal(_step(fused), _step(plain))
    calls = {name: count_ops(lambda: _step(m))["_weight_int8pack_mm"] for name, m in
             (("fused", fused), ("plain", plain))}
    # per layer and token pass: qkv, o, gate_up, down = 4 (unfused 7); two passes (prompt, step), two layers
    assert calls == {"fused": 2 * 2 * 4, "plain": 2 * 2 * 7}


def test_fused_group_with_many_rows_or_fp32_takes_the_dequantize_path_layer_by_layer():
    model = Q.quantize_model(_model(), "int8")
    attn = model.layers[0].self_attn
    x = torch.randn(1, Q.KERNEL_MAX_ROWS + 1, 128, dtype=torch.bfloat16)
    with torch.no_grad():
        q, k, v = attn.fused_qkv(x)
        assert torch.equal(q, attn.q_proj(x)) and torch.equal(v, attn.v_proj(x))
        x1 = x[:, :2]
        q1, k1, v1 = attn.fused_qkv(x1)
        assert torch.allclose(k1.float(), attn.k_proj(x1).float(), atol=1e-2, rtol=1e-2)


def test_a_copy_keeps_the_fusion_and_a_dtype_change_runs_one_by_one():
    model = Q.quantize_model(_model(), "int8")
    twin = copy.deepcopy(model)
    attn = twin.layers[0].self_attn
    assert attn.fused_qkv.is_current((attn.q_proj, attn.k_proj, attn.v_proj))
    assert torch.equal(_step(twin), _step(model))
    # the bf16 scales become fp32 buffers: the fused copy is stale, so each projection runs alone
    wide = copy.deepcopy(model).float()
    attn = wide.layers[0].self_attn
    assert not attn.fused_qkv.is_current((attn.q_proj, attn.k_proj, attn.v_proj))
    ref = _step(Q.quantize_model(_model(), "int8", fuse=False).float())
    assert torch.allclose(_step(wide), ref, atol=1e-5)


def test_fused_int8_with_biases_and_the_engine_form():
    model = Q.quantize_model(_model(attention_bias=True), "int8")
    plain = Q.quantize_model(_model(attention_bias=True), "int8", fuse=False)
    attn = model.layers[0].self_attn
    assert attn.fused_qkv.bias is not None and attn.q_proj.bias.data_ptr() == attn.fused_qkv.bias.data_ptr()
    assert torch.allclose(_step(model).float(), _step(plain).float(), atol=2e-2)


def test_only_int8_layers_fuse():
    lins = [Q.QuantizedLinear.from_linear(torch.nn.Linear(128, 32, bias=False), "int4-g32") for _ in range(2)]
    assert not Q.fusable_quantized(lins)
    with pytest.raises(TypeError, match="int8"):
        Q.FusedQuantizedLinears(lins)
    mixed = [Q.QuantizedLinear.from_linear(torch.nn.Linear(128, 32, bias=b), "int8") for b in (True, False)]
    assert not Q.fusable_quantized(mixed)
    assert not Q.fusable_quantized([])
    model = Q.quantize_model(_model(), "int4-g32")
    assert model.layers[0].self_attn.fused_qkv is None
