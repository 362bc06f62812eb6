import pytest

from servelab import pool


def test_seed_pool_defaults():
    r = pool.size_pool()  # 16 seats, 8B class, 1,200-token prompt, 30% prefix hits, chat
    assert r.live_seats == 16 and r.miss_tokens == 840
    # the shared prefix (360 tokens) once, plus 16 seats of 840 miss + 200 answer tokens
    assert r.shared_prefix_tokens == 360 and r.kv_tokens_per_seat == 1040
    assert r.kv_tokens_in_use == 360 + 16 * 1040 and round(r.kv_token_budget, -3) == 464_000
    assert round(r.ttft_s * 1000) == 27
    assert round(r.aggregate_tokens_per_s) == 1698
    assert round(r.monthly_usd) == 2913 and r.chips == 1
    assert (r.latency_ok, r.capacity_ok, r.cost_ok) == (True, True, True)


def test_the_two_workloads_differ_and_the_defaults_pass_only_chat():
    chat, docs = pool.WORKLOADS["chat"], pool.WORKLOADS["documents"]
    assert docs.prompt_tokens > 10 * chat.prompt_tokens and docs.output_tokens > chat.output_tokens
    assert pool.size_pool(workload="chat").passes
    r = pool.size_pool(workload="documents")
    assert r.prompt_tokens == docs.prompt_tokens and not r.passes


def test_percentiles_come_from_the_simulator():
    r = pool.size_pool()
    assert r.ttft_p95_s > r.ttft_p50_s >= r.ttft_s * 0.999  # queueing only adds
    assert r.tpot_p95_s >= r.tpot_p50_s > 0
    quick = pool.size_pool(simulate=False)
    assert quick.replicas == quick.littles_law_replicas and quick.ttft_p95_s != quick.ttft_p95_s  # NaN


def test_the_planner_adds_replicas_for_the_tail():
    r = pool.size_pool(workload="documents")
    assert r.replicas > r.littles_law_replicas and r.latency_ok
    one = pool.simulate_peak(pool.WORKLOADS["documents"].peak_arrivals_per_s, r.live_seats, r.prompt_tokens,
                             600, r.miss_tokens, r.kv_token_budget)
    assert one[1] > pool.WORKLOADS["documents"].slo_ttft_s  # Little's law alone misses the p95


def test_knee_latency_grows_with_load():
    rows = pool.knee([1.0, 4.0, 8.0, 12.0])
    p95 = [r["ttft_p95_s"] for r in rows]
    assert p95 == sorted(p95) and p95[-1] > 5 * p95[0]
    with pytest.raises(ValueError, match="positive"):
        pool.knee([0.0])


@pytest.mark.parametrize("name", sorted(pool.FAMOUS_FAILURES))
def test_each_famous_failure_breaks_one_check_and_the_fix_passes_all(name):
    f = pool.FAMOUS_FAILURES[name]
    broken, fixed = pool.famous_failure(name)
    failed = [c for c in ("latency", "capacity", "cost") if not getattr(broken, f"{c}_ok")]
    assert failed == [f.check]
    assert fixed.passes, fixed.verdict()
    story = pool.failure_story(name)
    assert "before:" in story and "after:" in story and f.title in story


def test_the_quality_upgrade_keeps_the_70b():
    _, fixed = pool.famous_failure("quality upgrade")
    assert fixed.workload == "chat" and fixed.chips // fixed.replicas == 2


def test_the_70b_fix_keeps_the_promise_in_every_seeded_run_and_64_seats_do_not():
    fix = pool.FAMOUS_FAILURES["quality upgrade"].fix
    w = pool.WORKLOADS["chat"]

    def kept(pairs):
        return sum(t <= w.slo_ttft_s and g <= w.slo_tpot_s for t, g in pairs)

    assert pool.size_pool(**{**fix, "seats": 10_000}, simulate=False).live_seats >= fix["seats"]
    assert kept(pool.p95_over_seeds(1, range(10), **fix)) == 10
    assert kept(pool.p95_over_seeds(1, range(10), **{**fix, "seats": 64})) < 10


def test_what_mattered_differs_per_workload():
    chat = {r["change"]: r["flipped"] for r in pool.what_mattered("chat")}
    docs = {r["change"]: r["flipped"] for r in pool.what_mattered("documents")}
    assert chat != docs
    assert chat["70B class"] == ["cost"] and chat["static batching"] == ["latency"]


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
    (dict(tier="large", prompt_tokens=2_000_000), "not one seat"), (dict(policy="magic"), "policy"),
])
def test_bad_knobs_raise_clearly(kwargs, match):
    with pytest.raises(ValueError, match=match):
        pool.size_pool(**kwargs)


def test_a_shared_prefix_is_held_once():
    no_hits = pool.size_pool(seats=10_000, prefix_hit_rate=0.0, simulate=False)
    hits = pool.size_pool(seats=10_000, prefix_hit_rate=0.9, simulate=False)
    budget = hits.kv_token_budget
    assert no_hits.live_seats == budget // 1400
    assert hits.live_seats == (budget - 1080) // (120 + 200) > 3 * no_hits.live_seats
    # the step still reads every seat's whole context: same seats, same step
    same = pool.size_pool(seats=16, prefix_hit_rate=0.9, simulate=False)
    assert same.step_s == pool.size_pool(seats=16, prefix_hit_rate=0.0, simulate=False).step_s


def test_spares_add_whole_replicas_to_the_bill():
    plan = pool.size_pool(simulate=False)
    n1 = pool.size_pool(simulate=False, spares=1)
    assert n1.replicas == plan.replicas + 1 and n1.spare_replicas == 1
    assert n1.monthly_usd == pytest.approx(plan.monthly_usd * (plan.replicas + 1) / plan.replicas)
    with pytest.raises(ValueError, match="spares"):
        pool.size_pool(spares=-1)


def test_what_mattered_table_names_no_flip_and_shows_the_deltas():
    text = pool.what_mattered_table("chat")
    assert text.splitlines()[0] == "chat" and "defaults" in text
    line = next(x for x in text.splitlines() if "prompt x 4" in x)
    assert " none " in line and "$5,825" in line
    assert "cost pass->FAIL" in next(x for x in text.splitlines() if "70B class" in x)


def test_p95_over_seeds_starts_from_the_planners_run_and_spreads():
    fix = pool.FAMOUS_FAILURES["quality upgrade"].fix
    planned = pool.size_pool(**fix)
    one = pool.p95_over_seeds(1, seeds=range(4), **fix)
    assert len(one) == 4 and one[0] == (planned.ttft_p95_s, planned.tpot_p95_s)
    assert len({round(t, 6) for t, _ in one}) > 1          # another seed, another p95
    two = pool.p95_over_seeds(2, seeds=range(4), **fix)
    assert max(t for t, _ in two) < min(t for t, _ in one)  # halving each replica's share shortens the queue
    with pytest.raises(ValueError):
        pool.p95_over_seeds(0, **fix)
