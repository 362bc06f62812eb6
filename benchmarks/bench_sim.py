"""Simulator benchmarks: speed, and the check against the real engine on held-out trace families.

    .venv/bin/python benchmarks/bench_sim.py                      # full run (1 thread)
    .venv/bin/python benchmarks/bench_sim.py --speed-only         # the million-request timing only
    .venv/bin/python benchmarks/bench_sim.py --calibration-only [--quick-calibration] [--repeats 5]
    .venv/bin/python benchmarks/bench_sim.py --quick --out D      # smoke run (seconds), into folder D

Writes sim.md and sim.json into benchmarks/results/ (or ``--out``); a measured
calibration also saves the fitted step model (data/sim/step_model.json, with
the engine fingerprint the staleness test checks) and every engine run it
measured (data/sim/calibration_runs.json), which the unit tests and the
chapters read.

The calibration (:func:`servelab.sim.check.calibrate_here`) runs the engine
through a sweep of designed pieces (decode batches up to the seat limit at short
to long contexts, chunked prompts, mixed steps, prefix hits, preemption) and two
random streams, and fits the step model to all their steps. The check then
serves each held-out family of ``benchmarks/make_sim_traces.py`` with the engine
``--repeats`` times (the engine's own run-to-run spread) and once with the
simulator, and publishes each percentile's error beside that spread, as Vidur
does (Agrawal et al., MLSys 2024) for held-out traces. The engine serves on one
thread with its own scheduler; each step is timed by the CPU time it used,
divided by the machine's level then (a fixed piece of work timed every 10 steps
against its time at the calibration's start, raised to the power the calibration
fitted: the steady clock), and arrivals
come on a virtual clock advanced by those times (``--clock cpu``: CPU time as it
came; ``--clock wall``: real time).
"""
from __future__ import annotations

import argparse
import inspect
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from servelab import machine
from servelab.sim import ReplicaConfig, RooflineStepModel, simulate, synthetic
from servelab.sim import calibrate as cal
from servelab.sim import check
from servelab.sim.fit import fit_report
from servelab.sim.step_model import STEP_KINDS
from servelab.sim.sweep import residuals_by_feature
from servelab.workload import Exponential, LogNormal, load_trace

from _common import RESULTS, parser, write_results
from make_sim_traces import FAMILIES, OUT as TRACES, file_name

ROOT = Path(__file__).resolve().parents[1]
RUNS_PATH = ROOT / "data" / "sim" / "calibration_runs.json"
#: Earlier checks sim.json keeps (each check's verdict, clock and runs): every check since the
#: steady clock came in (and a couple before it), so the chapters can count how often the goal was met.
HISTORY = 40
#: Seconds of a run's steps per window of the within-run wander (sim.md): speed_windows' default.
WINDOW_S = inspect.signature(check.speed_windows).parameters["window_s"].default


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


#: The goal (issue 26): on held-out families, worst percentile error and the median one.
GOAL_WORST, GOAL_MEDIAN = 0.15, 0.07


def _speed(runs, model) -> float | None:
    """How long the fixed reference work (timed every few steps off the clock) took during ``runs``
    over during the calibration: >1, a slower machine."""
    ratio = cal.reference_ratio(runs, model)
    return None if ratio is None else round(ratio, 3)


#: Every step this many times as long: the sensitivity sim.md reports (its "sensitivity_5pct").
SENSITIVITY = 1.05


def _deciles(xs) -> list | None:
    """10th, 50th and 90th percentiles of ``xs`` (None when empty)."""
    return [round(float(x), 3) for x in np.quantile(xs, (0.1, 0.5, 0.9))] if len(xs) else None


def _sensitivity(trace, model, factor: float = SENSITIVITY) -> float:
    """The largest change of a predicted percentile (TTFT/TPOT p50/p95) when every step is
    ``factor`` times as long: how much a small step error is worth on this trace."""
    a = check.predict(trace, model, cal.CONFIGS["base"])
    b = check.predict(trace, model.scaled(factor), cal.CONFIGS["base"])
    return round(max(abs(b[k] / a[k] - 1) for k in cal.METRICS), 4)


#: The steady clock's reference work before it was a decode step (checks that do not name theirs).
OLD_REFERENCE = "one row through the weights"


def reference_of(calibration: dict) -> str | None:
    """The steady clock's reference work a check's calibration used (None off the steady clock)."""
    meta = (calibration.get("model") or {}).get("meta", {})
    if ((calibration.get("engine_measured_at") or {}).get("clock") or meta.get("clock")) != "steady":
        return None
    return meta.get("reference_work") or OLD_REFERENCE


def calibration(quick_cal: bool, runs_from: Path | None, clock: str = "steady", repeats: int = 3,
                model_from: Path | None = None) -> tuple:
    """Calibrate (or refit from saved runs), then check every held-out family. Returns
    ``(result, fit_runs, held_runs)``. ``model_from`` (with ``runs_from``): predict with that
    saved step model instead of refitting (the saved runs were timed with its powers; a refit
    reads the powers again from runs already divided by them, and can land elsewhere)."""
    if runs_from is not None:
        saved = json.loads(Path(runs_from).read_text())
        fit_runs = [cal.EngineRun.from_dict(d) for d in saved["fit"]]
        held_runs = [cal.EngineRun.from_dict(d) for d in saved["held_out"]]
        if model_from is not None:
            model = cal.step_model_from_dict(json.loads(Path(model_from).read_text()))
        else:
            model, fit_runs = cal.fit_calibration(fit_runs)
        shapes = [s for r in fit_runs for s in r.shapes]
        durs = np.concatenate([r.durations for r in fit_runs])
        model.meta.update({k: v for k, v in (saved.get("model_meta") or {}).items()
                           if k in ("engine_fingerprint", "machine_key", "model", "calibration", "seconds",
                                    "cpu_seconds", "load_average_1min", "clock", "reference_base_s",
                                    "reference_work", "reference_warm", "reference_every")})
        model.meta["residuals_by_feature"] = residuals_by_feature(model, shapes, durs,
                                                                 decode_groups=check.run_groups(fit_runs))
    else:
        print("calibration sweep ...", flush=True)
        model, fit_runs = check.calibrate_here(quick=quick_cal, clock=clock)
        held_runs = []
    checks = []
    traces = {name: load_trace(TRACES / file_name(name)) for name in FAMILIES}
    if runs_from is None:
        # rounds: every family once per round, so a drift of the machine's speed over minutes
        # falls on every family's runs alike instead of on one family's block of runs
        for k in range(repeats):
            for name, trace in traces.items():
                print(f"round {k + 1} of {repeats}: held-out family {name!r}, {len(trace)} requests ...", flush=True)
                held_runs.append(check.serve_once(trace, model, cal.CONFIGS["base"], clock=clock,
                                                  label=f"{name} #{k + 1}", seed_offset=k, relevel=True))
    for name, trace in traces.items():
        mine = [r for r in held_runs if cal.piece_of(r.label) == name]
        if not mine:
            continue
        c = check.spread_check(name, mine, model, info={"clock": clock})
        c.info["speed_vs_calibration"] = _speed(mine, model)
        # the machine's wander within each run: measured over predicted time in 2-second windows
        c.info["wander"] = _deciles(np.concatenate([check.speed_windows(r, model, WINDOW_S) for r in mine]))
        # on the steady clock: the machine's level the runs were divided by
        c.info["machine_levels"] = _deciles([x for r in mine for x in (r.info.get("levels") or [])])
        print(c.table(), flush=True)
        checks.append(c)
    # the trace each family's runs served (saved runs keep theirs: the families have grown since)
    c_trace = {c.label: next(r.trace for r in held_runs if cal.piece_of(r.label) == c.label) for c in checks}
    rows = []
    for r in fit_runs:
        cmp_ = cal.compare(r, model)
        rows.append({"set": "fit", "workload": r.label, "requests": len(r.trace), "rate": round(r.trace.rate, 3),
                     **{f"error_{k}": round(v, 4) for k, v in cmp_.errors.items()}, "worst": round(cmp_.worst, 4),
                     "speed_vs_calibration": _speed([r], model)})
    for c in checks:
        rows.append({"set": "held-out", "workload": c.label, "description": FAMILIES[c.label][0],
                     "requests": c.info["requests"], "rate": round(c.info["rate"], 3), "runs": len(c.runs),
                     **{f"error_{k}": round(v, 4) for k, v in c.errors.items()},
                     **{f"spread_{k}": round(v, 4) for k, v in c.spread.items()},
                     **{f"measured_{k}": round(v, 6) for k, v in c.measured.items()},
                     **{f"median_noise_{k}": round(v, 4) for k, v in c.median_noise.items()},
                     **{f"predicted_{k}": round(v, 6) for k, v in c.predicted.items()},
                     "worst": round(c.worst, 4), "worst_spread": round(c.worst_spread, 4),
                     **({f"relevelled_{k}": round(v, 4) for k, v in c.errors_relevelled.items()}
                        if c.relevelled else {}),
                     **({f"own_fit_{k}": round(v, 4) for k, v in c.own_fit_errors.items()} if c.own_fit else {}),
                     "levels": c.info.get("levels"),
                     "sensitivity_5pct": _sensitivity(c_trace[c.label], model),
                     "load_average_1min": c.info.get("load_average_1min"),
                     "wander_p10_p50_p90": c.info.get("wander"),
                     "machine_level_p10_p50_p90": c.info.get("machine_levels"),
                     "speed_vs_calibration": c.info.get("speed_vs_calibration")})
    shapes = [s for r in fit_runs for s in r.shapes]
    durs = np.concatenate([r.durations for r in fit_runs])
    hshapes = [s for r in held_runs for s in r.shapes]
    hdurs = np.concatenate([r.durations for r in held_runs]) if held_runs else np.zeros(0)
    at = fit_runs[0].info if fit_runs else {}
    res = {"model": model.to_dict(), "describe": model.describe(), "rows": rows,
           "fit_report": fit_report(model, shapes, durs),
           "held_out_report": fit_report(model, hshapes, hdurs) if hshapes else None,
           "held_out_residuals_by_feature": residuals_by_feature(model, hshapes, hdurs,
                                                                 decode_groups=check.run_groups(held_runs))
           if hshapes else None,
           "engine_measured_at": {"git_commit": at.get("git_commit"), "machine": at.get("machine"),
                                  "clock": at.get("clock", clock), "engine_tree": at.get("engine_tree")},
           "repeats": repeats, "goal": {"worst": GOAL_WORST, "median": GOAL_MEDIAN},
           "predict_scales": list(check.PREDICT_SCALES)}
    if held_runs and all(cal.step_levels(r) is not None for r in held_runs):
        # the same slope read from the held-out runs' own windows: does the calibration's power carry over?
        res["held_out_level_exponent"] = cal.fit_level_exponent(held_runs, model, kind="decode")
        res["held_out_prompt_exponent"] = cal.fit_prompt_exponent(
            held_runs, model, res["held_out_level_exponent"]["exponent"])
    errs = [abs(r[f"error_{k}"]) for r in rows if r["set"] == "held-out" for k in cal.METRICS]
    if errs:
        res["held_out_worst"] = round(max(errs), 4)
        res["held_out_median"] = round(float(np.median(errs)), 4)
    if checks and len(checks[0].runs) > 1:
        # the judge's own noise: what a perfect simulator would score against these medians
        res["noise_floor"] = {k: (round(v, 4) if v is not None else None)
                              for k, v in check.noise_floor(checks, GOAL_WORST).items()}
    for key in ("relevelled", "own_fit"):
        e = [abs(r[f"{key}_{k}"]) for r in rows if r["set"] == "held-out" for k in cal.METRICS if f"{key}_{k}" in r]
        if e:
            res[f"held_out_{key}_worst"] = round(max(e), 4)
            res[f"held_out_{key}_median"] = round(float(np.median(e)), 4)
    return res, fit_runs, held_runs


def _span(xs) -> str:
    """``"1.1-1.3"``, or ``"about 1.2"`` when the range rounds to one value."""
    lo, hi = f"{min(xs):.2g}", f"{max(xs):.2g}"
    return f"about {lo}" if lo == hi else f"{lo}-{hi}"


def _pct(x) -> str:
    return "-" if x is None else f"{x:+.1%}"


def _decode_power_md(meta: dict, c: dict) -> str:
    """How the decode steps' power of the level was read, in words ("" off the steady clock)."""
    fit = meta.get("level_exponent_fit")
    if not fit:
        return ""
    hfit = c.get("held_out_level_exponent") or {}
    held = hfit.get("exponent") if hfit.get("r") is not None and (hfit.get("reliability") or 0) >= 0.5 else None
    held_txt = f"; the held-out runs' own windows gave {held:.2f}" if held is not None else ""
    windows = f"{fit['windows']} windows of {cal.LEVEL_WINDOW_S:g} s"
    if fit.get("r") is None:
        return (f"; each decode step is divided by the level itself (power 1.00: the level moved too little "
                f"within the calibration's runs to read a power from, sd {fit['level_sd']:.2%} over {windows}"
                f"{held_txt})")
    if fit.get("reliability") is not None and fit["reliability"] < 0.5:
        return (f"; each decode step is divided by the level itself (power 1.00: over {windows} the level's "
                f"readings were mostly noise, {fit['reliability']:.0%} of their variance the machine's, so no "
                f"power was read; correlation {fit['r']}{held_txt})")
    plain = (f"; each window read twice, from its even and its odd timings, so one timing's noise does not "
             f"flatten the slope: a plain least-squares slope gave {fit['plain_slope']:.2f}"
             if fit.get("plain_slope") is not None else "")
    return (f"; each decode step is divided by the level to the power {meta['level_exponent']:.2f}, how much the "
            f"decode steps slowed with that work within the calibration's own runs (slope over {windows}, "
            f"correlation {fit['r']}{plain}{held_txt})")


def _prompt_how(fit: dict) -> str:
    """How the prompt power was read, in words (fits before "how" was recorded were step by step)."""
    if fit.get("how") == "between runs":
        return "between the rounds of each piece (the level each round ran at on the whole)"
    return "step by step within runs"


def calibration_md(c: dict) -> list:
    at = c.get("engine_measured_at") or {}
    am = at.get("machine") or {}
    meta = (c.get("model") or {}).get("meta") or {}
    # how the reference was timed: as recorded (a calibration before these were kept: 1 and 10)
    warm, every = meta.get("reference_warm", 1), meta.get("reference_every", 10)
    held = [r for r in c["rows"] if r["set"] == "held-out"]
    fit = [r for r in c["rows"] if r["set"] == "fit"]
    loads = [r.get("load_average_1min") for r in held if r.get("load_average_1min") is not None]
    lines = ["## Calibration and the check on held-out traces", "",
             f"Engine runs measured at commit {at.get('git_commit')} (engine tree {at.get('engine_tree')}) on "
             f"{am.get('cpu')} ({am.get('logical_cpus')} logical CPUs, {am.get('date')}), one thread, each step "
             + ("timed by the CPU time its thread used, divided by the machine's level then (the *steady clock*: "
                f"a fixed piece of work, a decode step of {cal.REFERENCE_ROWS} rows at {cal.REFERENCE_CONTEXT} "
                f"cached tokens through the whole model on a cache of its own, after {warm} untimed "
                f"pass{'es' if warm != 1 else ''}, is timed every {every} steps, and the level is the median of the latest "
                f"{cal.LEVEL_WINDOW} timings over its time at the "
                f"calibration's start, {meta['reference_base_s'] * 1e3:.3f} ms"
                + _decode_power_md(meta, c)
                + (f"; a step with prompt tokens by a power moved from that toward "
                   f"{meta['prompt_level_exponent']:.2f} by its prompt work's share of its predicted time (the "
                   f"prompt work's power, fitted {_prompt_how(meta['prompt_level_exponent_fit'])} over "
                   f"{meta['prompt_level_exponent_fit']['steps']:,} prompt steps, correlation "
                   f"{meta['prompt_level_exponent_fit']['r']}"
                   + (f"; the held-out runs' own: {c['held_out_prompt_exponent']['exponent']:.2f}"
                      if (c.get("held_out_prompt_exponent") or {}).get("r") is not None else "")
                   + ")"
                   if (meta.get("prompt_level_exponent_fit") or {}).get("r") is not None else "")
                + "), and arrivals on a virtual clock "
                "advanced by those times (so other processes' time is not counted, and the wander of the "
                "machine's own speed is divided out). Load average"
                if at.get("clock") == "steady" and meta.get("reference_base_s") else
                "timed by the CPU time its thread used and arrivals on a virtual clock advanced by those times "
                "(so other processes' time is not counted; neighbours sharing the core's caches still slow a "
                "step). Load average")
             + " (1 min) when the calibration began: "
             f"{am.get('load_average_1min')}; during the checks: "
             + (", ".join(f"{x:g}" for x in loads) if loads else "not recorded") + ". "
             "This machine is shared by several developers: the load figures say how busy it was, and the "
             "engine's run-to-run spread below says how much that moved the measurement.", "",
             f"Calibration: {meta.get('calibration', 'sweep')}, {meta.get('seconds', '?')} s wall"
             + (f" ({meta['cpu_seconds']} s of CPU)" if meta.get("cpu_seconds") else "")
             + f"; engine fingerprint {meta.get('engine_fingerprint')}, machine key {meta.get('machine_key')}.", "",
             f"Step model: {c['describe']}.", ""]
    fr, hr = c["fit_report"], c.get("held_out_report")
    lines += [f"Fit: R^2 {fr['r2']:.3f} over {fr['n_steps']:,} calibration steps"
              + (f"; on the held-out runs' {hr['n_steps']:,} steps R^2 {hr['r2']:.3f}" if hr else "") + ".", "",
              "| steps | kind | count | median error | median abs error | predicted/measured time |",
              "|---|---|---|---|---|---|"]
    for name, rep in (("calibration", fr), ("held-out", hr)):
        for k in STEP_KINDS:
            if rep and k in rep["kinds"]:
                x = rep["kinds"][k]
                lines.append(f"| {name} | {k} | {x['steps']:,} | {x['median_err']:+.1%} | {x['median_abs_err']:.1%} "
                             f"| {x['total_ratio']:.3f} |")
    lines += ["", "### Residuals by feature", "",
              "Measured over predicted step time in bins of each feature (median of the steps in the bin; "
              "in brackets, total measured over total predicted time). A bin far from 1.00 is a shape the "
              "step model misprices.", "",
              "| feature | bin | calibration steps | calibration | held-out steps | held-out |", "|---|---|---|---|---|---|"]
    fres = meta.get("residuals_by_feature") or {}
    hres = c.get("held_out_residuals_by_feature") or {}
    for feat, rows in fres.items():
        hb = {r["bin"]: r for r in hres.get(feat, [])}
        for r in rows:
            h = hb.get(r["bin"])
            lines.append(f"| {feat} | {r['bin']} | {r['steps']:,} | {r['median_measured_over_predicted']:.2f} "
                         f"({r['total_measured_over_predicted']:.2f}) | "
                         + (f"{h['steps']:,} | {h['median_measured_over_predicted']:.2f} "
                            f"({h['total_measured_over_predicted']:.2f})" if h else "- | -") + " |")
    worst_bins = sorted(((abs(r["total_measured_over_predicted"] - 1), feat, r) for feat, rows in hres.items()
                         if feat != "step kind" for r in rows if r["steps"] >= 50), key=lambda x: -x[0])[:4]
    if worst_bins:
        lines += ["", "Where the held-out steps were mispriced most (total measured over total predicted time, "
                  "bins of at least 50 steps): " + "; ".join(
                      f"{feat} {r['bin']}: {r['total_measured_over_predicted']:.2f} over {r['steps']:,} steps"
                      for _, feat, r in worst_bins) + ". These held-out ratios are against the model as "
                  "calibrated, so they carry the machine's speed change between the calibration and the checks "
                  "(the families' *machine speed* below) as well as any shape the model misprices."]
    if held:
        lines += ["", "### Held-out trace families", "",
                  "Made by `benchmarks/make_sim_traces.py` (committed in `data/sim/traces/`); the calibration "
                  "never ran any of them. Each served by the engine "
                  f"{held[0]['runs']} time{'s' if held[0]['runs'] > 1 else ''} (a fresh engine each run) and by the simulator (the median of "
                  f"{len(c.get('predict_scales') or [1])} simulations, every step scaled by "
                  f"{', '.join(f'{x:g}' for x in c.get('predict_scales') or [1])}); *measured* is "
                  "the median of the runs, *spread* half their range as a share of it (the engine's own "
                  "run-to-run noise), *error* the prediction of the model as calibrated against the measured "
                  "median. After each run the same engine served a *level probe* (the calibration's poisson-mix "
                  "piece again): its measured over predicted step time is the machine's speed then against the "
                  "calibration (*machine speed*). *Scaled*: the worst error when each run's prediction is scaled "
                  "by that speed. *Own-trace fit*: the worst error when each run is predicted by a step model "
                  "fitted to the family's other runs (what a calibration on this very workload would do).", "",
                  "| family | what | req/s | TTFT p50 | TTFT p95 | TPOT p50 | TPOT p95 | worst | engine spread (worst) "
                  "| machine speed | scaled | own-trace fit |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]

        def worst_of(r, key):
            v = [abs(r[f"{key}_{k}"]) for k in cal.METRICS if f"{key}_{k}" in r]
            return f"{max(v):.1%}" if v else "-"
        for r in held:
            cells = " | ".join(f"{_pct(r['error_' + k])} (±{r['spread_' + k]:.1%})" for k in cal.METRICS)
            lv = r.get("levels")
            lines.append(f"| {r['workload']} | {r['description']} | {r['rate']:.2f} | {cells} | {r['worst']:.1%} | "
                         f"±{r['worst_spread']:.1%} | {', '.join(f'{x:.2f}x' for x in lv) if lv else '-'} | "
                         f"{worst_of(r, 'relevelled')} | {worst_of(r, 'own_fit')} |")
        w, med = c.get("held_out_worst"), c.get("held_out_median")
        ok = w is not None and w <= GOAL_WORST and med <= GOAL_MEDIAN
        beyond = sum(abs(r["error_" + k]) > r["spread_" + k] for r in held for k in cal.METRICS)
        lines += ["", f"Over the families, worst held-out error {w:.1%}; median held-out error {med:.1%} over {4 * len(held)} "
                  f"percentiles ({beyond} of them outside the engine's own spread). Goal (issue 26, on a quiet "
                  f"machine): worst <= {GOAL_WORST:.0%} and median <= {GOAL_MEDIAN:.0%}: "
                  f"{'met' if ok else 'missed'} here"
                  + (f", under load averages of {_span(loads)}." if loads else ".")]
        extra = []
        if c.get("held_out_relevelled_worst") is not None:
            extra.append(f"scaled by each run's level probe, worst {c['held_out_relevelled_worst']:.1%}"
                         f" and median {c['held_out_relevelled_median']:.1%}")
        if c.get("held_out_own_fit_worst") is not None:
            extra.append(f"each run predicted by a model fitted to its family's other runs, worst "
                         f"{c['held_out_own_fit_worst']:.1%} and median {c['held_out_own_fit_median']:.1%}")
        if extra:
            lines[-1] += " Beside it: " + "; ".join(extra) + "."
        nf = c.get("noise_floor")
        if nf:
            lines += ["", f"The judge's own noise: a measured median of {c['repeats']} runs is itself uncertain "
                      f"(standard error sqrt(pi/2) times the runs' standard deviation over sqrt({c['repeats']})). "
                      f"A perfect simulator, judged against these medians, would show a worst error of "
                      f"{nf['expected_worst']:.1%} on average (90th percentile {nf['worst_p90']:.1%}) and a median "
                      f"of {nf['expected_median']:.1%}; its worst error would exceed the goal's "
                      f"{GOAL_WORST:.0%} in {nf['p_over_goal']:.0%} of checks like this one "
                      f"(`servelab.sim.check.noise_floor`, normal draws about each median)."]
        wander = [(r["workload"], r["wander_p10_p50_p90"]) for r in held if r.get("wander_p10_p50_p90")]
        if wander:
            lines += ["", f"How the machine's speed wandered within a run: over windows of {WINDOW_S:g} s of a run's "
                      "steps, measured over predicted time from its 10th to its 90th percentile (median in "
                      "brackets): " + ", ".join(f"{w} {q[0]:.2f}-{q[2]:.2f}x ({q[1]:.2f}x)" for w, q in wander)
                      + ". A window's time is what a request waiting or streaming then feels, so the tails of "
                      "a run's TTFT and TPOT carry this wander; the simulator's steps are the model's, without it."]
        lv = [(r["workload"], r["machine_level_p10_p50_p90"]) for r in held if r.get("machine_level_p10_p50_p90")]
        if lv:
            lines[-1] += (" The steady clock had already divided out the machine's level, which read (10th to 90th "
                          "percentile of its readings, median in brackets): " + ", ".join(
                              f"{w} {q[0]:.2f}-{q[2]:.2f}x ({q[1]:.2f}x)" for w, q in lv) + ".")
        sens = [(r["sensitivity_5pct"], r["workload"]) for r in held if r.get("sensitivity_5pct") is not None]
        if sens:
            lines += ["", f"How much a step error is worth: with every step {SENSITIVITY - 1:.0%} slower, the "
                      "simulator moves a "
                      "family's percentiles by at most " + ", ".join(f"{w} {s:.0%}" for s, w in sens) + "."]
    fit_speeds = [f"{r['workload']} {r['speed_vs_calibration']:.2f}x" for r in fit
                  if r.get("speed_vs_calibration") is not None]
    if held and any(r.get("speed_vs_calibration") for r in held):
        lines += ["", f"A fixed piece of work (a decode step of {cal.REFERENCE_ROWS} rows at {cal.REFERENCE_CONTEXT} "
                  f"cached tokens through the whole model, on a cache of its own, timed every "
                  f"{every} steps after untimed passes, off the engine's clock) took, over its "
                  "calibration time: "
                  + ", ".join(f"{r['workload']} {r['speed_vs_calibration']:.2f}x" for r in held
                              if r.get("speed_vs_calibration") is not None)
                  + (f" (the calibration's own pieces: {', '.join(fit_speeds)})" if fit_speeds else "")
                  + ". The steady clock divides each step by this work's time then (to the fitted power); "
                  "a ratio here is what the "
                  "machine's level did between the calibration and a family's runs (on the CPU clock, the "
                  "comparison the steps' times carry)."]
    if fit:
        lines += ["", "The calibration's own pieces, predicted by the model fitted to them (worst percentile "
                  "error): " + ", ".join(f"{r['workload']} {r['worst']:.1%}" for r in fit) + ". The designed "
                  "pieces start on an idle engine, so their TTFT percentiles are single steps' times"
                  + (". Their latencies were timed with the plain division (power 1), before the exponent was "
                     "fitted, so these errors mix the two" if meta.get("level_exponent", 1.0) != 1.0 else "")
                  + "."]
    for h in c.get("history") or []:
        lines += ["", f"An earlier check ({h['when']}, commit {h['git_commit']}, {h['what']}"
                  + (f", on the {h['clock']} clock" if h.get("clock") else "")
                  + (f" (reference work: {h['reference']})" if h.get("reference") else "")
                  + (f" with the level to the power {h['level_exponent']:.2f}" if h.get("level_exponent") else "")
                  + (f" (prompt work {h['prompt_level_exponent']:.2f})" if h.get("prompt_level_exponent") else "")
                  + (f", {h['runs']} engine runs a family" if h.get("runs") else "")
                  + (f" of {min(h['requests'])}-{max(h['requests'])} requests" if h.get("requests") else "")
                  + (f", on an {h['cpu']}" if h.get("cpu") else "")
                  + f"): worst held-out "
                  f"error {h['worst']:.1%}, median {h['median']:.1%}"
                  + (f", engine spread up to ±{h['worst_spread']:.1%}" if h.get("worst_spread") is not None else "")
                  + (f", a perfect simulator's expected worst {h['noise_floor']:.1%}" if h.get("noise_floor") else "")
                  + f", under load averages of {h['loads']}."]
    lines += ["", "Rerun: `python benchmarks/bench_sim.py --calibration-only` (the full sweep; "
              "`--quick-calibration` for the smaller one `python -m servelab.sim calibrate --quick` runs); "
              "refit from the saved runs without measuring: `--runs-from data/sim/calibration_runs.json`. "
              "The held-out traces: `python benchmarks/make_sim_traces.py`. One family by hand: "
              "`python -m servelab.sim check --trace data/sim/traces/bursts.jsonl`."]
    return lines


def markdown(res: dict) -> str:
    m = res["machine"]
    lines = ["# Simulator: speed and calibration against the engine", "",
             f"Machine: {m['cpu']}, {m['logical_cpus']} logical CPUs, load average {m['load_average_1min']} "
             f"(1 min, at the end), Python {m['python']}, torch {m.get('torch')}, numpy {m.get('numpy')}, "
             f"{m['date']}. Written at git commit {res['git_commit']}"
             + ((" (predicted again from saved engine runs with the saved step model)" if res.get("model_from")
                 else " (the calibration refitted from saved engine runs)") if res.get("runs_from") else "")
             + ".", ""]
    sp = res.get("speed")
    if sp:
        at = sp.get("measured_at")
        if at:
            am = at.get("machine") or {}
            lines += [f"Speed measured at commit {at.get('git_commit')} ({am.get('date')}, load average "
                      f"{am.get('load_average_1min')}).", ""]
        lines += ["## Speed", "",
                  f"{sp['requests']:,} requests through one replica (8B class on one H100, roofline step model, "
                  f"Poisson arrivals at {sp.get('rate', 9.0):g} requests/s, 1,000-token median prompts, "
                  f"200-token mean answers, {sp['simulated_hours']} simulated hours): "
                  f"**{sp['cpu_s']} s of CPU** ({sp['requests_per_cpu_s']:,} requests per CPU-second, "
                  f"{sp['steps']:,} engine steps), wall {sp['wall_s']} s on a shared machine. "
                  f"Goal: under 60 s on one core: {'met' if sp['cpu_s'] < 60 else 'missed'}.", ""]
    cal_res = res.get("calibration")
    if cal_res and "fit_report" in cal_res and isinstance(cal_res.get("rows"), list) and \
            cal_res.get("goal"):
        lines += calibration_md(cal_res)
    return "\n".join(lines) + "\n"


def history_entry(was: dict) -> dict:
    """An earlier check's line in ``sim.json``'s history, from its ``"calibration"`` result."""
    at = was.get("engine_measured_at") or {}
    meta = (was.get("model") or {}).get("meta", {})
    held = [r for r in was["rows"] if r["set"] == "held-out"]
    loads = [r.get("load_average_1min") for r in held if r.get("load_average_1min") is not None]
    return {"when": (at.get("machine") or {}).get("date"), "git_commit": at.get("git_commit"),
            "cpu": (at.get("machine") or {}).get("cpu"), "what": meta.get("calibration", "sweep"),
            "worst": was["held_out_worst"], "median": was["held_out_median"],
            "loads": _span(loads) if loads else "not recorded", "clock": at.get("clock") or "cpu",
            "level_exponent": meta.get("level_exponent"), "prompt_level_exponent": meta.get("prompt_level_exponent"),
            "reference": reference_of(was), "reference_warm": meta.get("reference_warm"),
            "decode_knee": ((was.get("model") or {}).get("decode") or {}).get("knee_context"),
            "predict_scales": was.get("predict_scales"),
            "runs": next((r.get("runs") for r in held), None), "requests": [r.get("requests") for r in held],
            "noise_floor": (was.get("noise_floor") or {}).get("expected_worst"),
            "aftermath": len((was.get("model") or {}).get("aftermath") or ()),
            "predicted_before": was.get("predicted_before"),
            "worst_spread": max((r["worst_spread"] for r in held if r.get("worst_spread") is not None), default=None)}


def main(argv=None) -> int:
    p = parser(__doc__, quick_help="seconds: small speed run, calibration refitted from saved runs", out_default=RESULTS,
               formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--speed-only", action="store_true")
    p.add_argument("--calibration-only", action="store_true")
    p.add_argument("--quick-calibration", action="store_true", help="the smaller calibration sweep")
    p.add_argument("--repeats", type=int, default=5, help="engine runs per held-out family (default %(default)s)")
    p.add_argument("--runs-from", default=None, help="refit from saved engine runs instead of measuring")
    p.add_argument("--model-from", default=None, help="with --runs-from: predict with this saved step model "
                   "(data/sim/step_model.json) instead of refitting")
    p.add_argument("--clock", default="steady", choices=cal.CLOCKS,
                   help="time engine steps by their CPU time over the machine's level on a virtual clock "
                        "(steady, the default), their CPU time as it came (cpu), or the wall clock")
    p.add_argument("--data-dir", default=None, help="where to save the step model and the runs "
                   "(default: data/sim)")
    a = p.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    out = a.out
    out.mkdir(parents=True, exist_ok=True)
    res: dict = {"git_commit": cal.git_commit()}
    if a.runs_from:
        res["runs_from"] = str(a.runs_from)
        if a.model_from:
            res["model_from"] = str(a.model_from)
    if not a.calibration_only:
        n = 20_000 if a.quick else 1_000_000
        print(f"speed: {n:,} requests ...", flush=True)
        res["speed"] = speed(n)
        res["speed"]["measured_at"] = {"git_commit": res["git_commit"], "machine": machine.describe(threads=1)}
        print(res["speed"], flush=True)
    if not a.speed_only:
        runs_from = a.runs_from or (RUNS_PATH if a.quick else None)
        if runs_from is not None and not Path(runs_from).exists():
            print(f"no saved runs at {runs_from}; skipping calibration", flush=True)
        else:
            print("calibration ...", flush=True)
            res["calibration"], fit_runs, held = calibration(a.quick_calibration, runs_from, a.clock, a.repeats,
                                                                Path(a.model_from) if a.model_from else None)
            data_dir = Path(a.data_dir) if a.data_dir else RUNS_PATH.parent
            if runs_from is None:  # a fresh measurement: keep it for the tests and chapters
                data_dir.mkdir(parents=True, exist_ok=True)
                meta = res["calibration"]["model"].get("meta", {})
                (data_dir / RUNS_PATH.name).write_text(json.dumps({
                    "fit": [r.to_dict() for r in fit_runs], "held_out": [r.to_dict() for r in held],
                    "model_meta": {k: v for k, v in meta.items() if k != "residuals_by_feature"}}) + "\n")
                cal.save_step_model(cal.step_model_from_dict(res["calibration"]["model"]),
                                    data_dir / cal.DEFAULT_STEP_MODEL.name)
    res["machine"] = machine.describe(threads=1)
    old = out / "sim.json"
    if not a.quick and (a.speed_only or a.calibration_only) and old.exists():
        prev = json.loads(old.read_text())  # keep the part not rerun
        for key in ("speed", "calibration"):
            if prev.get(key) is not None:
                res.setdefault(key, prev[key])
        new, was = res.get("calibration") or {}, prev.get("calibration") or {}
        def when(x):
            return ((x.get("engine_measured_at") or {}).get("machine") or {}).get("date")
        # a refit from the same engine runs is the same measurement: not an earlier one
        if new is not was and was.get("held_out_worst") is not None and "goal" in was and when(new) != when(was):
            new["history"] = [history_entry(was)] + \
                list(was.get("history") or [])[:HISTORY - 1]
        elif new is not was and was.get("history"):
            new["history"] = list(was["history"])
        if new is not was and was.get("held_out_worst") is not None and when(new) == when(was):
            # the same engine runs predicted again: keep what they scored before
            new["predicted_before"] = [{"worst": was["held_out_worst"], "median": was["held_out_median"],
                                        "predict_scales": was.get("predict_scales")}] + \
                list(was.get("predicted_before") or [])
    report = markdown(res)
    write_results(out, "sim", res, report)
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
