"""The profiled step model (servelab.sim.profiled.ProfiledStepModel, format 3): a per-kind
linear model with a per-size correction of its prompt steps, measured by a profiling sweep."""
import json

import numpy as np
import pytest

from servelab.sim import KindStepModel, LinearStepModel, ProfiledStepModel, ReplicaConfig, StepShape, simulate, \
    synthetic
from servelab.sim import calibrate as cal
from servelab.sim.profiled import PROFILE_TOKENS, fit_profiled
from servelab.sim.step_model import STEP_MODEL_FORMAT, step_model_from_dict

DECODE = LinearStepModel(a=0.004, c_decode=3e-5, d_context=1.5e-6, bin_edges=(2, 4), bin_costs=(0.002, 0.003))
PREFILL = LinearStepModel(a=0.003, b_prefill=1.4e-4, e_pairs=2e-7, c_decode=1e-5)
BASE = KindStepModel(DECODE, PREFILL)
GRID = (63, 64, 65, 127, 128, 129)
FACTORS = (1.0, 0.9, 1.0, 1.0, 0.95, 1.0)


def _prompt(n, rows=0):
    return StepShape(n, rows, 40 * rows, n * (n + 1) / 2, 1, n)


def _model(**kw):
    return ProfiledStepModel(BASE, kw.get("tokens", GRID), kw.get("factors", FACTORS))


def test_exact_at_grid_points():
    m = _model()
    for t, f in zip(GRID, FACTORS):
        assert m.factor(t) == pytest.approx(f)
        assert m.step_s(_prompt(t)) == pytest.approx(BASE.step_s(_prompt(t)) * f, rel=1e-12)
        assert m.step_s(_prompt(t, rows=3)) == pytest.approx(BASE.step_s(_prompt(t, rows=3)) * f, rel=1e-12)


def test_interpolation_between_points_is_monotone():
    m = ProfiledStepModel(BASE, (100, 200, 300), (1.0, 1.2, 0.9))
    up = [m.factor(t) for t in range(100, 201, 10)]
    down = [m.factor(t) for t in range(200, 301, 10)]
    assert all(b >= a for a, b in zip(up, up[1:])) and all(b <= a for a, b in zip(down, down[1:]))
    assert m.factor(150) == pytest.approx(1.1)
    # with a flat correction the predicted time grows with the prompt, as the base model's does
    flat = ProfiledStepModel(BASE, (16, 512), (1.05, 1.05))
    times = [flat.step_s(_prompt(n)) for n in range(16, 513, 16)]
    assert all(b > a for a, b in zip(times, times[1:]))


def test_falls_back_to_the_linear_model_outside_the_grid_and_for_decode():
    m = _model()
    for n in (1, 62, 130, 700):
        assert m.factor(n) == 1.0
        assert m.step_s(_prompt(n)) == BASE.step_s(_prompt(n))
    d = StepShape(0, 5, 900)
    assert m.step_s(d) == BASE.step_s(d)
    assert m.decode_lines(5) == BASE.decode_lines(5)
    assert m.decode_run_s(5, 900, 7) == pytest.approx(BASE.decode_run_s(5, 900, 7))


def test_save_load_round_trip(tmp_path):
    m = ProfiledStepModel(BASE, GRID, FACTORS, {"profile_steps": 90})
    d = m.to_dict()
    assert d["kind"] == "profiled" and d["format"] == STEP_MODEL_FORMAT == 6
    path = cal.save_step_model(m, tmp_path / "m.json")
    back = cal.load_step_model(path)
    assert isinstance(back, ProfiledStepModel) and back.tokens == GRID and back.factors == FACTORS
    for s in (_prompt(64), _prompt(100, 2), StepShape(0, 3, 300)):
        assert back.step_s(s) == pytest.approx(m.step_s(s), rel=1e-12)
    # an older per-kind file still loads as what it was
    old = json.loads(json.dumps({**BASE.to_dict(), "format": 2}))
    assert isinstance(step_model_from_dict(old), KindStepModel)


def test_bad_input_errors():
    with pytest.raises(TypeError, match="KindStepModel"):
        ProfiledStepModel(PREFILL, GRID, FACTORS)
    with pytest.raises(ValueError, match="one factor per grid point"):
        _model(factors=(1.0, 0.9))
    with pytest.raises(ValueError, match="strictly increasing"):
        _model(tokens=(64, 63, 65, 127, 128, 129))
    with pytest.raises(ValueError, match="positive and finite"):
        _model(factors=(1.0, 0.0, 1.0, 1.0, 0.95, 1.0))
    with pytest.raises(ValueError, match="whole prompt-token counts"):
        _model(tokens=(63, 64.5, 65, 127, 128, 129))
    with pytest.raises(ValueError, match="at least 2 grid points"):
        ProfiledStepModel(BASE, (64,), (1.0,))
    with pytest.raises(ValueError, match="needs 'base'"):
        step_model_from_dict({"kind": "profiled", "format": 3, "tokens": [1, 2], "factors": [1, 1]})
    with pytest.raises(ValueError, match="newer"):
        step_model_from_dict({**_model().to_dict(), "format": 99})


def test_fit_recovers_a_dip_at_a_chunk_size_whatever_the_sweep_speed():
    # a machine 1.3x slower than the fit, whose 128-token steps run 8% faster than their neighbours
    shapes, y = [], []
    rng = np.random.default_rng(0)
    for _ in range(9):
        for n in PROFILE_TOKENS:
            s = _prompt(n)
            shapes.append(s)
            y.append(1.3 * BASE.step_s(s) * (0.92 if n == 128 else 1.0) * rng.lognormal(0, 0.002))
    m = fit_profiled(BASE, shapes, y)
    assert m.tokens == PROFILE_TOKENS
    assert m.factor(128) == pytest.approx(0.92, abs=0.01)
    for n in (127, 129, 64, 256, 512):
        assert m.factor(n) == pytest.approx(1.0, abs=0.01)
    assert m.meta["profile_speed"] == pytest.approx(1.3, rel=0.02)


def test_fit_profiled_bad_input():
    s = [_prompt(n) for n in (63, 64, 65)]
    with pytest.raises(ValueError, match="shapes but"):
        fit_profiled(BASE, s, [0.01, 0.01])
    with pytest.raises(ValueError, match="positive, finite"):
        fit_profiled(BASE, s, [0.01, -1, 0.01])
    with pytest.raises(ValueError, match="without any"):
        fit_profiled(BASE, [*s[:2], StepShape(0, 2, 20)], [0.01] * 3)
    with pytest.raises(ValueError, match="both neighbours"):
        fit_profiled(BASE, [_prompt(n) for n in (32, 64, 128)], [0.01] * 3)
    with pytest.raises(TypeError, match="KindStepModel"):
        fit_profiled(PREFILL, s, [0.01] * 3)


def test_simulator_runs_it_and_noise_scaling_keep_the_correction():
    m = _model()
    tr = synthetic(60, 5.0, seed=3)
    cfg = ReplicaConfig(max_num_seqs=8, max_num_batched_tokens=128, long_prefill_token_threshold=64)
    r = simulate(tr, m, cfg)
    assert r.makespan_s > 0
    # chunks of exactly 64 tokens run faster, so the run ends no later than with the base model
    assert r.makespan_s < simulate(tr, BASE, cfg).makespan_s  # the correction applied
    big = m.scaled(2.0)
    assert isinstance(big, ProfiledStepModel)
    assert big.step_s(_prompt(64)) == pytest.approx(2 * m.step_s(_prompt(64)))
    shapes = [_prompt(n) for n in (20, 64, 100)] + [StepShape(0, r, 30 * r) for r in (1, 2, 3, 5)] * 3
    noisy = m.with_noise(shapes, [BASE.step_s(s) * 1.05 for s in shapes], seed=1)
    assert isinstance(noisy, ProfiledStepModel) and noisy.noisy and not m.noisy
    assert noisy.without_noise().step_s(_prompt(64)) == pytest.approx(m.step_s(_prompt(64)))


def test_step_profile_round_trip_and_fit_step_model_with_it():
    runs = json.loads((cal.ROOT / "data" / "sim" / "calibration_runs.json").read_text())
    fit = [cal.EngineRun.from_dict(d) for d in runs["fit"]]  # every calibration piece: each kind of step measured
    base = cal.fit_step_model(fit)
    shapes = [_prompt(n) for n in PROFILE_TOKENS for _ in range(3)]
    prof = cal.StepProfile(shapes, np.array([base.step_s(s) for s in shapes]), {"git_commit": "abc"})
    back = cal.StepProfile.from_dict(json.loads(json.dumps(prof.to_dict())))
    assert back.shapes == prof.shapes and np.allclose(back.durations, prof.durations)
    m = cal.fit_step_model(fit, profile=back)
    assert isinstance(m, ProfiledStepModel) and m.meta["profile_git_commit"] == "abc"
    assert all(f == pytest.approx(1.0, abs=1e-3) for f in m.factors)  # durations kept to 0.1 us
    with pytest.raises(ValueError, match="by_kind"):
        cal.fit_step_model(fit, profile=back, kind="linear")
    with pytest.raises(TypeError, match="StepProfile"):
        cal.fit_step_model(fit, profile={"shapes": []})
    with pytest.raises(ValueError, match="'shapes' and 'durations'"):
        cal.StepProfile.from_dict({"shapes": []})


def test_profile_prompt_steps_checks_its_input():
    with pytest.raises(ValueError, match="positive prompt-token counts"):
        cal.profile_prompt_steps((0, 5))
    with pytest.raises(ValueError, match="repeats"):
        cal.profile_prompt_steps((4, 5), repeats=0)
    with pytest.raises(ValueError, match="step budget"):
        cal.profile_prompt_steps((4, 2000))
