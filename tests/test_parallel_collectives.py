"""Ring all-reduce on send/recv, ring attention and the pipeline, on real gloo processes."""
import pytest
import torch

from servelab import comm
from servelab.attention import naive_attention
from servelab.model import LlamaConfig, LlamaModel
from servelab.parallel import collectives, launch, pipeline, ring


@pytest.mark.parametrize("world", [2, 3])
def test_ring_all_reduce_equals_gloo(world):
    shapes = [(1,), (7,), (4, 5), (1000,)]   # fewer numbers than ranks, uneven chunks, a matrix
    results = launch(collectives._check_worker, world, (shapes,), timeout=60)
    for per_rank in results:
        for ok, stats in per_rank:
            assert ok
            assert stats["steps"] == 2 * (world - 1)
    # bytes each rank sends: 2 (p-1)/p of the (padded) tensor
    _, stats = results[0][-1]
    assert stats["bytes_sent"] == 2 * (world - 1) * (-(-1000 // world)) * 4


def test_measure_collectives_reports_every_size():
    rows = collectives.measure_collectives([4096, 65536], world_size=2, repeats=2)
    assert [r["bytes"] for r in rows] == [4096, 65536]
    assert all(r["gloo_s"] > 0 and r["ring_s"] > 0 and r["all_to_all_s"] > 0 for r in rows)
    with pytest.raises(ValueError):
        collectives.measure_collectives([0])


def test_fit_alpha_beta_recovers_a_line():
    sizes = [1e3, 1e5, 1e6, 4e6]
    alpha, bw = comm.fit_alpha_beta(sizes, [2e-5 + s / 1e9 for s in sizes])
    assert alpha == pytest.approx(2e-5) and bw == pytest.approx(1e9)
    with pytest.raises(ValueError):
        comm.fit_alpha_beta([1, 1], [1, 2])


@pytest.mark.parametrize("causal,kv_heads", [(True, 2), (False, 4)])
def test_ring_attention_equals_full_attention(causal, kv_heads):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 12, 8, generator=g)
    k = torch.randn(2, kv_heads, 12, 8, generator=g)
    v = torch.randn(2, kv_heads, 12, 8, generator=g)
    out, per_rank = ring.ring_attention_across(q, k, v, world_size=3, causal=causal)
    ref = naive_attention(q, k, v, causal=causal)
    assert (out - ref).abs().max().item() < 1e-5
    assert all(r["kv_positions_held"] == 4 for r in per_rank)
    assert per_rank[0]["stats"]["blocks_received"] == 2
    with pytest.raises(ValueError, match="divide"):
        ring.ring_attention_across(q[..., :11, :], k[..., :11, :], v[..., :11, :], world_size=3)


def test_pipeline_logits_and_bubble():
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2)
    model = LlamaModel(cfg).init_weights(seed=0).eval()
    ids = torch.randint(0, 64, (8, 6), generator=torch.Generator().manual_seed(1))
    run = pipeline.run_pipeline(model, ids, stages=2, microbatches=4, pad_s=0.02)
    with torch.no_grad():
        ref = model(ids)
    assert (run["logits"] - ref).abs().max().item() < 1e-5
    assert run["layers"] == [(0, 2), (2, 4)]
    assert [len(tl) for tl in run["timelines"]] == [4, 4]
    # stage 1 never works on a micro-batch before stage 0 finished it
    for (i0, _, e0), (i1, s1, _) in zip(*run["timelines"]):
        assert i0 == i1 and s1 >= e0
    assert 0 < run["bubble"] < 1


def test_measured_bubble_of_an_ideal_timeline_is_the_formula():
    p, m, t = 4, 6, 1.0
    timelines = [[(i, (s + i) * t, (s + i + 1) * t) for i in range(m)] for s in range(p)]
    assert pipeline.measured_bubble(timelines)["bubble"] == pytest.approx(comm.bubble_fraction(p, m))


def test_pipeline_bad_input():
    model = LlamaModel(LlamaConfig(vocab_size=16, hidden_size=8, intermediate_size=8, num_hidden_layers=2,
                                   num_attention_heads=2))
    with pytest.raises(ValueError, match="at least one layer"):
        pipeline.run_pipeline(model, torch.zeros(2, 2, dtype=torch.long), stages=3, microbatches=1)
    with pytest.raises(ValueError, match="equal micro-batches"):
        pipeline.run_pipeline(model, torch.zeros(3, 2, dtype=torch.long), stages=2, microbatches=2)
    assert pipeline.stage_bounds(5, 2) == [(0, 2), (2, 5)]


def test_launch_refuses_notebook_functions_and_reports_rank_errors():
    with pytest.raises(ValueError, match="module"):
        launch(lambda r, w: r, 2)
    with pytest.raises(RuntimeError, match="failed"):
        launch(pipeline.stage_bounds, 2, (0,), timeout=30)  # stage_bounds(rank, world, 0) raises in a rank


def test_launch_kills_ranks_that_overrun_their_deadline():
    import time

    from servelab.parallel.launch import stall
    assert launch(stall, 2, (0.0,), timeout=30) == [0, 1]
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="killed"):
        launch(stall, 2, (60.0,), timeout=1, startup_s=2)
    assert time.monotonic() - t0 < 20
