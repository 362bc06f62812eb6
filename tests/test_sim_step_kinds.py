"""The step model fitted per step kind (servelab.sim.step_model.KindStepModel, format 2)."""
import json

import numpy as np
import pytest

from servelab.sim import KindStepModel, LinearStepModel, ReplicaConfig, StepShape, fit_by_kind, simulate, synthetic
from servelab.sim.fit import fit_report
from servelab.sim.step_model import STEP_MODEL_FORMAT, step_kind, step_model_from_dict

TRUE_DECODE = LinearStepModel(a=0.004, c_decode=3e-5, d_context=1.5e-6, bin_edges=(2, 4), bin_costs=(0.002, 0.003))
TRUE_PREFILL = LinearStepModel(a=0.003, b_prefill=1.4e-4, e_pairs=2e-7, f_chunks=0.002, c_decode=1e-5,
                               bin_edges=(1,), bin_costs=(0.0025,), bin_on="decode_rows")
TRUE = KindStepModel(TRUE_DECODE, TRUE_PREFILL)


def _shapes(n=600, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        kind = rng.integers(3)
        R = 0 if kind == 1 else int(rng.integers(1, 12))
        K = int(R * rng.integers(10, 300))
        if kind == 0:
            out.append(StepShape(0, R, K))
        else:
            P = int(rng.integers(8, 400))
            start = int(rng.integers(0, 300))
            out.append(StepShape(P, R, K, P * start + P * (P + 1) / 2, 1, start + P))
    return out


def test_step_kind():
    assert step_kind(StepShape(0, 3, 30)) == "decode"
    assert step_kind(StepShape(40, 0, 0, 820.0, 1, 40)) == "prefill"
    assert step_kind(StepShape(40, 2, 30, 820.0, 1, 40)) == "mixed"


def test_fit_recovers_a_model_of_that_form():
    shapes = _shapes()
    y = np.array([TRUE.step_s(s) for s in shapes])
    m = fit_by_kind(shapes, y, decode_bins=(2, 4))
    assert m.meta["r2"] == pytest.approx(1.0, abs=1e-9)
    for s in shapes[:50]:
        assert m.step_s(s) == pytest.approx(TRUE.step_s(s), rel=1e-6)
    assert set(m.meta["kinds"]) == {"decode", "prefill", "mixed"}
    assert m.prefill.bin_on == "decode_rows" and m.prefill.bin_edges[0] == 1


def _mixed_shapes(n=900, seed=3):
    """Prompt steps alone and with 1-32 decode rows (a queue for seats fills every seat)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        R = int(rng.integers(0, 33)) if rng.random() < 0.8 else 0
        K = int(R * rng.integers(10, 200))
        P = int(rng.integers(8, 400))
        start = int(rng.integers(0, 300))
        chunks = int(rng.integers(1, 4))
        out.append(StepShape(P, R, K, P * start + P * (P + 1) / 2, chunks, start + P))
    return out


def test_mixed_steps_price_decode_rows_by_bins():
    """Decode rows cost a mixed step less per row as they grow (as in a decode step): with one
    slope per row the fit misprices a step of many rows and a short prompt; the row bins of
    the prompt line find it."""
    concave = LinearStepModel(a=0.003, b_prefill=1.4e-4, e_pairs=2e-7, c_decode=3e-4, d_context=1e-6,
                              bin_edges=(1, 9, 17, 25), bin_costs=(0.0025, -0.0005, -0.0015, -0.002),
                              bin_on="decode_rows")
    truth = KindStepModel(TRUE_DECODE, concave)
    shapes = _shapes() + _mixed_shapes()
    y = np.array([truth.step_s(s) for s in shapes])
    probe = StepShape(64, 30, 30 * 100, 64 * 65 / 2, 1, 64)
    m = fit_by_kind(shapes, y, decode_bins=(2, 4))
    assert {1, 9, 17, 25} <= set(m.prefill.bin_edges)
    assert m.step_s(probe) == pytest.approx(truth.step_s(probe), rel=0.01)
    one_slope = fit_by_kind(shapes, y, decode_bins=(2, 4), prompt_row_bins=())
    assert one_slope.prefill.bin_edges == (1,)
    assert abs(one_slope.step_s(probe) / truth.step_s(probe) - 1) > 0.03


def test_noisy_fit_reports_residuals_by_kind():
    shapes = _shapes(seed=1)
    rng = np.random.default_rng(2)
    y = np.array([TRUE.step_s(s) for s in shapes]) * rng.lognormal(0, 0.1, len(shapes))
    m = fit_by_kind(shapes, y)
    rep = fit_report(m, shapes, y)
    assert 0.5 < rep["r2"] < 1.0
    for k, v in rep["kinds"].items():
        assert v["median_abs_err"] < 0.15 and abs(v["total_ratio"] - 1) < 0.1, k


def test_round_trip_and_format():
    d = json.loads(json.dumps(TRUE.to_dict()))
    assert d["format"] == STEP_MODEL_FORMAT and d["kind"] == "by_kind"
    back = step_model_from_dict(d)
    s = StepShape(100, 3, 300, 5050.0, 1, 100)
    assert back.step_s(s) == pytest.approx(TRUE.step_s(s))
    with pytest.raises(ValueError, match="decode"):
        step_model_from_dict({"kind": "by_kind", "format": 2, "prefill": TRUE_PREFILL.to_dict()})
    with pytest.raises(TypeError, match="LinearStepModel"):
        KindStepModel(TRUE_DECODE, "fast")


def test_simulator_runs_with_it_and_decode_runs_match_single_steps():
    """Whole decode runs summed in closed form equal the sum of single steps (the decode part's bins)."""
    for rows in (1, 2, 3, 5):
        k0 = 40 * rows
        run = TRUE.decode_run_s(rows, k0, 17)
        one_by_one = sum(TRUE.step_s(StepShape(0, rows, k0 + i * rows)) for i in range(17))
        assert run == pytest.approx(one_by_one)
    r = simulate(synthetic(200, 5.0, seed=3), TRUE, ReplicaConfig(max_num_seqs=16, max_num_batched_tokens=512,
                                                                     num_kv_blocks=1024))
    assert np.all(np.isfinite(r.ttft)) and r.num_steps > 0
    slow = TRUE.scaled(2.0)
    assert slow.step_s(StepShape(50, 2, 60, 1275.0, 1, 50)) == pytest.approx(
        2 * TRUE.step_s(StepShape(50, 2, 60, 1275.0, 1, 50)))


def test_fit_needs_steps_of_both_kinds():
    shapes = [StepShape(0, 2, 40)] * 30
    with pytest.raises(ValueError, match="prompt steps"):
        fit_by_kind(shapes, np.full(30, 0.005))


def test_with_noise_and_noise_band():
    from servelab.sim import Trace
    from servelab.sim import calibrate as cal
    shapes = _shapes(seed=4)
    rng = np.random.default_rng(5)
    y = np.array([TRUE.step_s(s) for s in shapes]) * rng.lognormal(0, 0.1, len(shapes))
    m = fit_by_kind(shapes, y)
    noisy = m.with_noise(shapes, y, seed=1)
    assert noisy.noisy and not m.noisy
    s = StepShape(0, 3, 300)
    assert len({round(noisy.step_s(s), 9) for _ in range(20)}) > 1
    trace = synthetic(60, 20.0, seed=6)
    cfg = ReplicaConfig(max_num_seqs=16, max_num_batched_tokens=512, num_kv_blocks=1024)
    sim = simulate(trace, m, cfg)
    run = cal.EngineRun(trace, cfg, shapes, y, sim.ttft, sim.tpot, sim.ttft + 1.0, "synthetic")
    band = cal.noise_band(run, m, [run], seeds=3)
    assert set(band) == set(cal.METRICS) and all(v >= 0 for v in band.values())
    with pytest.raises(ValueError, match="KindStepModel"):
        cal.noise_band(run, TRUE_DECODE, [run])


def _served_shapes(n=1500, seed=5):
    """Steps as a served trace makes them: a prompt step, then a run of 0-15 decode steps."""
    rng = np.random.default_rng(seed)
    base = _shapes(n, seed)
    prompts = [s for s in base if s.prefill_tokens]
    decodes = [s for s in base if not s.prefill_tokens]
    out = []
    while len(out) < n and prompts and decodes:
        out.append(prompts.pop())
        for _ in range(int(rng.integers(0, 16))):
            if decodes:
                out.append(decodes.pop())
    return out


def test_the_aftermath_of_a_prompt_step_is_recovered():
    """The first decode steps after a prompt step of P tokens cost their line times
    1 + a_k + b_k * P: the fit finds each position's a and b and leaves the decode line as it
    was; a model without the term misprices both the near and the settled steps."""
    from servelab.sim.step_model import after_prompt, aftermath_position
    true = KindStepModel(TRUE_DECODE, TRUE_PREFILL, aftermath=((0.15, 2e-4), (0.10, 1e-4), (0.04, 0.0)))
    shapes = after_prompt(_served_shapes(4000, seed=5))
    assert sum(1 for s in shapes if aftermath_position(s) == 3) >= 20
    y = np.array([true.step_s(s) for s in shapes])
    m = fit_by_kind(shapes, y, decode_bins=(2, 4))
    assert len(m.aftermath) == 3 and m.aftermath_steps == 3
    for got, want in zip(m.aftermath, true.aftermath):
        assert got == pytest.approx(want, rel=1e-6, abs=1e-12)
    assert m.decode.a == pytest.approx(TRUE_DECODE.a, rel=1e-6)
    assert "after a prompt step" in m.describe() and "(3rd)" in m.describe()
    back = step_model_from_dict(json.loads(json.dumps(m.to_dict())))
    assert back.aftermath == m.aftermath
    assert all(back.step_s(s) == m.step_s(s) for s in shapes[:40])
    # without the term, the decode line absorbs the cost and misprices both sets of steps
    blind = fit_by_kind([s._replace(after_prompt_tokens=0, steps_after_prompt=0) for s in shapes], y,
                        decode_bins=(2, 4))
    assert blind.aftermath == ()
    near = [s for s in shapes if aftermath_position(s) == 1 and s.after_prompt_tokens > 200]
    settled = [s for s in shapes if not s.prefill_tokens and aftermath_position(s) > 6]
    plain = lambda s: s._replace(after_prompt_tokens=0, steps_after_prompt=0)  # noqa: E731
    assert np.median([blind.step_s(plain(s)) / true.step_s(s) for s in near]) < 0.9
    assert np.median([blind.step_s(plain(s)) / true.step_s(s) for s in settled]) > 1.01


def test_a_format_5_step_model_keeps_its_cost_of_the_step_right_after_a_prompt_step():
    """A saved model from before the aftermath (format 5: a + b * P seconds on the first decode
    step after a prompt step) prices exactly that step, and no later one."""
    from servelab.sim.step_model import after_prompt
    old = KindStepModel(TRUE_DECODE, TRUE_PREFILL, after_prompt_s=4e-4, after_prompt_token_s=2e-6)
    d = old.to_dict()
    d["format"] = 5
    del d["aftermath"]
    back = step_model_from_dict(d)
    assert back.aftermath_steps == 1
    shapes = after_prompt([StepShape(100, 0, 0, 5050.0, 1, 100), StepShape(0, 2, 40), StepShape(0, 2, 42)])
    assert back.step_s(shapes[1]) == pytest.approx(TRUE_DECODE.step_s(shapes[1]) + 4e-4 + 2e-4)
    assert back.step_s(shapes[2]) == pytest.approx(TRUE_DECODE.step_s(shapes[2]))
    # a shape that says only "right after" (how format 5 marked it) is the first position
    assert back.step_s(StepShape(0, 2, 40, after_prompt_tokens=100)) == back.step_s(shapes[1])
    with pytest.raises(ValueError, match="aftermath"):
        KindStepModel(TRUE_DECODE, TRUE_PREFILL, aftermath=((0.1, -1e-4),))


def test_noise_residuals_do_not_count_the_step_before_cost_twice():
    """Exact steps with a step-before cost: their residuals against the whole model are zero,
    so the noisy copy prices every step as the model does."""
    from servelab.sim.step_model import after_prompt
    true = KindStepModel(TRUE_DECODE, TRUE_PREFILL, after_prompt_s=4e-4, after_prompt_token_s=2e-6)
    shapes = after_prompt(_shapes(1200, seed=5))
    y = np.array([true.step_s(s) for s in shapes])
    noisy = true.with_noise(shapes, y, seed=2)
    after = next(s for s in shapes if not s.prefill_tokens and s.after_prompt_tokens > 100)
    draws = [noisy.step_s(after) - true.step_s(after) for _ in range(200)]
    assert max(abs(d) for d in draws) < 1e-12


KNEED = LinearStepModel(a=0.004, c_decode=3e-5, d_context=1.0e-6, bin_edges=(2, 4), bin_costs=(0.002, 0.003),
                        knee_context=1500, g_knee=1.5e-6)


def _decode_shapes(n=1500, seed=3):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        R = int(rng.integers(1, 24))
        out.append(StepShape(0, R, int(R * rng.integers(8, 300))))
    return out


def test_a_planted_knee_in_the_context_price_is_found():
    """Decode steps whose context beyond a total of 1,500 tokens costs 2.5x: the fit finds the
    knee near it; a straight line through the same steps underprices the short contexts and overprices the
    middle (the shape the AMD EPYC's decode steps showed: data/sim/calibration_runs.json at
    commit ff640ad)."""
    from servelab.sim.fit import _fit_decode_line
    shapes = _decode_shapes()
    rng = np.random.default_rng(4)
    y = np.array([KNEED.step_s(s) for s in shapes]) * rng.normal(1, 0.03, len(shapes))
    m = _fit_decode_line(shapes, y, (2, 4))
    assert 1100 <= m.knee_context <= 1900 and m.g_knee == pytest.approx(1.5e-6, rel=0.35)
    assert m.meta["knee_gain"] >= 0.01
    line = fit_by_kind(shapes + _shapes(300), np.concatenate([y, [TRUE.step_s(s) for s in _shapes(300)]]),
                       decode_bins=(2, 4)).decode
    assert line.g_knee > 0
    from servelab.sim.fit import fit_linear
    straight = fit_linear(shapes, y, features=("decode_rows", "decode_context"), bins=(2, 4))
    short = [s for s in shapes if s.decode_context < 400]
    middle = [s for s in shapes if 1500 < s.decode_context < 3000]
    assert np.median([straight.step_s(s) / KNEED.step_s(s) for s in short]) < 0.95
    assert np.median([straight.step_s(s) / KNEED.step_s(s) for s in middle]) > 1.02
    assert np.median([abs(m.step_s(s) / KNEED.step_s(s) - 1) for s in short + middle]) < 0.02


def test_no_knee_where_the_price_is_straight():
    """Steps on a straight line with noise: no knee is worth its term (KNEE_GAIN)."""
    shapes = _decode_shapes(seed=8)
    rng = np.random.default_rng(9)
    y = np.array([TRUE_DECODE.step_s(s) for s in shapes]) * rng.normal(1, 0.05, len(shapes))
    m = fit_by_kind(shapes + _shapes(300), np.concatenate([y, [TRUE.step_s(s) for s in _shapes(300)]]),
                    decode_bins=(2, 4))
    assert m.decode.g_knee == 0.0 and m.decode.knee_context == 0


def test_a_knee_prices_decode_runs_in_closed_form_as_step_by_step():
    for rows, k0, k in ((1, 100, 3000), (8, 40, 400), (20, 1400, 50), (3, 5000, 10)):
        one_by_one = sum(KNEED.step_s(StepShape(0, rows, k0 + i * rows)) for i in range(k))
        assert KNEED.decode_run_s(rows, k0, k) == pytest.approx(one_by_one, rel=1e-12)
        dt = one_by_one * 0.6
        n = KNEED.steps_to_reach(rows, k0, dt, k)
        assert KNEED.decode_run_s(rows, k0, n) >= dt > KNEED.decode_run_s(rows, k0, n - 1)


def test_a_knee_is_saved_scaled_and_described():
    m = KindStepModel(KNEED, TRUE_PREFILL)
    back = step_model_from_dict(json.loads(json.dumps(m.to_dict())))
    assert m.to_dict()["format"] == STEP_MODEL_FORMAT >= 5
    s = StepShape(0, 6, 3000)
    assert back.step_s(s) == m.step_s(s)
    assert m.scaled(2.0).step_s(s) == pytest.approx(2 * m.step_s(s))
    assert "beyond 1500 tokens" in m.describe()
    with pytest.raises(ValueError, match="knee_context"):
        LinearStepModel(a=0.004, knee_context=-1)
    with pytest.raises(ValueError, match="g_knee"):
        LinearStepModel(a=0.004, g_knee=-1e-6)
