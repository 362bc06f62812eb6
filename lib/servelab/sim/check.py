"""Calibrate the simulator where it runs, and check it against the engine's own spread.

* :func:`calibrate_here` runs the engine through :func:`~servelab.sim.sweep.sweep_traces`
  (every step timed by its CPU time, as :func:`~servelab.sim.calibrate.run_engine` does)
  and fits a :class:`~servelab.sim.step_model.KindStepModel` to all of its steps. The
  model's ``meta`` records the machine (:func:`~servelab.sim.fingerprint.machine_key`),
  the engine's step path (:func:`~servelab.sim.fingerprint.engine_fingerprint`), the
  checkpoint, and the fit's residuals by feature.
* :func:`step_model_here` returns the calibration of *this* machine and engine from a
  cache (``$SERVELAB_CACHE/sim``, default ``~/.cache/servelab/sim``), making one first
  when there is none, and saying so.
* :func:`check_trace` serves a trace with the engine ``repeats`` times, each on a freshly
  built engine, and simulates it: per percentile the measured median, the run-to-run
  spread (half the range of the runs, as a share of the median) and the prediction's
  error. :class:`SpreadCheck`'s table ends with ``worst error: X%``.

A shared virtual machine changes speed: on the course's 2-vCPU Xeon a fixed piece
of work ran up to 1.4x slower within one run, and on the CPU clock runs of one
trace differed by up to ±42%. So calibration and check run on the *steady clock*
by default (:func:`~servelab.sim.calibrate.run_engine`): each step's CPU time
divided by the machine's level, read every 10 steps from that fixed work against
its time at the calibration's start (``meta["reference_base_s"]``); the check uses
the calibration's base, so both read as if the machine had held one speed. The
work is a small decode step of its own, so the steps slow about as much as it does;
the calibration still fits the power they follow (:func:`~servelab.sim.calibrate.fit_level_exponent`,
``meta["level_exponent"]``) and every check divides by the level raised to it.
:func:`speed_windows` shows the wander a run keeps. The verdict is the simulator as
calibrated (as the chapters use it). Two diagnostics sit beside it. ``relevel=True`` follows each
checked run, on the same engine, with a *level probe*: one calibration piece
served again (:func:`level_probe_trace`); its measured over predicted step time
(:func:`machine_level`) is the machine's speed then, and the run's prediction
scaled by it is reported as ``relevelled``. ``own_fit=True`` predicts each checked
run with a step model fitted to the trace's *other* runs (all runs when there is
one): what a calibration on this very workload would have done.

Imports the engine (and torch) inside the functions.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from servelab.sim import calibrate as cal
from servelab.sim.core import ReplicaConfig, simulate
from servelab.sim.fingerprint import engine_fingerprint, machine_key
from servelab.sim.sweep import random_streams, residuals_by_feature, sweep_traces
from servelab.workload import Trace, percentile

__all__ = ["noise_floor", "check_history", "met_by_cpu", "cpu_label", "speed_windows", "model_clock", "calibrate_here", "step_model_here", "cache_path", "check_trace", "SpreadCheck", "model_tag",
           "stale_reasons", "run_groups", "predict", "save_check", "CACHE_ENV", "level_probe_trace",
           "machine_level", "spread_check", "serve_once", "QUICK_ROUNDS", "model_level_exponent", "model_prompt_exponent"]

CACHE_ENV = "SERVELAB_CACHE"
METRICS = cal.METRICS


def model_tag(model_dir=None) -> str:
    """A short key of the checkpoint (its folder name and its config file)."""
    d = Path(model_dir or cal.DEFAULT_MODEL_DIR)
    cfg = d / "config.json"
    text = cfg.read_text() if cfg.exists() else str(d.resolve())
    return d.name + "-" + hashlib.sha256(text.encode()).hexdigest()[:8]


def cache_path(model_dir=None, quick: bool = True, clock: str = "steady") -> Path:
    """Where this machine's calibration of this engine and checkpoint (on ``clock``) is kept."""
    root = Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "servelab") / "sim"
    kind = ("quick" if quick else "full") + ("" if clock == "cpu" else f"-{clock}")
    return root / f"step_model-{machine_key()}-{engine_fingerprint()}-{model_tag(model_dir)}-{kind}.json"


#: Rounds of the quick sweep (each with its own seed: other contexts, another order, other
#: moments), so no one moment's machine speed sets a price; the simulator appendix shows how
#: far a calibration's rounds, fitted apart, price the same steps.
QUICK_ROUNDS = 2


def calibrate_here(quick: bool = True, model_dir=None, clock: str = "steady", say=print, rate: float | None = None,
                   rounds: int | None = None):
    """Fit a step model to the engine on this machine over the calibration sweep
    (``rounds`` times, each with its own seed; default ``QUICK_ROUNDS`` quick, one full).
    Returns ``(model, runs)``; the runs are :class:`~servelab.sim.calibrate.EngineRun`\\ s.
    On the steady clock every piece divides its steps by the machine's level against the
    reference work's time at the first piece's start (``meta["reference_base_s"]``), which a
    check then uses too."""
    rounds = (QUICK_ROUNDS if quick else 1) if rounds is None else rounds
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be a positive whole number, got {rounds!r}")
    t0, c0 = time.perf_counter(), time.process_time()
    runs = []
    base = None
    for k in range(rounds):
        for name, (trace, cfg) in sweep_traces(quick=quick, rate=rate, seed=k).items():
            label = name if k == 0 else f"{name} ({k + 1})"
            say(f"calibration piece {label!r}: {len(trace)} requests ...")
            runs.append(cal.run_engine(trace, cfg, model_dir=model_dir, label=label, clock=clock, probe=False,
                                       reference_base=base))
            base = runs[-1].info.get("reference_base_s", base)
    model, runs = cal.fit_calibration(runs)
    shapes = [s for r in runs for s in r.shapes]
    durs = np.concatenate([r.durations for r in runs])
    model.meta.update(
        engine_fingerprint=engine_fingerprint(), machine_key=machine_key(), model=model_tag(model_dir),
        calibration=("sweep (quick)" if quick else "sweep") + (f", {rounds} rounds" if rounds > 1 else ""),
        seconds=round(time.perf_counter() - t0, 1),
        cpu_seconds=round(time.process_time() - c0, 1),
        load_average_1min=round(os.getloadavg()[0], 2), clock=clock,
        **({"reference_base_s": base, "reference_work": cal.REFERENCE_NAME, "reference_warm": cal.REFERENCE_WARM,
            "reference_every": cal.REFERENCE_EVERY} if base is not None else {}),
        residuals_by_feature=residuals_by_feature(model, shapes, durs, decode_groups=run_groups(runs)))
    return model, runs


def run_groups(runs) -> list | None:
    """Every step's decode-group count over ``runs`` (None unless every run recorded them)."""
    if not runs or any("decode_groups" not in (r.info or {}) for r in runs):
        return None
    return [g for r in runs for g in r.info["decode_groups"]]


def stale_reasons(model, model_dir=None) -> list[str]:
    """Why ``model`` is not a calibration of this machine, this engine and this checkpoint
    (an empty list when it is)."""
    meta = getattr(model, "meta", {}) or {}
    out = []
    if meta.get("engine_fingerprint") != engine_fingerprint():
        out.append(f"fitted to engine code {meta.get('engine_fingerprint', 'not recorded')}, "
                   f"this engine is {engine_fingerprint()}")
    if meta.get("machine_key") != machine_key():
        out.append(f"fitted on machine {meta.get('machine_key', 'not recorded')}, this is {machine_key()}")
    if meta.get("model") not in (None, model_tag(model_dir)):
        out.append(f"fitted to checkpoint {meta['model']}, this is {model_tag(model_dir)}")
    return out


def step_model_here(quick: bool = True, model_dir=None, say=print, clock: str = "steady"):
    """``(model, path)``: this machine's calibration of this engine on ``clock`` (from the
    cache, else made now with :func:`calibrate_here` and cached)."""
    path = cache_path(model_dir, quick, clock)
    for p in (cache_path(model_dir, False, clock), path):  # a full calibration, when there is one, serves too
        if p.exists():
            try:
                return cal.load_step_model(p), p
            except ValueError:
                pass  # a broken cache file: calibrate again
    say(f"no calibration of this machine and engine yet: calibrating now "
        f"(`python -m servelab.sim calibrate{' --quick' if quick else ''}`, a few minutes; "
        f"kept in {path.parent})")
    model, _ = calibrate_here(quick=quick, model_dir=model_dir, clock=clock, say=say)
    cal.save_step_model(model, path)
    return model, path


@dataclass
class SpreadCheck:
    """Measured (``runs``: one percentile dict per engine run) against ``predicted``."""

    label: str
    runs: list
    predicted: dict
    info: dict = field(default_factory=dict)
    #: the prediction scaled by each run's level probe (None: no probe ran)
    relevelled: dict | None = None
    #: the prediction of step models fitted to the trace's other runs (None: not computed)
    own_fit: dict | None = None

    @property
    def measured(self) -> dict:
        return {k: float(np.median([r[k] for r in self.runs])) for k in METRICS}

    @property
    def spread(self) -> dict:
        """Half the range of the runs, as a share of their median, per metric (0 with one run)."""
        m = self.measured
        return {k: float((max(r[k] for r in self.runs) - min(r[k] for r in self.runs)) / 2 / m[k]) for k in METRICS}

    @property
    def median_noise(self) -> dict:
        """Per metric, the standard error of the measured median as a share of it: sqrt(pi/2)
        times the runs' standard deviation over sqrt(runs) (the large-sample rule for the median
        of normal draws); 0 with one run."""
        m, n = self.measured, len(self.runs)
        if n < 2:
            return {k: 0.0 for k in METRICS}
        return {k: float(np.sqrt(np.pi / 2) * np.std([r[k] for r in self.runs], ddof=1) / np.sqrt(n) / m[k])
                for k in METRICS}

    @property
    def errors(self) -> dict:
        m = self.measured
        return {k: (self.predicted[k] - m[k]) / m[k] for k in METRICS}

    @property
    def worst(self) -> float:
        return max(abs(e) for e in self.errors.values())

    def _errors_of(self, predicted: dict | None) -> dict | None:
        if predicted is None:
            return None
        m = self.measured
        return {k: (predicted[k] - m[k]) / m[k] for k in METRICS}

    @property
    def errors_relevelled(self) -> dict | None:
        return self._errors_of(self.relevelled)

    @property
    def own_fit_errors(self) -> dict | None:
        return self._errors_of(self.own_fit)

    @property
    def worst_spread(self) -> float:
        return max(self.spread.values())

    def table(self) -> str:
        n = len(self.runs)
        lines = [f"{'metric':<10}{'measured':>12}{'spread':>9}{'predicted':>12}{'error':>9}",
                 f"{'':<10}{f'median of {n}':>12}{'± half':>9}"]
        for k in METRICS:
            lines.append(f"{k:<10}{self.measured[k] * 1e3:>9.2f} ms{self.spread[k]:>8.1%} "
                         f"{self.predicted[k] * 1e3:>9.2f} ms{self.errors[k]:>+9.1%}")
        lines.append(f"engine's own spread: up to ±{self.worst_spread:.1%} between {n} runs")
        levels = self.info.get("levels")
        if levels:
            lines.append("machine speed vs the calibration (level probe after each run): "
                         + ", ".join(f"{x:.2f}x" for x in levels))
        for name, errs in (("scaled by that speed", self.errors_relevelled),
                           ("fitted to the trace's other runs", self.own_fit_errors)):
            if errs:
                lines.append(f"{name}: " + ", ".join(f"{k} {v:+.1%}" for k, v in errs.items())
                             + f"; worst {max(abs(v) for v in errs.values()):.1%}")
        lines.append(f"worst error: {self.worst:.1%}")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"label": self.label, "runs": self.runs, "predicted": self.predicted, "measured": self.measured,
                "spread": self.spread, "median_noise": self.median_noise, "errors": self.errors, "worst": self.worst, "info": self.info,
                "relevelled": self.relevelled, "errors_relevelled": self.errors_relevelled,
                "own_fit": self.own_fit, "own_fit_errors": self.own_fit_errors}


def noise_floor(checks, goal_worst: float | None = None, draws: int = 20_000, seed: int = 0) -> dict:
    """What a *perfect* simulator would score against ``checks``' measured medians from the
    engine runs' noise alone: each percentile's median drawn ``draws`` times as normal about
    the truth with its :attr:`SpreadCheck.median_noise`. ``{"expected_worst", "worst_p90",
    "expected_median", "p_over_goal"}`` (the chance the worst error over all percentiles
    exceeds ``goal_worst``; None without one). The judge's own noise: a worst error near
    ``expected_worst`` is as good as the measurement can tell."""
    sds = np.array([v for c in checks for v in c.median_noise.values()])
    if sds.size == 0:
        raise ValueError("noise_floor needs at least one check")
    z = np.abs(np.random.default_rng(seed).normal(size=(draws, sds.size)) * sds)
    worst = z.max(axis=1)
    return {"expected_worst": float(worst.mean()), "worst_p90": float(np.quantile(worst, 0.9)),
            "expected_median": float(np.median(z, axis=1).mean()),
            "p_over_goal": None if goal_worst is None else float((worst > goal_worst).mean())}


#: Scales of the step model whose predictions :func:`predict` takes the median of. One
#: simulation of a finite trace sits on a knife-edge: a p95 of 120 requests is about its
#: sixth-largest value, and the long-prompts trace's TPOT p95 jumped between 8.7-9.6 ms and
#: 10.3-10.6 ms as every step was scaled by 0.97-1.05 (the model committed at 269e22c: 0.98-1.0
#: high, 1.005-1.01 low). Where a percentile moves monotonically with the step times, the
#: median over scales symmetric about 1 is exactly the one simulation at 1; where it jumps, it
#: is the typical value. +-3% is about the range the level probe reads after a check's runs.
PREDICT_SCALES = (0.97, 0.98, 0.99, 1.0, 1.01, 1.02, 1.03)


def predict(trace: Trace, model, config: ReplicaConfig, scales: tuple = PREDICT_SCALES) -> dict:
    """The simulator's TTFT and TPOT p50/p95 on ``trace``: the median, per percentile, over
    ``model`` scaled by each of ``scales`` (``(1.0,)``: one simulation; a model without
    ``scaled`` is simulated once)."""
    if not hasattr(model, "scaled") or tuple(scales) == (1.0,):
        return _predict_once(trace, model, config)
    return _median_of([_predict_once(trace, model if x == 1.0 else model.scaled(x), config) for x in scales])


def _predict_once(trace: Trace, model, config: ReplicaConfig) -> dict:
    sim = simulate(trace, model, config)
    ttft = np.sort(sim.ttft[np.isfinite(sim.ttft)])
    tpot = np.sort(sim.tpot[np.isfinite(sim.tpot)])
    return {"ttft_p50": percentile(ttft, 50), "ttft_p95": percentile(ttft, 95),
            "tpot_p50": percentile(tpot, 50), "tpot_p95": percentile(tpot, 95)}


def check_history(result: dict) -> list[dict]:
    """A check's result (``sim.json``'s ``"calibration"``) and the earlier checks it keeps,
    newest first, each ``{"worst", "median", "cpu", "clock", "reference", "level_exponent",
    "prompt_level_exponent", "predict_scales", "reference_warm", "requests", "noise_floor",
    "aftermath", "git_commit", "predicted_before", "present"}``.
    ``present``: the present method (the steady clock's reference work a decode step, prompt
    work given its own power); ``predict_scales``: None for a check predicted with one
    simulation; ``reference_warm``: the untimed passes before each reference timing (None
    where not recorded: 1, until December 2026); ``requests``: each family's trace length (None or [] where not recorded: the
    checks before the families grew, of 60-200 requests); ``noise_floor``: the expected worst
    error of a perfect simulator against that check's medians (:func:`noise_floor`), where
    recorded; ``aftermath``: how many decode steps after a prompt step its step model priced
    apart (None where not recorded: before December 2026, one step at most); ``git_commit``: the
    engine's commit its runs were measured at; ``predicted_before``: what its runs scored
    before they were predicted again (a list, newest first; None where they were not)."""
    meta = (result.get("model") or {}).get("meta", {})
    at = result.get("engine_measured_at") or {}
    this = {"worst": result.get("held_out_worst"), "median": result.get("held_out_median"),
            "cpu": (at.get("machine") or {}).get("cpu"), "clock": at.get("clock") or meta.get("clock"),
            "reference": meta.get("reference_work"), "level_exponent": meta.get("level_exponent"),
            "prompt_level_exponent": meta.get("prompt_level_exponent"),
            "predict_scales": result.get("predict_scales"),
            "reference_warm": meta.get("reference_warm"),
            "requests": [r.get("requests") for r in result.get("rows") or [] if r.get("set") == "held-out"],
            "noise_floor": (result.get("noise_floor") or {}).get("expected_worst"),
            "aftermath": len((result.get("model") or {}).get("aftermath") or ()),
            "git_commit": at.get("git_commit"), "predicted_before": result.get("predicted_before")}
    out = []
    for h in [this] + list(result.get("history") or []):
        h = {k: h.get(k) for k in this}
        h["present"] = (h["clock"] == "steady" and h["reference"] == cal.REFERENCE_NAME
                        and bool(h["prompt_level_exponent"]))
        out.append(h)
    return out


def cpu_label(name: str | None) -> str:
    """A processor's name as the chapters print it: an Intel Xeon's long name shortened, a
    missing one "unrecorded"."""
    name = name or "unrecorded"
    return "Intel Xeon" if "Xeon" in name else name


def met_by_cpu(checks, goal: dict) -> dict:
    """``{processor: [checks, checks that met both goals]}`` over ``checks`` (from
    :func:`check_history`), in the order the processors first appear (by :func:`cpu_label`)."""
    out: dict = {}
    for h in checks:
        tally = out.setdefault(cpu_label(h.get("cpu")), [0, 0])
        tally[0] += 1
        tally[1] += int(h["worst"] <= goal["worst"] and h["median"] <= goal["median"])
    return out


def level_probe_trace() -> Trace:
    """The level probe: the quick calibration's Poisson stream (60 requests, served whole),
    whose pieces the step model was fitted to, so its prediction is right at the calibration's
    speed."""
    return random_streams(quick=True)["poisson mix"][0]


def machine_level(run, model) -> float:
    """How much slower (>1) ``run``'s steps ran than ``model`` predicts: total measured over
    total predicted step time, over the run's own steps."""
    predicted = sum(model.step_s(s) for s in run.shapes)
    if not run.shapes or predicted <= 0:
        raise ValueError("the level probe recorded no steps to measure the machine's speed by")
    return float(np.sum(run.durations) / predicted)


def speed_windows(run, model, window_s: float = 2.0) -> np.ndarray:
    """How the machine's speed wandered *within* ``run``: total measured over total predicted
    step time in consecutive windows of about ``window_s`` seconds of the run's own steps (a
    last, shorter window is dropped). Every window serves the same trace at the same model, so
    their spread is the machine's wander over seconds, plus the model's mispricing of whatever
    shapes a window held."""
    if window_s <= 0:
        raise ValueError(f"window_s must be positive seconds, got {window_s!r}")
    pred = np.array([model.step_s(s) for s in run.shapes])
    return np.array([float(run.durations[w].sum() / pred[w].sum())
                     for w in cal.window_slices(run.durations, window_s)])


def _median_of(preds: list) -> dict:
    return {k: float(np.median([p[k] for p in preds])) for k in METRICS}


def _own_fit_prediction(engine_runs) -> dict | None:
    """Each run predicted by a step model fitted to the other runs of its trace (out of sample;
    minutes apart when the runs went in rounds), the median over runs; with one run, a fit to
    it. None when the runs are too few to fit (a fit fails)."""
    trace, config = engine_runs[0].trace, engine_runs[0].config
    preds = []
    for i in range(len(engine_runs)):
        others = [r for j, r in enumerate(engine_runs) if j != i] or engine_runs
        try:
            preds.append(predict(trace, cal.fit_step_model(others), config))
        except ValueError:  # e.g. too few steps of a kind for its row-count offsets
            continue
    return _median_of(preds) if preds else None


def model_clock(model) -> str:
    """The clock ``model`` was calibrated on (its ``meta["clock"]``; "cpu" when not recorded)."""
    return (getattr(model, "meta", {}) or {}).get("clock") or "cpu"


def _reference_base(model, clock: str) -> float | None:
    if clock != "steady":
        return None
    base = (getattr(model, "meta", {}) or {}).get("reference_base_s")
    if base is None:
        raise ValueError("a check on the steady clock divides the engine's steps by the machine's level against "
                         "the calibration's reference time, and this step model has none (meta reference_base_s): "
                         "calibrate again (`python -m servelab.sim calibrate --quick`) or check with --clock cpu")
    return float(base)


def model_level_exponent(model) -> float:
    """The power of the machine's level ``model``'s calibration divides decode steps by (its
    ``meta["level_exponent"]``; 1.0, the plain division, when not recorded)."""
    return float((getattr(model, "meta", {}) or {}).get("level_exponent", 1.0))


def model_prompt_exponent(model) -> float | None:
    """The power a step's prompt work follows in ``model``'s calibration (its
    ``meta["prompt_level_exponent"]``; None, every step at the decode power, when not recorded)."""
    x = (getattr(model, "meta", {}) or {}).get("prompt_level_exponent")
    return None if x is None else float(x)


def serve_once(trace: Trace, model, config: ReplicaConfig | None = None, *, model_dir=None, clock: str | None = None,
               label: str = "", seed_offset: int = 0, relevel: bool = False):
    """Serve ``trace`` once with a freshly built engine (no prefixes cached from another run);
    an :class:`~servelab.sim.calibrate.EngineRun` with ``info["load_average_1min"]``. With
    ``relevel``, the same engine then serves :func:`level_probe_trace` (other prompts: another
    seed, so no prefix hits) and ``info["level"]`` is its :func:`machine_level`. ``clock``:
    default the model's own (:func:`model_clock`); on the steady clock the run is read against
    the calibration's reference time."""
    config = config or cal.CONFIGS["base"]
    clock = clock or model_clock(model)
    base = _reference_base(model, clock)
    llm = cal.build_llm(config, model_dir)
    power = model_level_exponent(model) if clock == "steady" else 1.0
    powers = {"level_exponent": power, "prompt_level_exponent": model_prompt_exponent(model) if clock == "steady"
              else None, "share_model": model}
    run = cal.run_engine(trace, config, model_dir=model_dir, llm=llm, label=label, clock=clock, probe=False,
                         reference_base=base, **powers)
    run.info["load_average_1min"] = round(os.getloadavg()[0], 2)
    if relevel:
        probe = cal.run_engine(level_probe_trace(), config, llm=llm, seed=1000 + seed_offset,
                               label=f"level probe {label}", clock=clock, probe=False, reference_base=base,
                               **powers)
        run.info["level"] = machine_level(probe, model)
    return run


def check_trace(trace: Trace, model, config: ReplicaConfig | None = None, *, repeats: int = 5, model_dir=None,
                clock: str | None = None, label: str = "", say=None, keep_runs: bool = False,
                relevel: bool = False, own_fit: bool = True) -> SpreadCheck:
    """Serve ``trace`` with the engine ``repeats`` times (:func:`serve_once`: a fresh engine
    each time) and compare the median of each percentile with the simulator's prediction,
    beside the runs' spread (:func:`spread_check`).

    ``relevel``: after each run, serve :func:`level_probe_trace` on the same engine and
    also report the prediction scaled by :func:`machine_level` (the machine's speed then
    against the calibration) as ``relevelled``. ``own_fit``: also predict each run with a
    step model fitted to the other runs (see the module doc)."""
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a positive whole number, got {repeats!r}")
    config = config or cal.CONFIGS["base"]
    clock = clock or model_clock(model)
    relevel = relevel and hasattr(model, "scaled")  # a model that cannot be scaled has no relevelled line
    engine_runs = []
    for k in range(repeats):
        if say:
            say(f"engine run {k + 1} of {repeats} ..." + (" (then the level probe)" if relevel else ""))
        engine_runs.append(serve_once(trace, model, config, model_dir=model_dir, clock=clock,
                                      label=f"{label} #{k + 1}", seed_offset=k, relevel=relevel))
    info = {"config": config.__dict__, "clock": clock, "git_commit": cal.git_commit()}
    check = spread_check(label, engine_runs, model, own_fit=own_fit, info=info)
    if keep_runs:
        check.info["engine_runs"] = engine_runs
    return check


def spread_check(label: str, engine_runs: list, model, *, own_fit: bool = True,
                 info: dict | None = None) -> SpreadCheck:
    """A :class:`SpreadCheck` from engine runs of one trace (and config) already measured
    (:func:`serve_once`). When every run has its level probe's ``info["level"]``, the
    prediction scaled by each is reported as ``relevelled``."""
    if not engine_runs:
        raise ValueError("spread_check needs at least one engine run")
    trace, config = engine_runs[0].trace, engine_runs[0].config
    info = dict(info or {})
    info.setdefault("requests", len(trace))
    info.setdefault("rate", trace.rate)
    info["steps"] = [len(r.shapes) for r in engine_runs]
    loads = [r.info["load_average_1min"] for r in engine_runs if r.info.get("load_average_1min") is not None]
    info.setdefault("load_average_1min", max(loads, default=None))
    predicted, relevelled = predict(trace, model, config), None
    levels = [r.info.get("level") for r in engine_runs]
    if None not in levels:
        info["levels"] = [round(float(x), 4) for x in levels]
        relevelled = _median_of([predict(trace, model.scaled(x), config) for x in levels])
    own = _own_fit_prediction(engine_runs) if own_fit else None
    return SpreadCheck(label, [r.percentiles() for r in engine_runs], predicted, info,
                       relevelled=relevelled, own_fit=own)


def save_check(check: SpreadCheck, path) -> Path:
    path = Path(path)
    d = check.to_dict()
    d["info"] = {k: v for k, v in d["info"].items() if k != "engine_runs"}
    path.write_text(json.dumps(d, indent=1) + "\n")
    return path
