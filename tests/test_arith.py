"""servelab.arith: parameter counts, bytes, chips and operations, with the seed's figures."""

import pytest
from hypothesis import given, settings, strategies as st

from servelab import arith, sources, specs
from servelab.specs import GB


# -- seed figures ---------------------------------------------------------------

def test_seed_200b_weights_at_16_8_4_bits():
    assert arith.weights_memory(200e9, 8) == 200 * GB
    assert arith.weights_memory(200e9, 16) == 400 * GB
    assert arith.weights_memory(200e9, 4) == 100 * GB
    assert arith.weights_memory(200e9, "fp8") == 200 * GB


def test_seed_ops_per_token_200b():
    assert arith.ops_per_token(200e9) == 400e9


def test_seed_prefill_3000_tokens_on_200b():
    ops = arith.prefill_ops(200e9, 3000)
    assert ops == pytest.approx(1.2e15)
    # 8 B200s at 50% of the 8-bit peak: "about 70 ms"
    t = arith.prefill_seconds(ops, "B200", num_chips=8, efficiency=0.5, dtype="fp8")
    assert t == pytest.approx(0.0667, abs=5e-4)
    assert round(t, 2) == 0.07


def test_seed_70b_on_two_80gb_cards_leaves_19gb():
    weights = arith.weights_memory(70e9, 16)
    assert weights == 140 * GB
    assert arith.memory_left(weights, "H100", num_chips=2) == pytest.approx(20 * GB)
    # with the KV calculator's 5% margin: "roughly 19 GB"
    assert arith.memory_left(weights, "H100", num_chips=2, margin=0.05) == pytest.approx(19 * GB)


def test_seed_embedding_table_1_8_billion_numbers():
    n = arith.embedding_numbers(specs.EXAMPLE_200B)
    assert n == 150_000 * 12_288
    assert round(n / 1e9, 1) == 1.8


def test_seed_200b_fits_one_8_chip_b200_box():
    weights = arith.weights_memory(200e9, 8)
    assert arith.chips_for_weights(weights, "B200") == 2  # 108 GB of each chip's 180 GB at 60%
    assert arith.chips_per_replica(weights, "B200") == 2  # the fewest; the example runs a box of 8
    assert arith.weights_share(weights, "B200", 8) == pytest.approx(200 / 1440)


# -- parameter counts against published sizes ---------------------------------

@pytest.mark.parametrize("name, total, active", [
    ("Llama-3-8B", 8.03e9, 8.03e9),
    ("Llama-3-70B", 70.55e9, 70.55e9),
    ("Llama-3.1-405B", 405.85e9, 405.85e9),
    ("GPT-3-175B", 174.6e9, 174.6e9),
    ("Mixtral-8x7B", 46.70e9, 12.88e9),
    ("DeepSeek-V3", 671.0e9, 37.5e9),
    ("Qwen2.5-7B", 7.62e9, 7.62e9),
])
def test_count_params_matches_published(name, total, active):
    p = arith.count_params(name)
    assert p.total == pytest.approx(total, rel=3e-3)
    assert p.active == pytest.approx(active, rel=5e-3)


def test_count_params_exact_llama3_8b():
    # Meta's model card: 8,030,261,248 parameters
    assert arith.count_params("Llama-3-8B").total == 8_030_261_248


def test_count_params_parts_and_dict():
    p = arith.count_params("Mixtral-8x7B")
    d = p.as_dict()
    assert d["total"] == p.total and d["active"] == p.active
    assert p.experts == 32 * 8 * 3 * 4096 * 14336
    assert p.active_experts == p.experts // 4
    dense = arith.count_params("Llama-3-8B")
    assert dense.experts == dense.active_experts == 0
    assert dense.matmul_active == dense.total - dense.embedding - dense.norms


def test_tied_head_counts_once_but_multiplies():
    c = specs.LLAMA3_8B.with_(tie_word_embeddings=True)
    p = arith.count_params(c)
    assert p.lm_head == 0
    assert p.matmul_active == p.attention + p.mlp + p.embedding


def test_matches_servelab_model_counter():
    model = pytest.importorskip("servelab.model")
    cfg = specs.LLAMA3_8B
    theirs = model.count_parameters_from_config(model.LlamaConfig.from_hf_dict(
        {k: v for k, v in cfg.to_hf_dict().items() if k != "architectures"}))
    assert arith.count_params(cfg).total == theirs["total"]


def test_attention_split_one_third_two_thirds_for_gpt3():
    p = arith.count_params("GPT-3-175B")
    assert p.attention / (p.attention + p.mlp) == pytest.approx(1 / 3, abs=0.01)


# -- bytes and chips -------------------------------------------------------------

@pytest.mark.parametrize("precision, expected", [(32, 4), (16, 2), (8, 1), (4, 0.5), ("bf16", 2), ("int4", 0.5)])
def test_bytes_per_param(precision, expected):
    assert arith.bytes_per_param(precision) == expected


@pytest.mark.parametrize("bad", [3, 0, -8, True, None, 1.5, "fp7"])
def test_bytes_per_param_rejects(bad):
    with pytest.raises(ValueError):
        arith.bytes_per_param(bad)


@pytest.mark.parametrize("n, group", [(1, 1), (2, 2), (3, 4), (5, 8), (8, 8), (9, 16), (17, 24),
                                      (33, 40), (36, 40), (63, 64), (65, 72), (72, 72)])
def test_round_to_group(n, group):
    assert arith.round_to_group(n) == group


def test_group_sizes_are_powers_of_two_in_a_box_then_whole_boxes():
    box = arith.BOX_CHIPS
    in_box = [g for g in arith.GROUP_SIZES if g <= box]
    beyond = [g for g in arith.GROUP_SIZES if g > box]
    assert in_box == [1, 2, 4, 8] and all(g % box == 0 for g in beyond)
    assert beyond == list(range(2 * box, arith.MAX_REPLICA_CHIPS + 1, box))
    assert arith.MAX_REPLICA_CHIPS == sources.value("nvl72_gpus")


@pytest.mark.parametrize("model, bits, chip, chips", [
    ("Llama-3-8B", 16, "H100 SXM", 1), ("Llama-3-70B", 16, "H100 SXM", 4),
    ("Llama-3-70B", 8, "H100 SXM", 2), ("Llama-3-70B", 16, "B200", 2),
    ("Llama-3.1-405B", 16, "H100 SXM", 24), ("Llama-3.1-405B", 8, "H100 SXM", 16),
])
def test_one_card_models_get_one_card_not_a_box(model, bits, chip, chips):
    weights = arith.weights_memory(arith.count_params(model).total, bits)
    assert arith.chips_per_replica(weights, chip) == chips


def test_round_to_group_beyond_largest_and_custom_sizes():
    with pytest.raises(ValueError, match="largest group"):
        arith.round_to_group(73)
    assert arith.round_to_group(3, (1, 2, 4, 8)) == 4
    with pytest.raises(ValueError):
        arith.round_to_group(3, (0, 8))
    with pytest.raises(ValueError):
        arith.round_to_group(0)


def test_moe_total_must_fit_not_active():
    p = arith.count_params("DeepSeek-V3")
    total = arith.weights_memory(p.total, 8)
    active = arith.weights_memory(p.active, 8)
    assert arith.chips_for_weights(active, "H100") == 1
    assert arith.chips_per_replica(total, "H100") == 16  # 671 GB / 48 GB -> 14 -> 16


def test_chips_for_weights_exact_boundary():
    # exactly one chip's share must not round up to two
    assert arith.chips_for_weights(180e9 * 0.6, "B200") == 1
    assert arith.chips_for_weights(180e9 * 0.6 + 1, "B200") == 2


@pytest.mark.parametrize("call", [
    lambda: arith.weights_memory(0, 16),
    lambda: arith.weights_memory(-1e9, 8),
    lambda: arith.chips_for_weights(1e9, "B200", share=0),
    lambda: arith.chips_for_weights(1e9, "B200", share=1.2),
    lambda: arith.chips_for_weights(1e9, "TPU-v9"),
    lambda: arith.max_weights_bytes("B200", num_chips=0),
    lambda: arith.weights_share(1e9, "B200", num_chips=2.5),
    lambda: arith.memory_left(200e9, "H100", 2),  # does not fit
    lambda: arith.ops_per_token(0),
    lambda: arith.ops_per_token(1e9, context_tokens=10),  # needs config
    lambda: arith.ops_per_token(1e9, "Llama-3-8B", context_tokens=-1),
    lambda: arith.prefill_ops(1e9, 0),
    lambda: arith.prefill_ops(1e9, 10, cached_tokens=11),
    lambda: arith.prefill_seconds(1e15, "B200", efficiency=0),
    lambda: arith.prefill_seconds(1e15, "B200", efficiency=1.5),
    lambda: arith.prefill_seconds(1e15, "A100 80GB", dtype="fp4"),
    lambda: arith.count_params("no-such-model"),
])
def test_bad_input_raises_value_error(call):
    with pytest.raises(ValueError):
        call()


# -- operations ---------------------------------------------------------------

def test_attention_ops_grow_with_context():
    c = specs.LLAMA3_8B
    per = arith.attention_ops_per_token(c, 1)
    assert per == 4 * 32 * 32 * 128
    assert arith.attention_ops_per_token(c, 8000) == 8000 * per
    assert arith.ops_per_token(8e9, c, 8000) == 16e9 + 8000 * per


def test_prefill_cached_tokens_are_free_and_attention_is_causal():
    c = specs.LLAMA3_8B
    per = arith.attention_ops_per_token(c, 1)
    full = arith.prefill_ops(8e9, 1000, c)
    assert full == pytest.approx(2 * 8e9 * 1000 + per * sum(range(1000)))
    half = arith.prefill_ops(8e9, 1000, c, cached_tokens=500)
    assert half == pytest.approx(2 * 8e9 * 500 + per * sum(range(500, 1000)))
    assert arith.prefill_ops(8e9, 1000, cached_tokens=1000) == 0


def test_mla_attention_ops():
    assert arith.attention_ops_per_token("DeepSeek-V3", 1) == 4 * 61 * 128 * (192 + 128) / 2


@settings(max_examples=50, deadline=None)
@given(params=st.floats(1e6, 1e13), tokens=st.integers(1, 100_000), chips=st.sampled_from([1, 2, 8, 72]),
       eff=st.floats(0.05, 1.0))
def test_prefill_time_scales(params, tokens, chips, eff):
    ops = arith.prefill_ops(params, tokens)
    t = arith.prefill_seconds(ops, "H100", chips, eff)
    assert t > 0
    assert arith.prefill_seconds(2 * ops, "H100", chips, eff) == pytest.approx(2 * t)
    assert arith.prefill_seconds(ops, "H100", chips, eff / 2 if eff / 2 > 0 else eff) >= t


@settings(max_examples=50, deadline=None)
@given(weights=st.floats(1e8, 3e13), share=st.floats(0.1, 1.0))
def test_chips_for_weights_is_smallest_that_fits(weights, share):
    n = arith.chips_for_weights(weights, "B200", share)
    assert arith.max_weights_bytes("B200", n, share) >= weights * (1 - 1e-9)
    if n > 1:
        assert arith.max_weights_bytes("B200", n - 1, share) < weights
