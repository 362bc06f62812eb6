"""servelab.fleet: rate limits, routers, priorities, shedding, canary, demand over a day."""
import numpy as np
import pytest

from servelab import fleet, pool
from servelab.sim import Exponential, Fixed, LinearStepModel, LogNormal, ReplicaConfig, Trace, simulate, synthetic

MODEL = pool.pool_step_model("small")
CFG = ReplicaConfig(max_num_seqs=32, max_num_batched_tokens=8192, num_kv_blocks=12000)


def test_token_bucket_rejects_with_a_retry_time():
    b = fleet.TokenBucket(per_minute=60, capacity=2)  # one a second, bursts of two
    assert b.take(0.0) == 0.0 and b.take(0.0) == 0.0
    assert b.take(0.0) == pytest.approx(1.0)      # empty: one more in a second
    assert b.take(0.5) == pytest.approx(0.5)
    assert b.take(1.0) == 0.0
    with pytest.raises(ValueError, match="never pass"):
        b.take(2.0, 5)
    with pytest.raises(ValueError, match="backwards"):
        b.take(0.9)
    with pytest.raises(ValueError, match="per_minute"):
        fleet.TokenBucket(0)


def test_rate_limiter_per_account_requests_and_tokens():
    lim = fleet.RateLimiter(requests_per_minute=2, tokens_per_minute=1000)
    assert lim.admit("a", 0.0, 100).ok and lim.admit("a", 0.0, 100).ok
    d = lim.admit("a", 0.0, 100)
    assert not d.ok and d.retry_after_s == pytest.approx(30.0) and "requests" in d.reason
    assert lim.admit("b", 0.0, 900).ok           # another account has its own buckets
    d = lim.admit("b", 1.0, 900)
    assert not d.ok and "tokens" in d.reason
    assert not lim.admit("c", 0.0, 5000).ok      # bigger than the whole minute


def test_routers_spread_and_affinity_trades_load_for_hits():
    tr = synthetic(3000, 20, prompt=LogNormal(200, 0.5, 16, 2000), output=Exponential(150, 1000),
                   prefix_groups=200, prefix_tokens=4000, seed=3)
    rr = fleet.serve(tr, MODEL, CFG, replicas=4, router="round_robin")
    aff = fleet.serve(tr, MODEL, CFG, replicas=4, router="prefix_affinity", slack=32)
    strict = fleet.serve(tr, MODEL, CFG, replicas=4, router="prefix_affinity", slack=0)
    assert rr.load_imbalance == 1.0
    assert aff.prefix_hit_share > 2 * rr.prefix_hit_share
    assert strict.prefix_hit_share < aff.prefix_hit_share
    assert np.percentile(aff.result.ttft, 95) < np.percentile(rr.result.ttft, 95)
    lo = fleet.route(tr, 4, "least_outstanding", step_model=MODEL)
    assert set(lo) == {0, 1, 2, 3}
    with pytest.raises(ValueError, match="step_model"):
        fleet.route(tr, 4, "least_outstanding")
    with pytest.raises(ValueError, match="router"):
        fleet.route(tr, 4, "cleverest")


def test_least_outstanding_avoids_the_busy_replica():
    # one huge request first, then small ones: least outstanding keeps them off its replica
    tr = Trace(np.r_[0.0, np.arange(1, 11) * 0.01], np.r_[4000, np.full(10, 50)], np.r_[2000, np.full(10, 10)])
    where = fleet.route(tr, 2, "least_outstanding", step_model=MODEL)
    assert (where[1:] != where[0]).sum() >= 5


def test_batch_fills_the_gaps():
    tr = synthetic(600, 12, prompt=Fixed(400), output=Fixed(100), seed=1)
    pri = (np.arange(600) % 3 == 0).astype(int)  # a third is batch
    m = LinearStepModel(a=0.01, b_prefill=1e-5, c_decode=2e-4)
    cfg = ReplicaConfig(max_num_seqs=8, num_kv_blocks=4096)
    mixed = simulate(tr, m, cfg, priority=pri)
    fifo = simulate(tr, m, cfg)
    inter = pri == 0
    assert np.percentile(mixed.ttft[inter], 95) < np.percentile(fifo.ttft[inter], 95)
    assert np.percentile(mixed.ttft[~inter], 95) > np.percentile(mixed.ttft[inter], 95)
    assert np.all(np.isfinite(mixed.finish_s))


def test_shedding_drops_batch_first_or_caps_answers():
    tr = synthetic(2000, 40, prompt=Fixed(200), output=Fixed(300), seed=2)
    pri = (np.arange(2000) % 2).astype(int)
    keep, out = fleet.shed(tr, capacity_tokens_per_s=10_000, priority=pri)
    assert keep.mean() < 1
    assert keep[pri == 0].mean() > keep[pri == 1].mean()
    keep2, out2 = fleet.shed(tr, 10_000, policy="cap_output", min_output=16)
    assert keep2.all() and out2.min() >= 16 and out2.sum() < tr.output_tokens.sum()
    with pytest.raises(ValueError, match="policy"):
        fleet.shed(tr, 10_000, policy="panic")


def test_canary_share_grows_and_old_drains():
    tr = synthetic(4000, 20, prompt=Fixed(300), output=Fixed(50), seed=4)
    new = pool.pool_step_model("small", "fp8")
    c = fleet.canary(tr, MODEL, new, CFG)
    a = tr.arrival_s
    t0, t1 = a[0], a[-1]
    early = c.share_new(t0, t0 + 0.2 * (t1 - t0), a)
    late = c.share_new(t0 + 0.8 * (t1 - t0), t1 + 1, a)
    assert early < 0.05 and late == 1.0
    assert c.old is not None and c.new is not None
    assert np.nanmax(c.old.arrival_s) < t0 + 0.76 * (t1 - t0)


def test_diurnal_demand_and_capacity_for_the_peak():
    t, r = fleet.diurnal_rates(24, mean_rate=5, peak_to_trough=4)
    assert r.max() / r.min() == pytest.approx(4, rel=0.01)
    assert r.mean() == pytest.approx(5, rel=0.01)
    assert np.argmax(r) * 60 / 3600 == pytest.approx(14, abs=0.1)
    _, wk = fleet.diurnal_rates(24, mean_rate=5, weekday=False)
    _, s = fleet.diurnal_rates(24, mean_rate=5, surge=(20, 2, 3.0))
    assert wk.max() < r.max() < s.max()
    tr = fleet.arrivals_from_rates(t[:120], r[:120], seed=0)  # two hours
    assert abs(len(tr) - r[:120].sum() * 60) < 4 * np.sqrt(r[:120].sum() * 60)
    per = fleet.max_rate_for_slo(MODEL, CFG, ttft_p95_s=1.2, prompt=Fixed(800), output=Fixed(200), n=600)
    assert per > 0
    assert fleet.replicas_for_peak(r, per) == int(np.ceil(r.max() / per))
    with pytest.raises(ValueError, match="per_replica_rate"):
        fleet.replicas_for_peak(r, 0)


def test_the_slo_rate_is_judged_after_the_warm_up():
    """The first arrivals meet an empty replica: judged from the start, a run claims more."""
    from servelab.sim import simulate, synthetic
    n, slo = 400, 1.2
    rate = fleet.max_rate_for_slo(MODEL, CFG, ttft_p95_s=slo, prompt=Fixed(800), output=Fixed(200), n=n)
    for r, ok in ((rate, True), (rate * 1.05, False)):
        res = simulate(synthetic(n, r, seed=0, prompt=Fixed(800), output=Fixed(200)), MODEL, CFG,
                       progress=False, timeline_points=0)
        assert bool(np.percentile(res.ttft[n // 2:], 95) <= slo) is ok


def test_highway_surge_and_outage():
    calm = fleet.highway(1.0, False)
    assert calm.offered == calm.edge_hits + calm.blocked + calm.rejected + calm.admitted
    surge = fleet.highway(2.0, False)
    assert surge.rejected > 3 * calm.rejected  # the heavy accounts hit their limits first
    down = fleet.highway(1.0, True)
    assert down.replicas_up == calm.replicas_up - 1 and down.ttft_p95_s > calm.ttft_p95_s
    assert len(calm.minute_p95_s) == 5 and "admitted" in calm.line()
    with pytest.raises(ValueError, match="surge"):
        fleet.highway(0)


def test_highway_lab_reacts_to_its_dial():
    pytest.importorskip("ipywidgets")
    from servelab.widgets.highway_lab import highway_lab
    lab = highway_lab(minutes=2.0)
    dial, switch = lab.children[1].children
    before = lab.children[2].value
    switch.value = True
    assert lab.children[2].value != before and "1 replica(s) up" in lab.children[2].value


def test_output_weight_counts_a_decoded_token_in_prompt_tokens():
    w = fleet.output_weight(MODEL, 200, 300, 32)
    assert 3 < w < 20                                  # several prompt tokens
    assert fleet.output_weight(MODEL, 2000, 300, 32) > w   # grows with context
    assert fleet.output_weight(MODEL, 200, 300, 128) < w   # falls with seats
    with pytest.raises(ValueError):
        fleet.output_weight(MODEL, 0, 300, 32)


def test_one_router_for_the_fleet_and_the_simulators_pools():
    """fleet.route is sim.pools.route: simulate_pool takes the load-aware routers too, and
    fleet.serve's merged result is simulate_pool's for the same router."""
    from servelab.sim import pools

    assert fleet.route is pools.route and fleet.ROUTERS is pools.ROUTERS
    tr = synthetic(400, 20, prompt=Fixed(100), output=Fixed(20), prefix_groups=8, prefix_tokens=64, seed=1)
    served = fleet.serve(tr, MODEL, CFG, replicas=3, router="prefix_affinity", slack=2)
    pooled = pools.simulate_pool(tr, MODEL, CFG, replicas=3, router="prefix_affinity", slack=2, progress=False)
    np.testing.assert_array_equal(served.result.finish_s, pooled.finish_s)
