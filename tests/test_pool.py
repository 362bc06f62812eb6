import pytest

from servelab import pool


def test_seed_pool_defaults():
    r = pool.size_pool()  # 16 seats, 8B class, 1,200-token prompt, 30% prefix hits, chat
    assert r.live_seats == 16 and r.miss_tokens == 840
    assert r.kv_tokens_in_use == 22_400 and round(r.kv_token_budget, -3) == 464_000
    assert round(r.ttft_s * 1000) == 27
    assert round(r.aggregate_tokens_per_s) == 1698
    assert round(r.monthly_usd) == 2913 and r.chips == 1
    assert (r.latency_ok, r.capacity_ok, r.cost_ok) == (True, True, True)


def test_same_config_on_the_other_workload_also_passes():
    assert pool.size_pool(workload="documents").verdict().count("pass") == 3


@pytest.mark.parametrize("name", sorted(pool.FAMOUS_FAILURES))
def test_each_famous_failure_breaks_its_check_and_the_fix_mends_it(name):
    check = pool.FAMOUS_FAILURES[name].check
    broken, fixed = pool.famous_failure(name)
    assert getattr(broken, f"{check}_ok") is False
    assert getattr(fixed, f"{check}_ok") is True


def test_more_traffic_needs_more_replicas():
    quiet = pool.size_pool(workload=pool.Workload("quiet", 1.0, 200))
    busy = pool.size_pool(workload=pool.Workload("busy", 40.0, 200))
    assert quiet.replicas == 1 and busy.replicas > quiet.replicas
    assert busy.monthly_usd == pytest.approx(busy.chips * pool.POOL_CHIP_HOURLY_USD * pool.HOURS_PER_MONTH)


def test_full_prefix_hits_skip_prefill():
    assert pool.size_pool(prefix_hit_rate=1.0).ttft_s == 0.0


@pytest.mark.parametrize("kwargs,match", [
    (dict(seats=0), "seats"), (dict(prompt_tokens=-1), "prompt_tokens"),
    (dict(prefix_hit_rate=1.5), "prefix_hit_rate"), (dict(workload="gaming"), "unknown workload"),
    (dict(tier="large", prompt_tokens=2_000_000), "not one seat"),
])
def test_bad_knobs_raise_clearly(kwargs, match):
    with pytest.raises(ValueError, match=match):
        pool.size_pool(**kwargs)
