"""The MoE layer, the tiny MoE model and expert parallelism over all_to_all_single."""
import pytest
import torch

from servelab.model import LlamaConfig
from servelab.parallel import experts as ex


def _layer(e=8, k=2, seed=0):
    torch.manual_seed(seed)
    return ex.MoELayer(16, 24, e, k).eval()


def test_layer_equals_a_token_by_token_blend():
    layer = _layer()
    x = torch.randn(5, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = layer(x)
        for t in range(5):
            logits = layer.router(x[t])
            top, idx = logits.topk(2)
            w = torch.softmax(top, -1)
            want = sum(w[j] * layer.experts[int(idx[j])](x[t]) for j in range(2))
            assert torch.allclose(out[t], want, atol=1e-6)
    assert sum(layer.last_counts) == 10


def test_route_rejects_bad_k():
    with pytest.raises(ValueError):
        ex.route(torch.zeros(3, 4), 5)
    with pytest.raises(ValueError):
        ex.MoELayer(8, 8, 4, 0)


def test_tiny_moe_model_runs_and_caches():
    cfg = LlamaConfig(vocab_size=50, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2)
    model = ex.moe_model(cfg, num_experts=4, top_k=2, seed=0)
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        full = model(ids)
        cache = model.new_cache(1, 8)
        model(ids[:, :3], cache=cache)
        step = model(ids[:, 3:], cache=cache)
    assert full.shape == (1, 4, 50)
    assert torch.allclose(full[:, -1], step[:, -1], atol=1e-5)


@pytest.mark.parametrize("world,replicas", [(2, None), (4, {0: 2})])
def test_expert_parallel_equals_single_process(world, replicas):
    layer = _layer(e=8, k=2)
    x = torch.randn(12, 16, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = layer(x)
    out, per_rank = ex.expert_parallel_forward(layer, x, world, replicas=replicas)
    assert (out - ref).abs().max().item() < 1e-5
    assert sum(r["pairs_received"] for r in per_rank) == 12 * 2
    if replicas:
        assert 0 in per_rank[1]["experts_held"]


def test_hot_expert_and_its_copy_on_processes():
    layer = _layer(e=4, k=1)
    layer.router_bias = torch.tensor([4.0, 0.0, 0.0, 0.0])   # expert 0 wins most tokens
    x = torch.randn(64, 16, generator=torch.Generator().manual_seed(3))
    _, plain = ex.expert_parallel_forward(layer, x, 2)
    _, fixed = ex.expert_parallel_forward(layer, x, 2, replicas={0: 2})
    pairs = [r["pairs_received"] for r in plain]
    assert pairs[0] > 2 * pairs[1]
    even = [r["pairs_received"] for r in fixed]
    assert max(even) < max(pairs)
