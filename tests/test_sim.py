"""servelab.sim: the simulator against the engine's own scheduler, step models, traces, metrics."""
import json
import math

import numpy as np
import pytest

from servelab.sim import (Exponential, Fixed, LinearStepModel, LogNormal, Mixture, ReplicaConfig,
                          RooflineStepModel, StepShape, Trace, Uniform, fit_linear, load_trace, save_trace,
                          simulate, step_model_from_dict, synthetic, weighted_percentile)
from servelab.sim.replay import replay_scheduler, trace_prompts

MODEL = LinearStepModel(a=0.002, b_prefill=20e-6, c_decode=50e-6, d_context=1e-8, e_pairs=1e-9, f_chunks=1e-4)


def _trace(seed=1, n=200, rate=30.0, **kw):
    kw.setdefault("prompt", LogNormal(200, 0.8, 8, 900))
    kw.setdefault("output", Exponential(60, 300))
    return synthetic(n, rate, seed=seed, **kw)


# -- the simulator is the engine's scheduler -------------------------------------------------
CONFIGS = {
    "defaults": dict(max_num_seqs=16, num_kv_blocks=4096),
    "small budget": dict(max_num_seqs=16, num_kv_blocks=4096, max_num_batched_tokens=256),
    "chunk cap": dict(max_num_seqs=16, num_kv_blocks=4096, long_prefill_token_threshold=64),
    "no chunking": dict(max_num_seqs=16, num_kv_blocks=4096, enable_chunked_prefill=False,
                        max_num_batched_tokens=1024),
    "preemption, no cache": dict(max_num_seqs=16, num_kv_blocks=120, enable_prefix_caching=False),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_simulator_equals_engine_scheduler(name):
    tr = _trace()
    cfg = ReplicaConfig(**CONFIGS[name])
    a, b = simulate(tr, MODEL, cfg), replay_scheduler(tr, MODEL, cfg)
    np.testing.assert_allclose(a.first_token_s, b.first_token_s, rtol=0, atol=1e-9)
    np.testing.assert_allclose(a.finish_s, b.finish_s, rtol=0, atol=1e-9)
    assert a.num_steps == b.num_steps
    assert a.num_preemptions == b.num_preemptions


def test_a_decode_step_after_a_prompt_step_costs_what_the_model_says_in_both():
    """The carryover (a decode step right after a prompt step costs more) is charged to that
    step alone: by the simulator's closed-form decode runs as by the engine's scheduler."""
    from servelab.sim import KindStepModel
    tr = _trace(seed=4)
    cfg = ReplicaConfig(max_num_seqs=16, num_kv_blocks=4096)
    carry = KindStepModel(MODEL, MODEL, after_prompt_s=0.003, after_prompt_token_s=2e-5)
    a, b = simulate(tr, carry, cfg), replay_scheduler(tr, carry, cfg)
    np.testing.assert_allclose(a.first_token_s, b.first_token_s, rtol=0, atol=1e-9)
    np.testing.assert_allclose(a.finish_s, b.finish_s, rtol=0, atol=1e-9)
    plain = simulate(tr, KindStepModel(MODEL, MODEL), cfg)
    assert a.num_steps == b.num_steps and a.busy_s > plain.busy_s
    assert np.median(a.tpot) > np.median(plain.tpot)
    # the gaps keep every step: the carried ones as runs of one step
    assert a.gap_steps.sum() == b.gap_steps.sum()


def test_the_aftermath_of_a_prompt_step_costs_what_the_model_says_in_both():
    """The first few decode steps after a prompt step cost more (each its own share): the
    simulator's decode runs charge them step by step, as the engine's scheduler replay does,
    and split a run at the next arrival in the same place."""
    from servelab.sim import KindStepModel
    tr = _trace(seed=4)
    cfg = ReplicaConfig(max_num_seqs=16, num_kv_blocks=4096)
    after = KindStepModel(MODEL, MODEL, aftermath=((0.4, 1e-3), (0.3, 0.0), (0.1, 5e-4), (0.05, 0.0)))
    a, b = simulate(tr, after, cfg), replay_scheduler(tr, after, cfg)
    np.testing.assert_allclose(a.first_token_s, b.first_token_s, rtol=0, atol=1e-9)
    np.testing.assert_allclose(a.finish_s, b.finish_s, rtol=0, atol=1e-9)
    plain = simulate(tr, KindStepModel(MODEL, MODEL), cfg)
    assert a.num_steps == b.num_steps and a.busy_s > plain.busy_s
    assert a.busy_s == pytest.approx(b.busy_s, rel=1e-9)
    assert a.gap_steps.sum() == b.gap_steps.sum()


def test_prefix_groups_equal_engine_prefix_cache():
    tr = _trace(seed=2, prompt=LogNormal(100, 0.8, 8, 400), prefix_groups=4, prefix_tokens=200)
    cfg = ReplicaConfig(max_num_seqs=16, num_kv_blocks=400)
    a, b = simulate(tr, MODEL, cfg), replay_scheduler(tr, MODEL, cfg)
    np.testing.assert_allclose(a.first_token_s, b.first_token_s, atol=1e-9)
    np.testing.assert_array_equal(a.cached_tokens, b.cached_tokens)
    assert a.cached_tokens.sum() > 0
    off = simulate(tr, MODEL, ReplicaConfig(max_num_seqs=16, num_kv_blocks=400, enable_prefix_caching=False))
    assert off.cached_tokens.sum() == 0
    assert np.percentile(a.ttft, 95) < np.percentile(off.ttft, 95)


def test_preemption_with_cache_close_to_engine():
    """Cached blocks of a preempted sequence are re-matched; the simulator evicts them as the engine
    does (tail first), so TTFT p95 agrees within 1%."""
    tr = _trace()
    cfg = ReplicaConfig(max_num_seqs=16, num_kv_blocks=120)
    a, b = simulate(tr, MODEL, cfg), replay_scheduler(tr, MODEL, cfg)
    assert a.num_preemptions > 10
    assert abs(a.num_preemptions - b.num_preemptions) <= 2
    pa, pb = np.percentile(a.ttft, 95), np.percentile(b.ttft, 95)
    assert abs(pa - pb) / pb < 0.01
    assert np.all(np.isfinite(a.finish_s))


# -- hand-checked cases -----------------------------------------------------------------------
def test_one_request_by_hand():
    tr = Trace([0.5], [100], [4])
    m = LinearStepModel(a=0.01, b_prefill=1e-4, c_decode=1e-3, d_context=1e-6)
    r = simulate(tr, m, ReplicaConfig(max_num_seqs=4, num_kv_blocks=64))
    prefill = 0.01 + 100 * 1e-4
    assert r.ttft[0] == pytest.approx(prefill)
    # three decode steps read 101, 102, 103 tokens of context
    decodes = sum(0.01 + 1e-3 + 1e-6 * c for c in (101, 102, 103))
    assert r.e2e[0] == pytest.approx(prefill + decodes)
    assert r.tpot[0] == pytest.approx(decodes / 3)


def test_static_wave_waits_for_its_longest_member():
    # two requests arrive together; a third arrives during the wave and must wait for the wave's end
    tr = Trace([0.0, 0.0, 0.001], [10, 10, 10], [2, 50, 2])
    m = LinearStepModel(a=0.01)
    static = simulate(tr, m, ReplicaConfig(max_num_seqs=4, num_kv_blocks=64, policy="static"))
    cont = simulate(tr, m, ReplicaConfig(max_num_seqs=4, num_kv_blocks=64))
    assert static.first_token_s[2] == pytest.approx(static.finish_s[1] + 0.01)
    assert cont.first_token_s[2] == pytest.approx(0.02)  # joins at the next step
    assert static.ttft[2] > 10 * cont.ttft[2]


def test_chunk_cap_trades_ttft_for_smoother_gaps():
    # streams decoding while long prompts arrive: a chunk cap lowers the worst gap
    tr = Trace(np.r_[np.zeros(8), np.arange(1, 9) * 0.2], np.r_[np.full(8, 16), np.full(8, 2000)],
               np.r_[np.full(8, 300), np.full(8, 4)])
    m = LinearStepModel(a=0.002, b_prefill=5e-5, c_decode=1e-4)
    whole = simulate(tr, m, ReplicaConfig(max_num_seqs=32, num_kv_blocks=4096))
    capped = simulate(tr, m, ReplicaConfig(max_num_seqs=32, num_kv_blocks=4096, long_prefill_token_threshold=256))
    assert capped.percentiles("itl", (99,))[99] < whole.percentiles("itl", (99,))[99]
    assert np.mean(capped.ttft[8:]) > np.mean(whole.ttft[8:])


def test_prefilled_requests_decode_only():
    tr = Trace([0.0, 0.0], [64, 64], [1, 5])
    r = simulate(tr, LinearStepModel(a=0.01), ReplicaConfig(max_num_seqs=4, num_kv_blocks=64),
                 prefilled=[True, True])
    assert r.finish_s[0] == 0.0
    assert r.finish_s[1] == pytest.approx(0.04)  # four decode steps
    assert np.all(np.isnan(r.first_token_s))


def test_progress_bar_and_many_requests_finish():
    tr = synthetic(5000, 50, prompt=Uniform(10, 200), output=Fixed(20), seed=3)
    r = simulate(tr, MODEL, ReplicaConfig(max_num_seqs=32, num_kv_blocks=2048), progress=True)
    assert np.all(np.isfinite(r.finish_s)) and np.all(r.finish_s >= r.first_token_s)
    assert 0 < r.utilisation <= 1


# -- step models ------------------------------------------------------------------------------
@pytest.mark.parametrize("model", [MODEL, RooflineStepModel.for_tier("small"),
                                   RooflineStepModel.for_tier("large", overhead_s=0.002)])
@pytest.mark.parametrize("rows,context0,k", [(1, 10, 1), (8, 1000, 37), (64, 250_000, 500),
                                             (512, 1_000, 2000), (300, 5_000_000, 100)])
def test_decode_run_is_the_sum_of_its_steps(model, rows, context0, k):
    loop = sum(model.step_s(StepShape(decode_rows=rows, decode_context=context0 + i * rows)) for i in range(k))
    assert model.decode_run_s(rows, context0, k) == pytest.approx(loop, rel=1e-9)
    for dt in (0.0, loop / 3, loop, loop * 2):
        got = model.steps_to_reach(rows, context0, dt, k)
        assert 1 <= got <= k
        if got > 1:
            assert model.decode_run_s(rows, context0, got - 1) < dt
        if got < k:
            assert model.decode_run_s(rows, context0, got) >= dt


def test_roofline_step_is_memory_bound_for_decode_compute_bound_for_prefill():
    m = RooflineStepModel.for_tier("small")
    decode = m.step_s(StepShape(decode_rows=1, decode_context=1000))
    assert decode == pytest.approx((16e9 + 1000 * 131072) / (3.35e12 * 0.6))
    prefill = m.step_s(StepShape(prefill_tokens=4000, prefill_pairs=4000 * 4001 / 2, prefill_seqs=1,
                                 prefill_context=4000))
    assert prefill > 2 * 8e9 * 4000 / (989.4e12 * 0.5) * 0.999


def test_fit_recovers_coefficients():
    rng = np.random.default_rng(0)
    true = LinearStepModel(a=0.003, b_prefill=4e-5, c_decode=2e-4, d_context=3e-8)
    shapes = [StepShape(int(p), int(r), int(r * c), 0.0, int(p > 0), 0)
              for p, r, c in zip(rng.integers(0, 600, 80) * (rng.random(80) < 0.5), rng.integers(1, 32, 80),
                                 rng.integers(10, 800, 80))]
    y = [true.step_s(s) * (1 + 0.01 * rng.standard_normal()) for s in shapes]
    fit = fit_linear(shapes, y, features=("prefill_tokens", "decode_rows", "decode_context"))
    assert fit.a == pytest.approx(0.003, rel=0.1)
    assert fit.b_prefill == pytest.approx(4e-5, rel=0.1)
    assert fit.c_decode == pytest.approx(2e-4, rel=0.1)
    assert all(c >= 0 for c in fit.coefficients)
    again = step_model_from_dict(json.loads(json.dumps(fit.to_dict())))
    assert again.step_s(shapes[0]) == pytest.approx(fit.step_s(shapes[0]))


def test_fit_never_returns_negative_terms():
    shapes = [StepShape(p, 1, 10, 0.0, 1, 0) for p in range(1, 30)]
    y = [0.01 - 1e-5 * p for p in range(1, 30)]  # time falling with work: the fit drops that term
    fit = fit_linear(shapes, y)
    assert fit.b_prefill == 0 and fit.a > 0


# -- traces and bad input -----------------------------------------------------------------------
def test_trace_roundtrip_and_groups(tmp_path):
    tr = synthetic(50, 5, prefix_groups=3, prefix_tokens=64, prefix_share=0.5, seed=4)
    path = save_trace(tr, tmp_path / "t.jsonl")
    back = load_trace(path)
    np.testing.assert_allclose(back.arrival_s, tr.arrival_s, atol=1e-6)
    np.testing.assert_array_equal(back.prompt_tokens, tr.prompt_tokens)
    assert (back.prefix_group >= 0).sum() == (tr.prefix_group >= 0).sum()
    ids = trace_prompts(back, 4096, seed=0)
    same = [i for i in range(len(back)) if back.prefix_group[i] == back.prefix_group[0] and back.prefix_group[0] >= 0]
    if len(same) > 1:
        assert ids[same[0]][:64] == ids[same[1]][:64]


def test_trace_group_without_prefix_tokens_shares_the_shortest_prompt(tmp_path):
    p = tmp_path / "g.jsonl"
    p.write_text('{"arrival_s": 0, "prompt_tokens": 300, "output_tokens": 5, "prefix_group": "faq"}\n'
                 '{"arrival_s": 0.1, "prompt_tokens": 200, "output_tokens": 5, "prefix_group": "faq"}\n')
    assert load_trace(p).prefix_tokens.tolist() == [200, 200]


@pytest.mark.parametrize("text,match", [
    ("", "empty"),
    ('{"arrival_s": 0, "prompt_tokens": 3}\n', "output_tokens"),
    ('{"arrival_s": -1, "prompt_tokens": 3, "output_tokens": 2}\n', "arrival_s"),
    ('{"arrival_s": 0, "prompt_tokens": 0, "output_tokens": 2}\n', "prompt_tokens"),
    ("not json\n", "JSON"),
])
def test_bad_traces_name_the_field(tmp_path, text, match):
    p = tmp_path / "bad.jsonl"
    p.write_text(text)
    with pytest.raises(ValueError, match=match):
        load_trace(p)


def test_bad_input_messages():
    with pytest.raises(ValueError, match="rate"):
        synthetic(10, -1.0)
    with pytest.raises(ValueError, match="empty"):
        Trace([], [], [])
    with pytest.raises(ValueError, match="num_kv_blocks"):
        simulate(Trace([0.0], [5000], [10]), MODEL, ReplicaConfig(num_kv_blocks=100))
    with pytest.raises(ValueError, match="chunked prefill"):
        simulate(Trace([0.0], [3000], [10]), MODEL,
                 ReplicaConfig(num_kv_blocks=1000, enable_chunked_prefill=False))
    with pytest.raises(ValueError, match="max_num_seqs"):
        ReplicaConfig(max_num_seqs=64, max_num_batched_tokens=32)
    with pytest.raises(ValueError, match="policy"):
        ReplicaConfig(policy="fastest")
    with pytest.raises(TypeError, match="StepModel"):
        simulate(Trace([0.0], [5], [5]), lambda s: 0.1)
    with pytest.raises(ValueError, match="cv"):
        synthetic(10, 1.0, arrival="gamma", cv=0)
    with pytest.raises(ValueError, match=">= 0"):
        LinearStepModel(a=-1.0)


def test_distributions():
    rng = np.random.default_rng(0)
    assert set(Fixed(7).sample(rng, 5)) == {7}
    x = LogNormal(100, 0.5, 10, 300).sample(rng, 2000)
    assert x.min() >= 10 and x.max() <= 300 and 80 < np.median(x) < 120
    y = Exponential(50, 400).sample(rng, 4000)
    assert 45 < y.mean() < 55
    z = Mixture(((0.5, Fixed(1)), (0.5, Fixed(3)))).sample(rng, 1000)
    assert set(z) == {1, 3}
    g = synthetic(4000, 10, arrival="gamma", cv=3.0, seed=0)
    gaps = np.diff(g.arrival_s)
    assert gaps.std() / gaps.mean() > 2


def test_weighted_percentile_matches_repetition():
    rng = np.random.default_rng(1)
    v = rng.random(30)
    w = rng.integers(1, 6, 30)
    for q in (0, 12.5, 50, 90, 99, 100):
        assert weighted_percentile(v, w, q) == pytest.approx(np.percentile(np.repeat(v, w), q))


def test_goodput_and_summary():
    tr = _trace(n=300)
    r = simulate(tr, MODEL, ReplicaConfig(max_num_seqs=16, num_kv_blocks=4096))
    s = r.summary()
    assert s["ttft_p50"] <= s["ttft_p95"] <= s["ttft_p99"]
    assert r.goodput(ttft_slo_s=1e9) == pytest.approx(r.throughput_rps)
    assert r.goodput(ttft_slo_s=s["ttft_p50"]) < r.throughput_rps
    assert 0.45 < r.slo_attainment(s["ttft_p50"]) < 0.55
    assert math.isfinite(s["itl_p99"])


def test_importing_the_simulator_does_not_load_torch():
    import subprocess
    import sys
    code = "import sys, servelab.sim, servelab.sim.replay; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# -- pools --------------------------------------------------------------------------------------
def test_pool_of_replicas_splits_the_load():
    from servelab.sim import simulate_pool
    tr = _trace(n=400, rate=60)
    cfg = ReplicaConfig(max_num_seqs=8, num_kv_blocks=4096)
    one = simulate_pool(tr, MODEL, cfg, replicas=1)
    four = simulate_pool(tr, MODEL, cfg, replicas=4, router="random")
    assert np.all(np.isfinite(four.finish_s))
    assert np.percentile(four.ttft, 95) < np.percentile(one.ttft, 95)
    with pytest.raises(ValueError, match="router"):
        simulate_pool(tr, MODEL, cfg, replicas=2, router="smartest")


def test_disaggregated_pools_keep_streams_smooth():
    from servelab.sim import simulate_disaggregated, simulate_pool
    tr = Trace(np.r_[np.zeros(8), np.arange(1, 9) * 0.2], np.r_[np.full(8, 16), np.full(8, 2000)],
               np.r_[np.full(8, 300), np.full(8, 4)])
    m = LinearStepModel(a=0.002, b_prefill=5e-5, c_decode=1e-4)
    cfg = ReplicaConfig(max_num_seqs=32, num_kv_blocks=4096)
    mixed = simulate_pool(tr, m, cfg, replicas=2)
    dis = simulate_disaggregated(tr, m, prefill_replicas=1, decode_replicas=1, prefill_config=cfg,
                                 decode_config=cfg, kv_bytes_per_token=131072, link_bandwidth=50e9)
    assert dis.result.percentiles("itl", (100,))[100] < mixed.percentiles("itl", (100,))[100] / 10
    assert np.all(dis.result.finish_s > dis.result.first_token_s)
    assert dis.transfer_s[8] == pytest.approx(2000 * 131072 / 50e9)
    assert set(dis.summary()) >= {"prefill_utilisation", "decode_utilisation", "ttft_p95"}


def test_jitter_is_reproducible_and_keeps_the_mean():
    rng = np.random.default_rng(0)
    shapes = [StepShape(int(p), 4, 400, 0.0, int(p > 0), 0) for p in rng.integers(0, 300, 300)]
    y = [0.002 + 1e-5 * s.prefill_tokens + 0.004 * (rng.random() < 0.1) for s in shapes]  # stalls
    m = fit_linear(shapes, y, features=("prefill_tokens",), jitter=True)
    assert m.noisy and len(m.noise) == 201
    tr = _trace(n=100)
    a = simulate(tr, m, ReplicaConfig(max_num_seqs=16, num_kv_blocks=4096))
    b = simulate(tr, m, ReplicaConfig(max_num_seqs=16, num_kv_blocks=4096))
    np.testing.assert_array_equal(a.finish_s, b.finish_s)
    quiet = simulate(tr, m.without_noise(), ReplicaConfig(max_num_seqs=16, num_kv_blocks=4096))
    assert a.busy_s == pytest.approx(quiet.busy_s, rel=0.1)
    assert step_model_from_dict(json.loads(json.dumps(m.to_dict()))).noise == m.noise


def test_largest_chunk_and_best_split():
    from servelab.sim.pools import best_split, largest_chunk
    m = LinearStepModel(a=0.006, b_prefill=70e-6, c_decode=20e-6)
    c = largest_chunk(0.050, m.a, m.b_prefill, m.c_decode, 32)
    assert m.step_s(StepShape(c, 32)) <= 0.050 < m.step_s(StepShape(c + 1, 32))
    with pytest.raises(ValueError, match="no room"):
        largest_chunk(0.01, 0.006, 70e-6, 1e-4, 64)
    assert best_split(4, 3.2, 0.8) == 3 and best_split(4, 0.1, 3.3) == 1
    assert best_split(5, 1.0, 1.0) == 2
    with pytest.raises(ValueError, match="2 GPUs"):
        best_split(1, 1.0, 1.0)


def test_roofline_for_any_registry_chip():
    h100 = RooflineStepModel.for_chip("Llama-3-8B", 8e9, "H100 SXM")
    tier = RooflineStepModel.for_tier("small")
    shape = StepShape(decode_rows=16, decode_context=16 * 1400)
    assert h100.step_s(shape) == pytest.approx(tier.step_s(shape))
    b200 = RooflineStepModel.for_chip("Llama-3-70B", 70e9, "B200", num_chips=2, weight_dtype="fp8")
    assert b200.step_s(shape) < RooflineStepModel.for_tier("large").step_s(shape)
    with pytest.raises(ValueError, match="chip"):
        RooflineStepModel.for_chip("Llama-3-8B", 8e9, "TPU-v9")


def test_row_count_bins_fit_a_step_that_is_not_linear_in_rows():
    # 1 row: 5 ms; 2-3 rows: 10 ms (a slow small-matrix kernel); then +0.1 ms a row
    def true(rows):
        return 0.005 if rows == 1 else (0.010 if rows < 4 else 0.010 + 1e-4 * (rows - 3))
    shapes = [StepShape(0, r, 100 * r, 0.0, 0, 0) for r in list(range(1, 40)) * 3]
    y = [true(s.decode_rows) for s in shapes]
    plain = fit_linear(shapes, y, features=("decode_rows",))
    binned = fit_linear(shapes, y, features=("decode_rows",), bins=(2, 4))
    err = lambda m: max(abs(m.step_s(s) - t) / t for s, t in zip(shapes, y))  # noqa: E731
    assert err(binned) < 0.01 < err(plain)
    run = binned.decode_run_s(2, 200, 5)
    assert run == pytest.approx(sum(binned.step_s(StepShape(0, 2, 200 + 2 * i)) for i in range(5)))
    back = step_model_from_dict(json.loads(json.dumps(binned.to_dict())))
    assert back.step_s(shapes[1]) == pytest.approx(binned.step_s(shapes[1]))
