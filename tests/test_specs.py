import json

import pytest

from servelab import specs
from servelab.specs import ModelConfig, get_chip, get_model


def test_every_entry_cites_a_source():
    for config in specs.MODELS.values():
        assert config.source, config.name
    for chip in specs.CHIPS.values():
        assert chip.source, chip.name


@pytest.mark.parametrize("name,kind", [("Llama-3-8B", "gqa"), ("GPT-3-175B", "mha"),
                                       ("DeepSeek-V3", "mla"), ("Mixtral-8x7B", "gqa")])
def test_attention_kind(name, kind):
    assert get_model(name).attention_kind == kind


def test_mqa_is_detected():
    assert get_model("llama-3-8b").with_(num_key_value_heads=1).attention_kind == "mqa"


def test_from_hf_dict_reads_llama_names_and_defaults_like_transformers():
    d = {"architectures": ["LlamaForCausalLM"], "vocab_size": 100, "hidden_size": 64,
         "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 8,
         "rope_theta": 1e4, "torch_dtype": "float32", "unknown_future_field": 3}
    c = ModelConfig.from_hf_dict(d)
    assert c.num_key_value_heads == 8 and c.head_dim == 8 and c.architecture == "LlamaForCausalLM"


def test_from_hf_dict_explicit_head_dim_and_mla_and_moe():
    d = {"vocab_size": 10, "hidden_size": 64, "intermediate_size": 32, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 48,
         "kv_lora_rank": 16, "qk_rope_head_dim": 8, "n_routed_experts": 4, "num_experts_per_tok": 2}
    c = ModelConfig.from_hf_dict(d)
    assert c.head_dim == 48 and c.attention_kind == "mla" and c.num_experts == 4 and c.is_moe


def test_from_hf_dict_roundtrips_through_transformers_llamaconfig():
    transformers = pytest.importorskip("transformers")
    c = get_model("Llama-3.1-405B")
    hf = transformers.LlamaConfig(**c.to_hf_dict())
    back = ModelConfig.from_hf_dict(json.loads(hf.to_json_string()), name=c.name, source=c.source)
    for field in ("hidden_size", "num_key_value_heads", "head_dim", "num_hidden_layers", "vocab_size"):
        assert getattr(back, field) == getattr(c, field)


def test_missing_field_and_bad_ratio_raise_clearly():
    with pytest.raises(ValueError, match="missing required field"):
        ModelConfig.from_hf_dict({"hidden_size": 8})
    with pytest.raises(ValueError, match="divide"):
        ModelConfig(name="bad", vocab_size=1, hidden_size=8, intermediate_size=8,
                    num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=3)
    with pytest.raises(ValueError, match="positive integer"):
        ModelConfig(name="bad", vocab_size=0, hidden_size=8, intermediate_size=8,
                    num_hidden_layers=1, num_attention_heads=4)


def test_lookups_name_the_known_entries():
    with pytest.raises(ValueError, match="known models"):
        get_model("GPT-5")
    with pytest.raises(ValueError, match="known chips"):
        get_chip("TPU v99")
    assert get_chip("h100") is specs.H100_SXM and get_chip("b200").usable_memory_bytes == 180e9


def test_b200_ops_per_byte_is_about_560_at_8_bits():
    assert round(get_chip("B200").ops_per_byte("fp8")) == 562
    with pytest.raises(ValueError, match="no dense rate"):
        get_chip("A100 80GB").peak_flops("fp4")


def test_one_config_type_for_calculators_and_model():
    """servelab.model.LlamaConfig is specs.ModelConfig; its rms_norm_eps default is transformers'."""
    from servelab import model
    assert model.LlamaConfig is ModelConfig
    c = model.LlamaConfig(vocab_size=8, hidden_size=8, intermediate_size=8, num_hidden_layers=1,
                          num_attention_heads=2)
    assert c.rms_norm_eps == 1e-6 and c.name == "custom" and c.kv_groups == 1
    transformers = pytest.importorskip("transformers")
    assert transformers.LlamaConfig().rms_norm_eps == c.rms_norm_eps
    # a registry shape feeds the model directly; a shape the model cannot build names its field
    small = get_model("Llama-3-8B").with_(num_hidden_layers=1, hidden_size=64, intermediate_size=64,
                                          num_attention_heads=4, num_key_value_heads=2,
                                          vocab_size=32, name="small")
    assert model.LlamaModel(small).config is small
    with pytest.raises(ValueError, match="architectures"):
        model.LlamaModel(get_model("GPT-3-175B").with_(num_hidden_layers=1))


def test_hf_dict_roundtrip_keeps_token_ids_and_rope_parameters():
    d = {"vocab_size": 10, "hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 1,
         "num_attention_heads": 2, "eos_token_id": [3, 4], "model_type": "llama",
         "rope_parameters": {"rope_type": "default", "rope_theta": 5e5}}
    c = ModelConfig.from_hf_dict(d)
    assert c.eos_token_ids == [3, 4] and c.rope_theta == 5e5 and c.rope_scaling is None
    assert ModelConfig.from_hf_dict(c.to_hf_dict()) == c


@pytest.mark.parametrize("size", ["8B", "70B"])
def test_llama31_is_llama3_with_a_128k_context(size):
    old, new = get_model(f"Llama-3-{size}"), get_model(f"Llama-3.1-{size}")
    for field in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                  "num_attention_heads", "num_key_value_heads", "head_dim"):
        assert getattr(new, field) == getattr(old, field)
    assert (old.max_position_embeddings, new.max_position_embeddings) == (8192, 131_072)


def test_gemma_7b_heads_are_wider_than_width_over_heads_and_count_as_transformers_does():
    c = get_model("Gemma-7B")
    assert c.num_attention_heads * c.head_dim == 4096 != c.hidden_size == 3072
    assert c.attention_kind == "mha" and c.tie_word_embeddings
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    hf = transformers.GemmaConfig(**{k: v for k, v in c.to_hf_dict().items()
                                     if k != "architectures"})
    with torch.device("meta"):  # shapes only: no memory for 8.5B parameters
        model = transformers.GemmaForCausalLM(hf)
    from servelab.arith import count_params
    assert sum(p.numel() for p in model.parameters()) == count_params(c).total
    back = ModelConfig.from_hf_dict(json.loads(hf.to_json_string()), name=c.name)
    assert back.architecture == "GemmaForCausalLM" and back.head_dim == 256
