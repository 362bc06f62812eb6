"""The steady clock's level exponent: how much the engine's steps slow when the reference
work slows by a factor, fitted at calibration and divided out by every check. No engine
runs here (instant): the runs are built from a known model, a known wander and a known
exponent, and the fit must find them."""
import math

import numpy as np
import pytest

from servelab.sim import calibrate as cal
from servelab.sim import check
from servelab.sim.step_model import KindStepModel, LinearStepModel, StepShape

TRUE = LinearStepModel(a=0.004, c_decode=2e-4)


def _steady_run(power: float, *, exponent_used: float = 1.0, steps: int = 3000, seed: int = 0,
                offset: float = 1.0, label: str = "r", reading_noise: float = 0.0) -> cal.EngineRun:
    """A steady-clock run whose raw step times are ``TRUE``'s times x level ** power x offset,
    with the machine's level wandering slowly between 0.8 and 1.25, divided (as run_engine
    does) by the level to ``exponent_used``. The reference work is timed after every 10th
    step at 1.5 ms x the level, each timing off by a lognormal ``reading_noise``."""
    rng = np.random.default_rng(seed)
    rows = rng.choice([1, 2, 4, 8, 16, 32], size=steps)
    shapes = [StepShape(0, int(r), int(r) * 200) for r in rows]
    t = np.arange(steps)
    level = np.round(np.exp(0.11 * np.sin(t / 300.0 + seed)), 5)
    raw = np.array([TRUE.step_s(s) for s in shapes]) * level ** power * offset
    durations = raw / level ** exponent_used
    after = np.arange(9, steps, 10)  # the step each timing followed
    refs = 1.5e-3 * level[after] * np.exp(reading_noise * rng.standard_normal(len(after)))
    info = {"clock": "steady", "step_levels": level.tolist(), "level_exponent": exponent_used,
            "levels": level[::10].tolist(), "reference_s": refs.tolist(), "reference_every": 10}
    z = np.zeros(0)
    return cal.EngineRun(None, cal.CONFIGS["base"], shapes, durations, z, z, z, label, info)


def test_fit_finds_the_exponent_the_steps_follow():
    runs = [_steady_run(1.6, seed=k, offset=1 + 0.1 * k) for k in range(3)]
    fit = cal.fit_level_exponent(runs, TRUE)
    # each run's own offset (a piece the model prices 10-20% off) does not bias the slope
    assert fit["exponent"] == pytest.approx(1.6, abs=0.01)
    assert fit["r"] > 0.99 and fit["windows"] >= 8
    # the exponent a run was divided by does not change what it finds: raw times are rebuilt
    other = [_steady_run(1.6, exponent_used=1.3, seed=k) for k in range(3)]
    assert cal.fit_level_exponent(other, TRUE)["exponent"] == pytest.approx(1.6, abs=0.01)


def test_noisy_readings_of_the_level_do_not_flatten_the_exponent():
    # each timing of the reference work off by ~25%, so a window's mean reading keeps a noise
    # of about a third of the level's own swing: a plain least-squares slope on it comes out
    # flatter; the even/odd fit does not
    runs = [_steady_run(1.8, seed=k, reading_noise=0.25, steps=12000) for k in range(4)]
    fit = cal.fit_level_exponent(runs, TRUE)
    assert fit["plain_slope"] < 1.8 * 0.93
    assert fit["exponent"] == pytest.approx(1.8, abs=0.15)
    assert 0.5 < fit["reliability"] < 0.97
    even, odd, pace = cal.reference_windows(runs[0], TRUE)
    assert len(even) == len(odd) == len(pace) >= 8
    # readings that are almost all noise keep the plain division
    flat = [_steady_run(1.8, seed=k, reading_noise=0.6) for k in range(2)]
    for r in flat:
        r.info["reference_s"] = (1.5e-3 * np.exp(0.6 * np.random.default_rng(7).standard_normal(
            len(r.info["reference_s"])))).tolist()
    got = cal.fit_level_exponent(flat, TRUE)
    assert got["exponent"] == 1.0 and got["reliability"] < 0.5


def test_a_still_machine_or_a_short_run_keeps_the_plain_division():
    still = _steady_run(1.6)
    still.info["reference_s"] = [1.5e-3] * len(still.info["reference_s"])
    assert cal.fit_level_exponent([still], TRUE)["exponent"] == 1.0
    short = _steady_run(1.6, steps=40)
    fit = cal.fit_level_exponent([short], TRUE)
    assert fit["exponent"] == 1.0 and fit["r"] is None
    # a fit outside the kept range is clipped to it
    wild = _steady_run(9.0)
    assert cal.fit_level_exponent([wild], TRUE)["exponent"] == cal.LEVEL_EXPONENT_RANGE[1]


def test_relevel_changes_the_step_times_only():
    run = _steady_run(1.6)
    again = cal.relevel(run, 1.6)
    expected = np.array([TRUE.step_s(s) for s in run.shapes])
    assert np.allclose(again.durations, expected)  # the wander divided out entirely
    assert again.info["level_exponent"] == 1.6 and run.info["level_exponent"] == 1.0
    assert again.shapes is run.shapes and again.ttft is run.ttft
    back = cal.relevel(again, 1.0)
    assert np.allclose(back.durations, run.durations)
    cpu = cal.EngineRun(None, None, run.shapes, run.durations, run.ttft, run.tpot, run.e2e, "cpu",
                        {"clock": "cpu"})
    with pytest.raises(ValueError, match="not on the steady clock"):
        cal.relevel(cpu, 1.5)


def test_step_levels_rebuilt_for_runs_recorded_before_they_were_kept():
    run = _steady_run(1.0, steps=35)
    levels = run.info.pop("step_levels")
    run.info["levels"] = [1.1, 1.2, 1.3]  # after steps 10, 20 and 30
    got = cal.step_levels(run)
    assert got[:20].tolist() == [1.1] * 20 and got[20:30].tolist() == [1.2] * 10
    assert got[30:].tolist() == [1.3] * 5 and len(levels) == 35
    # a run timed its reference every 30 steps: the levels land 30 steps apart
    run.info["reference_every"] = 30
    run.info["levels"] = [1.1, 1.2]
    wide = cal.step_levels(cal.EngineRun(None, run.config, run.shapes * 2, np.concatenate(
        [run.durations] * 2), run.ttft, run.tpot, run.e2e, "w", run.info))
    assert wide[:60].tolist() == [1.1] * 60 and wide[60:].tolist() == [1.2] * 10


def test_the_reference_is_warmed_before_each_timing():
    """Right after the engine's big steps the reference runs slow for several passes
    (steady.AFTER_BIG_STEPS_MS); each timing follows REFERENCE_WARM untimed ones."""
    calls = []
    assert cal.time_reference(lambda: calls.append(1)) >= 0
    assert len(calls) == cal.REFERENCE_WARM + 1
    from servelab.sim import steady
    passes_to_settle = next(i for i, ms in enumerate(steady.AFTER_BIG_STEPS_MS)
                            if ms <= 1.2 * max(steady.WARM_MS))
    assert cal.REFERENCE_WARM >= passes_to_settle


def test_calibration_fit_divides_the_wander_out_and_records_the_exponent():
    runs = [_steady_run(1.5, seed=k) for k in range(3)]
    model, fitted = cal.fit_calibration(runs)
    assert model.meta["level_exponent"] == pytest.approx(1.5, abs=0.02)
    assert model.meta["level_exponent_fit"]["windows"] >= 8
    assert all(r.info["level_exponent"] == model.meta["level_exponent"] for r in fitted)
    shapes = [StepShape(0, r, 200 * r) for r in (1, 8, 32)]
    for s in shapes:
        assert model.step_s(s) == pytest.approx(TRUE.step_s(s), rel=0.03)
    # the plain division leaves half the wander in the steps: its windows still follow the level
    assert cal.fit_level_exponent(runs, cal.fit_step_model(runs))["exponent"] == pytest.approx(1.5, abs=0.05)
    # runs without levels (another clock) fit as before, with no exponent
    cpu = [cal.EngineRun(None, None, r.shapes, r.durations, r.ttft, r.tpot, r.e2e, "c", {"clock": "cpu"})
           for r in runs]
    model_cpu, _ = cal.fit_calibration(cpu)
    assert "level_exponent" not in model_cpu.meta


def test_a_check_divides_by_the_calibrations_exponent():
    assert check.model_level_exponent(LinearStepModel(a=0.01)) == 1.0
    m = LinearStepModel(a=0.01)
    m.meta["level_exponent"] = 1.55
    assert check.model_level_exponent(m) == 1.55


@pytest.mark.parametrize("bad", [0, -1.0, math.nan, math.inf, True, "1.5"])
def test_run_engine_refuses_a_bad_exponent(bad):
    with pytest.raises(ValueError, match="level_exponent must be a positive number"):
        cal.run_engine(None, clock="steady", level_exponent=bad)


def test_the_committed_calibration_records_its_power():
    model = cal.load_step_model(cal.DEFAULT_STEP_MODEL)
    meta = model.meta
    assert meta["clock"] == "steady"
    lo, hi = cal.LEVEL_EXPONENT_RANGE
    assert lo <= meta["level_exponent"] <= hi
    assert meta["level_exponent_fit"]["exponent"] == meta["level_exponent"]
    # the prompt work's own power, and the reference work the level was read from
    assert 0.1 <= meta["prompt_level_exponent"] <= hi
    assert meta["prompt_level_exponent_fit"]["exponent"] == meta["prompt_level_exponent"]
    assert meta["reference_work"] == cal.REFERENCE_NAME


def test_windows_close_when_their_time_is_reached_and_drop_a_short_tail():
    got = cal.window_slices([0.5, 0.6, 1.0, 0.2, 2.5, 0.1], 1.0)
    assert got == [slice(0, 2), slice(2, 3), slice(3, 5)]  # the last 0.1 s is no window


def test_each_check_names_the_reference_work_its_clock_read():
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import bench_sim
    steady = {"model": {"meta": {"clock": "steady"}}}
    assert bench_sim.reference_of(steady) == bench_sim.OLD_REFERENCE  # checks from before it was named
    steady["model"]["meta"]["reference_work"] = cal.REFERENCE_NAME
    assert bench_sim.reference_of(steady) == cal.REFERENCE_NAME
    assert bench_sim.reference_of({"model": {"meta": {"clock": "cpu"}}}) is None
    assert str(cal.REFERENCE_ROWS) in cal.REFERENCE_NAME and str(cal.REFERENCE_CONTEXT) in cal.REFERENCE_NAME


#: A decode line and a prompt line, for the prompt work's own power.
TRUE_BY_KIND = KindStepModel(LinearStepModel(a=0.004, c_decode=2e-4, d_context=1e-7),
                             LinearStepModel(a=0.004, b_prefill=1.5e-4, e_pairs=2e-8, c_decode=2e-4))


def _mixed_steps(rng, n: int, prompt_share: float) -> list:
    """``n`` steps: that share of them prompts of 16-512 tokens (with 0-7 decode rows), the rest
    decode steps of 1-16 rows."""
    shapes = []
    for _ in range(n):
        if rng.random() < prompt_share:
            p = int(rng.choice([16, 64, 256, 512]))
            shapes.append(StepShape(p, int(rng.integers(0, 8)), 800, p * (p + 1) / 2, 1, 0))
        else:
            r = int(rng.choice([1, 2, 4, 8, 16]))
            shapes.append(StepShape(0, r, r * 200))
    return shapes


def test_prompt_work_gets_its_own_power_by_its_share_of_the_step():
    true = TRUE_BY_KIND
    runs = []
    for k in range(3):
        rng = np.random.default_rng(k)
        shapes = _mixed_steps(rng, 4000, 0.15)
        t = np.arange(len(shapes))
        level = np.round(np.exp(0.2 * np.sin(t / 300.0 + k)), 5)
        power = cal.step_exponents(shapes, 0.9, 0.4, true)
        durations = np.array([true.step_s(s) for s in shapes]) * level ** power / level  # divided at power 1
        refs = 5e-3 * level[np.arange(9, len(shapes), 10)]
        info = {"clock": "steady", "step_levels": level.tolist(), "level_exponent": 1.0,
                "reference_s": refs.tolist(), "reference_every": 10}
        z = np.zeros(0)
        runs.append(cal.EngineRun(None, cal.CONFIGS["base"], shapes, durations, z, z, z, f"r{k}", info))
    share = [cal.prompt_share(true, s) for s in runs[0].shapes]
    assert min(share) == 0.0 and 0.8 < max(share) < 1.0  # decode steps none; a long prompt most
    model, fitted = cal.fit_calibration(runs)
    assert model.meta["level_exponent"] == pytest.approx(0.9, abs=0.05)
    assert model.meta["prompt_level_exponent"] == pytest.approx(0.4, abs=0.1)
    # relevelled by the fitted powers, the wander is gone: steps are the true model's again
    s = StepShape(512, 2, 800, 512 * 513 / 2, 1, 0)
    assert model.step_s(s) == pytest.approx(true.step_s(s), rel=0.05)
    with pytest.raises(ValueError, match="prompt_level_exponent must be a positive number"):
        cal.run_engine(None, clock="steady", prompt_level_exponent=-1.0)


def test_prompt_power_is_read_between_rounds_of_a_piece():
    """Each step's level is a noisy, lagging reading, so a step-by-step slope of prompt work on
    it comes out flat; two rounds of each piece, run when the machine stood at other levels,
    read the power from the runs' levels on the whole."""
    true = TRUE_BY_KIND
    runs = []
    for k, (piece, mean_level) in enumerate([("sweep", 0.7), ("chunked", 0.8), ("sweep (2)", 1.1),
                                             ("chunked (2)", 1.0), ("mix", 0.9), ("mix (2)", 1.3)]):
        rng = np.random.default_rng(k)
        shapes = _mixed_steps(rng, 3000, 0.2)
        t = np.arange(len(shapes))
        level = mean_level * np.exp(0.1 * np.sin(t / 200.0 + k))
        reading = level * np.exp(0.15 * rng.standard_normal(len(shapes)))  # each step's noisy level
        power = cal.step_exponents(shapes, 0.9, 0.5, true)
        durations = np.array([true.step_s(s) for s in shapes]) * level ** power / reading
        info = {"clock": "steady", "step_levels": reading.tolist(), "level_exponent": 1.0}
        z = np.zeros(0)
        runs.append(cal.EngineRun(None, cal.CONFIGS["base"], shapes, durations, z, z, z, piece, info))
    assert cal.piece_of("sweep (2)") == "sweep" and cal.piece_of("bursts #3") == "bursts"
    fit = cal.fit_prompt_exponent(runs, true, 0.9)
    assert fit["how"] == "between runs" and fit["exponent"] == pytest.approx(0.5, abs=0.08)
    within = cal.fit_prompt_exponent([r for r in runs if "(2)" not in r.label], true, 0.9)
    assert within["how"] == "within runs" and within["exponent"] < 0.4  # flattened by the readings' noise
