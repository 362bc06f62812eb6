"""The steady clock: the machine's level, read from a fixed piece of work, and the power of
it the engine's steps follow.

A shared virtual machine changes speed from second to second (neighbours it cannot see share
its caches and memory), and even a step's CPU time follows. So on the steady clock
(:func:`servelab.sim.calibrate.run_engine` with ``clock="steady"``) the engine times
:func:`reference_work`, a small decode step of its own, every ``REFERENCE_EVERY`` steps;
the median of the latest ``LEVEL_WINDOW`` timings over its time at the calibration's start
is the machine's *level*, and each step's CPU time is divided by the level raised to a
power. A calibration fits that power (:func:`fit_level_exponent`) and every check divides
by it; with a decode step as the reference it comes out near 1 (the steps slow as much as
the reference does); :func:`relevel` applies another power to a run already measured.

Pure numpy (the reference work imports torch inside).
"""
from __future__ import annotations

import math
import re
import time
from dataclasses import replace

import numpy as np

__all__ = ["PROMPT_EXPONENT_FLOOR", "REFERENCE_ROWS", "REFERENCE_CONTEXT", "REFERENCE_NAME", "REFERENCE_WARM", "LEVEL_WINDOW", "REFERENCE_EVERY", "LEVEL_WINDOW_S", "LEVEL_EXPONENT_RANGE",
           "reference_work", "time_reference", "reference_drift", "step_levels", "relevel", "window_slices", "reference_windows", "is_prompt_step", "prompt_share", "step_exponent", "step_exponents", "fit_prompt_exponent", "piece_of", "exponents_of", "MIN_KIND_STEPS",
           "fit_level_exponent"]

#: The reference work's shape: a decode step of this many rows, each reading
#: ``REFERENCE_CONTEXT`` cached tokens.
REFERENCE_ROWS = 4
REFERENCE_CONTEXT = 128

#: What the reference work is, in a few words (kept in a calibration's meta; the steady
#: clock's first reference, until December 2026, was "one row through the weights").
REFERENCE_NAME = f"a decode step ({REFERENCE_ROWS} rows, {REFERENCE_CONTEXT} cached tokens)"

#: Untimed passes of the reference work before the timed one, so it reads the machine and
#: not the steps before it: right after the engine's many-row steps the reference runs slow
#: for several passes (:data:`AFTER_BIG_STEPS_MS`). With one (until December 2026) the
#: overload family's level read :data:`OVERLOAD_LEVEL_ONE_PASS` while a probe after each run
#: read the machine at 1.01-1.02, so its steps were divided by the engine's own aftermath
#: (held out, its 24+-row steps came out at 0.91 of their price); with 8 it read 0.98.
REFERENCE_WARM = 8

#: The evidence for ``REFERENCE_WARM``, measured by hand on a 2-vCPU Xeon (December 2026):
#: the reference's first passes right after the engine's 32-row steps, and its time when
#: warm, in ms; the overload family's level with one untimed pass (10th-90th percentile).
AFTER_BIG_STEPS_MS = (5.2, 4.8, 4.3, 3.9, 3.5, 3.4)
WARM_MS = (2.9, 3.1)
OVERLOAD_LEVEL_ONE_PASS = (1.22, 1.50)

#: References whose median sets the steady clock's current level (the latest ones).
LEVEL_WINDOW = 3

#: Steps between timings of the reference work (:func:`run_engine`'s default): 30 (10 until
#: the warm-up grew to 8 passes, which would have added half to a long-answers run's time).
REFERENCE_EVERY = 30

#: Windows of this many seconds (of a run's own steps) in which :func:`fit_level_exponent`
#: compares the steps' pace with the machine's level.
LEVEL_WINDOW_S = 2.0

#: Steps of one kind a window needs for :func:`fit_level_exponent` to read that kind's pace in it.
MIN_KIND_STEPS = 3

#: The lowest prompt power :func:`fit_prompt_exponent` returns (a fit below it has read
#: noise; a calibration at it has no measured prompt power).
PROMPT_EXPONENT_FLOOR = 0.1

#: The range :func:`fit_level_exponent` keeps its answer in (outside it the fit is taken to
#: have read noise, not the machine).
LEVEL_EXPONENT_RANGE = (0.5, 3.0)


def reference_work(llm):
    """A fixed piece of work that is a decode step: ``REFERENCE_ROWS`` rows, each attending to
    ``REFERENCE_CONTEXT`` cached tokens, through the whole model (embedding, every layer, the
    output head), on a small cache of its own (no engine state touched). Returns a function
    that does it once.

    A real step's work, so decode steps follow its time nearly one for one (the decode powers
    of the calibrations since, in ``benchmarks/results/sim.json``'s history, 0.82-0.96). One row
    through the weight matrices alone (this function until December 2026) swung less than the
    steps did, and the power fitted to it wandered from 1.09 to 1.80 between calibrations
    (the same history)."""
    import torch

    from servelab.model import KVCache
    model = llm.model
    cfg = model.config
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    cache = KVCache(cfg, batch_size=REFERENCE_ROWS, max_len=REFERENCE_CONTEXT + 1, dtype=dtype)
    ids = torch.ones(REFERENCE_ROWS, 1, dtype=torch.long)

    def run():
        with torch.no_grad():
            cache.crop(0)
            cache.advance(REFERENCE_CONTEXT)  # as if the context were cached: the step reads it all
            model(ids, cache=cache)
    run()
    return run


def time_reference(reference, warm: int = REFERENCE_WARM) -> float:
    """CPU seconds of one pass of ``reference`` (from :func:`reference_work`) after ``warm``
    untimed ones."""
    for _ in range(warm):
        reference()
    c0 = time.thread_time()
    reference()
    return time.thread_time() - c0


def reference_drift(run, min_count: int = 8) -> float | None:
    """How much the machine's speed shifted within ``run``: the median time of the reference work
    in the slower half of the run over the faster half (1.0: a steady machine; one timing alone
    varies by tens of percent, a half's median by a few). None with fewer than ``min_count``
    timings."""
    refs = run.info.get("reference_s") if run.info else None
    if not refs or len(refs) < min_count:
        return None
    h = len(refs) // 2
    a, b = float(np.median(refs[:h])), float(np.median(refs[h:]))
    return max(a, b) / min(a, b)


def step_levels(run) -> np.ndarray | None:
    """The machine's level each of ``run``'s steps was divided by on the steady clock (None
    for another clock). Runs recorded before ``info["step_levels"]`` existed: rebuilt from
    the level after each reference timing (every ``info["reference_every"]`` steps), the first
    steps taking the first one."""
    info = run.info or {}
    if info.get("clock") != "steady":
        return None
    if info.get("step_levels") is not None:
        return np.asarray(info["step_levels"], dtype=float)
    levels = info.get("levels") or []
    if not levels:
        return None
    every = int(info.get("reference_every", 10))  # 10: the default when runs did not record it
    j = np.clip(np.arange(len(run.shapes)) // every - 1, 0, len(levels) - 1)
    return np.asarray(levels, dtype=float)[j]


def is_prompt_step(shape) -> bool:
    """A step with prompt tokens (the step model's prompt line), as against a decode-only step."""
    return bool(shape.prefill_tokens)


def prompt_share(model, shape) -> float:
    """The share of ``shape``'s predicted time that its prompt tokens' own work takes (per
    prompt token and per attention pair, on ``model``'s prompt line): 0 for a decode-only step,
    near 1 for a long prompt alone. 0 for a model without a prompt line."""
    if not shape.prefill_tokens:
        return 0.0
    line = getattr(model, "prefill", None) or getattr(getattr(model, "base", None), "prefill", None)
    if line is None:
        return 0.0
    t = line.step_s(shape)
    work = line.b_prefill * shape.prefill_tokens + line.e_pairs * shape.prefill_pairs
    return float(min(1.0, max(0.0, work / t))) if t > 0 else 0.0


def step_exponent(shape, level_exponent: float, prompt_level_exponent: float | None = None,
                  model=None) -> float:
    """The power of the level one step is divided by: ``level_exponent``, moved toward
    ``prompt_level_exponent`` by the step's :func:`prompt_share` on ``model`` (a long prompt's
    step is compute-bound and swings less than a decode step). Without a prompt exponent or
    a model, ``level_exponent``."""
    if prompt_level_exponent is None or model is None:
        return float(level_exponent)
    return float(level_exponent + (prompt_level_exponent - level_exponent) * prompt_share(model, shape))


def step_exponents(shapes, level_exponent: float, prompt_level_exponent: float | None = None,
                   model=None) -> np.ndarray:
    """:func:`step_exponent` of every step in ``shapes``."""
    return np.array([step_exponent(s, level_exponent, prompt_level_exponent, model) for s in shapes],
                    dtype=float)


def exponents_of(run) -> np.ndarray:
    """The power of the level each of ``run``'s steps was divided by (its
    ``info["step_exponents"]``, else its one ``info["level_exponent"]``, else 1.0)."""
    info = run.info or {}
    if info.get("step_exponents") is not None:
        return np.asarray(info["step_exponents"], dtype=float)
    return np.full(len(run.shapes), float(info.get("level_exponent", 1.0)))


def relevel(run, level_exponent: float, prompt_level_exponent: float | None = None, model=None):
    """``run`` with every step's time divided by its level to the powers of
    :func:`step_exponents` instead of the powers it ran with (steady clock only). Only the step
    times change: the schedule and the latencies stay those of the clock it ran on, which is
    all a fit of step times needs."""
    lev = step_levels(run)
    if lev is None:
        raise ValueError(f"run {run.label!r} is not on the steady clock: it has no levels to relevel by")
    old = exponents_of(run)
    new = step_exponents(run.shapes, level_exponent, prompt_level_exponent, model)
    info = dict(run.info, level_exponent=float(level_exponent), step_exponents=np.round(new, 4).tolist())
    if prompt_level_exponent is not None and model is not None:
        info["prompt_level_exponent"] = float(prompt_level_exponent)
    else:
        info.pop("prompt_level_exponent", None)
    return replace(run, durations=run.durations * lev ** (old - new), info=info)


def window_slices(durations, window_s: float) -> list[slice]:
    """Consecutive runs of steps whose times first add up to ``window_s`` seconds or more (a
    last, shorter run is dropped)."""
    out, lo, clock = [], 0, 0.0
    for k, dt in enumerate(durations):
        clock += float(dt)
        if clock >= window_s:
            out.append(slice(lo, k + 1))
            lo, clock = k + 1, 0.0
    return out


def reference_windows(run, model, window_s: float = LEVEL_WINDOW_S,
                      kind: str | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(even, odd, log pace)`` per window of about ``window_s`` seconds of ``run``'s steps:
    the mean log time of the reference work over the timings taken in the window, from its
    even and its odd timings apart (two readings of the machine's level whose noises are
    independent), and the steps' CPU time before any division (level to the power the run
    used, times its time) over ``model``'s prediction. A window needs four timings (the
    reference is timed after every ``info["reference_every"]`` steps, default
    ``REFERENCE_EVERY``). ``kind="decode"``: read only the decode-only steps' pace (at least
    ``MIN_KIND_STEPS`` of them in a window; prompt work has its own fit,
    :func:`fit_prompt_exponent`). Empty arrays when the run has no timings or no levels."""
    if kind not in (None, "decode"):
        raise ValueError(f"kind must be None or 'decode', got {kind!r}")
    refs = (run.info or {}).get("reference_s")
    lev = step_levels(run)
    empty = np.zeros(0), np.zeros(0), np.zeros(0)
    if not refs or lev is None or len(lev) != len(run.durations):
        return empty
    every = int(run.info.get("reference_every", REFERENCE_EVERY))
    after = (np.arange(len(refs)) + 1) * every - 1  # the step each timing followed
    log_ref = np.log(np.asarray(refs, dtype=float))
    raw = run.durations * lev ** exponents_of(run)
    pred = np.array([model.step_s(s) for s in run.shapes])
    keep = np.array([kind is None or not is_prompt_step(s) for s in run.shapes], dtype=bool)
    need = 1 if kind is None else MIN_KIND_STEPS
    even, odd, pace = [], [], []
    for w in window_slices(run.durations, window_s):
        q = log_ref[(after >= w.start) & (after < w.stop)]
        m = keep[w]
        p = pred[w][m].sum()
        if len(q) >= 4 and m.sum() >= need and p > 0:
            even.append(q[0::2].mean())
            odd.append(q[1::2].mean())
            pace.append(math.log(float(raw[w][m].sum() / p)))
    return np.array(even), np.array(odd), np.array(pace)


#: Below this spread of the level's window readings (their standard deviation) there is no
#: slope to read: :func:`fit_level_exponent` keeps the plain division (power 1).
LEVEL_SD_MIN = 0.01


def fit_level_exponent(runs, model, window_s: float = LEVEL_WINDOW_S, min_windows: int = 8,
                       kind: str | None = None) -> dict:
    """How much the engine's steps slow when the reference work slows by a factor: the slope
    of log(step CPU time / ``model``'s prediction) on log(reference time) over windows of
    about ``window_s`` seconds, within each run (each run's own mean taken out, so a model's
    offset for one piece's shapes does not count).

    One timing of the reference work is noisy (about 9% on the course's VM), and a plain
    least-squares slope on a noisy reading comes out too flat (a third flatter in a
    calibration's 2-second windows, where a dozen timings fall). So each window is read twice,
    from its even and from its odd timings, and the slope is the covariance of the pace with
    their mean over the covariance of the two readings (an instrumental-variable fit: the
    noise of one reading is not in the other). Returns ``{"exponent", "windows", "r",
    "level_sd", "reliability", "plain_slope"}`` (reliability: the share of the readings'
    variance that is the machine's, not noise; plain_slope: the flatter least-squares slope).
    The exponent is 1.0 (the steady clock's plain division) when there are fewer than
    ``min_windows`` windows, the level barely moved (sd under ``LEVEL_SD_MIN``) or the readings are mostly
    noise (reliability under 0.5), and is kept within ``LEVEL_EXPONENT_RANGE``."""
    parts = [reference_windows(run, model, window_s, kind) for run in runs]
    parts = [[v - v.mean() for v in part] for part in parts if len(part[2]) >= 2]
    even, odd, pace = (np.concatenate([p[i] for p in parts]) if parts else np.zeros(0) for i in range(3))
    level = (even + odd) / 2
    out = {"windows": int(len(pace)), "level_sd": round(float(level.std()), 4) if len(pace) else 0.0}
    if len(pace) < min_windows or level.std() < LEVEL_SD_MIN:
        return dict(out, exponent=1.0, r=None, reliability=None, plain_slope=None)
    shared = float((even * odd).sum())  # the readings' covariance: the machine's variance alone
    reliability = shared / float((level * level).sum())
    plain = float((level * pace).sum() / (level * level).sum())
    out.update(r=round(float(np.corrcoef(level, pace)[0, 1]), 3), reliability=round(reliability, 3),
               plain_slope=round(plain, 3))
    if reliability < 0.5:
        return dict(out, exponent=1.0)
    slope = float((level * pace).sum()) / shared
    lo, hi = LEVEL_EXPONENT_RANGE
    return dict(out, exponent=round(min(hi, max(lo, slope)), 3))


def piece_of(label: str) -> str:
    """The piece or trace a run served, without its round: "sweep (2)" and "bursts #3" are runs
    of "sweep" and "bursts" (the same shapes at another moment)."""
    return re.sub(r"( \(\d+\)| #\d+)$", "", label or "")


def _prompt_terms(run, model, level_exponent: float):
    """Per step with prompt tokens of ``run``: its share, share x log level, and log(CPU time /
    prediction) less the decode part's ``level_exponent`` x (1 - share) x log level."""
    lev = step_levels(run)
    if lev is None or len(lev) != len(run.shapes):
        return None
    loglev = np.log(lev)
    raw = np.log(run.durations) + exponents_of(run) * loglev
    out = []
    for i, s in enumerate(run.shapes):
        if not s.prefill_tokens:
            continue
        share, p = prompt_share(model, s), model.step_s(s)
        if p > 0 and share > 0:
            out.append((share, share * loglev[i],
                        raw[i] - math.log(p) - level_exponent * (1 - share) * loglev[i]))
    return (np.array(out).T, float(np.median(loglev))) if len(out) >= 3 else None


def fit_prompt_exponent(runs, model, level_exponent: float, min_steps: int = 30,
                        min_level_sd: float = 0.03) -> dict:
    """The power of the level a step's prompt work follows (:func:`step_exponents`), given
    the decode steps' ``level_exponent``: the slope of log(step CPU time / ``model``'s
    prediction), less the decode part's ``level_exponent`` x (1 - share) x log level, on
    share x log level, over the steps with prompt tokens.

    Read *between runs of the same piece* (:func:`piece_of`: a calibration's rounds, a check's
    repeats), the level each run ran at on the whole. A step's own level is a median of three
    timings of a decode step taken before it, a noisy reading, and a slope on it comes out too
    flat: on one calibration of the course's VM 0.19 step by step within runs, 0.55 between
    them (the held-out runs of its check: 0.21 and 0.62; those runs are
    ``data/sim/calibration_runs.json`` at commit 291a441). Prompt steps are too few for the
    windows :func:`fit_level_exponent` reads. So each step's instrument is its share x (its
    run's median log level less its piece's), and the slope is the covariance of the steps'
    times with it over that of their levels (within each piece, a misprice of the piece's
    shapes cancels). Returns ``{"exponent", "steps", "r", "level_sd", "how"}`` (level_sd: the
    spread of the runs' levels about their pieces'; how: "between runs", or "within runs", the
    step-by-step slope, when no piece ran twice at levels apart by ``min_level_sd``). The
    exponent is ``level_exponent`` (no correction) with fewer than ``min_steps`` steps or no
    spread, and is kept within ``LEVEL_EXPONENT_RANGE`` (its lower end lowered to :data:`PROMPT_EXPONENT_FLOOR`)."""
    terms = [(run.label, t) for run in runs if (t := _prompt_terms(run, model, level_exponent)) is not None]
    pieces: dict = {}
    for label, t in terms:
        pieces.setdefault(piece_of(label), []).append(t)
    xs, ys, zs, spread = [], [], [], []
    for ts in pieces.values():
        if len(ts) < 2:
            continue
        n = np.array([len(a[0]) for a, _ in ts], dtype=float)
        mid = float((n * np.array([m for _, m in ts])).sum() / n.sum())
        x = np.concatenate([a[1] for a, _ in ts])
        y = np.concatenate([a[2] for a, _ in ts])
        xs.append(x - x.mean())
        ys.append(y - y.mean())
        zs.append(np.concatenate([a[0] * (m - mid) for a, m in ts]))
        spread += [m - mid for _, m in ts]
    level_sd = float(np.std(spread)) if spread else 0.0
    hi = LEVEL_EXPONENT_RANGE[1]
    if level_sd >= min_level_sd and sum(len(x) for x in xs) >= min_steps:
        x, y, z = (np.concatenate(v) for v in (xs, ys, zs))
        slope = float((z * y).sum() / (z * x).sum())
        return {"steps": int(len(x)), "exponent": round(min(hi, max(PROMPT_EXPONENT_FLOOR, slope)), 3),
                "r": round(float(np.corrcoef(z, y)[0, 1]), 3), "level_sd": round(level_sd, 3),
                "how": "between runs"}
    # no piece ran twice at levels apart: the step-by-step slope within each run
    xs, ys = [], []
    for _, (a, _m) in terms:
        xs.append(a[1] - a[1].mean())
        ys.append(a[2] - a[2].mean())
    x = np.concatenate(xs) if xs else np.zeros(0)
    y = np.concatenate(ys) if ys else np.zeros(0)
    out = {"steps": int(len(x)), "level_sd": round(level_sd, 3), "how": "within runs"}
    if len(x) < min_steps or x.std() < 1e-3:
        return dict(out, exponent=float(level_exponent), r=None)
    slope = float((x * y).sum() / (x * x).sum())
    return dict(out, exponent=round(min(hi, max(PROMPT_EXPONENT_FLOOR, slope)), 3), r=round(float(np.corrcoef(x, y)[0, 1]), 3))
