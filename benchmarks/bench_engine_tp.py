"""The engine split over processes (``tensor_parallel_size``) on this machine, and what explains its time.

    flock /work/coord/bench.lock .venv/bin/python benchmarks/bench_engine_tp.py --realtime
    .venv/bin/python benchmarks/bench_engine_tp.py --quick --out /tmp/x   # smoke run, seconds

Three measurements on the course model (servelab-main), gloo over 127.0.0.1:
  * tokens per second of one workload (prompts sharing a prefix, then decoding
    together) at 1 and 2 processes, the same greedy tokens checked. The split uses
    two cores (one thread per process); the single process runs with one thread
    and, as its best setup on two cores, with two. Every run starts from an empty
    prefix cache, so every row does the same steps and prefills the same tokens;
  * each step of the 2-process run split into compute, collectives and the
    rest (scheduling, posting the plan, sampling), on rank 0's clock. Every
    rank logs every collective call; a call's time on the rank that arrived
    last is the transfer alone, on the other rank it includes the wait for it;
  * chapter 15's alpha-beta model, fitted on this machine's gloo all-reduce
    (timed on the engine's own two processes between steps, at sizes from 1 KB
    to the largest message the run sent, each call after as much computing as a
    step does between two exchanges; back to back too), predicting each step's
    collective time from the calls' byte counts; set beside the measured transfer.
Writes benchmarks/results/engine_tp.md and engine_tp.json (``--out`` picks another folder).
"""
from __future__ import annotations

import os
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

from servelab import comm  # noqa: E402
from servelab.engine import LLM  # noqa: E402
from servelab.machine import describe, git_commit  # noqa: E402
from servelab.model import COURSE_MODELS_DIR, load_config  # noqa: E402
from servelab.sampling import SamplingParams  # noqa: E402

from _common import parser, results_folder, write_results  # noqa: E402

MODEL = COURSE_MODELS_DIR / "servelab-main"
SETTINGS = dict(block_size=16, num_kv_blocks=160, max_num_seqs=16, max_num_batched_tokens=512,
                max_model_len=256, skip_tokenizer_init=True)


def workload(num_prompts: int, prompt_len: int, shared: int, vocab: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    prefix = torch.randint(0, vocab, (shared,), generator=g).tolist()
    return [prefix + torch.randint(0, vocab, (prompt_len - shared,), generator=g).tolist()
            for _ in range(num_prompts)]


def cold(llm) -> None:
    """Empty the prefix cache and the step log: the next run prefills every prompt token."""
    llm.engine.scheduler.kv.reset_prefix_cache()
    llm.engine.step_log.clear()


def timed_run(llm, prompts, params, repeats: int, warm_up: bool = True):
    """Wall seconds of ``generate`` (fastest of ``repeats``, after a warm-up), its tokens, its step log."""
    if warm_up:
        llm.generate(prompts[:2], params)  # warm-up: first-call allocations
    best, tokens, log = None, None, None
    for _ in range(repeats):
        cold(llm)
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params)
        wall = time.perf_counter() - t0
        if best is None or wall < best:
            best, tokens, log = wall, [o.outputs[0].token_ids for o in outs], list(llm.engine.step_log)
    return best, tokens, log


def fit_sizes(largest: int) -> list[int]:
    """Message sizes for the fit: powers of four from one decode row's all-reduce (1 KB) to the
    first at or past the largest message the run sent (at least three sizes)."""
    sizes = [1024]
    while sizes[-1] < largest or len(sizes) < 3:
        sizes.append(sizes[-1] * 4)
    return sizes


def split_run(prompts, params, repeats: int, probe_repeats: int):
    """The 2-process run, with every collective call of every rank logged (the last repeat)."""
    llm = LLM(MODEL, tensor_parallel_size=2, **SETTINGS)
    try:
        ex = llm.engine.runner
        wall, tokens, log = timed_run(llm, prompts, params, repeats - 1) if repeats > 1 else (None, None, None)
        # the logged run: the same workload from an empty prefix cache, fresh step counters
        if wall is None:
            llm.generate(prompts[:2], params)  # warm-up
        ex.record_collectives(True)
        ex.collective_logs()
        ex.reset_stats()
        cold(llm)
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params)
        logged_wall = time.perf_counter() - t0
        logs = ex.collective_logs()
        stats = ex.comm_stats()
        steps = list(llm.engine.step_log)
        ex.record_collectives(False)
        # the compute between two exchanges of a step, on average: the burst before each timed call
        burst = max(0.0, (stats["step_seconds"] - stats["plan_seconds"] - stats["all_reduce_seconds"]
                          - stats["gather_seconds"]) / max(1, len(logs[0])))
        sizes = fit_sizes(max(c[2] for c in logs[0]))
        probe = {}
        for kind, b in (("idle", 0.0), ("after_compute", burst)):
            rows = ex.probe_all_reduce(sizes, probe_repeats, b)
            while True:  # a noisy machine can hide the slope: then add a larger size, at most to 16 MB
                try:
                    comm.fit_alpha_beta([c["bytes"] for c in rows], [c["median_s"] for c in rows])
                    break
                except ValueError:
                    if rows[-1]["bytes"] >= 1 << 24:
                        raise
                    rows += ex.probe_all_reduce([rows[-1]["bytes"] * 4], probe_repeats, b)
            probe[kind] = rows
        probe["burst_s"] = burst
        if wall is None or logged_wall < wall:
            wall, tokens, log = logged_wall, [o.outputs[0].token_ids for o in outs], steps
        return {"wall": wall, "tokens": tokens, "step_log": log, "logged_wall": logged_wall,
                "logged_steps": steps, "logs": logs, "stats": stats, "probe": probe}
    finally:
        llm.shutdown()


def main(argv=None) -> dict:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--realtime", action="store_true",
                   help="run every process at real-time priority (SCHED_FIFO 5; needs CAP_SYS_NICE), "
                        "as if the cores were the engine's alone; run it under the bench lock")
    args = p.parse_args(argv)
    if args.realtime:  # inherited by the fork server and the workers it forks
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(5))
    out_dir = results_folder(p, args)
    quick = args.quick
    torch.set_num_threads(1)
    t_start = time.perf_counter()
    load_before = os.getloadavg()[0]
    cfg = load_config(MODEL)
    n, plen, shared, new = (4, 24, 16, 8) if quick else (12, 64, 48, 48)
    repeats = 1 if quick else args.repeats
    prompts = workload(n, plen, shared, cfg.vocab_size)
    params = SamplingParams(temperature=0, max_tokens=new, ignore_eos=True)

    one = LLM(MODEL, **SETTINGS)
    wall1, tokens1, log1 = timed_run(one, prompts, params, repeats)
    torch.set_num_threads(2)  # the single process's best setup on two cores
    wall1t2, tokens1t2, log1t2 = timed_run(one, prompts, params, repeats)
    torch.set_num_threads(1)
    del one
    two = split_run(prompts, params, repeats, 7 if quick else 25)
    same = two["tokens"] == tokens1 == tokens1t2

    # every call, as the rank that arrived last saw it (the transfer) and as rank 0 saw it
    r0, r1 = two["logs"][0], two["logs"][1]
    assert len(r0) == len(r1) and all(a[0] == b[0] and a[2] == b[2] for a, b in zip(r0, r1)), \
        "the ranks' collective calls do not line up"
    steps = two["stats"]["steps"]
    fits = {}
    for kind in ("after_compute", "idle"):
        rows = two["probe"][kind]
        a, b = comm.fit_alpha_beta([c["bytes"] for c in rows], [c["median_s"] for c in rows])
        fits[kind] = {"alpha_s": a, "bandwidth": b, "rows": rows,
                      "predicted_ms": sum(a + c[2] / b for c in r0) / two["stats"]["steps"] * 1e3}
    alpha, bw, coll_rows = fits["after_compute"]["alpha_s"], fits["after_compute"]["bandwidth"], \
        fits["after_compute"]["rows"]
    transfer = sum(min(a[1], b[1]) for a, b in zip(r0, r1))
    rank0 = sum(a[1] for a in r0)
    predicted = sum(alpha + c[2] / bw for c in r0)
    st = two["stats"]
    step_s = st["step_seconds"]
    engine_s = sum(s.duration for s in two["logged_steps"])
    per_step = {
        "engine_ms": engine_s / steps * 1e3,
        "forward_ms": (step_s - st["plan_seconds"]) / steps * 1e3,
        "compute_ms": (step_s - st["plan_seconds"] - rank0) / steps * 1e3,
        "collectives_rank0_ms": rank0 / steps * 1e3,
        "transfer_ms": transfer / steps * 1e3,
        "wait_ms": (rank0 - transfer) / steps * 1e3,
        "plan_ms": st["plan_seconds"] / steps * 1e3,
        "other_ms": (engine_s - step_s) / steps * 1e3,
        "predicted_ms": predicted / steps * 1e3,
        "calls": len(r0) / steps,
        "bytes": sum(c[2] for c in r0) / steps,
    }
    err = per_step["predicted_ms"] / per_step["transfer_ms"] - 1
    out_tokens = sum(len(t) for t in tokens1)
    result = {
        "machine": describe(), "commit": git_commit(), "quick": quick, "model": MODEL.name,
        "workload": {"prompts": n, "prompt_tokens": plen, "shared_prefix": shared, "new_tokens": new},
        "settings": {k: v for k, v in SETTINGS.items() if k != "skip_tokenizer_init"},
        "same_tokens": same,
        # rows: "1" one process, one thread; "1t2" one process, two threads; "2" two processes
        "tokens_per_s": {"1": out_tokens / wall1, "1t2": out_tokens / wall1t2, "2": out_tokens / two["wall"]},
        "steps": {"1": len(log1), "1t2": len(log1t2), "2": len(two["step_log"])},
        "prefill_tokens": {k: sum(s.num_prefill_tokens for s in lg)
                           for k, lg in (("1", log1), ("1t2", log1t2), ("2", two["step_log"]))},
        "logged_run": {"steps": len(two["logged_steps"]),
                       "prefill_tokens": sum(s.num_prefill_tokens for s in two["logged_steps"])},
        "step_ms": {"1": sum(s.duration for s in log1) / len(log1) * 1e3,
                    "1t2": sum(s.duration for s in log1t2) / len(log1t2) * 1e3, "2": per_step["engine_ms"]},
        "per_step": per_step, "steps_logged": steps,
        "fit": {"alpha_s": alpha, "bandwidth": bw, "rows": coll_rows, "burst_s": two["probe"]["burst_s"]},
        "fit_idle": fits["idle"],
        "prediction_error": err,
        "load_avg": [load_before, os.getloadavg()[0]], "realtime": bool(args.realtime),
        "seconds": time.perf_counter() - t_start,
    }
    write_results(out_dir, "engine_tp", result, report(result))
    print(report(result))
    return result


def report(r: dict) -> str:
    ps, f = r["per_step"], r["fit"]
    w, m = r["workload"], r["machine"]
    return "\n".join([
        "# The engine split over processes (gloo over loopback)",
        "",
        f"{m['cpu']}, {m['logical_cpus']} logical CPUs, Python {m['python']}, torch {m['torch']}, {m['date']}, "
        f"git commit {r['commit']}, load average {r['load_avg'][0]:.2f} at the start "
        f"({r['load_avg'][1]:.2f} at the end), one thread per process (the split uses two cores)"
        f"{', every process at real-time priority (SCHED_FIFO 5): other programs on the machine could not delay its wake-ups' if r.get('realtime') else ''}"
        f". Command: `python benchmarks/bench_engine_tp.py{' --quick' if r['quick'] else ''}"
        f"{' --realtime' if r.get('realtime') else ''}` ({r['seconds']:.0f} s).",
        "",
        f"Workload: {w['prompts']} prompts of {w['prompt_tokens']} tokens ({w['shared_prefix']} shared), "
        f"{w['new_tokens']} greedy tokens each, all queued at once; engine settings {r['settings']}. "
        f"Fastest of the timed runs after a warm-up; every run starts from an empty prefix cache.",
        "",
        "## Tokens per second",
        "",
        "| processes | threads each (cores) | output tokens/s | steps | prefill tokens | ms per step |",
        "|---|---|---|---|---|---|",
        *(f"| {k[0]} | {t} ({c}) | {r['tokens_per_s'][k]:.1f} | {r['steps'][k]} | {r['prefill_tokens'][k]} "
          f"| {r['step_ms'][k]:.2f} |" for k, t, c in (("1", 1, 1), ("1t2", 2, 2), ("2", 1, 2))),
        "",
        f"Same greedy tokens in every row: {'yes' if r['same_tokens'] else 'NO'}.",
        "",
        "## One step of the 2-process run, on rank 0's clock (mean over the logged run's "
        f"{r['steps_logged']} steps; the logged run is the last timed run, with every collective "
        f"call recorded: {r['logged_run']['prefill_tokens']} prefill tokens)",
        "",
        "| part | ms per step |",
        "|---|---|",
        f"| compute (rank 0's shard) | {ps['compute_ms']:.2f} |",
        f"| collectives: transfer (time on the rank that arrived last) | {ps['transfer_ms']:.2f} |",
        f"| collectives: rank 0 waiting for the other rank | {ps['wait_ms']:.2f} |",
        f"| posting the step plan | {ps['plan_ms']:.2f} |",
        f"| scheduling, sampling, stop checks | {ps['other_ms']:.2f} |",
        f"| **whole step** | **{ps['engine_ms']:.2f}** |",
        "",
        f"{ps['calls']:.1f} collective calls per step ({ps['bytes'] / 1e3:.1f} kB per step).",
        "",
        "## The alpha-beta model's prediction",
        "",
        f"gloo all-reduce timed on the engine's own two processes between steps, each call after the "
        f"ranks line up and then compute for {f['burst_s'] * 1e3:.2f} ms (the mean compute between two "
        f"exchanges of a step), median of repeats, fitted: alpha {f['alpha_s'] * 1e6:.0f} us, "
        f"bandwidth {f['bandwidth'] / 1e9:.2f} GB/s (sizes {', '.join(str(x['bytes']) for x in f['rows'])} bytes). "
        f"Timed back to back with no compute between, the same fit gives alpha "
        f"{r['fit_idle']['alpha_s'] * 1e6:.0f} us, bandwidth {r['fit_idle']['bandwidth'] / 1e9:.2f} GB/s.",
        "",
        "| collective time per step | ms |",
        "|---|---|",
        f"| predicted: sum over calls of alpha + bytes / bandwidth | {ps['predicted_ms']:.2f} |",
        f"| predicted from the back-to-back fit | {r['fit_idle']['predicted_ms']:.2f} |",
        f"| measured transfer | {ps['transfer_ms']:.2f} |",
        f"| measured on rank 0 (transfer + wait) | {ps['collectives_rank0_ms']:.2f} |",
        "",
        f"Prediction against the measured transfer: {r['prediction_error'] * 100:+.0f}%.",
        "",
    ])


if __name__ == "__main__":
    main()
