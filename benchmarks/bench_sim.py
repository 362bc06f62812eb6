"""Simulator benchmarks: speed, and the calibration against the real engine (an error table like Vidur's).

    .venv/bin/python benchmarks/bench_sim.py                  # full run (~15-25 min, 1 thread)
    .venv/bin/python benchmarks/bench_sim.py --speed-only     # the million-request timing only
    .venv/bin/python benchmarks/bench_sim.py --quick --out D  # smoke run (seconds), into folder D

Writes sim.md and sim.json into benchmarks/results/ (or ``--out``); the full run
also saves the fitted step model (data/sim/step_model.json) and every engine
run it measured (data/sim/calibration_runs.json), which the unit tests and the
chapters read.

Calibration, as Vidur does it (Agrawal et al., "Vidur: A Large-Scale Simulation
Framework for LLM Inference", MLSys 2024): fit the step model on one set of
real engine runs, then predict the engine's TTFT and TPOT percentiles on
held-out workloads that differ in arrival rate, burstiness, length mix, chunk
size and prefix hits, and publish the error of each. The engine serves each
trace in real time on one thread; rates are set from a probe run so that each
workload loads *this* machine as intended.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from servelab import machine
from servelab.sim import ReplicaConfig, RooflineStepModel, simulate, synthetic
from servelab.sim import calibrate as cal
from servelab.sim.workload import Exponential, LogNormal

ROOT = Path(__file__).resolve().parents[1]
RUNS_PATH = ROOT / "data" / "sim" / "calibration_runs.json"


def speed(n: int) -> dict:
    """``n`` requests through one 8B replica on an H100 (roofline), at about 85% of its capacity."""
    model = RooflineStepModel.for_tier("small")
    cfg = ReplicaConfig(max_num_seqs=64, max_num_batched_tokens=8192, num_kv_blocks=29_000)
    lengths = dict(prompt=LogNormal(1000, 0.5, 16, 8000), output=Exponential(200, 2000))
    trace = synthetic(n, 9.0, seed=1, **lengths)
    t0 = time.process_time()
    w0 = time.perf_counter()
    r = simulate(trace, model, cfg, progress=False)
    cpu = time.process_time() - t0
    wall = time.perf_counter() - w0
    s = r.summary()
    return {"requests": n, "rate": 9.0, "cpu_s": round(cpu, 2), "wall_s": round(wall, 2),
            "requests_per_cpu_s": round(n / cpu), "steps": r.num_steps, "utilisation": round(s["utilisation"], 3),
            "ttft_p95_s": round(s["ttft_p95"], 4), "tpot_p50_s": round(s["tpot_p50"], 5),
            "simulated_hours": round(r.makespan_s / 3600, 2)}


def calibration(quick: bool, runs_from: Path | None) -> tuple[dict, list, list]:
    """Probe, fit runs and held-out runs: fit on the probe and fit runs, compare on all."""
    if runs_from is not None:
        data = json.loads(Path(runs_from).read_text())
        fit_runs = [cal.EngineRun.from_dict(d) for d in data["fit"]]
        held = [cal.EngineRun.from_dict(d) for d in data["held_out"]]
    else:
        probe = cal.run_engine(cal.probe_trace(), cal.CONFIGS["base"], label="probe")
        probe_model = cal.fit_step_model([probe])
        work = cal.calibration_workloads(probe_model, quick=quick)
        fit_runs = [probe]
        for name, (tr, cfg) in work["fit"].items():
            print(f"  fit: {name} ({len(tr)} requests at {tr.rate:.2f}/s)", flush=True)
            fit_runs.append(cal.run_engine(tr, cfg, label=name))
        held = []
        for name, (tr, cfg) in work["held_out"].items():
            print(f"  held out: {name} ({len(tr)} requests at {tr.rate:.2f}/s)", flush=True)
            held.append(cal.run_engine(tr, cfg, label=name))
    model = cal.fit_step_model(fit_runs)
    rows = []
    for part, runs in (("fit", fit_runs[1:]), ("held-out", held)):
        for r in runs:
            c = cal.compare(r, model)
            scaled = cal.compare(r, model, normalise=True)
            rows.append({"set": part, "workload": r.label, "requests": len(r.trace),
                         "speed_factor": round(cal.speed_factor(r, model), 3), "worst_scaled": round(scaled.worst, 4),
                         "rate": round(r.trace.rate, 3), "chunk": r.config.long_prefill_token_threshold,
                         "steps": len(r.shapes),
                         **{f"measured_{k}": round(v, 5) for k, v in c.measured.items()},
                         **{f"predicted_{k}": round(v, 5) for k, v in c.predicted.items()},
                         **{f"error_{k}": round(v, 4) for k, v in c.errors.items()},
                         "worst": round(c.worst, 4)})
    per_step, speed = {}, {}
    for r in [*fit_runs, *held]:
        pred = np.array([model.step_s(s) for s in r.shapes])
        per_step[r.label] = round(float(np.median(np.abs(pred - r.durations) / r.durations)), 4)
        speed[r.label] = round(float(r.durations.sum() / pred.sum()), 3)  # >1: the machine ran slower
    return {"model": model.to_dict(), "describe": model.describe(), "rows": rows,
            "engine_measured_at": {"git_commit": model.meta.get("git_commit"),
                                   "machine": model.meta.get("machine")},
            "per_step_median_error": per_step, "speed_ratio": speed}, fit_runs, held


def write_md(out: Path, res: dict) -> None:
    m = res["machine"]
    lines = ["# Simulator: speed and calibration against the engine", "",
             f"Machine: {m['cpu']}, {m['logical_cpus']} logical CPUs, load average {m['load_average_1min']} "
             f"(1 min, at the end), Python {m['python']}, torch {m.get('torch')}, numpy {m.get('numpy')}, "
             f"{m['date']}. Git commit measured: {res['git_commit']}.", ""]
    sp = res.get("speed")
    if sp:
        lines += ["## Speed", "",
                  f"{sp['requests']:,} requests through one replica (8B class on one H100, roofline step model, "
                  f"Poisson arrivals at {sp.get('rate', 9.0):g} requests/s, 1,000-token median prompts, "
                  f"200-token mean answers, {sp['simulated_hours']} simulated hours): "
                  f"**{sp['cpu_s']} s of CPU** ({sp['requests_per_cpu_s']:,} requests per CPU-second, "
                  f"{sp['steps']:,} engine steps), wall {sp['wall_s']} s on a shared machine. "
                  f"Goal: under 60 s on one core: {'met' if sp['cpu_s'] < 60 else 'missed'}.", ""]
    cal_res = res.get("calibration")
    if cal_res:
        at = cal_res.get("engine_measured_at") or {}
        am = at.get("machine") or {}
        lines += ["## Calibration: predicted vs measured engine percentiles", "",
                  f"Engine runs measured at commit {at.get('git_commit')} on {am.get('cpu')} "
                  f"({am.get('logical_cpus')} logical CPUs, load average {am.get('load_average_1min')}, "
                  f"{am.get('date')}), one thread.", "",
                  f"Step model fitted on the probe and the fit runs: {cal_res['describe']}.", "",
                  "Each run first times a fixed little batch (the speed probe; column *probe*: its time over "
                  "the fit runs' median). *Worst, probe-scaled*: the worst error if the model is scaled by "
                  "that factor. The main columns use the model as fitted.", "",
                  "| set | workload | req/s | chunk | probe | TTFT p50 err | TTFT p95 err | TPOT p50 err "
                  "| TPOT p95 err | worst | worst, probe-scaled |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in cal_res["rows"]:
            e = [r[f"error_{k}"] for k in cal.METRICS]
            lines.append(f"| {r['set']} | {r['workload']} | {r['rate']:.2f} | {r['chunk'] or '-'} | "
                         f"{r.get('speed_factor', 1.0):.2f} | "
                         + " | ".join(f"{x:+.1%}" for x in e) + f" | {r['worst']:.1%} | "
                         f"{r.get('worst_scaled', r['worst']):.1%} |")
        held = [r for r in cal_res["rows"] if r["set"] == "held-out"]
        worst = max(r["worst"] for r in held) if held else float("nan")
        within = sum(r["worst"] <= 0.10 for r in held)
        lines += ["", f"Held-out workloads within 10% on all four percentiles: {within} of {len(held)}; "
                  f"worst held-out error {worst:.1%}.", "",
                  "Median per-step error of the fitted model, per run: "
                  + ", ".join(f"{k} {v:.1%}" for k, v in cal_res["per_step_median_error"].items()) + ".", "",
                  "Measured over fitted step time, per run (how much slower or faster the machine ran "
                  "than the fit's average): "
                  + ", ".join(f"{k} {v:.2f}" for k, v in cal_res.get("speed_ratio", {}).items()) + ".", "",
                  "Where it misses: the engine here shares two cores with other work (load average "
                  f"{am.get('load_average_1min')} when the runs began), so a step's time varies by more than "
                  "the model's terms explain: the median step is off by the per-step errors above, and whole "
                  "runs ran faster or slower than the fit's average by the ratios above. The speed probe did "
                  "not track that drift (its factor and the run's measured/fitted ratio disagree), so the "
                  "drift is within runs, not between them. "
                  "TTFT p95 is the most sensitive: it sits in the queue's tail, where a small error in "
                  "the service rate is multiplied. The simulator's scheduling alone is exact: fed the "
                  "same step times it reproduces the engine's scheduler step for step "
                  "(tests/test_sim.py), so on a quiet machine the error left is the step model's. "
                  "Rerun: `python benchmarks/bench_sim.py --calibration-only` (about 30 min)."]
    (out / "sim.md").write_text("\n".join(lines) + "\n")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="seconds: small speed run, calibration from saved runs")
    p.add_argument("--speed-only", action="store_true")
    p.add_argument("--calibration-only", action="store_true")
    p.add_argument("--runs-from", default=None, help="refit from saved engine runs instead of measuring")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    a = p.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    res: dict = {"git_commit": cal.git_commit()}
    if not a.calibration_only:
        n = 20_000 if a.quick else 1_000_000
        print(f"speed: {n:,} requests ...", flush=True)
        res["speed"] = speed(n)
        print(res["speed"], flush=True)
    if not a.speed_only:
        runs_from = a.runs_from or (RUNS_PATH if a.quick else None)
        if runs_from is not None and not Path(runs_from).exists():
            print(f"no saved runs at {runs_from}; skipping calibration", flush=True)
        else:
            print("calibration ...", flush=True)
            res["calibration"], fit_runs, held = calibration(a.quick, runs_from)
            if runs_from is None:  # a fresh measurement: keep it for the tests and chapters
                RUNS_PATH.parent.mkdir(parents=True, exist_ok=True)
                RUNS_PATH.write_text(json.dumps({"fit": [r.to_dict() for r in fit_runs],
                                                 "held_out": [r.to_dict() for r in held]}) + "\n")
            if not a.quick:  # the fitted model the CLI's check uses
                cal.save_step_model(cal.step_model_from_dict(res["calibration"]["model"]))
    res["machine"] = machine.describe(threads=1)
    old = out / "sim.json"
    if not a.quick and (a.speed_only or a.calibration_only) and old.exists():
        prev = json.loads(old.read_text())  # keep the part not rerun
        for key in ("speed", "calibration"):
            if prev.get(key) is not None:
                res.setdefault(key, prev[key])
    (out / "sim.json").write_text(json.dumps(res, indent=1) + "\n")
    write_md(out, res)
    print((out / "sim.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
