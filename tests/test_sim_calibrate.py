"""Calibration plumbing: the real engine on a tiny trace, the fit, the comparison, the CLI.

Fast by design (a dozen short requests on the course's small model); the long
engine runs and the 10% goal live in benchmarks/bench_sim.py.
"""
import json
from pathlib import Path

import numpy as np
import pytest

from servelab.sim import KindStepModel, LinearStepModel, ReplicaConfig, Trace, save_trace
from servelab.sim import calibrate as cal
from servelab.sim.__main__ import main

CFG = ReplicaConfig(max_num_seqs=8, max_num_batched_tokens=256, num_kv_blocks=256)
TRACE = Trace(np.arange(12) * 0.01, [20, 40, 60, 80, 100, 30, 50, 70, 90, 110, 25, 45],
              [3, 5, 4, 6, 2, 5, 3, 4, 6, 2, 5, 4])


@pytest.fixture(scope="module")
def run():
    return cal.run_engine(TRACE, CFG, label="tiny", warmup=2)


def test_engine_run_records_every_step(run):
    assert len(run.shapes) == len(run.durations) > 0
    assert np.all(run.durations > 0)
    # every prompt token computed once, every output token after the first decoded once
    assert sum(s.prefill_tokens for s in run.shapes) == int(TRACE.prompt_tokens.sum())
    assert sum(s.decode_rows for s in run.shapes) == int((TRACE.output_tokens - 1).sum())
    assert np.all(run.ttft > 0) and np.all(run.e2e >= run.ttft)
    assert run.info["git_commit"] and run.info["machine"]["cpu"]
    back = cal.EngineRun.from_dict(json.loads(json.dumps(run.to_dict())))
    assert back.shapes == run.shapes and back.config == run.config


def test_fit_and_compare(run):
    model = cal.fit_step_model([run], features=("prefill_tokens", "decode_rows"), kind="linear")
    assert isinstance(model, LinearStepModel) and model.a > 0
    c = cal.compare(run, model)
    assert set(c.errors) == set(cal.METRICS)
    assert c.table().splitlines()[-1].startswith("worst error: ")
    assert c.worst == max(abs(e) for e in c.errors.values())


def test_cpu_clock_run_is_a_virtual_timeline(run):
    """The default clock: step durations are CPU times and the requests' times are on the
    virtual clock they advance (so TTFT of the first request is at least its first step)."""
    assert run.info["clock"] == "cpu" and run.info["engine_tree"] in ("clean", "modified", "snapshot")
    busy = run.durations.sum()
    assert run.e2e.max() <= TRACE.arrival_s.max() + busy + 1e-9  # nothing waits but for steps
    assert np.all(run.ttft >= run.durations.min() - 1e-12)


def test_reference_work_tracks_the_machine():
    r = cal.run_engine(TRACE.subset(slice(0, 4)), CFG, label="ref", warmup=1, probe=False, reference_every=2)
    refs = r.info["reference_s"]
    assert len(refs) == len(r.shapes) // 2 and all(x > 0 for x in refs)
    assert cal.reference_drift(r, min_count=2) >= 1.0 and cal.reference_drift(r, min_count=10**6) is None
    model = cal.fit_step_model([r], features=("prefill_tokens", "decode_rows"), kind="linear")
    assert model.meta["reference_s"] == pytest.approx(float(np.median(refs)))
    assert cal.speed_factor(r, model) == pytest.approx(1.0)


def test_steady_clock_divides_each_step_by_the_machines_level():
    """The steady clock: five reference timings before the first step set the base (or the
    caller's), every ``reference_every`` steps a new timing moves the level (median of the latest
    three over the base), and each step's CPU time is divided by the level then."""
    r = cal.run_engine(TRACE.subset(slice(0, 6)), CFG, label="steady", warmup=1, probe=False, clock="steady",
                       reference_every=2)
    assert r.info["clock"] == "steady" and r.info["reference_base_s"] > 0
    assert len(r.info["levels"]) == len(r.info["reference_s"]) == len(r.shapes) // 2
    assert all(x > 0 for x in r.info["levels"]) and np.all(r.durations > 0)
    # a base twice the machine's reference time: every step reads about half its CPU time
    half = cal.run_engine(TRACE.subset(slice(0, 6)), CFG, label="half", warmup=1, probe=False, clock="steady",
                          reference_every=2, reference_base=2 * r.info["reference_base_s"])
    assert half.info["reference_base_s"] == 2 * r.info["reference_base_s"]
    assert np.median(half.info["levels"]) < 0.8  # the machine reads as twice as fast as the base
    with pytest.raises(ValueError, match="reference_every"):
        cal.run_engine(TRACE, CFG, clock="steady", reference_every=0)
    with pytest.raises(ValueError, match="reference_base"):
        cal.run_engine(TRACE, CFG, clock="steady", reference_base=-1.0)


def test_wall_clock_still_runs():
    r = cal.run_engine(TRACE.subset(slice(0, 4)), CFG, label="wall", warmup=1, clock="wall", probe=False)
    assert r.info["clock"] == "wall" and np.all(r.ttft > 0) and len(r.durations) == len(r.shapes)
    with pytest.raises(ValueError, match="clock"):
        cal.run_engine(TRACE, CFG, clock="sundial")


def test_by_kind_fit_falls_back_on_a_tiny_run(run):
    """A run with too few steps of one kind gets the one-line model, with a note saying why."""
    model = cal.fit_step_model([run])
    assert isinstance(model, (LinearStepModel, KindStepModel))
    if isinstance(model, LinearStepModel):
        assert "one line" in model.meta["note"]


def test_old_step_model_files_still_load(tmp_path):
    old = {"kind": "linear", "a": 0.004, "b_prefill": 1e-4, "c_decode": 2e-4, "d_context": 0.0, "e_pairs": 0.0,
           "f_chunks": 0.0, "meta": {}, "noise": [], "noise_seed": 0, "bin_edges": [2], "bin_costs": [0.001]}
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old))
    m = cal.load_step_model(path)
    assert isinstance(m, LinearStepModel) and m.bin_on == "rows"
    path.write_text(json.dumps({**old, "format": 99}))
    with pytest.raises(ValueError, match="newer"):
        cal.load_step_model(path)
    path.write_text("not json")
    with pytest.raises(ValueError, match="not a saved step model"):
        cal.load_step_model(path)


def test_build_llm_is_public():
    with pytest.raises(TypeError, match="ReplicaConfig"):
        cal.build_llm({"max_num_seqs": 2})


def test_cli_check(tmp_path, run, capsys):
    model = cal.fit_step_model([run], features=("prefill_tokens", "decode_rows"), kind="linear")
    mpath = cal.save_step_model(model, tmp_path / "m.json")
    tpath = save_trace(TRACE.subset(slice(0, 6)), tmp_path / "t.jsonl")
    rc = main(["check", "--trace", str(tpath), "--step-model", str(mpath), "--max-num-seqs", "8",
               "--max-num-batched-tokens", "256", "--num-kv-blocks", "256", "--repeats", "1", "--relevel"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "ttft_p95" in out and out.strip().splitlines()[-1].startswith("worst error: ")
    assert "clock: cpu" in out  # the step model's own clock (fitted to a CPU-clock run)
    # the level probe ran after the run; with one run, the own-trace fit is fitted to it
    assert "machine speed vs the calibration" in out and "scaled by that speed" in out and "other runs" in out


def test_a_steady_check_needs_the_calibrations_reference_time(tmp_path, capsys):
    """A step model that says it was calibrated on the steady clock but carries no reference
    time cannot be checked on it: the error names the missing field and both ways out."""
    model = LinearStepModel(a=0.004, meta={"clock": "steady"})
    mpath = cal.save_step_model(model, tmp_path / "m.json")
    tpath = save_trace(TRACE.subset(slice(0, 2)), tmp_path / "t.jsonl")
    assert main(["check", "--trace", str(tpath), "--step-model", str(mpath), "--repeats", "1"]) == 2
    err = capsys.readouterr().err
    assert "reference_base_s" in err and "calibrate" in err and "--clock cpu" in err


def test_cli_errors_are_clear(tmp_path, capsys):
    empty = tmp_path / "e.jsonl"
    empty.write_text("")
    assert main(["check", "--trace", str(empty), "--step-model", str(tmp_path / "none.json")]) == 2
    assert "empty" in capsys.readouterr().err
    assert main(["check", "--trace", str(tmp_path / "missing.jsonl")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_too_long_for_the_model_is_refused():
    with pytest.raises(ValueError, match="context"):
        cal.run_engine(Trace([0.0], [1000], [100]), CFG, warmup=0)


def test_rate_for_busy_hits_its_target():
    model = LinearStepModel(a=0.003, b_prefill=3e-5, c_decode=2e-4)
    cfg = cal.CONFIGS["base"]
    rate = cal.rate_for_busy(model, cfg, 0.5, n=200, **cal.SHORT)
    from servelab.sim import simulate, synthetic
    busy = simulate(synthetic(200, rate, seed=0, **cal.SHORT), model, cfg).utilisation
    assert busy == pytest.approx(0.5, abs=0.02)


def test_saved_calibration_if_present():
    """The committed calibration (benchmarks/bench_sim.py) loads and predicts finite percentiles."""
    if not cal.DEFAULT_STEP_MODEL.exists():
        pytest.skip("no saved step model yet")
    model = cal.load_step_model()
    runs = Path(cal.DEFAULT_STEP_MODEL).with_name("calibration_runs.json")
    assert model.meta.get("git_commit")
    if runs.exists():
        data = json.loads(runs.read_text())
        r = cal.EngineRun.from_dict(data["held_out"][0])
        c = cal.compare(r, model)
        assert all(np.isfinite(v) for v in c.predicted.values())


def test_long_prompt_interference_in_the_engine():
    llm = cal.build_llm(ReplicaConfig(max_num_seqs=3, max_num_batched_tokens=1024, num_kv_blocks=256))
    whole = cal.long_prompt_interference(None, llm=llm, streams=2, stream_tokens=12, long_prompt=300,
                                         arrive_after=3)
    chunked = cal.long_prompt_interference(64, llm=llm, streams=2, stream_tokens=12, long_prompt=300,
                                           arrive_after=3)
    assert whole["prefill_steps"] == 1 and chunked["prefill_steps"] == 5  # ceil(300 / 64)
    assert len(whole["gaps"]) == 2 * 11 and whole["ttft_s"] > 0


def test_speed_probe_scales_the_model(run):
    assert run.info["probe_s"] > 0
    model = cal.fit_step_model([run], features=("prefill_tokens", "decode_rows"), kind="linear")
    model.meta.pop("reference_s", None)  # without in-run reference timings the probe decides
    assert model.meta["probe_s"] == run.info["probe_s"]
    assert cal.speed_factor(run, model) == 1.0
    model.meta["probe_s"] = run.info["probe_s"] / 2  # the fit ran twice as fast as now
    assert cal.speed_factor(run, model) == pytest.approx(2.0)
    slow = model.scaled(2.0)
    assert slow.step_s(run.shapes[0]) == pytest.approx(2 * model.step_s(run.shapes[0]))
    assert cal.compare(run, model, normalise=True).predicted == cal.compare(run, slow).predicted
