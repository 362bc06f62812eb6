"""Tensor parallelism over gloo processes equals the single-process model (fp32, max |diff| <= 1e-5)."""
import pytest
import torch

from servelab.model import COURSE_MODELS_DIR, LlamaConfig, LlamaModel, load_pretrained
from servelab.parallel import tensor as tp

TOL = 1e-5

CONFIGS = {
    "mha_uneven_vocab": dict(vocab_size=101, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                             num_attention_heads=4),
    "gqa_fewer_kv_than_ranks": dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                    num_attention_heads=8, num_key_value_heads=2),
    "mqa": dict(vocab_size=64, hidden_size=32, intermediate_size=32, num_hidden_layers=1,
                num_attention_heads=4, num_key_value_heads=1),
    "explicit_head_dim_bias_tied": dict(vocab_size=80, hidden_size=24, intermediate_size=40,
                                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                        head_dim=16, attention_bias=True, mlp_bias=True,
                                        tie_word_embeddings=True),
}


def _model(cfg: dict) -> LlamaModel:
    model = LlamaModel(LlamaConfig(**cfg)).init_weights(std=0.2, seed=1).eval()
    if cfg.get("attention_bias") or cfg.get("mlp_bias"):
        with torch.no_grad():  # non-zero biases, so adding one twice would show
            for name, p in model.named_parameters():
                if name.endswith(".bias"):
                    p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(2)) * 0.1)
    return model


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_logits_equal_single_process(name, world):
    cfg = CONFIGS[name]
    if cfg["intermediate_size"] % world:
        pytest.skip("width does not divide")
    model = _model(cfg)
    ids = torch.randint(0, cfg["vocab_size"], (2, 9), generator=torch.Generator().manual_seed(3))
    results = tp.run_tensor_parallel(model, [{"kind": "logits", "input_ids": ids}], world, timeout=60)
    with torch.no_grad():
        ref = model(ids)
    got = results[0][0]["value"]
    assert got.shape == ref.shape
    assert (got - ref).abs().max().item() <= TOL
    layers = cfg["num_hidden_layers"]
    for rank in range(world):
        traffic = results[rank][0]["traffic"]
        assert traffic["all_reduces"] == 2 * layers                     # two per layer, nothing else
        assert traffic["all_reduce_bytes"] == 2 * layers * ids.numel() * cfg["hidden_size"] * 4
        assert traffic["gathers"] == 1
        assert results[rank][0]["heads"] == cfg["num_attention_heads"] // world
    kv = cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    assert results[0][0]["kv_heads"] == max(1, kv // world)


def test_each_rank_holds_a_shard_not_the_model():
    cfg = CONFIGS["mha_uneven_vocab"]
    model = _model(cfg)
    full = sum(t.numel() * 4 for t in model.state_dict().values())
    results = tp.run_tensor_parallel(model, [{"kind": "logits", "input_ids": [[1, 2]]}], 2)
    embed = cfg["vocab_size"] * cfg["hidden_size"] * 4    # replicated
    for r in range(2):
        held = results[r][0]["weight_bytes"]
        assert held < full and held - embed < (full - embed) / 2 + 4 * 32 * 4  # + replicated norms


def test_course_checkpoint_read_in_slices_and_generate():
    folder = COURSE_MODELS_DIR / "servelab-main"
    if not (folder / "config.json").exists():
        pytest.skip("course model not trained")
    model = load_pretrained(folder, dtype=torch.float32)
    prompt = torch.tensor([[5, 17, 300, 42, 7]])
    jobs = [{"kind": "logits", "input_ids": prompt},
            {"kind": "generate", "input_ids": prompt[0], "max_new_tokens": 6}]
    results = tp.run_tensor_parallel(folder, jobs, 4, timeout=60)
    with torch.no_grad():
        ref = model(prompt)
        cache, ids, want = model.new_cache(1, 16), prompt, []
        for _ in range(6):
            nxt = model(ids, cache=cache)[0, -1].argmax()
            want.append(int(nxt))
            ids = nxt.view(1, 1)
    assert (results[0][0]["value"] - ref).abs().max().item() <= TOL
    assert results[0][1]["value"] == want
    # each rank's cache held 1 of the 4 K/V heads; decode made 2 all-reduces per layer per token
    assert results[1][1]["kv_heads"] == 1
    assert results[1][1]["traffic"]["all_reduces"] == 2 * model.config.num_hidden_layers * 6
    # the time inside each kind of collective is recorded, and fits inside the job's wall time
    for rank in range(4):
        t = results[rank][1]["traffic"]
        assert t["broadcasts"] == 6 and t["gathers"] == 6
        inside = t["all_reduce_seconds"] + t["gather_seconds"] + t["broadcast_seconds"]
        assert 0 < inside <= results[rank][1]["seconds"]


@pytest.mark.parametrize("cfg,world,match", [
    (dict(num_attention_heads=6, num_key_value_heads=6), 4, "num_attention_heads=6"),
    (dict(num_attention_heads=8, num_key_value_heads=8, intermediate_size=50), 4, "intermediate_size=50"),
    (dict(num_attention_heads=12, num_key_value_heads=3), 4, "num_key_value_heads=3"),
])
def test_heads_that_do_not_divide_raise_value_error(cfg, world, match):
    base = dict(vocab_size=32, hidden_size=48, intermediate_size=48, num_hidden_layers=1)
    config = LlamaConfig(**{**base, **cfg})
    with pytest.raises(ValueError, match=match):
        tp.shard_config(config, world)
    with pytest.raises(ValueError, match=match):
        tp.tensor_parallel_logits(LlamaModel(config), [[1, 2]], world)  # refused before any process starts


def test_bad_arguments():
    model = _model(CONFIGS["mqa"])
    with pytest.raises(ValueError, match="world_size"):
        tp.shard_config(model.config, 0)
    with pytest.raises(TypeError, match="LlamaModel"):
        tp.tensor_parallel_logits(object(), [[1]], 2)
    with pytest.raises(ValueError, match="input_ids"):
        tp.tensor_parallel_logits(model, [], 2)
    with pytest.raises(ValueError, match="max_new_tokens"):
        tp.tensor_parallel_generate(model, [1, 2], 0, 2)


def test_shard_plan_tiles_every_tensor():
    """The ranks' slices of each split tensor cover it exactly once (K/V copies aside)."""
    cfg = LlamaConfig(**CONFIGS["explicit_head_dim_bias_tied"])
    model = _model(CONFIGS["explicit_head_dim_bias_tied"])
    sd = model.state_dict()
    shards = [tp.shard_state_dict(sd, cfg, r, 2) for r in range(2)]
    q = torch.cat([s["layers.0.self_attn.q_proj.weight"] for s in shards])
    assert torch.equal(q, sd["layers.0.self_attn.q_proj.weight"])
    down = torch.cat([s["layers.1.mlp.down_proj.weight"] for s in shards], dim=1)
    assert torch.equal(down, sd["layers.1.mlp.down_proj.weight"])
    head = torch.cat([s["lm_head.weight"] for s in shards])
    assert torch.equal(head, sd["embed_tokens.weight"])  # tied head split by vocabulary
