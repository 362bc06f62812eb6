"""cost.prefix_tier_price: a cold prefix reloaded from a tier, or recomputed (chapter 13)."""
import pytest

from servelab import arith, cost, kvcache
from servelab.specs import get_model


def test_reload_is_bytes_over_bandwidth_and_grows_linearly():
    p = cost.prefix_tier_price(prefix_tokens=1000)
    q = cost.prefix_tier_price(prefix_tokens=2000)
    assert p.kv_bytes == 1000 * kvcache.kv_bytes_per_token(get_model("Llama-3.1-8B"), "bf16")
    for name, tier in cost.PREFIX_TIERS.items():
        assert p.reload_s[name] == pytest.approx(p.kv_bytes / tier.bandwidth + tier.latency_s)
        assert q.reload_s[name] - tier.latency_s == pytest.approx(2 * (p.reload_s[name] - tier.latency_s))


def test_recompute_grows_faster_than_the_prefix_because_of_attention():
    short, long = (cost.prefix_tier_price(prefix_tokens=n) for n in (1000, 100_000))
    assert long.recompute_chip_s > 100 * short.recompute_chip_s
    assert 0 < short.attention_share < long.attention_share < 1
    ratio = lambda p: p.recompute_chip_s / p.reload_s["ssd"]
    assert ratio(long) > 2 * ratio(short)


def test_recompute_chip_time_is_the_prefix_prefill():
    p = cost.prefix_tier_price(prefix_tokens=1200, question_tokens=24)
    cfg = get_model("Llama-3.1-8B")
    # both run at the same rate, so their ratio is the ratio of operations
    ops = arith.prefill_ops(cfg.nominal_params, 1224, cfg) - arith.prefill_ops(
        cfg.nominal_params, 1224, cfg, cached_tokens=1200)
    whole = arith.prefill_ops(cfg.nominal_params, 1224, cfg)
    assert p.recompute_chip_s / p.recompute_ttft_s == pytest.approx(ops / whole)


def test_a_reload_costs_the_chip_far_less_than_recomputing():
    p = cost.prefix_tier_price()
    assert p.hbm_write_s < p.recompute_chip_s / 100
    assert p.recompute_usd_per_million > 0


def test_pipelined_reload_hides_behind_the_pass():
    p = cost.prefix_tier_price()
    for tier in cost.PREFIX_TIERS:
        piped, serial = p.reload_ttft_s(tier), p.reload_ttft_s(tier, pipelined=False)
        assert max(p.pass_s, p.reload_s[tier]) <= piped <= serial
        assert serial == pytest.approx(p.reload_s[tier] + p.pass_s)
        assert p.layerwise_stall_s(tier) == pytest.approx(piped - p.pass_s)
    # host memory's load (smaller than the pass) adds only its first layer's share
    assert p.reload_s["host"] < p.pass_s
    assert p.reload_ttft_s("host") == pytest.approx(p.pass_s + p.reload_s["host"] / p.num_layers)


def test_a_pipelined_load_longer_than_the_pass_still_waits_for_the_last_layer():
    p = cost.prefix_tier_price(chip="B200", math_dtype="fp8", cache_dtype="bf16")
    load, n = p.reload_s["ssd"], p.num_layers
    assert load > p.pass_s
    # the last layer's blocks arrive with the whole load; its compute follows
    assert p.reload_ttft_s("ssd") == pytest.approx(load + p.pass_s / n)
    # that holds the batch's step longer than recomputing the prefix would take
    assert p.layerwise_stall_s("ssd") > p.recompute_chip_s


def test_writing_the_reload_into_hbm_runs_at_the_bandwidth_efficiency():
    from servelab.specs import get_chip
    p = cost.prefix_tier_price(bandwidth_efficiency=0.5)
    assert p.hbm_write_s == pytest.approx(p.kv_bytes / (get_chip("H100 SXM").hbm_bandwidth * 0.5))


def test_fp8_cache_halves_the_bytes_and_the_reload():
    a = cost.prefix_tier_price(chip="B200", math_dtype="fp8", cache_dtype="bf16")
    b = cost.prefix_tier_price(chip="B200", math_dtype="fp8", cache_dtype="fp8")
    assert b.kv_bytes == pytest.approx(a.kv_bytes / 2)
    assert b.recompute_chip_s == a.recompute_chip_s


def test_on_latency_the_race_can_flip_but_chip_time_favours_the_reload():
    h100 = cost.prefix_tier_price()
    b200 = cost.prefix_tier_price(chip="B200", math_dtype="fp8")
    assert h100.reload_ttft_s("ssd") < h100.recompute_ttft_s
    assert b200.recompute_ttft_s < b200.reload_ttft_s("ssd")
    assert b200.hbm_write_s < b200.recompute_chip_s


@pytest.mark.parametrize("kwargs", [dict(prefix_tokens=0), dict(prefix_tokens=1.5), dict(question_tokens=-1),
                                    dict(efficiency=0), dict(bandwidth_efficiency=1.5)])
def test_bad_input_is_refused(kwargs):
    with pytest.raises(ValueError):
        cost.prefix_tier_price(**kwargs)
