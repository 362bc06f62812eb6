"""Command line for the simulator.

    python -m servelab.sim check --trace FILE.jsonl [--model DIR]
        serve the trace with the real engine and with the calibrated simulator;
        print measured vs predicted TTFT and TPOT p50/p95, then "worst error: X%".
        The engine's steps are timed by their CPU time on a virtual clock (``--clock wall``:
        in real time, a busy machine's stalls included).
    python -m servelab.sim calibrate [--model DIR] [--out data/sim/step_model.json] [--quick]
        refit the step model on this machine (a probe burst, a profile of prompt steps at the
        chunk sizes, then the fit workloads) and save it.
    python -m servelab.sim run --rate 8 --n 100000 [--tier small] [--seats 64]
        simulate a synthetic stream on a registry chip (roofline step model) and print percentiles.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

from servelab.sim.core import ReplicaConfig


def _config_args(p: argparse.ArgumentParser, seats=32, budget=512, blocks=1024) -> None:
    p.add_argument("--max-num-seqs", type=int, default=seats, help="seats (default %(default)s)")
    p.add_argument("--max-num-batched-tokens", type=int, default=budget, help="token budget per step")
    p.add_argument("--num-kv-blocks", type=int, default=blocks, help="KV blocks of 16 tokens")
    p.add_argument("--chunk", type=int, default=None, help="long_prefill_token_threshold (chunk cap)")
    p.add_argument("--no-prefix-caching", action="store_true")


def _config(a) -> ReplicaConfig:
    return ReplicaConfig(max_num_seqs=a.max_num_seqs, max_num_batched_tokens=a.max_num_batched_tokens,
                         num_kv_blocks=a.num_kv_blocks, long_prefill_token_threshold=a.chunk,
                         enable_prefix_caching=not a.no_prefix_caching)


def cmd_check(a) -> int:
    from servelab.sim import calibrate
    from servelab.sim.workload import load_trace
    trace = load_trace(a.trace)
    model = calibrate.load_step_model(a.step_model)
    meta = getattr(model, "meta", {})
    print(f"trace: {len(trace)} requests over {trace.duration_s:.1f} s; step model fitted at commit "
          f"{meta.get('git_commit', '?')} on {(meta.get('machine') or {}).get('cpu', '?')}")
    run = calibrate.run_engine(trace, _config(a), model_dir=a.model, label=str(a.trace), clock=a.clock)
    f = calibrate.speed_factor(run, model)
    if f != 1.0:
        print(f"speed: this machine ran the reference work (or the probe) {f:.2f}x as slowly as during "
              f"the fit (not applied; a large factor means a busier machine and larger errors)")
    if a.save_run:
        with open(a.save_run, "w") as f:
            json.dump(run.to_dict(), f)
    print(calibrate.compare(run, model).table())
    return 0


def cmd_calibrate(a) -> int:
    from servelab.sim import calibrate
    t0 = time.time()
    cfg = calibrate.CONFIGS["base"]
    print("probe: a burst of requests to estimate this machine's speed ...", flush=True)
    calibrate.run_engine(calibrate.probe_trace(), cfg, model_dir=a.model, label="warm-up", clock=a.clock)
    probe = calibrate.run_engine(calibrate.probe_trace(), cfg, model_dir=a.model, label="probe", clock=a.clock)
    probe_model = calibrate.fit_step_model([probe], kind="linear")  # sets the workloads' rates only
    print("profile: the engine's prompt steps at the chunk sizes and their neighbours ...", flush=True)
    profile = calibrate.profile_prompt_steps(repeats=3 if a.quick else 15, model_dir=a.model)
    runs = []
    for name, (trace, c) in calibrate.calibration_workloads(probe_model, quick=a.quick)["fit"].items():
        print(f"fit workload {name!r}: {len(trace)} requests at {trace.rate:.2f}/s ...", flush=True)
        runs.append(calibrate.run_engine(trace, c, model_dir=a.model, label=name, clock=a.clock))
    model = calibrate.fit_step_model(runs, profile=profile)
    path = calibrate.save_step_model(model, a.out)
    print(f"step model: {model.describe()}")
    print(f"median per-step error {model.meta['median_abs_rel_err']:.1%} over {model.meta['n_steps']} steps"
          + (f", R^2 {model.meta['r2']:.3f}" if "r2" in model.meta else ""))
    for r in runs:
        c = calibrate.compare(r, model)
        print(f"\n{r.label}\n{c.table()}")
    print(f"\nsaved to {path} ({time.time() - t0:.0f} s)")
    return 0


def cmd_run(a) -> int:
    from servelab.sim import RooflineStepModel, simulate, synthetic
    from servelab.sim.workload import Exponential, LogNormal
    model = RooflineStepModel.for_tier(a.tier, overhead_s=a.overhead_ms / 1e3)
    trace = synthetic(a.n, a.rate, prompt=LogNormal(a.prompt, 0.6, 16, 16 * a.prompt),
                      output=Exponential(a.output, 8 * a.output), seed=a.seed)
    cfg = ReplicaConfig(max_num_seqs=a.seats, max_num_batched_tokens=a.budget, num_kv_blocks=a.blocks,
                        long_prefill_token_threshold=a.chunk)
    t0 = time.perf_counter()
    r = simulate(trace, model, cfg, progress=a.n > 100_000)
    wall = time.perf_counter() - t0
    for k, v in r.summary().items():
        print(f"{k:>20}: {v:.4g}" if isinstance(v, float) else f"{k:>20}: {v}")
    print(f"simulated {a.n:,} requests in {wall:.1f} s ({a.n / wall:,.0f} requests/s)")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m servelab.sim", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check", help="real engine vs calibrated simulator on a JSONL trace")
    c.add_argument("--trace", required=True, help="JSONL: one {arrival_s, prompt_tokens, output_tokens} per line")
    c.add_argument("--model", default=None, help="checkpoint folder (default: the course's main model)")
    c.add_argument("--step-model", default=None, help="saved step model (default: data/sim/step_model.json)")
    c.add_argument("--save-run", default=None, help="also save the engine's measurements as JSON")
    c.add_argument("--clock", default="cpu", choices=("cpu", "wall"),
                   help="time the engine's steps by their CPU time on a virtual clock (default) or in real time")
    _config_args(c)
    k = sub.add_parser("calibrate", help="refit the step model on this machine and save it")
    k.add_argument("--model", default=None)
    k.add_argument("--out", default=None, help="where to save (default: data/sim/step_model.json)")
    k.add_argument("--quick", action="store_true", help="fewer requests per workload")
    k.add_argument("--clock", default="cpu", choices=("cpu", "wall"), help="as for check")
    r = sub.add_parser("run", help="simulate a synthetic stream on registry chips")
    r.add_argument("--n", type=int, default=100_000)
    r.add_argument("--rate", type=float, default=8.0)
    r.add_argument("--tier", default="small", help="small (8B on one H100) or large (70B on two)")
    r.add_argument("--prompt", type=int, default=1000, help="median prompt tokens")
    r.add_argument("--output", type=int, default=200, help="mean output tokens")
    r.add_argument("--seats", type=int, default=64)
    r.add_argument("--budget", type=int, default=8192)
    r.add_argument("--blocks", type=int, default=29_000)
    r.add_argument("--chunk", type=int, default=None)
    r.add_argument("--overhead-ms", type=float, default=0.0)
    r.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    from servelab.sim import calibrate
    for name in ("step_model", "out"):
        if getattr(a, name, "unset") is None:
            setattr(a, name, calibrate.DEFAULT_STEP_MODEL)
    try:
        return {"check": cmd_check, "calibrate": cmd_calibrate, "run": cmd_run}[a.cmd](a)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
