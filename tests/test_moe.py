"""servelab.moe: coverage formula vs simulated routing, bytes read, load and placement (pure)."""
import subprocess
import sys

import pytest

from servelab import moe


def test_guides_figures():
    assert moe.coverage(8, 256, 1) == pytest.approx(8 / 256)            # "about 3%"
    assert moe.untouched_fraction(8, 256, 64) == pytest.approx(0.131, abs=1e-3)   # "about 13%"
    assert moe.coverage(8, 256, 256) > 0.999                             # "nearly all"
    assert moe.coverage(2, 8, 0) == 0 and moe.experts_touched(2, 8, 1) == pytest.approx(2)


@pytest.mark.parametrize("k,e,b", [(8, 256, 64), (2, 8, 4), (1, 16, 16), (8, 256, 1)])
def test_formula_matches_simulated_routing(k, e, b):
    sim = moe.simulate_coverage(k, e, b, trials=300, seed=1)
    assert sim == pytest.approx(moe.coverage(k, e, b), abs=0.02)


def test_swapped_k_and_e_is_refused():
    with pytest.raises(ValueError, match="swap"):
        moe.coverage(256, 8, 64)


@pytest.mark.parametrize("call", [
    lambda: moe.coverage(0, 8, 1), lambda: moe.coverage(2, 8, -1), lambda: moe.coverage(2.0, 8, 1),
    lambda: moe.simulate_coverage(2, 8, 4, trials=0), lambda: moe.zipf_probs(8, -1),
    lambda: moe.place_experts(6, 4), lambda: moe.place_experts(8, 4, {9: 2}),
    lambda: moe.place_experts(8, 4, {0: 5}), lambda: moe.rank_loads([1, 1, 1], [[0], [1]]),
    lambda: moe.routing_counts(2, 8, 4, probs=[1.0]), lambda: moe.load_imbalance([]),
    lambda: moe.bytes_read_per_step("DeepSeek-V3", 8, bytes_per_param=0),
])
def test_bad_input(call):
    with pytest.raises(ValueError):
        call()


def test_bytes_read_dense_like_at_serving_batches_compute_stays_active():
    one = moe.bytes_read_per_step("DeepSeek-V3", 1)
    big = moe.bytes_read_per_step("DeepSeek-V3", 256)
    assert one["read_bytes"] == pytest.approx(one["active_bytes"])   # one token reads what it uses
    assert 36e9 < one["active_bytes"] < 38e9 and 660e9 < one["total_bytes"] < 680e9
    assert big["read_share_of_total"] > 0.99
    assert big["active_bytes"] == one["active_bytes"]
    reads = [moe.bytes_read_per_step("Mixtral-8x7B", b)["read_bytes"] for b in (1, 2, 4, 8, 32)]
    assert reads == sorted(reads)
    dense = moe.bytes_read_per_step("Llama-3-8B", 5)
    assert dense["read_bytes"] == dense["total_bytes"] and dense["coverage"] == 1.0


def test_routing_counts_and_skew():
    counts = moe.routing_counts(2, 8, 1000, seed=0)
    assert sum(counts) == 2000 and len(counts) == 8
    hot = moe.routing_counts(2, 8, 1000, seed=0, probs=moe.zipf_probs(8, 1.5))
    assert hot[0] == max(hot) and hot[0] > 2 * hot[-1]
    assert moe.zipf_probs(4, 0) == [0.25] * 4


def test_replicating_the_hot_expert_evens_the_load():
    counts = [700, 300, 200, 200, 150, 150, 150, 150]
    plain = moe.place_experts(8, 4)
    assert plain == [[0, 1], [2, 3], [4, 5], [6, 7]]
    loads = moe.rank_loads(counts, plain)
    assert loads == [1000, 400, 300, 300]
    fixed = moe.rank_loads(counts, moe.place_experts(8, 4, {0: 2}))
    assert fixed == [650, 750, 300, 300] and sum(fixed) == sum(loads)
    assert moe.load_imbalance(fixed) < moe.load_imbalance(loads)


def test_moe_module_is_pure_and_never_reaches_for_the_layer():
    """The calculators load no torch, and the torch layer lives only in servelab.parallel.experts
    (which imports this module, never the reverse: no import circle)."""
    code = "import sys, servelab.moe as m; print('torch' in sys.modules, hasattr(m, 'MoELayer'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
    with pytest.raises(AttributeError):
        moe.no_such_thing


def test_expert_parallel_chips_read_a_full_copy_of_the_dense_weights():
    one = moe.bytes_read_per_step("DeepSeek-V3", 2048)
    ep = moe.bytes_read_per_step("DeepSeek-V3", 2048, chips=32)
    assert one["read_bytes_per_chip"] == pytest.approx(one["read_bytes"])
    assert ep["read_bytes"] == pytest.approx(one["read_bytes"])          # each weight once
    assert ep["read_bytes_per_chip"] == pytest.approx(ep["dense_bytes"] + ep["expert_bytes_read"] / 32)
    assert ep["read_bytes_all_chips"] == pytest.approx(32 * ep["dense_bytes"] + ep["expert_bytes_read"])
    assert 16e9 < ep["dense_bytes"] < 18e9                               # 671B - 654B of experts, 8 bits
    with pytest.raises(ValueError, match="chips"):
        moe.bytes_read_per_step("DeepSeek-V3", 8, chips=0)


def test_ridge_and_expert_size():
    assert moe.expert_params_per_layer("DeepSeek-V3") == 3 * 7168 * 2048
    assert moe.ridge_tokens_per_expert("H100 SXM") == pytest.approx(295, abs=1)
    assert moe.ridge_tokens_per_expert("H100 SXM", "bf16", 2) == pytest.approx(295, abs=1)
    with pytest.raises(ValueError, match="not a mixture"):
        moe.expert_params_per_layer("Llama-3-8B")


def test_imbalance_cost_depends_on_the_regime():
    p = moe.expert_params_per_layer("DeepSeek-V3")
    ridge = moe.ridge_tokens_per_expert("H100 SXM")
    plain = moe.place_experts(8, 4)
    copied = moe.place_experts(8, 4, {0: 2})
    big = [2600, 1600, 1100, 800, 700, 500, 500, 400]                     # all above the ridge
    assert min(big) > ridge
    assert moe.imbalance_cost(big, plain, p, "H100 SXM") == pytest.approx(
        moe.load_imbalance(moe.rank_loads(big, plain)))                  # time follows the pairs
    assert moe.imbalance_cost(big, copied, p, "H100 SXM") < moe.imbalance_cost(big, plain, p, "H100 SXM")
    small = [160, 100, 65, 47, 42, 29, 34, 24]                            # all below the ridge
    assert moe.load_imbalance(moe.rank_loads(small, plain)) > 2
    assert moe.imbalance_cost(small, plain, p, "H100 SXM") == pytest.approx(1.0)   # every rank: one read
    # the copy adds a weight read to the rank that takes it: 3 experts where 2 were
    assert moe.imbalance_cost(small, copied, p, "H100 SXM") == pytest.approx(1.5)
    secs = moe.rank_expert_seconds([0, 10, 0, 0], [[0, 1], [2, 3]], p, "H100 SXM")
    assert secs[0] > 0 and secs[1] == 0.0                               # untouched experts are not read


def test_capacity_and_dropped_pairs():
    assert moe.expert_capacity(4096, 2, 8, 1.0) == 1024
    assert moe.expert_capacity(4096, 2, 8) == 1280
    assert moe.expert_capacity(3, 1, 2, 1.0) == 2                          # rounded up
    assert moe.dropped_pairs([1300, 1000, 900], 1280) == 20
    assert moe.dropped_pairs([10, 10], 10) == 0
    for call in (lambda: moe.expert_capacity(8, 2, 8, 0), lambda: moe.dropped_pairs([1], -1),
                 lambda: moe.dropped_pairs([1], 1.5), lambda: moe.rank_expert_seconds([1], [[0]], 0, "H100 SXM")):
        with pytest.raises(ValueError):
            call()
