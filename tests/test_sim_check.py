"""The simulator's calibration where it runs: fingerprints, the per-machine cache, the sweep,
residuals by feature and the check beside the engine's spread. No engine runs here (instant);
tests/test_sim_calibrate.py runs the engine on a tiny trace through the command line."""
import json

import numpy as np
import pytest

from servelab.sim import calibrate as cal
from servelab.sim import check, fingerprint
from servelab.sim.step_model import LinearStepModel, StepShape
from servelab.sim.sweep import GAP_S, SWEEP_CONFIGS, residuals_by_feature, sweep_traces


def test_fingerprint_follows_code_not_documentation(tmp_path):
    src = 'def f(x):\n    """Doc."""\n    return x + 1  # one\n'
    docs = 'def f(x):\n    """Other words."""\n    # a comment\n    return x + 1\n'
    code = 'def f(x):\n    """Doc."""\n    return x + 2\n'
    paths = {}
    for name, text in (("a", src), ("b", docs), ("c", code)):
        paths[name] = tmp_path / f"{name}.py"
        paths[name].write_text(text)
    fp = {k: fingerprint.engine_fingerprint({"m": p}) for k, p in paths.items()}
    assert fp["a"] == fp["b"] != fp["c"]


def test_step_path_is_found_by_imports():
    files = fingerprint.step_path_files()
    for must in ("servelab.model", "servelab.paged", "servelab.engine.model_runner", "servelab.engine.scheduler"):
        assert must in files
    assert not set(files) & fingerprint.NOT_STEP_PATH
    assert fingerprint.machine_key() == fingerprint.machine_key() and len(fingerprint.machine_key()) == 12


def test_cache_is_keyed_by_machine_engine_and_checkpoint(tmp_path, monkeypatch):
    monkeypatch.setenv(check.CACHE_ENV, str(tmp_path))
    p = check.cache_path()
    assert p.parent == tmp_path / "sim"
    assert fingerprint.machine_key() in p.name and fingerprint.engine_fingerprint() in p.name
    assert check.cache_path(quick=False) != p
    assert check.cache_path(clock="cpu") != p  # a calibration on another clock is another model
    # a cached calibration is used as it is: nothing is measured
    m = LinearStepModel(a=0.004, meta={"engine_fingerprint": fingerprint.engine_fingerprint(),
                                       "machine_key": fingerprint.machine_key(), "model": check.model_tag()})
    cal.save_step_model(m, p)
    said = []
    got, where = check.step_model_here(say=said.append)
    assert where == p and got.a == 0.004 and not said
    assert check.stale_reasons(got) == []
    assert len(check.stale_reasons(LinearStepModel(a=0.004))) == 2


def test_sweep_covers_the_space_within_the_replica():
    traces = sweep_traces(quick=True)
    assert set(traces) == {"sweep", "chunked", "preemption"}
    tr, cfg = traces["sweep"]
    # lone prompts on an idle engine, and the random streams' pieces, are in the sweep
    starts, counts = np.unique(np.floor(tr.arrival_s / GAP_S), return_counts=True)
    assert (counts == 1).sum() >= 16
    # the pieces come in a shuffled order: the decode grid's sizes are not laid out ascending
    first = [int(tr.prompt_tokens[tr.arrival_s // GAP_S == k].size) for k in starts[:20]]
    assert first != sorted(first)
    assert int((tr.prompt_tokens + tr.output_tokens).max()) <= 1024
    assert (tr.prefix_group >= 0).any()
    # the decode grid reaches the seat limit
    starts = np.round(tr.arrival_s, 3)
    assert max(np.unique(starts, return_counts=True)[1]) >= cfg.max_num_seqs
    tight, tcfg = traces["preemption"]
    assert tcfg is SWEEP_CONFIGS["tight"]
    need = int(((tight.prompt_tokens + tight.output_tokens + 15) // 16).sum())
    assert need > tcfg.num_kv_blocks  # the pool cannot hold them all: preemption


def test_residuals_by_feature_find_a_planted_miss():
    model = LinearStepModel(a=0.004, c_decode=1e-4)
    shapes = [StepShape(0, r, 100 * r) for r in (1, 2, 4, 8, 16, 24, 32) for _ in range(10)]
    durs = [model.step_s(s) * (1.3 if s.decode_rows >= 24 else 1.0) for s in shapes]
    res = residuals_by_feature(model, shapes, durs)
    rows = {r["bin"]: r["median_measured_over_predicted"] for r in res["decode rows"]}
    assert rows["24+"] == pytest.approx(1.3) and rows["1"] == pytest.approx(1.0)
    assert res["step kind"][0]["bin"] == "decode"


def test_spread_check_reports_each_error_beside_the_spread():
    runs = [{"ttft_p50": 0.10, "ttft_p95": 0.30, "tpot_p50": 0.010, "tpot_p95": 0.020},
            {"ttft_p50": 0.12, "ttft_p95": 0.34, "tpot_p50": 0.012, "tpot_p95": 0.022},
            {"ttft_p50": 0.11, "ttft_p95": 0.32, "tpot_p50": 0.011, "tpot_p95": 0.021}]
    pred = {"ttft_p50": 0.11, "ttft_p95": 0.40, "tpot_p50": 0.011, "tpot_p95": 0.021}
    c = check.SpreadCheck("t", runs, pred)
    assert c.measured["ttft_p95"] == pytest.approx(0.32)
    assert c.spread["ttft_p50"] == pytest.approx(0.01 / 0.11)
    assert c.worst == pytest.approx(0.25)
    lines = c.table().splitlines()
    assert lines[-1] == "worst error: 25.0%" and "spread" in lines[0]
    assert json.loads(json.dumps(c.to_dict()))["worst"] == pytest.approx(0.25)
    with pytest.raises(ValueError, match="repeats"):
        check.check_trace(None, None, repeats=0)


def test_noise_floor_is_what_a_perfect_simulator_scores_against_noisy_medians():
    rng = np.random.default_rng(3)
    truth = {"ttft_p50": 0.1, "ttft_p95": 0.3, "tpot_p50": 0.01, "tpot_p95": 0.02}
    sd = {"ttft_p50": 0.02, "ttft_p95": 0.10, "tpot_p50": 0.03, "tpot_p95": 0.15}  # relative, per run

    def noisy_check(n):
        runs = [{k: v * (1 + sd[k] * rng.normal()) for k, v in truth.items()} for _ in range(n)]
        return check.SpreadCheck("t", runs, dict(truth))
    # the standard error follows the runs' spread and shrinks with more of them
    se = np.mean([noisy_check(5).median_noise["tpot_p95"] for _ in range(300)])
    assert se == pytest.approx(np.sqrt(np.pi / 2) * 0.15 / np.sqrt(5), rel=0.15)
    assert np.mean([noisy_check(20).median_noise["tpot_p95"] for _ in range(300)]) < se * 0.6
    # a perfect prediction's worst error over six families, measured, is about what noise_floor
    # expects of it from each check's own runs
    trials = [[noisy_check(5) for _ in range(6)] for _ in range(150)]
    actual = np.mean([max(c.worst for c in checks) for checks in trials])
    expected = np.mean([check.noise_floor(checks, draws=2000)["expected_worst"] for checks in trials])
    assert expected == pytest.approx(actual, rel=0.2)
    floor = check.noise_floor(trials[0], goal_worst=0.15)
    assert floor["worst_p90"] > floor["expected_worst"] > floor["expected_median"] > 0
    assert 0 < floor["p_over_goal"] < 1 and check.noise_floor(trials[0])["p_over_goal"] is None
    assert check.SpreadCheck("one", [truth], truth).median_noise == {k: 0.0 for k in truth}
    with pytest.raises(ValueError, match="at least one check"):
        check.noise_floor([])


def test_residuals_by_decode_groups_when_the_runs_recorded_them():
    model = LinearStepModel(a=0.004, c_decode=1e-4)
    shapes = [StepShape(0, 8, 800)] * 20 + [StepShape(64, 0, 0, 2080.0, 1, 64)] * 5
    groups = [1] * 10 + [4] * 10 + [0] * 5
    durs = [model.step_s(s) * (1.2 if g == 4 else 1.0) for s, g in zip(shapes, groups)]
    res = residuals_by_feature(model, shapes, durs, decode_groups=groups)
    rows = {r["bin"]: r["median_measured_over_predicted"] for r in res["decode groups (decode steps)"]}
    assert rows == {"1": pytest.approx(1.0), "4-5": pytest.approx(1.2)}
    assert "decode groups (decode steps)" not in residuals_by_feature(model, shapes, durs)


def _run_like_engine(trace, model, config, label="r"):
    """An EngineRun made by the simulator (as if the engine had run at ``model``'s speed)."""
    from servelab.sim.core import simulate
    sim = simulate(trace, model, config)
    return cal.EngineRun(trace, config, [], np.zeros(0), sim.ttft, sim.tpot, sim.ttft, label)


def test_relevelled_prediction_takes_the_machine_speed_from_the_probe():
    from servelab.workload import synthetic
    model = LinearStepModel(a=0.004, c_decode=2e-4, d_context=1e-6, b_prefill=5e-5)
    config = cal.CONFIGS["base"]
    trace = synthetic(80, 20.0, seed=3)
    slow = [_run_like_engine(trace, model.scaled(1.3), config, f"r{k}") for k in range(2)]
    plain = check.spread_check("t", slow, model, own_fit=False)
    assert plain.relevelled is None  # no run had a level probe
    slow[0].info["level"] = 1.3
    assert check.spread_check("t", slow, model, own_fit=False).relevelled is None  # one run lacks it
    slow[1].info["level"] = 1.3
    c = check.spread_check("t", slow, model, own_fit=False)
    assert max(abs(v) for v in c.errors_relevelled.values()) < 1e-9  # scaled by the probe: the runs
    assert c.worst > 0.15  # as calibrated it misses: the verdict
    assert c.info["levels"] == [1.3, 1.3] and plain.predicted == c.predicted
    text = c.table()
    assert "1.30x" in text and "scaled by that speed" in text and text.splitlines()[-1].startswith("worst error:")


def test_machine_level_is_measured_over_predicted_step_time():
    model = LinearStepModel(a=0.004, c_decode=2e-4)
    shapes = [StepShape(0, r, 50 * r) for r in (1, 4, 16)]
    run = cal.EngineRun(None, cal.CONFIGS["base"], shapes, np.array([model.step_s(s) * 1.25 for s in shapes]),
                        np.zeros(0), np.zeros(0), np.zeros(0))
    assert check.machine_level(run, model) == pytest.approx(1.25)
    with pytest.raises(ValueError, match="no steps"):
        check.machine_level(cal.EngineRun(None, None, [], np.zeros(0), *[np.zeros(0)] * 3), model)
    probe = check.level_probe_trace()
    assert len(probe) == 60 and probe.timed  # the quick calibration's poisson-mix piece


def test_speed_windows_find_a_wander_within_a_run():
    model = LinearStepModel(a=0.010)
    shapes = [StepShape(0, 1, 10)] * 400
    durs = np.array([0.010] * 200 + [0.012] * 200)  # the second half runs a fifth slow
    run = cal.EngineRun(None, None, shapes, durs, np.zeros(0), np.zeros(0), np.zeros(0), "r")
    w = check.speed_windows(run, model, window_s=0.5)
    assert len(w) == 8  # 4.4 s of steps: the last 0.4 s window dropped
    assert w[0] == pytest.approx(1.0) and w[-1] == pytest.approx(1.2)
    with pytest.raises(ValueError, match="window_s"):
        check.speed_windows(run, model, window_s=0)


def test_prediction_is_the_median_over_the_model_scaled_a_little():
    """One simulation of a finite trace sits on a knife-edge (a p95 of 120 requests is its
    sixth-largest value); the check predicts with the median over the model scaled a little
    either way (check.PREDICT_SCALES), so a 0.2% change cannot swing it."""
    import json as _json
    from servelab.sim.step_model import step_model_from_dict
    from servelab.workload import load_trace
    model = step_model_from_dict(_json.loads((cal.ROOT / "data/sim/step_model.json").read_text()))
    trace = load_trace(cal.ROOT / "data/sim/traces/long_prompts.jsonl")
    config = cal.CONFIGS["base"]
    assert min(check.PREDICT_SCALES) >= 0.95 and max(check.PREDICT_SCALES) <= 1.05
    assert sorted(check.PREDICT_SCALES) == sorted(2 - x for x in check.PREDICT_SCALES)  # symmetric
    assert 1.0 in check.PREDICT_SCALES and len(check.PREDICT_SCALES) % 2 == 1
    once = [check.predict(trace, model.scaled(x), config, scales=(1.0,)) for x in check.PREDICT_SCALES]
    ens = check.predict(trace, model, config)
    for k in cal.METRICS:
        assert ens[k] == pytest.approx(float(np.median([p[k] for p in once])))
    # the ensemble moves little when every step moves 0.2%; single simulations can jump
    nudged = check.predict(trace, model.scaled(1.002), config)
    assert all(abs(nudged[k] / ens[k] - 1) < 0.05 for k in cal.METRICS)


def test_check_history_marks_the_present_method_and_tallies_by_processor():
    ref = cal.REFERENCE_NAME
    result = {"held_out_worst": 0.12, "held_out_median": 0.03,
              "engine_measured_at": {"clock": "steady", "machine": {"cpu": "AMD EPYC"}, "git_commit": "abc1234"},
              "model": {"meta": {"reference_work": ref, "level_exponent": 1.0, "prompt_level_exponent": 0.6}},
              "rows": [{"set": "fit", "requests": 750}, {"set": "held-out", "requests": 360},
                       {"set": "held-out", "requests": 180}],
              "noise_floor": {"expected_worst": 0.05},
              "history": [
                  {"worst": 0.2, "median": 0.05, "cpu": "Intel(R) Xeon(R) Processor", "clock": "steady",
                   "reference": ref, "level_exponent": 0.9, "prompt_level_exponent": 0.5,
                   "requests": [120, 60], "noise_floor": 0.11, "git_commit": "def5678"},
                  {"worst": 0.1, "median": 0.04, "cpu": "Intel(R) Xeon(R) Processor", "clock": "steady",
                   "reference": "one row through the weights", "level_exponent": 1.4},
                  {"worst": 0.14, "median": 0.06, "clock": "cpu"}]}
    checks = check.check_history(result)
    assert [h["present"] for h in checks] == [True, True, False, False]
    assert checks[0]["worst"] == 0.12 and checks[0]["cpu"] == "AMD EPYC"
    assert [h["requests"] for h in checks] == [[360, 180], [120, 60], None, None]
    assert [h["noise_floor"] for h in checks] == [0.05, 0.11, None, None]
    assert [h["git_commit"] for h in checks] == ["abc1234", "def5678", None, None]
    assert all(h["predicted_before"] is None for h in checks)
    goal = {"worst": 0.15, "median": 0.07}
    assert check.met_by_cpu([h for h in checks if h["present"]], goal) == {"AMD EPYC": [1, 1], "Intel Xeon": [1, 0]}
    assert check.met_by_cpu(checks[3:], goal) == {"unrecorded": [1, 1]}
    assert check.cpu_label("Intel(R) Xeon(R) Processor") == "Intel Xeon" and check.cpu_label(None) == "unrecorded"
