"""Fitting step models to measured steps: :func:`fit_linear` (one line),
:func:`fit_by_kind` (decode and prompt steps apart, the decode line's knee and the
aftermath of a prompt step) and :func:`fit_report` (how well a model explains steps).
The models themselves are in :mod:`servelab.sim.step_model`. Pure Python + numpy.
"""
from __future__ import annotations

import itertools
import math

import numpy as np

from servelab.sim.step_model import (BIN_ON, FEATURES, STEP_KINDS, KindStepModel, LinearStepModel, StepModel,
                                     aftermath_position, step_kind)

__all__ = ["fit_linear", "fit_by_kind", "fit_report", "filled_bins", "AFTERMATH_STEPS", "KNEE_GAIN",
           "KNEE_QUANTILES", "DECODE_FEATURES", "PREFILL_FEATURES"]


def fit_report(model: StepModel, shapes, durations) -> dict:
    """How well ``model`` explains measured steps: R^2 (on seconds) and, per step kind,
    the count, the median relative error (predicted - measured over measured), the
    median absolute relative error and the predicted/measured ratio of their total time."""
    shapes = list(shapes)
    y = np.asarray(durations, dtype=float)
    pred = np.array([model.step_s(s) for s in shapes])
    ss_res = float(np.sum((y - pred) ** 2))
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    out = {"r2": 1.0 - ss_res / ss_tot if ss_tot > 0 else math.nan, "n_steps": int(len(y)),
           "median_abs_rel_err": float(np.median(np.abs(pred - y) / y)) if len(y) else math.nan,
           "kinds": {}}
    kinds = np.array([step_kind(s) for s in shapes])
    for k in STEP_KINDS:
        m = kinds == k
        if not m.any():
            continue
        rel = (pred[m] - y[m]) / y[m]
        out["kinds"][k] = {"steps": int(m.sum()), "median_err": float(np.median(rel)),
                           "median_abs_err": float(np.median(np.abs(rel))),
                           "total_ratio": float(pred[m].sum() / y[m].sum())}
    return out


def filled_bins(rows, edges, min_steps: int) -> tuple:
    """The ``edges`` whose bins (``edges[k] <= rows < edges[k + 1]``, the last one open)
    hold at least ``min_steps`` of the steps' ``rows``. A bin with fewer steps cannot be
    measured (its fitted offset can go anywhere); dropping its edge merges it into the bin below."""
    rows = np.asarray(rows)
    edges = tuple(edges)
    return tuple(b for b, nxt in zip(edges, (*edges[1:], np.inf))
                 if np.sum((rows >= b) & (rows < nxt)) >= min_steps)


#: Terms of each part of :func:`fit_by_kind`.
DECODE_FEATURES = ("decode_rows", "decode_context")
PREFILL_FEATURES = ("prefill_tokens", "decode_rows", "decode_context", "prefill_pairs", "prefill_seqs")


def _fit_shedding_bins(shapes, y, bins: tuple, keep: int = 0, **kw) -> "LinearStepModel":
    """:func:`fit_linear` with ``bins``, dropping the top bin while the fit fails (down to ``keep`` bins)."""
    while True:
        try:
            return fit_linear(shapes, y, bins=bins, **kw)
        except ValueError:
            if len(bins) <= keep:
                raise
            bins = bins[:-1]


#: Candidate knees of the decode line (:func:`_fit_decode_line`): these quantiles of the
#: decode steps' total context; a knee is kept when it cuts the squared error by ``KNEE_GAIN``.
KNEE_QUANTILES = tuple(np.linspace(0.1, 0.9, 17).round(2))
KNEE_GAIN = 0.01


def _fit_decode_line(shapes, y, bins: tuple) -> "LinearStepModel":
    """The decode line, with the knee of :data:`KNEE_QUANTILES` that fits best when it cuts the
    squared error by at least ``KNEE_GAIN`` (``meta["knee_gain"]``: the share it cut)."""
    def sse(m):
        return float(sum((m.step_s(s) - t) ** 2 for s, t in zip(shapes, y)))
    line = straight = _fit_shedding_bins(shapes, y, bins, features=DECODE_FEATURES)
    base = best = sse(line)
    context = np.array([s.decode_context for s in shapes], dtype=float)
    for knee in sorted({int(k) for k in np.quantile(context, KNEE_QUANTILES) if k > 0}):
        m = _fit_shedding_bins(shapes, y, line.bin_edges, features=DECODE_FEATURES, knee=knee)
        if m.g_knee > 0 and (e := sse(m)) < best:
            line, best = m, e
    if best > base * (1 - KNEE_GAIN):  # too little gained to tell from noise
        line = straight
    line.meta["knee_gain"] = round(1 - best / base, 4) if base > 0 else 0.0
    return line


#: How many decode steps after a prompt step :func:`fit_by_kind` prices apart (the aftermath).
AFTERMATH_STEPS = 6


def _fit_aftermath(decode: LinearStepModel, shapes, y, positions, min_steps: int) -> tuple:
    """``((a1, b1), ...)``: for each position k (1, 2, ...) after a prompt step, least squares
    (both >= 0) of those decode steps' excess over ``decode`` on ``line * (a + b * P)``, P the
    prompt step's tokens; it stops at the first position with fewer than ``min_steps`` steps,
    and drops trailing positions that cost nothing."""
    positions = np.asarray(positions)
    y = np.asarray(y, dtype=float)
    out = []
    for k in range(1, AFTERMATH_STEPS + 1):
        idx = np.flatnonzero(positions == k)
        if len(idx) < min_steps:
            break
        line = np.array([decode.step_s(shapes[i]) for i in idx])
        tokens = np.array([shapes[i].after_prompt_tokens for i in idx], dtype=float)
        excess = y[idx] - line
        X = np.column_stack([line, line * tokens])
        (a, b), *_ = np.linalg.lstsq(X, excess, rcond=None)
        if b < 0:
            a, b = float(excess.sum() / line.sum()), 0.0
        if a < 0:
            col = X[:, 1]
            a, b = 0.0, float(col @ excess / (col @ col))
        out.append((max(float(a), 0.0), max(float(b), 0.0)))
    while out and out[-1] == (0.0, 0.0):
        out.pop()
    return tuple(out)


def fit_by_kind(shapes, durations, *, decode_bins: tuple = (2, 3, 4, 6, 9, 17, 25), min_bin_steps: int = 20,
                meta: dict | None = None, prompt_weighting: str = "relative",
                prompt_row_bins: tuple = (1, 5, 9, 17, 25)) -> KindStepModel:
    """Fit a :class:`KindStepModel` by least squares (slopes >= 0, row offsets of any sign).

    Pure decode steps fit ``a + c*rows + d*context`` plus an offset per row-count bin
    (``decode_bins``; a bin with fewer than ``min_bin_steps`` steps is merged into the one
    below). Steps with prompt tokens fit ``a + b*prompt tokens + e*attention pairs + f*prompt
    chunks + c*decode rows + d*context``, plus an offset per band of decode rows sharing the
    step (``prompt_row_bins``, likewise): one slope per row priced a calibration's mixed steps
    of 24-32 rows and a short prompt 11% slow, the shape a queue for seats runs on (the runs
    in ``data/sim/calibration_runs.json`` at commit bbd88fa).

    The first few pure decode steps after a step with prompt tokens run slower, most the
    second (the *aftermath*: on the course's Xeon VM the 1st-5th took 15%, 11%, 7%, 4%, 2% over
    a line fitted to the others in the calibration, 10%, 6%, 2%, 0.5%, 0% held out, more after
    a longer prompt step: ``data/sim/calibration_runs.json`` at commit 9fc8bb3). The decode
    line is fitted without the first ``AFTERMATH_STEPS`` such steps (a line through them ran
    long-trace decode steps of 4-15 rows 6-8% fast, where most steps are far from a prompt step),
    and each position's excess as a share ``a_k + b_k * P`` of its line (:func:`_fit_aftermath`);
    a position needs ``min_bin_steps`` steps.

    The decode line may bend up once at a knee of total context (:func:`_fit_decode_line`): on
    an AMD EPYC each token beyond about 1,900 cost 1.7 us more than the 2.2 us before it (a
    cache outgrown, probably: there one layer's keys and values take about 2 MB in float32),
    and a straight line priced short-context steps 5-16% low (commit ff640ad's runs; on the
    Intel Xeon's runs no knee cut the error by ``KNEE_GAIN``).

    The decode line minimises squared seconds (its steps add up to the measured time). The
    prompt line weighs each step's *relative* error alike (``prompt_weighting``), then is
    scaled so its steps add up to the measured time too (a relative fit alone runs low: on
    one calibration of the course's VM its prompt steps summed to 0.94 of their time). Its steps
    run from a few milliseconds (a lone short prompt) to over a hundred (a full chunk over a
    long prefix), and in squared seconds the longest few set it. On one calibration of the
    course's VM that fit priced every prompt step at 15.7 ms or more, an 8-token one at 3x
    its measured time.
    """
    shapes = list(shapes)
    y = np.asarray(durations, dtype=float)
    if len(shapes) != len(y):
        raise ValueError(f"got {len(shapes)} step shapes but {len(y)} durations")
    dec = np.array([not s.prefill_tokens for s in shapes], dtype=bool)
    need = {"decode": len(DECODE_FEATURES) + 1, "prompt": len(PREFILL_FEATURES) + 1}
    for name, m in (("decode", dec), ("prompt", ~dec)):
        if m.sum() < need[name]:
            raise ValueError(f"need at least {need[name]} measured {name} steps to fit that part, got {int(m.sum())}")
    positions = np.array([aftermath_position(s) for s in shapes])
    after = dec & (positions >= 1) & (positions <= AFTERMATH_STEPS)
    if (positions == 1).sum() < min_bin_steps or (dec & ~after).sum() < need["decode"]:
        after[:] = False  # too few to tell apart: the line takes them as they come
    plain = dec & ~after
    dshapes = [s for s, d in zip(shapes, plain) if d]
    rows = [s.decode_rows for s in dshapes]
    bins = filled_bins(rows, sorted(int(b) for b in decode_bins), min_bin_steps)
    decode = _fit_decode_line(dshapes, y[plain], bins)
    aftermath = _fit_aftermath(decode, shapes, y, np.where(after, positions, 0), min_bin_steps)
    pshapes = [s for s, d in zip(shapes, dec) if not d]
    mixed = sum(1 for s in pshapes if s.decode_rows)
    # a step with prompt tokens pays once for having decode rows at all, then by bands of rows
    more = sorted(int(b) for b in prompt_row_bins if int(b) > 1)
    pbins = ((1,) + filled_bins([s.decode_rows for s in pshapes], more, min_bin_steps)
             if min_bin_steps <= mixed < len(pshapes) else ())
    prefill = _fit_shedding_bins(pshapes, y[~dec], pbins, keep=min(1, len(pbins)), features=PREFILL_FEATURES,
                                 bin_on="decode_rows", weighting=prompt_weighting)
    if prompt_weighting == "relative":
        # a relative fit runs low on noisy steps (it lands near their median, below their mean):
        # scale the line so its steps add up to the measured time, as the decode line's do
        total = float(sum(prefill.step_s(s) for s in pshapes))
        scale = float(y[~dec].sum()) / total
        prefill = prefill.scaled(scale)
        prefill.meta["total_scale"] = round(scale, 4)
    model = KindStepModel(decode, prefill, dict(meta or {}), aftermath=aftermath)
    rep = fit_report(model, shapes, y)
    model.meta.update(n_steps=rep["n_steps"], median_abs_rel_err=rep["median_abs_rel_err"],
                      r2=rep["r2"], kinds=rep["kinds"])
    return model


def fit_linear(shapes, durations, features=FEATURES, meta: dict | None = None,
               weighting: str = "time", jitter: bool = False, bins: tuple = (),
               bin_on: str = "rows", knee: int = 0) -> LinearStepModel:
    """Least squares with every coefficient >= 0 (an exact search over active sets).

    ``shapes``: :class:`StepShape` per step; ``durations``: seconds per step.
    ``features``: which terms to fit (the others are 0); the constant is always
    kept. ``weighting="time"`` (default) minimises the squared error in seconds,
    so the fitted steps add up to the measured time (what a queue feels);
    ``"relative"`` weights each row by 1/duration (short decode steps count as
    much as long prefills, but the fit then runs low on noisy data).
    ``jitter``: keep the residuals' quantiles as the model's noise (see
    :class:`LinearStepModel`). ``bins``: row-count bin edges (e.g. ``(2, 4, 8)``);
    each bin gets its own offset, fitted without a sign constraint; ``bin_on``
    says what they count ("rows": prompt tokens + decode rows; "decode_rows").
    ``knee``: also fit ``g_knee`` (>= 0), a price per decode-context token beyond ``knee``.
    """
    shapes = list(shapes)
    y = np.asarray(durations, dtype=float)
    if len(shapes) != len(y):
        raise ValueError(f"got {len(shapes)} step shapes but {len(y)} durations")
    if len(y) < len(features) + 1:
        raise ValueError(f"need at least {len(features) + 1} measured steps to fit {len(features)} terms, "
                         f"got {len(y)}")
    if np.any(~np.isfinite(y)) or np.any(y <= 0):
        raise ValueError("durations must be positive, finite seconds")
    unknown = set(features) - set(FEATURES)
    if unknown:
        raise ValueError(f"unknown features {sorted(unknown)}; choose from {FEATURES}")
    X = np.array([s.features() for s in shapes], dtype=float)
    knee = int(knee)
    if knee:
        X = np.hstack([X, np.maximum(X[:, FEATURES.index("decode_context")] - knee, 0.0)[:, None]])
    nf = X.shape[1]  # the terms with a sign constraint (the bins' offsets follow them)
    bins = tuple(int(b) for b in bins)
    if bin_on not in BIN_ON:
        raise ValueError(f"bin_on must be one of {BIN_ON}, got {bin_on!r}")
    if bins:
        rows = np.array([s.decode_rows if bin_on == "decode_rows" else s.prefill_tokens + s.decode_rows
                         for s in shapes])
        edges = np.array(bins + (np.inf,))
        onehot = np.stack([(rows >= lo) & (rows < hi) for lo, hi in zip(edges[:-1], edges[1:])], axis=1)
        X = np.hstack([X, onehot.astype(float)])
    nb = len(bins)
    cols = [i for i, name in enumerate(FEATURES) if name in features or i == 0] + list(range(len(FEATURES), nf))
    if weighting not in ("time", "relative"):
        raise ValueError(f"weighting must be 'time' or 'relative', got {weighting!r}")
    w = 1.0 / y if weighting == "relative" else np.ones_like(y)
    scale = np.maximum(np.abs(X).max(axis=0), 1e-12)
    Xw = (X / scale) * w[:, None]
    yw = y * w
    best, best_err = None, math.inf
    others = cols[1:]
    free = list(range(nf, nf + nb))  # bin offsets: any sign
    for r in range(len(others), -1, -1):
        for subset in itertools.combinations(others, r):
            use = [0, *subset, *free]
            coef, *_ = np.linalg.lstsq(Xw[:, use], yw, rcond=None)
            if np.any(coef[: len(use) - nb] < 0):
                continue
            err = float(np.sum((Xw[:, use] @ coef - yw) ** 2))
            if err < best_err - 1e-15:
                full = np.zeros(nf + nb)
                full[use] = coef / scale[use]
                best, best_err = full, err
    if best is None:
        raise ValueError("no non-negative fit exists (the constant alone came out negative)")
    info = dict(meta or {})
    pred = X @ best
    info.update(n_steps=int(len(y)), median_abs_rel_err=float(np.median(np.abs(pred - y) / y)),
                weighting=weighting)
    noise = tuple(np.quantile(y - pred, np.linspace(0, 1, 201)).tolist()) if jitter else ()
    base = best[:len(FEATURES)]
    a = float(base[0])
    g = float(best[len(FEATURES)]) if knee else 0.0
    costs = [float(c) for c in best[nf:]]
    if costs and a + min(costs) < 0:  # keep every step's fixed part >= 0
        raise ValueError("the fitted row-count offsets make a step's fixed cost negative; use fewer bins")
    return LinearStepModel(*[float(c) for c in base], meta=info, noise=noise, bin_edges=bins,
                           bin_costs=tuple(costs), bin_on=bin_on, knee_context=knee if g > 0 else 0, g_knee=g)
