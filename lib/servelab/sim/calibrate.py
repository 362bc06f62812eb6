"""Calibrating the simulator against the real engine, and checking it on a trace.

1. :func:`run_engine` serves a :class:`~servelab.sim.workload.Trace` with the
   real engine: its own scheduler and steps, each request added when the clock
   reaches its arrival. By default the clock is *virtual*: every step is timed
   by the CPU time its thread used and the clock advances by that, so the
   timeline is what the engine would do on a core of its own, whatever else
   the machine runs (``clock="wall"`` keeps real time, sleeps and stalls
   included). It records every step's shape (from the scheduler's plan) and
   duration, and every request's TTFT and TPOT.
2. :func:`fit_step_model` fits a step model
   (:class:`~servelab.sim.step_model.KindStepModel`: one linear model per step
   kind) to the recorded steps of some runs.
   With a :class:`StepProfile` (:func:`profile_prompt_steps`: the engine's
   prompt steps timed on a grid of sizes) it adds a per-size correction
   (:class:`~servelab.sim.profiled.ProfiledStepModel`).
3. :func:`compare` simulates the same trace with the fitted model and prints
   measured vs predicted TTFT and TPOT percentiles with each error.

On the wall clock a step's duration runs from its start to the next step's
start when the engine went straight on (the loop's own work between steps
counts: the simulator has no other place to put it), else to its end. On the
virtual clock the loop's work (adding the arrived requests) is part of the
step's CPU time.

Imports the engine (and torch) inside the functions; the module itself is light.
"""
from __future__ import annotations

import json
import math
import subprocess
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from servelab.machine import git_commit
from servelab.sim.core import ReplicaConfig, simulate
from servelab.sim.metrics import SimResult
from servelab.sim.replay import decode_groups, plan_shape, trace_prompts
from servelab.sim.steady import (LEVEL_EXPONENT_RANGE, LEVEL_WINDOW, LEVEL_WINDOW_S, REFERENCE_CONTEXT,  # noqa: F401
                                 REFERENCE_EVERY, REFERENCE_NAME, REFERENCE_ROWS,
                                 REFERENCE_WARM, fit_level_exponent, fit_prompt_exponent, piece_of, prompt_share,
                                 reference_drift, reference_windows, reference_work, relevel, step_exponent, step_exponents,
                                 step_levels, time_reference, window_slices)
from servelab.sim.profiled import PROFILE_TOKENS, fit_profiled
from servelab.sim.fit import filled_bins, fit_by_kind, fit_linear, fit_report
from servelab.sim.step_model import KindStepModel, LinearStepModel, StepShape, after_prompt, step_model_from_dict
from servelab.workload import Exponential, LogNormal, Trace, percentile, synthetic

__all__ = ["EngineRun", "run_engine", "build_llm", "CLOCKS", "engine_tree_state", "fit_step_model", "compare", "Comparison", "DEFAULT_MODEL_DIR",
           "DEFAULT_STEP_MODEL", "load_step_model", "save_step_model", "calibration_workloads", "git_commit",
           "probe_trace", "rate_for_busy", "reference_work", "time_reference", "REFERENCE_EVERY", "REFERENCE_WARM", "REFERENCE_ROWS", "REFERENCE_CONTEXT", "REFERENCE_NAME", "LEVEL_WINDOW", "LEVEL_WINDOW_S", "LEVEL_EXPONENT_RANGE",
           "step_levels", "relevel", "window_slices", "reference_windows", "fit_level_exponent", "fit_calibration", "reference_drift", "noise_band", "WORKLOADS", "CONFIGS", "speed_probe", "speed_factor", "reference_ratio",
           "long_prompt_interference", "profile_prompt_steps", "StepProfile"]

ROOT = Path(__file__).resolve().parents[3]
DEFAULT_MODEL_DIR = ROOT / "data" / "models" / "servelab-main"
DEFAULT_STEP_MODEL = ROOT / "data" / "sim" / "step_model.json"
METRICS = ("ttft_p50", "ttft_p95", "tpot_p50", "tpot_p95")


@dataclass
class EngineRun:
    """What the real engine did on a trace."""

    trace: Trace
    config: ReplicaConfig
    shapes: list[StepShape]
    durations: np.ndarray
    ttft: np.ndarray
    tpot: np.ndarray
    e2e: np.ndarray
    label: str = ""
    info: dict = field(default_factory=dict)

    def percentiles(self) -> dict[str, float]:
        tp = self.tpot[np.isfinite(self.tpot)]
        return {"ttft_p50": percentile(self.ttft, 50), "ttft_p95": percentile(self.ttft, 95),
                "tpot_p50": percentile(tp, 50), "tpot_p95": percentile(tp, 95)}

    def to_dict(self) -> dict:
        r7 = 7  # seconds to 0.1 us: far below any step's noise, and a third of the file
        return {"label": self.label, "config": self.config.__dict__, "trace": self.trace.records(),
                "shapes": [list(s) for s in self.shapes], "durations": np.round(self.durations, r7).tolist(),
                "ttft": np.round(self.ttft, r7).tolist(),
                "tpot": [None if not math.isfinite(x) else round(float(x), r7) for x in self.tpot],
                "e2e": np.round(self.e2e, r7).tolist(), "info": self.info}

    @classmethod
    def from_dict(cls, d: dict) -> "EngineRun":
        recs = d["trace"]
        tr = Trace([r["arrival_s"] for r in recs], [r["prompt_tokens"] for r in recs],
                   [r["output_tokens"] for r in recs], [r.get("prefix_group", -1) for r in recs],
                   [r.get("prefix_tokens", 0) for r in recs])
        return cls(tr, ReplicaConfig(**d["config"]), after_prompt(StepShape(*s) for s in d["shapes"]),
                   np.array(d["durations"]), np.array(d["ttft"]),
                   np.array([math.nan if x is None else x for x in d["tpot"]]), np.array(d["e2e"]),
                   d.get("label", ""), d.get("info", {}))



@contextmanager
def _recording_plans(engine):
    """Every plan the engine's scheduler makes inside the block, in order, with the
    garbage collector off (a collection inside a timed step would be charged to it);
    the scheduler and the collector are restored on the way out."""
    import gc
    plans = []
    schedule = engine.scheduler.schedule

    def recording_schedule():
        plan = schedule()
        plans.append(plan)
        return plan

    engine.scheduler.schedule = recording_schedule
    gc.collect()
    gc.disable()
    try:
        yield plans
    finally:
        engine.scheduler.schedule = schedule
        gc.enable()

def build_llm(config: ReplicaConfig | None = None, model_dir=None, seed: int = 0):
    """The real engine (:class:`servelab.engine.LLM`) set up like ``config``'s replica.

    ``model_dir``: a checkpoint folder (default: the course's main model).
    """
    from servelab.engine import LLM
    config = config or ReplicaConfig()
    if not isinstance(config, ReplicaConfig):
        raise TypeError(f"config must be a servelab.sim.ReplicaConfig, got {type(config).__name__}")
    return LLM(str(model_dir or DEFAULT_MODEL_DIR), block_size=config.block_size,
               num_kv_blocks=config.num_kv_blocks, max_num_seqs=config.max_num_seqs,
               max_num_batched_tokens=config.max_num_batched_tokens,
               enable_prefix_caching=config.enable_prefix_caching,
               enable_chunked_prefill=config.enable_chunked_prefill,
               long_prefill_token_threshold=config.long_prefill_token_threshold, seed=seed)


#: The clocks :func:`run_engine` can time the engine by.
CLOCKS = ("cpu", "steady", "wall")

def run_engine(trace: Trace, config: ReplicaConfig | None = None, *, model_dir=None, llm=None, seed: int = 0,
               label: str = "", warmup: int = 8, threads: int | None = 1, probe: bool = True,
               clock: str = "cpu", reference_every: int = REFERENCE_EVERY, reference_base: float | None = None,
               level_exponent: float = 1.0, prompt_level_exponent: float | None = None,
               share_model=None) -> EngineRun:
    """Serve ``trace`` with the real engine and time every step (see module doc).

    ``clock="cpu"`` (default): the engine's own steps and schedule, each step
    timed by the CPU time its thread used (``time.thread_time``); arrivals come
    on a virtual clock advanced by those times, and idle gaps jump to the next
    arrival. What the engine would do on a core of its own: time other
    processes take from it is not counted. ``clock="wall"``: real time, the
    engine sleeping between arrivals (a shared machine's stalls included).
    ``clock="steady"``: the CPU clock with the machine's wander divided out. A
    shared machine's speed wanders (on the course's VM by a fifth within
    seconds, from neighbours it cannot see); so every ``reference_every`` steps
    the reference work is timed (see below), and each step's CPU time is
    divided by the machine's level then: the median of the latest
    ``LEVEL_WINDOW`` timings over ``reference_base`` (seconds; default: the
    median of five timings before the first step, kept in
    ``info["reference_base_s"]``). The run then reads as if the machine had
    held the speed it had when ``reference_base`` was measured; a calibration
    passes its own base to every run checked against it. ``level_exponent``: divide
    by the level raised to this power (a calibration's :func:`fit_level_exponent`;
    near 1 with a decode step as the reference work); with ``prompt_level_exponent`` and
    ``share_model``, a step with prompt tokens is divided by a power moved toward that one
    by its prompt work's share of its time (:func:`~servelab.sim.steady.step_exponents`);
    ``info["step_levels"]`` keeps the level each step was divided by, so
    :func:`relevel` can apply another power afterwards.
    Either way the garbage collector is off while timing (collected first).

    ``probe``: first time :func:`speed_probe` (the machine's speed right now,
    by the same clock), so a comparison can scale the step model to it.
    ``reference_every``: on the CPU and steady clocks, every that many steps also
    time a fixed piece of work (:func:`reference_work`: a small decode step
    through the whole model on a cache of its own, timed after ``REFERENCE_WARM``
    untimed passes), off the
    virtual clock;
    ``info["reference_s"]`` lists those times,
    so a run can show whether the machine's speed drifted while it ran
    (neighbours sharing the core's caches slow even the CPU time). 0: never.
    """
    import torch

    from servelab.sampling import SamplingParams
    if clock not in CLOCKS:
        raise ValueError(f"clock must be one of {CLOCKS}, got {clock!r}")
    if clock == "steady" and reference_every < 1:
        raise ValueError("the steady clock reads the machine's level from the reference work: "
                         "set reference_every >= 1")
    if reference_base is not None and not (math.isfinite(reference_base) and reference_base > 0):
        raise ValueError(f"reference_base must be positive seconds, got {reference_base!r}")
    for name, x in (("level_exponent", level_exponent), ("prompt_level_exponent", prompt_level_exponent)):
        if x is None and name == "prompt_level_exponent":
            continue
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x <= 0:
            raise ValueError(f"{name} must be a positive number, got {x!r}")
    if threads is not None:
        torch.set_num_threads(threads)
    cfg = config or ReplicaConfig()
    if cfg.policy != "continuous":
        raise ValueError("the engine runs the continuous policy; set policy='continuous'")
    if llm is None:
        llm = build_llm(cfg, model_dir, seed)
    engine = llm.engine
    ctx = engine.config.max_model_len
    too_long = np.flatnonzero(trace.prompt_tokens + trace.output_tokens > ctx)
    if len(too_long):
        i = int(too_long[0])
        raise ValueError(f"request {i} needs {int(trace.prompt_tokens[i] + trace.output_tokens[i])} tokens but "
                         f"the model's context is {ctx}: shorten it (prompt_tokens + output_tokens <= {ctx})")
    eos = list(getattr(engine, "eos_token_ids", ()))
    prompts = trace_prompts(trace, llm.model.config.vocab_size, seed, avoid=eos)
    # warm up: a few requests with their own random tokens (no prefix shared with the trace), untimed
    rng = np.random.default_rng(seed + 99)
    for w in range(warmup):
        engine.add_request(f"warm{w}", rng.integers(0, llm.model.config.vocab_size - 8, 40 + 20 * w).tolist(),
                           SamplingParams(max_tokens=4, ignore_eos=True, temperature=0.0))
    engine.run_to_completion()
    prefault(llm)
    probe_s = speed_probe(llm, seed=seed, clock=clock) if probe else None
    reference = reference_work(llm) if clock != "wall" and reference_every else None
    refs: list[float] = []
    level, levels = 1.0, []
    if clock == "steady":
        start = [time_reference(reference) for _ in range(5)]
        if reference_base is None:
            reference_base = float(np.median(start))
        recent = start[-LEVEL_WINDOW:]
        level = float(np.median(recent)) / reference_base

    shapes: list[StepShape] = []
    groups: list[int] = []  # decode groups per step (not on the wall clock)
    step_levels: list[float] = []  # the level each step was divided by (steady clock)
    exps: list[float] = []  # the power of it, when it varies by step

    n = len(trace)
    arrival = trace.arrival_s.tolist()
    params = [SamplingParams(max_tokens=int(m), ignore_eos=True, temperature=0.0)
              for m in trace.output_tokens.tolist()]
    first = [math.nan] * n
    last = [math.nan] * n
    count = [0] * n
    done = 0
    starts, ends = [], []
    nxt = 0
    with _recording_plans(engine) as plans:
        if clock != "wall":
            # the virtual clock: arrivals at their trace times, each step advancing it by its CPU time
            # (on the steady clock, divided by the machine's level)
            vt = 0.0
            while done < n:
                c0 = time.thread_time()
                while nxt < n and arrival[nxt] <= vt:
                    engine.add_request(str(nxt), prompts[nxt], params[nxt], arrival_time=arrival[nxt])
                    nxt += 1
                if not engine.has_unfinished_requests():
                    vt = arrival[nxt]
                    continue
                got = engine.step()
                cpu = time.thread_time() - c0
                plan = plans[-1]
                power = level_exponent
                if not plan.is_empty:
                    shapes.append(plan_shape(plan))
                    if prompt_level_exponent is not None and share_model is not None:
                        power = step_exponent(shapes[-1], level_exponent, prompt_level_exponent, share_model)
                        exps.append(round(power, 4))
                dt = cpu / level ** power
                if not plan.is_empty:
                    groups.append(decode_groups(plan, cfg.block_size))
                    step_levels.append(round(level, 5))
                    starts.append(vt)
                    ends.append(vt + dt)
                vt += dt
                if reference is not None and shapes and len(shapes) % reference_every == 0 \
                        and not plan.is_empty:
                    refs.append(time_reference(reference))
                    if clock == "steady":
                        recent = (recent + refs[-1:])[-LEVEL_WINDOW:]
                        level = float(np.median(recent)) / reference_base
                        levels.append(round(level, 4))
                for out in got:
                    i = int(out.request_id)
                    if count[i] == 0:
                        first[i] = vt
                    last[i] = vt
                    count[i] += 1
                    if out.finished:
                        done += 1
            durations = np.array(ends) - np.array(starts)
        else:
            t0 = time.perf_counter() + 0.01
            while done < n:
                now = time.perf_counter()
                while nxt < n and t0 + arrival[nxt] <= now:
                    engine.add_request(str(nxt), prompts[nxt], params[nxt], arrival_time=t0 + arrival[nxt])
                    nxt += 1
                if not engine.has_unfinished_requests():
                    time.sleep(max(0.0, t0 + arrival[nxt] - time.perf_counter()))
                    continue
                s = time.perf_counter()
                got = engine.step()
                e = time.perf_counter()
                plan = plans[-1]
                if not plan.is_empty:
                    shapes.append(plan_shape(plan))
                    starts.append(s)
                    ends.append(e)
                for out in got:
                    i = int(out.request_id)
                    if count[i] == 0:
                        first[i] = e - t0
                    last[i] = e - t0
                    count[i] += 1
                    if out.finished:
                        done += 1
            # a step's duration: to the next step's start if the loop went straight on, else to its end
            durations = np.array(ends) - np.array(starts)
            for k in range(len(starts) - 1):
                gap = starts[k + 1] - ends[k]
                if gap < 0.5 * durations[k]:  # no sleep in between: charge the loop's own work to this step
                    durations[k] = starts[k + 1] - starts[k]
    arr = trace.arrival_s
    ttft = np.array(first) - arr
    e2e = np.array(last) - arr
    cnt = np.array(count)
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(cnt > 1, (np.array(last) - np.array(first)) / np.maximum(cnt - 1, 1), math.nan)
    from servelab import machine
    info = {"machine": machine.describe(), "git_commit": git_commit(), "engine_tree": engine_tree_state(),
            "steps": len(shapes), "probe_s": probe_s, "clock": clock}
    if refs:
        info["reference_s"] = [round(x, 7) for x in refs]
        info["reference_every"] = reference_every
    if clock == "steady":
        info["reference_base_s"] = reference_base
        info["levels"] = levels
        info["step_levels"] = step_levels
        info["level_exponent"] = float(level_exponent)
        if exps:
            info["prompt_level_exponent"] = float(prompt_level_exponent)
            info["step_exponents"] = exps
    if groups:
        info["decode_groups"] = groups
    return EngineRun(trace, cfg, after_prompt(shapes), durations, ttft, tpot, e2e, label, info)


def fit_calibration(runs, iterations: int = 3):
    """Fit a step model to calibration ``runs`` (:func:`fit_step_model`); on the steady clock
    also fit the powers of the level the steps follow: the decode steps' (:func:`fit_level_exponent`
    over windows of decode steps) and the prompt work's (:func:`fit_prompt_exponent`), relevel
    the runs by them and refit, ``iterations`` times (the powers are read against the model,
    the model fitted to steps divided by the powers' levels). Returns ``(model, runs)``, the
    runs as the model was fitted to them; the model's ``meta["level_exponent"]`` and
    ``meta["prompt_level_exponent"]`` are what checks divide by."""
    runs = list(runs)
    model = fit_step_model(runs)
    if not runs or any(step_levels(r) is None for r in runs):
        return model, runs
    fit = prompt = None
    for _ in range(iterations):
        fit = fit_level_exponent(runs, model, kind="decode")
        if fit["r"] is None:  # too few decode steps for windows of their own: all steps
            fit = fit_level_exponent(runs, model)
        prompt = fit_prompt_exponent(runs, model, fit["exponent"])
        runs = [relevel(r, fit["exponent"], prompt["exponent"], model) for r in runs]
        model = fit_step_model(runs)
    model.meta["level_exponent"] = fit["exponent"]
    model.meta["level_exponent_fit"] = fit
    model.meta["prompt_level_exponent"] = prompt["exponent"]
    model.meta["prompt_level_exponent_fit"] = prompt
    return model, runs


def prefault(llm) -> None:
    """Write every page of the engine's KV cache once, so no timed step pays the
    operating system for a first touch (a fixed memory state for every run)."""
    import torch
    runner = getattr(llm.engine, "runner", None)
    for t in getattr(runner, "kv_pools", None) or ():
        if isinstance(t, torch.Tensor):
            t.zero_()


def engine_files() -> tuple[str, ...]:
    """The files whose code the engine's step times depend on (checked for uncommitted edits):
    the step path of :func:`servelab.sim.fingerprint.step_path_files`, found by its imports."""
    from servelab.sim.fingerprint import step_path_files
    return tuple(str(p.relative_to(ROOT)) for p in step_path_files().values())


def engine_tree_state() -> str:
    """"clean", or "modified" when the engine's files had uncommitted edits while it ran
    ("snapshot" for a run from an exported commit: see :func:`git_commit`)."""
    import os
    if os.environ.get("SERVELAB_GIT_COMMIT"):
        return "snapshot"
    try:
        r = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", *engine_files()],
                           capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return "modified" if r.stdout.strip() else "clean"


_probe_calls = [0]


def speed_probe(llm, seed: int = 0, clock: str = "wall") -> float:
    """Seconds the engine takes for a fixed little batch (6 prompts of 64 tokens, 24 tokens each,
    all at once): the same steps every time, so its time tracks the machine's current speed.
    Fresh random tokens each call (no prefix-cache hits). ``clock``: "wall" or "cpu" (the
    thread's CPU time)."""
    from servelab.sampling import SamplingParams
    engine = llm.engine
    _probe_calls[0] += 1
    rng = np.random.default_rng([seed, 7919, _probe_calls[0]])
    vocab = llm.model.config.vocab_size - 8
    sp = SamplingParams(max_tokens=24, ignore_eos=True, temperature=0.0)
    for k in range(6):
        engine.add_request(f"probe{_probe_calls[0]}-{k}", rng.integers(0, vocab, 64).tolist(), sp)
    timer = time.thread_time if clock == "cpu" else time.perf_counter
    total = 0.0
    while engine.has_unfinished_requests():
        t0 = timer()
        engine.step()
        total += timer() - t0
    return total


#: Row-count bins of the one-line model (:func:`fit_step_model` with ``kind="linear"``).
ROW_BINS = (2, 4, 8, 16, 32, 64)


def _fit_meta(runs) -> dict:
    meta = {"runs": [r.label for r in runs]}
    if runs and runs[0].info:
        meta.update(git_commit=runs[0].info.get("git_commit"), machine=runs[0].info.get("machine"),
                    clock=runs[0].info.get("clock", "wall"), engine_tree=runs[0].info.get("engine_tree"))
    probes = [r.info.get("probe_s") for r in runs if r.info.get("probe_s")]
    if probes:
        meta["probe_s"] = float(np.median(probes))  # the machine's speed during the fit runs
    refs = [x for r in runs for x in (r.info.get("reference_s") or [])]
    if refs:
        meta["reference_s"] = float(np.median(refs))
    return meta


@dataclass
class StepProfile:
    """The engine's prompt steps timed on a grid of sizes (:func:`profile_prompt_steps`)."""

    shapes: list[StepShape]
    durations: np.ndarray
    info: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"shapes": [list(s) for s in self.shapes], "durations": np.round(self.durations, 7).tolist(),
                "info": self.info}

    @classmethod
    def from_dict(cls, d: dict) -> "StepProfile":
        if not isinstance(d, dict) or "shapes" not in d or "durations" not in d:
            raise ValueError("a saved step profile is an object with 'shapes' and 'durations'")
        return cls([StepShape(*s) for s in d["shapes"]], np.array(d["durations"], dtype=float), d.get("info", {}))


#: The replica the profile runs on: the calibration's, with a budget that holds a 513-token step.
PROFILE_CONFIG = ReplicaConfig(max_num_seqs=32, max_num_batched_tokens=1024, num_kv_blocks=1024)


def profile_prompt_steps(tokens=PROFILE_TOKENS, repeats: int = 15, config: ReplicaConfig | None = None, *,
                         model_dir=None, llm=None, seed: int = 0, threads: int | None = 1) -> StepProfile:
    """Time the engine's prompt steps at every size in ``tokens`` (prompt tokens in one step),
    ``repeats`` times each, the sizes in a fresh random order every round (a drift of the machine's
    speed falls on every size alike). Each step is one fresh prompt of that many random tokens (no
    prefix-cache hit, nothing else in the batch), timed like :func:`run_engine`'s: the CPU time of
    the thread, garbage collector off. Returns every timing with the step's shape from the
    scheduler's plan."""
    import torch

    from servelab.sampling import SamplingParams
    sizes = [int(t) for t in tokens]
    if not sizes or any(t < 1 for t in sizes):
        raise ValueError(f"tokens must be positive prompt-token counts, got {tokens!r}")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a positive whole number, got {repeats!r}")
    cfg = config or PROFILE_CONFIG
    if max(sizes) > cfg.max_num_batched_tokens:
        raise ValueError(f"a {max(sizes)}-token step does not fit the step budget "
                         f"({cfg.max_num_batched_tokens} tokens): lower the sizes or raise the budget")
    if threads is not None:
        torch.set_num_threads(threads)
    if llm is None:
        llm = build_llm(cfg, model_dir, seed)
    engine = llm.engine
    vocab = llm.model.config.vocab_size - 8
    rng = np.random.default_rng([seed, 4243])
    sp = SamplingParams(max_tokens=1, ignore_eos=True, temperature=0.0)

    prefault(llm)
    shapes, durs = [], []
    # an untimed round first: every size's kernels warmed up once
    order = [[int(t) for t in rng.permutation(sizes)] for _ in range(repeats + 1)]
    with _recording_plans(engine) as plans:
        for rnd, sizes_now in enumerate(order):
            for k, n in enumerate(sizes_now):
                engine.add_request(f"profile-{rnd}-{k}", rng.integers(0, vocab, n).tolist(), sp)
                c0 = time.thread_time()
                engine.step()
                dt = time.thread_time() - c0
                plan = plans[-1]
                while engine.has_unfinished_requests():
                    engine.step()
                shape = plan_shape(plan)
                if rnd and shape.prefill_tokens == n and not shape.decode_rows:
                    shapes.append(shape)
                    durs.append(dt)
    from servelab import machine
    info = {"machine": machine.describe(), "git_commit": git_commit(), "engine_tree": engine_tree_state(),
            "repeats": repeats, "tokens": sizes, "config": cfg.__dict__}
    return StepProfile(shapes, np.array(durs), info)


def fit_step_model(runs, features=("prefill_tokens", "decode_rows", "decode_context", "prefill_pairs",
                                   "prefill_seqs"), bins=ROW_BINS, kind: str = "by_kind",
                   profile: StepProfile | None = None):
    """Fit a step model to every recorded step of ``runs``.

    ``kind="by_kind"`` (default): :func:`~servelab.sim.fit.fit_by_kind`, a
    linear model per step kind (``features`` and ``bins`` are then unused).
    ``kind="linear"``: one :class:`LinearStepModel` over all steps with
    ``features`` and an offset per row-count bin (the model before format 2).
    ``profile`` (a :class:`StepProfile`, with ``kind="by_kind"``): correct the
    fitted model's prompt steps per size by it
    (:class:`~servelab.sim.profiled.ProfiledStepModel`, format 3).
    """
    if profile is not None:
        if kind != "by_kind":
            raise ValueError("a profile corrects the per-kind model: use kind='by_kind'")
        if not isinstance(profile, StepProfile):
            raise TypeError(f"profile must be a StepProfile, got {type(profile).__name__}")
        base = fit_step_model(runs, features, bins, kind)
        if not isinstance(base, KindStepModel):
            return base  # too few steps for a per-kind fit: nothing for the profile to correct
        meta = dict(base.meta)
        if profile.info.get("git_commit"):
            meta["profile_git_commit"] = profile.info["git_commit"]
        return fit_profiled(base, profile.shapes, profile.durations, meta=meta)
    shapes = [s for r in runs for s in r.shapes]
    durs = np.concatenate([r.durations for r in runs]) if runs else np.zeros(0)
    meta = _fit_meta(runs)
    if kind == "by_kind":
        try:
            return fit_by_kind(shapes, durs, meta=meta)
        except ValueError as exc:
            if "measured" not in str(exc):
                raise
            meta["note"] = f"one line for every step: {exc}"  # too few steps of a kind (a tiny run)
    elif kind != "linear":
        raise ValueError(f"kind must be 'by_kind' or 'linear', got {kind!r}")
    if bins:
        # a bin needs enough steps to be measured; with too few the offsets can go negative
        bins = filled_bins([s.prefill_tokens + s.decode_rows for s in shapes], bins, min_steps=20)
        try:
            return fit_linear(shapes, durs, features=features, meta=meta, bins=bins)
        except ValueError:
            meta["note"] = "row-count bins dropped: their fitted offsets went negative"
    return fit_linear(shapes, durs, features=features, meta=meta)


@dataclass
class Comparison:
    label: str
    measured: dict
    predicted: dict

    @property
    def errors(self) -> dict:
        return {k: (self.predicted[k] - self.measured[k]) / self.measured[k] for k in METRICS}

    @property
    def worst(self) -> float:
        return max(abs(e) for e in self.errors.values())

    def table(self) -> str:
        lines = [f"{'metric':<10}{'measured':>12}{'predicted':>12}{'error':>9}"]
        for k in METRICS:
            lines.append(f"{k:<10}{self.measured[k] * 1e3:>9.2f} ms{self.predicted[k] * 1e3:>9.2f} ms"
                         f"{self.errors[k]:>+9.1%}")
        lines.append(f"worst error: {self.worst:.1%}")
        return "\n".join(lines)


def reference_ratio(runs, step_model) -> float | None:
    """The median time of the reference work over ``runs`` (all their timings pooled) over its
    median during the fit: >1, a slower machine. None when either side has no timings."""
    ref0 = (getattr(step_model, "meta", {}) or {}).get("reference_s")
    refs = [x for r in runs for x in ((r.info or {}).get("reference_s") or [])]
    return float(np.median(refs)) / ref0 if ref0 and refs else None


def speed_factor(run: EngineRun, step_model) -> float:
    """How much slower (>1) the machine ran during ``run`` than during the fit: by the reference
    work timed during the runs (:func:`reference_ratio`) when both have it, else by the speed probe."""
    meta = getattr(step_model, "meta", {})
    ratio = reference_ratio([run], step_model)
    if ratio is not None:
        return ratio
    p_run = run.info.get("probe_s") if run.info else None
    p_fit = meta.get("probe_s")
    return p_run / p_fit if p_run and p_fit else 1.0


def compare(run: EngineRun, step_model, normalise: bool = False) -> Comparison:
    """Simulate the run's trace with ``step_model`` and set it beside the measurement.

    ``normalise``: scale the model by :func:`speed_factor` (the reference work
    timed during the run, or the speed probe run before it, against the fit
    runs'), when both were measured. Off by default.
    """
    if normalise and hasattr(step_model, "scaled"):
        f = speed_factor(run, step_model)
        if f != 1.0:
            step_model = step_model.scaled(f)
    sim: SimResult = simulate(run.trace, step_model, run.config)
    predicted = {"ttft_p50": sim.percentiles("ttft", (50,))[50], "ttft_p95": sim.percentiles("ttft", (95,))[95],
                 "tpot_p50": sim.percentiles("tpot", (50,))[50], "tpot_p95": sim.percentiles("tpot", (95,))[95]}
    return Comparison(run.label, run.percentiles(), predicted)


def noise_band(run: EngineRun, step_model, fit_runs, seeds: int = 9) -> dict:
    """How far each predicted percentile of ``run`` moves when every simulated step adds a
    residual drawn from the fit runs' (the machine's step-to-step noise): half the range of the
    ``seeds`` predictions, as a share of the measured value, per metric. A miss smaller than
    this is within what one run of the real engine could show by chance."""
    if not hasattr(step_model, "with_noise"):
        raise ValueError("noise_band needs a KindStepModel (fit_step_model's default)")
    shapes = [s for r in fit_runs for s in r.shapes]
    durs = np.concatenate([r.durations for r in fit_runs])
    measured = run.percentiles()
    preds = {k: [] for k in METRICS}
    for seed in range(seeds):
        sim = simulate(run.trace, step_model.with_noise(shapes, durs, seed=100 * seed), run.config)
        for k in METRICS:
            what, q = k.split("_p")
            preds[k].append(sim.percentiles(what, (int(q),))[int(q)])
    return {k: float((max(v) - min(v)) / 2 / measured[k]) for k, v in preds.items()}


def save_step_model(model, path=DEFAULT_STEP_MODEL) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(model.to_dict(), indent=1, sort_keys=True) + "\n")
    return path


def load_step_model(path=DEFAULT_STEP_MODEL):
    path = Path(path)
    if not path.exists():
        raise ValueError(f"no saved step model at {str(path)!r}: run `python -m servelab.sim calibrate` first")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{str(path)!r} is not a saved step model (not JSON: {exc})")
    return step_model_from_dict(data)


def probe_trace(n: int = 32, seed: int = 5) -> Trace:
    """A burst for a first fit: everyone arrives at once, lengths mixed, so the steps cover
    big prefills, full decode batches and the thinning tail."""
    tr = synthetic(n, 1e6, seed=seed, prompt=LogNormal(128, 0.9, 8, 700), output=Exponential(32, 160))
    return Trace(np.zeros(n), tr.prompt_tokens, tr.output_tokens)


def rate_for_busy(step_model, config: ReplicaConfig, target: float, n: int = 400, seed: int = 0,
                  **lengths) -> float:
    """Arrival rate at which the simulated replica is busy a share ``target`` of the time."""
    if not 0 < target < 1:
        raise ValueError(f"target busy share must lie in (0, 1), got {target!r}")
    lo, hi = 1e-3, 1e4
    for _ in range(40):
        mid = math.sqrt(lo * hi)
        busy = simulate(synthetic(n, mid, seed=seed, **lengths), step_model, config).utilisation
        lo, hi = (mid, hi) if busy < target else (lo, mid)
    return math.sqrt(lo * hi)


#: The calibration workloads: (length mix, busy share, arrivals, config name). Rates are set
#: from the probe fit so that each run loads *this* machine as intended (a fixed rate would
#: overload a slow CPU and idle a fast one).
SHORT = dict(prompt=LogNormal(64, 0.7, 8, 400), output=Exponential(24, 120))
LONG_PROMPTS = dict(prompt=LogNormal(320, 0.4, 64, 700), output=Exponential(12, 60))
LONG_ANSWERS = dict(prompt=LogNormal(32, 0.5, 8, 200), output=Exponential(64, 300))
MIXED = dict(prompt=LogNormal(128, 1.0, 8, 700), output=Exponential(32, 160))
PREFIXED = dict(prompt=LogNormal(48, 0.6, 8, 200), output=Exponential(24, 120), prefix_groups=4,
                prefix_tokens=256)
WORKLOADS = {
    "fit": {
        "light, short": (SHORT, 0.35, {}, "base"),
        "heavy, short": (SHORT, 0.8, {}, "base"),
        "long prompts": (LONG_PROMPTS, 0.6, {}, "base"),
        "long answers": (LONG_ANSWERS, 0.6, {}, "base"),
        "chunk 256": (MIXED, 0.5, {}, "chunk256"),
        "bursty, long answers": (LONG_ANSWERS, 0.7, {"arrival": "gamma", "cv": 3.0}, "base"),
    },
    "held_out": {
        "medium rate": (SHORT, 0.6, {}, "base"),
        "bursty arrivals": (SHORT, 0.5, {"arrival": "gamma", "cv": 3.0}, "base"),
        "mixed lengths": (MIXED, 0.6, {}, "base"),
        "chunk 128": (LONG_PROMPTS, 0.6, {}, "chunk"),
        "shared prefixes": (PREFIXED, 0.6, {}, "base"),
    },
}
CONFIGS = {
    "base": ReplicaConfig(max_num_seqs=32, max_num_batched_tokens=512, num_kv_blocks=1024),
    "chunk": ReplicaConfig(max_num_seqs=32, max_num_batched_tokens=512, num_kv_blocks=1024,
                           long_prefill_token_threshold=128),
    "chunk256": ReplicaConfig(max_num_seqs=32, max_num_batched_tokens=512, num_kv_blocks=1024,
                              long_prefill_token_threshold=256),
}


def calibration_workloads(probe_model, quick: bool = False) -> dict:
    """{"fit": {name: (trace, config)}, "held_out": {...}}: the held-out workloads differ from
    the fit set in rate, length mix, chunk size and prefix hits (the fit set has one bursty
    workload so that its steps cover large batches; the held-out bursty one has another length
    mix and rate). Sized for the course's small model (context 1,024 tokens)."""
    n = 24 if quick else 200
    out = {}
    for part, specs in WORKLOADS.items():
        out[part] = {}
        for k, (name, (lengths, busy, arrivals, cfg_name)) in enumerate(specs.items()):
            cfg = CONFIGS[cfg_name]
            rate = rate_for_busy(probe_model, cfg, busy, **lengths)
            seed = (11 if part == "fit" else 21) + k
            out[part][name] = (synthetic(n, rate, seed=seed, **lengths, **arrivals), cfg)
    return out


def long_prompt_interference(chunk: int | None, *, streams: int = 4, stream_tokens: int = 40,
                             long_prompt: int = 800, arrive_after: int = 8, model_dir=None, llm=None,
                             seed: int = 0) -> dict:
    """What a long prompt does to running streams, in the real engine.

    ``streams`` short requests decode; after ``arrive_after`` steps a
    ``long_prompt``-token request arrives. With ``chunk`` None the whole prompt
    is one step (the budget is raised to hold it); otherwise it is split into
    chunks of at most ``chunk`` tokens, each sharing a step with the decodes.
    Returns the streams' inter-token gaps (seconds), the worst one, the
    newcomer's time to first token and the steps its prefill took.
    """
    import torch

    from servelab.sampling import SamplingParams
    torch.set_num_threads(1)
    budget = max(long_prompt + streams, 1024)
    cfg = ReplicaConfig(max_num_seqs=streams + 1, max_num_batched_tokens=budget, num_kv_blocks=512,
                        long_prefill_token_threshold=chunk)
    if llm is None:
        llm = build_llm(cfg, model_dir, seed)
    else:
        c = llm.engine.config
        c.max_num_batched_tokens, c.long_prefill_token_threshold = budget, chunk
    engine = llm.engine
    rng = np.random.default_rng([seed, chunk or 0, long_prompt])  # fresh tokens: no prefix-cache hits
    vocab = llm.model.config.vocab_size - 8
    sp = SamplingParams(max_tokens=stream_tokens, ignore_eos=True, temperature=0.0)
    for k in range(streams):
        engine.add_request(f"s{seed}-{chunk}-{k}", rng.integers(0, vocab, 16).tolist(), sp)
    outs = {}
    for _ in range(arrive_after):
        for o in engine.step():
            outs[o.request_id] = o
    t_arrive = time.perf_counter()
    big = f"long{seed}-{chunk}"
    engine.add_request(big, rng.integers(0, vocab, long_prompt).tolist(),
                       SamplingParams(max_tokens=2, ignore_eos=True, temperature=0.0), arrival_time=t_arrive)
    prefill_steps = 0
    while engine.has_unfinished_requests():
        before = big in outs
        for o in engine.step():
            outs[o.request_id] = o
        if not before and big not in outs:
            prefill_steps += 1
    gaps = [g for k in range(streams) for g in outs[f"s{seed}-{chunk}-{k}"].metrics.inter_token_latencies]
    m = outs[big].metrics
    return {"chunk": chunk, "gaps": gaps, "max_gap_s": max(gaps), "median_gap_s": float(np.median(gaps)),
            "ttft_s": m.first_token_time - m.arrival_time, "prefill_steps": prefill_steps + 1}
