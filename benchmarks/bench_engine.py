"""Engine benchmarks: three batching policies on one workload, the engine vs
transformers (split into policy x implementation), the engine before issue 10,
batch of one, KV memory waste, and the prefix lab.

    .venv/bin/python benchmarks/bench_engine.py --jobs 3        # full run (~7 CPU-minutes, parts in 3 processes)
    .venv/bin/python benchmarks/bench_engine.py --quick --out D # smoke run (seconds), into folder D
    .venv/bin/python benchmarks/bench_engine.py --trace T.jsonl # the workload from a JSONL trace
                                  # (servelab.workload's format, as loadgen and `sim check` read it)

Writes engine.md and engine.json into benchmarks/results/ (or ``--out``).

The model is a random-weight Llama with the course's main preset shape (d=256,
6 layers, 8 query / 4 KV heads, 4,096-token vocabulary), fp32, one thread.
Weights do not change the cost of a step, and ``ignore_eos`` makes every
request produce exactly the number of tokens the workload drew for it, so every
system does the same useful work.

The three policies, same workload, same seats, same model runner:

* static, padded: waves of ``seats`` requests; every prompt padded to the
  wave's longest and every finished member kept as a padding row until the
  wave ends (the rows one batched tensor computes, as ``transformers`` does);
* static, ragged: the same waves and steps, but only useful rows are computed
  (no padding; a finished member leaves the compute); only the waiting differs
  from continuous batching (and continuous splits prefills into chunks under
  its token budget);
* continuous: the engine; a finished request's seat is refilled next step.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from servelab.engine import EngineConfig, LLMEngine, ModelRunner, StaticBatchEngine
from servelab.engine.model_runner import can_compile
from servelab import sources
from servelab.engine.workload import expected_longest, mixed_workload, percentile, static_over_continuous_steps
from servelab.workload import load_trace, trace_workload
from servelab.model import LlamaConfig, LlamaModel, save_pretrained
from servelab.sampling import SamplingParams

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"

MODEL = dict(vocab_size=4096, hidden_size=256, intermediate_size=768, num_hidden_layers=6,
             num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=4096,
             tie_word_embeddings=True, eos_token_id=4091)

#: The smoke run's model: same vocabulary, context and end token, far smaller.
QUICK_MODEL = dict(MODEL, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2)

#: The engine before issue 10 (today's base when the issue was taken up): item 5's
#: throughput target is measured against it, in the same run, interleaved.
BASE_COMMIT = "ad02e85"

#: Whether the compiled engine can be measured here (torch.compile needs a C++ compiler).
COMPILE = can_compile()

#: Item 5's targets (issue 10): ratios measured within one run.
TARGET_BATCH_ONE_VS_TRANSFORMERS = 1.3
TARGET_CONTINUOUS_VS_BASE = 1.25

FULL = dict(requests=128, seats=64, sweep=(16, 64), workload=dict(prompt_max=512, output_cap=256),
            tight_blocks=768,
            base_rounds=3, batch_one=dict(prompt_len=64, new_tokens=128, repeats=3),
            prefix=dict(preamble_len=1200, question_len=24, repeats=5))
QUICK = dict(requests=12, seats=4, sweep=(2, 4),
             workload=dict(prompt_median=16, prompt_max=64, output_mean=8, output_cap=24),
             tight_blocks=24, base_rounds=1, batch_one=dict(prompt_len=8, new_tokens=8, repeats=1),
             prefix=dict(preamble_len=64, question_len=24, repeats=2))  # a full question block

POLICIES = {  # name -> (engine class, keyword arguments, what the row is)
    "static_padded": (StaticBatchEngine, {"padded": True},
                      "static waves, padded (one batched tensor's rows)"),
    "static_ragged": (StaticBatchEngine, {"padded": False},
                      "static waves, ragged (same waves, useful rows only)"),
    "continuous": (LLMEngine, {}, "continuous batching (the engine)"),
}


def machine() -> dict:
    """Machine, versions and load average (servelab.machine): on a shared machine other
    processes slow every system, so the load is part of the record."""
    from servelab.machine import describe
    return describe(("torch", "numpy", "transformers"), threads=1)


def build_model(shape=MODEL) -> LlamaModel:
    return LlamaModel(LlamaConfig(**shape)).init_weights(seed=0).eval()


def params(n):
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)


def engine_config(seats, pool_blocks, block_size=16):
    return EngineConfig(block_size=block_size, num_kv_blocks=pool_blocks, max_num_seqs=seats,
                        max_num_batched_tokens=2048, max_model_len=MODEL["max_position_embeddings"])


def throughput(total_tokens, elapsed, cpu_seconds, latencies, ttfts=None) -> dict:
    out = {"output_tokens": total_tokens, "seconds": round(elapsed, 3),
           "tokens_per_s": round(total_tokens / elapsed, 1), "cpu_seconds": round(cpu_seconds, 3),
           "tokens_per_cpu_s": round(total_tokens / cpu_seconds, 1),
           "latency_p50_s": round(percentile(latencies, 50), 3),
           "latency_p95_s": round(percentile(latencies, 95), 3)}
    if ttfts is not None:
        out["ttft_p50_s"] = round(percentile(ttfts, 50), 3)
        out["ttft_p95_s"] = round(percentile(ttfts, 95), 3)
    out["load_average_1min_end"] = round(os.getloadavg()[0], 2)
    return out


def run_policy(policy, model, workload, seats, pool_blocks, track_memory=False):
    """One policy over the whole workload (all requests queued at t=0)."""
    cls, kwargs, _ = POLICIES[policy]
    eng = cls(ModelRunner(model, pool_blocks, 16), engine_config(seats, pool_blocks),
              eos_token_ids=[MODEL["eos_token_id"]], **kwargs)
    t0, c0 = time.perf_counter(), time.process_time()
    for i, r in enumerate(workload):
        eng.add_request(str(i), r.prompt_token_ids, params(r.max_tokens), arrival_time=t0)
    final, memory = {}, []
    while eng.has_unfinished_requests():
        for out in eng.step():
            if out.finished:
                final[out.request_id] = out
        if track_memory:
            memory.append(kv_snapshot(eng))
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    outs = [final[str(i)] for i in range(len(workload))]
    total = sum(len(o.outputs[0].token_ids) for o in outs)
    assert total == sum(r.max_tokens for r in workload), "every request must produce its drawn length"
    stats = throughput(total, elapsed, cpu, [o.metrics.finished_time - t0 for o in outs],
                       [o.metrics.first_token_time - t0 for o in outs])
    rows = sum(s.num_batched_tokens for s in eng.step_log)
    stats.update(steps=eng.num_steps, rows_computed=rows, rows_per_useful_token=round(rows / total, 3))
    sched = eng.scheduler
    if cls is StaticBatchEngine:
        stats.update(waves=sched.num_waves, decode_padding_rows=sched.num_padding_tokens,
                     prompt_padding_rows=sched.num_prompt_padding_tokens)
    else:
        stats["preemptions"] = sched.num_preemptions
    return stats, memory


def kv_snapshot(eng):
    """Slots reserved and used now, by the paged pool and by reservation schemes."""
    usage = eng.kv_usage()
    running = eng.scheduler.running
    by_request = sum(s.num_prompt_tokens + s.sampling_params.max_tokens for s in running)
    by_context = len(running) * MODEL["max_position_embeddings"]
    return (usage.used_slots, usage.reserved_slots, by_request, by_context)


def memory_summary(memory):
    used = sum(m[0] for m in memory)
    return {"paged_waste": round(1 - used / sum(m[1] for m in memory), 4),
            "reserve_prompt_plus_max_tokens_waste": round(1 - used / sum(m[2] for m in memory), 4),
            "reserve_max_model_len_waste": round(1 - used / sum(m[3] for m in memory), 4),
            "note": "time-averaged over engine steps: 1 - used slots / reserved slots"}


def load_transformers(model):
    from transformers import LlamaForCausalLM
    with tempfile.TemporaryDirectory() as tmp:
        save_pretrained(model, tmp)
        hf = LlamaForCausalLM.from_pretrained(tmp, dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = None
    hf.generation_config.pad_token_id = 0
    return hf


def run_transformers(hf, workload, batch):
    """`transformers` generate, batched with left padding, in waves of `batch` (static, padded)."""
    t0, c0 = time.perf_counter(), time.process_time()
    finish, rows, useful = [], 0, 0
    for w in range(0, len(workload), batch):
        wave = workload[w:w + batch]
        longest = max(len(r.prompt_token_ids) for r in wave)
        most = max(r.max_tokens for r in wave)
        ids = torch.zeros(len(wave), longest, dtype=torch.long)
        mask = torch.zeros(len(wave), longest, dtype=torch.long)
        for row, r in enumerate(wave):
            ids[row, longest - len(r.prompt_token_ids):] = torch.tensor(r.prompt_token_ids)
            mask[row, longest - len(r.prompt_token_ids):] = 1
        with torch.no_grad():
            hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=most, min_new_tokens=most,
                        do_sample=False, eos_token_id=None, pad_token_id=0)
        finish += [time.perf_counter() - t0] * len(wave)
        useful += sum(r.max_tokens for r in wave)
        rows += len(wave) * (longest + most - 1)  # the tensor: every row, every step
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    stats = throughput(useful, elapsed, cpu, finish)
    stats.update(steps=sum(max(r.max_tokens for r in workload[w:w + batch])
                           for w in range(0, len(workload), batch)),
                 rows_computed=rows, rows_per_useful_token=round(rows / useful, 3))
    return stats


# -- the engine before issue 10, from git, in a fresh process ---------------------------------

_BASE_SCRIPT = r"""
import json, sys, time
import torch
torch.set_num_threads(1)
from servelab.engine import EngineConfig, LLMEngine, ModelRunner
from servelab.engine.workload import mixed_workload
from servelab.model import LlamaConfig, LlamaModel
from servelab.sampling import SamplingParams
a = json.loads(sys.argv[1])
model = LlamaModel(LlamaConfig(**a["model"])).init_weights(seed=0).eval()
work = mixed_workload(a["requests"], vocab_size=4000, seed=0, **a["workload"])
cfg = EngineConfig(block_size=16, num_kv_blocks=a["blocks"], max_num_seqs=a["seats"],
                   max_num_batched_tokens=2048, max_model_len=a["model"]["max_position_embeddings"])
w0 = time.perf_counter()  # LLM(..., enforce_eager=False) compiles at start-up, timed apart from the run
runner = ModelRunner(model, a["blocks"], 16, **({"compile": True} if a.get("compile") else {}))
compile_s = time.perf_counter() - w0 if a.get("compile") else 0.0
eng = LLMEngine(runner, cfg, eos_token_ids=[a["model"]["eos_token_id"]])
t0, c0 = time.perf_counter(), time.process_time()
for i, r in enumerate(work):
    eng.add_request(str(i), r.prompt_token_ids,
                    SamplingParams(temperature=0.0, max_tokens=r.max_tokens, ignore_eos=True),
                    arrival_time=t0)
total = 0
while eng.has_unfinished_requests():
    for out in eng.step():
        if out.finished:
            total += len(out.outputs[0].token_ids)
print(json.dumps({"output_tokens": total, "seconds": time.perf_counter() - t0,
                  "cpu_seconds": time.process_time() - c0, "steps": eng.num_steps,
                  "compile_seconds": compile_s}))
"""


def export_base(dest: Path, commit: str = BASE_COMMIT) -> Path | None:
    """``lib/`` of ``commit`` exported with ``git archive`` (nothing in the checkout changes)."""
    try:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit, "lib"], capture_output=True,
                                 check=True, timeout=60).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return dest / "lib"


def run_base(lib: Path, shape, requests, workload_kw, seats, blocks, compile: bool = False) -> dict:
    args = json.dumps({"model": shape, "requests": requests, "workload": workload_kw, "seats": seats,
                       "blocks": blocks, "compile": compile})
    env = dict(os.environ, PYTHONPATH=str(lib), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", _BASE_SCRIPT, args], capture_output=True, text=True,
                          env=env, cwd=str(lib.parent), timeout=3600)
    if proc.returncode != 0:
        raise RuntimeError(f"the engine at {BASE_COMMIT} failed:\n{proc.stderr[-2000:]}")
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    r["tokens_per_s"] = round(r["output_tokens"] / r["seconds"], 1)
    r["tokens_per_cpu_s"] = round(r["output_tokens"] / r["cpu_seconds"], 1)
    r["seconds"], r["cpu_seconds"] = round(r["seconds"], 3), round(r["cpu_seconds"], 3)
    return r


def versus_base(model, shape, workload, cfg, seats, blocks, rounds):
    """This engine and the engine at BASE_COMMIT, continuous, same workload, interleaved."""
    with tempfile.TemporaryDirectory() as tmp:
        lib = export_base(Path(tmp))
        if lib is None:
            return {"commit": BASE_COMMIT, "ran": False, "why": "git archive failed (no git checkout?)"}
        import servelab
        here = Path(servelab.__file__).resolve().parents[1]  # this engine's lib/, run the same way
        now, compiled, base = [], [], []
        runs = {"now": (now, here, False), "base": (base, lib, False)}
        if COMPILE:
            runs["compiled"] = (compiled, here, True)
        order = list(runs)
        for i in range(rounds):  # the order rotates, so a machine slowing down over the run favours none
            for name in order[i % len(order):] + order[:i % len(order)]:
                into, where, compile_ = runs[name]
                into.append(run_base(where, shape, len(workload), cfg["workload"], seats, blocks, compile=compile_))
    best = lambda runs, key: max(r[key] for r in runs)  # noqa: E731  (reported beside the median)
    out = {"commit": BASE_COMMIT, "ran": True, "rounds": rounds, "seats": seats,
           "how": f"lib/ of {BASE_COMMIT} exported with git archive; each round runs this engine eager, "
                  "this engine compiled (enforce_eager=False, compiling done before the timed run and "
                  "reported apart) and that one, each in a fresh process with the same script, in an order "
                  "that rotates from round to round; the ratio is the median over rounds of each round's "
                  "ratio (the machine's speed drifts over a run)",
           "order": [(order[i % len(order):] + order[:i % len(order)]) for i in range(rounds)],
           "now": [{k: r[k] for k in ("tokens_per_s", "tokens_per_cpu_s", "steps")} for r in now],
           "compiled": [{k: r[k] for k in ("tokens_per_s", "tokens_per_cpu_s", "steps")} for r in compiled],
           "compile_seconds": [round(r["compile_seconds"], 1) for r in compiled],
           "base": [{k: r[k] for k in ("tokens_per_s", "tokens_per_cpu_s", "steps")} for r in base]}

    def by_round(runs, key):  # each round's ratio to the old engine's run of the same round
        ratios = sorted(r[key] / b[key] for r, b in zip(runs, base))
        return ratios, round(statistics.median(ratios), 2)

    out["round_ratios_cpu"], out["speedup_cpu"] = by_round(now, "tokens_per_cpu_s")
    out["speedup"] = by_round(now, "tokens_per_s")[1]
    if not compiled:  # no C++ compiler for torch.compile here: the eager engine only
        for key in ("compiled", "compile_seconds"):
            out.pop(key)
        out["best_of_rounds_cpu"] = round(best(now, "tokens_per_cpu_s") / best(base, "tokens_per_cpu_s"), 2)
        out["target"] = TARGET_CONTINUOUS_VS_BASE
        out["met"] = out["speedup_cpu"] >= TARGET_CONTINUOUS_VS_BASE
        return out
    out["compiled_round_ratios_cpu"], out["compiled_speedup_cpu"] = by_round(compiled, "tokens_per_cpu_s")
    out["compiled_speedup"] = by_round(compiled, "tokens_per_s")[1]
    out["best_of_rounds_cpu"] = round(best(now, "tokens_per_cpu_s") / best(base, "tokens_per_cpu_s"), 2)
    out["compiled_best_of_rounds_cpu"] = round(best(compiled, "tokens_per_cpu_s") / best(base, "tokens_per_cpu_s"),
                                               2)
    out["target"] = TARGET_CONTINUOUS_VS_BASE
    out["met"] = out["speedup_cpu"] >= TARGET_CONTINUOUS_VS_BASE
    out["met_compiled"] = out["compiled_speedup_cpu"] >= TARGET_CONTINUOUS_VS_BASE
    return out


def batch_one(model, hf, prompt_len=64, new_tokens=128, repeats=3, compiled: bool = True):
    """One request alone, engine and transformers interleaved: per-token overhead.

    Eager against eager (the target), and with ``compiled`` also compiled against
    compiled: the engine with ``enforce_eager=False``, `transformers` with its own
    recipe for a compiled ``generate`` (a static cache and ``torch.compile`` of the
    forward pass). Compiling is done before the timed runs and reported apart.
    """
    prompt = list(range(100, 100 + prompt_len))

    def engine_run(eager):
        eng = LLMEngine.from_model(model, block_size=16, num_kv_blocks=64, max_num_seqs=1, enforce_eager=eager)
        t = time.perf_counter()
        eng.add_request("a", prompt, params(new_tokens))
        eng.run_to_completion()
        return time.perf_counter() - t

    def hf_run(**kw):
        t = time.perf_counter()
        with torch.no_grad():
            hf.generate(input_ids=torch.tensor([prompt]), max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                        do_sample=False, eos_token_id=None, pad_token_id=0, **kw)
        return time.perf_counter() - t

    times = {"engine": [], "transformers": []}
    for _ in range(repeats):
        times["engine"].append(engine_run(True))
        times["transformers"].append(hf_run())
    e, h = min(times["engine"]), min(times["transformers"])
    speedup = round(h / e, 2)
    out = {"prompt_tokens": prompt_len, "new_tokens": new_tokens,
           "engine_tokens_per_s": round(new_tokens / e, 1), "transformers_tokens_per_s": round(new_tokens / h, 1),
           "speedup": speedup, "target": TARGET_BATCH_ONE_VS_TRANSFORMERS,
           "met": speedup >= TARGET_BATCH_ONE_VS_TRANSFORMERS,
           "timing": f"best of {repeats}, interleaved"}
    if compiled:
        t = time.perf_counter()
        LLMEngine.from_model(model, block_size=16, num_kv_blocks=64, max_num_seqs=1, enforce_eager=False)
        engine_compile = time.perf_counter() - t  # the start-up compiles every kind of step
        eager_forward = hf.forward
        hf.forward = torch.compile(hf.forward)
        try:
            static = dict(cache_implementation="static")
            t = time.perf_counter()
            hf_run(**static)
            hf_compile = time.perf_counter() - t
            ce, ch = [], []
            for _ in range(repeats):
                ce.append(engine_run(False))
                ch.append(hf_run(**static))
        finally:
            hf.forward = eager_forward
        e, h = min(ce), min(ch)
        out["compiled"] = {"engine_tokens_per_s": round(new_tokens / e, 1),
                           "transformers_tokens_per_s": round(new_tokens / h, 1), "speedup": round(h / e, 2),
                           "met": h / e >= TARGET_BATCH_ONE_VS_TRANSFORMERS,
                           "first_run_seconds": {"engine": round(engine_compile, 1),
                                                 "transformers": round(hf_compile, 1)},
                           "how": "engine: LLM(..., enforce_eager=False); transformers: "
                                  "generate(cache_implementation='static') with torch.compile(model.forward)"}
    return out


#: Item 5's third target: a batch-1 step costs at most this many times the time to read its weights.
TARGET_BATCH1_OVER_WEIGHTS_READ = 2.5


def step_profile(model, quick: bool, repeats: int = 3, pairs: int = 7) -> dict:
    """Where a step's time goes, by phase (``servelab.engine.profile``), at batch 1 and at the
    benchmark's seat count, and the batch-1 step against one read of its weights.

    The read time moves with the machine's memory bandwidth, which on a shared machine
    drifts by a fifth from minute to minute; so the ratio is measured in ``pairs``:
    each pair times the mat-vec bandwidth, then an eager and a compiled batch-1 run
    right after it, and the ratio reported is the median over the pairs.
    """
    from servelab.engine import profile as P
    seats = (QUICK if quick else FULL)["seats"]
    prompt_len, new = (16, 8) if quick else (64, 64)
    rows = []
    for n in (1, seats):
        runs = [P.profile_engine(model, n, prompt_len, new) for _ in range(repeats)]
        rows.append(min(runs, key=lambda r: r["step_ms"]))
    compiled = min((P.profile_engine(model, 1, prompt_len, new, enforce_eager=False) for _ in range(repeats)),
                   key=lambda r: r["step_ms"]) if COMPILE else None
    samples = []
    for _ in range(2 if quick else pairs):
        bw = P.matvec_bandwidth_cpu_time(32 if quick else 256)
        read_ms = 1e3 * P.weights_read_seconds(model, bw)
        eager_ms = P.profile_engine(model, 1, prompt_len, new)["step_ms"]
        compiled_ms = P.profile_engine(model, 1, prompt_len, new, enforce_eager=False)["step_ms"] \
            if COMPILE else float("nan")
        # the profile's engines fused the model in place: its matrices as the runner stores them
        mats_ms = 1e3 * P.matmuls_alone_seconds(model, 20 if quick else 100)
        samples.append({"matvec_GB_per_s": round(bw / 1e9, 2), "weights_read_ms": round(read_ms, 4),
                        "matmuls_alone_ms": round(mats_ms, 4), "matmuls_alone_ratio": round(mats_ms / read_ms, 3),
                        "eager_step_ms": round(eager_ms, 4), "compiled_step_ms": round(compiled_ms, 4),
                        "eager_ratio": round(eager_ms / read_ms, 3), "compiled_ratio": round(compiled_ms / read_ms, 3)})
    mid = lambda key: statistics.median(x[key] for x in samples)  # noqa: E731
    ratio, compiled_ratio = mid("eager_ratio"), mid("compiled_ratio")
    floor = mid("matmuls_alone_ratio")
    for x in samples:
        x["compiled_over_eager"] = round(x["eager_step_ms"] / x["compiled_step_ms"], 3)
    out = {"runs": rows, "matvec_GB_per_s": mid("matvec_GB_per_s"), "weights_read_ms": mid("weights_read_ms"),
            "batch1_over_weights_read": round(ratio, 2), "target": TARGET_BATCH1_OVER_WEIGHTS_READ,
            "met": ratio <= TARGET_BATCH1_OVER_WEIGHTS_READ, "compiled_run": compiled,
            "compiled_batch1_over_weights_read": round(compiled_ratio, 2),
            "met_compiled": compiled_ratio <= TARGET_BATCH1_OVER_WEIGHTS_READ, "pairs": samples,
            "matmuls_alone_over_weights_read": round(floor, 2),
            "eager_step_ms_median": mid("eager_step_ms"), "compiled_step_ms_median": mid("compiled_step_ms"),
            "compiled_speedup_median": mid("compiled_over_eager"),
            "how": f"servelab.engine.profile: CPU time per decode step, fastest of {repeats} runs of "
                   f"{new} new tokens after a {prompt_len}-token prompt; against the weights read once at the "
                   f"mat-vec bandwidth measured on the same clock: median of {len(samples)} pairs, each a "
                   "bandwidth measurement then an eager and a compiled run"}
    if not COMPILE:  # no C++ compiler for torch.compile here: eager figures only
        for key in ("compiled_run", "compiled_batch1_over_weights_read", "met_compiled", "compiled_step_ms_median",
                    "compiled_speedup_median"):
            out.pop(key)
    return out


def prefix_lab(model, preamble_len=1200, question_len=24, repeats=5):
    """First-token time with a cached preamble vs the same preamble, one token changed.

    Every repeat asks a fresh question of the same length (the first one is the question
    chapter 13's live run asks), so every cached repeat hits exactly the preamble: with one
    question reused, its first full block would be cached by the first repeat and hit by
    the later ones, mixing two cases in the median."""
    g = torch.Generator().manual_seed(0)
    preamble = torch.randint(0, 4000, (preamble_len,), generator=g).tolist()
    questions = [torch.randint(0, 4000, (question_len,), generator=g).tolist() for _ in range(repeats)]
    eng = LLMEngine.from_model(model, block_size=16, num_kv_blocks=1024, max_num_seqs=4,
                               max_num_batched_tokens=2048)
    eng.add_request("warm", preamble + [1, 2, 3], params(1))
    eng.run_to_completion()
    cached, edited = [], []
    for k, question in enumerate(questions):
        for label, prompt, bucket in (
                ("cached", preamble + question, cached),
                ("edited", [(preamble[0] + 1 + k) % 4000] + preamble[1:] + question, edited)):
            rid = f"{label}{k}"
            eng.add_request(rid, prompt, params(1))
            out = eng.run_to_completion()[rid]
            bucket.append((out.metrics.ttft, out.metrics.num_cached_tokens))
    c = sorted(t for t, _ in cached)[repeats // 2]
    e = sorted(t for t, _ in edited)[repeats // 2]
    return {"preamble_tokens": preamble_len, "question_tokens": question_len,
            "cached_ttft_ms": round(c * 1e3, 2), "edited_ttft_ms": round(e * 1e3, 2),
            "speedup": round(e / c, 1),
            "cached_tokens_hit": cached[0][1], "edited_tokens_hit": edited[0][1],
            "cached_tokens_hit_each": [h for _, h in cached], "edited_tokens_hit_each": [h for _, h in edited],
            "cached_ttft_ms_each": [round(t * 1e3, 2) for t, _ in cached],
            "edited_ttft_ms_each": [round(t * 1e3, 2) for t, _ in edited],
            "timing": f"median of {repeats}, a fresh {question_len}-token question each repeat"}


def published() -> dict:
    """The published static-vs-continuous pair, from the registry of sourced figures."""
    static, cont = sources.get("vllm_static_throughput"), sources.get("vllm_continuous_throughput")
    return {"static_tokens_per_s": static.value, "continuous_tokens_per_s": cont.value,
            "setting": f"{static.what}; {cont.what}", "source": static.title, "url": static.url,
            "registry_keys": ["vllm_static_throughput", "vllm_continuous_throughput"]}


def ratio(a, b, key="tokens_per_cpu_s"):
    return round(a[key] / b[key], 2)


def setup(quick: bool):
    """The run's configuration, model shape, model and workload (the same in every part)."""
    cfg = QUICK if quick else FULL
    torch.set_num_threads(1)
    torch.manual_seed(0)
    shape = QUICK_MODEL if quick else MODEL
    model = build_model(shape)
    trace = os.environ.get(TRACE_ENV)
    if trace:  # every request of the trace, queued at t=0 (its arrival times are not used here)
        workload = trace_workload(load_trace(trace), vocab_size=4000, seed=0, avoid=[MODEL["eos_token_id"]])
        cfg = dict(cfg, requests=len(workload))
    else:
        workload = mixed_workload(cfg["requests"], vocab_size=4000, seed=0, **cfg["workload"])
    return cfg, shape, model, workload


#: The environment variable that carries ``--trace`` to the parts' processes.
TRACE_ENV = "SERVELAB_BENCH_TRACE"


AMPLE_BLOCKS = {False: 8192, True: 512}  # blocks of 16: room for every seat at its longest


def code_version() -> str:
    """The servelab measured: the checkout's HEAD commit, and whether lib/ has local changes."""
    import servelab
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=30, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "lib"], capture_output=True,
                               text=True, timeout=30, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return f"servelab from {Path(servelab.__file__).parent} (no git)"
    where = Path(servelab.__file__).resolve().parents[1]
    if where != (ROOT / "lib").resolve():
        return f"servelab from {where} (checkout HEAD {head})"
    return head + (" + local changes in lib/" if dirty else "")


def workload_description(overrides: dict) -> dict:
    """The workload's distributions in words, from ``mixed_workload``'s defaults and ``overrides``."""
    import inspect
    kw = {k: v.default for k, v in inspect.signature(mixed_workload).parameters.items()
          if v.default is not inspect.Parameter.empty and k != "seed"}
    kw.update(overrides)
    return {"prompt": f"log-normal, median {kw['prompt_median']:g}, sigma {kw['prompt_sigma']:g}, "
                      f"clipped to [{kw['prompt_min']}, {kw['prompt_max']}]",
            "output": f"exponential, mean {kw['output_mean']:g}, capped at {kw['output_cap']}",
            "parameters": kw}


def part_names(cfg, equal_memory: bool, base: bool) -> list[str]:
    names = [f"sweep:{k}" for k in cfg["sweep"]] + ["transformers", "batch_one", "prefix", "step_profile"]
    if base:
        names.append("base")
    if equal_memory:
        names.append("equal_memory")
    return names


def run_part(name: str, quick: bool) -> dict:
    """One independent part of the run, in this process. Every part builds the same model
    and workload; ratios are only ever taken within a part or over CPU-seconds."""
    cfg, shape, model, workload = setup(quick)
    seats, ample, started = cfg["seats"], AMPLE_BLOCKS[quick], time.perf_counter()
    out: dict = {"part": name, "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()),
                 "load_average_1min_start": round(os.getloadavg()[0], 2)}
    if name.startswith("sweep:"):
        k = int(name.split(":")[1])
        row = {"seats": k, "expected_longest_over_mean": round(expected_longest(k), 2)}
        for policy in ("continuous", "static_ragged", "static_padded"):
            row[policy], _ = run_policy(policy, model, workload, k, ample)
            if policy == "continuous" and k == seats:  # KV snapshots every step, in a run of their
                # own: walking the pool each step would slow the timed run (~1 ms a step)
                out["kv_memory"] = memory_summary(run_policy(policy, model, workload, k, ample,
                                                             track_memory=True)[1])
        c, rg, pd = row["continuous"], row["static_ragged"], row["static_padded"]
        row["continuous_vs_static_padded"] = ratio(c, pd, "tokens_per_s")
        row["continuous_vs_static_padded_cpu"] = ratio(c, pd)
        row["continuous_vs_static_ragged_cpu"] = ratio(c, rg)
        row["ragged_vs_padded_cpu"] = ratio(rg, pd)
        row["step_ratio"] = round(pd["steps"] / c["steps"], 2)
        out["row"] = row
    elif name == "transformers":
        out["transformers"] = run_transformers(load_transformers(model), workload, seats)
    elif name == "batch_one":
        out["batch_one"] = batch_one(model, load_transformers(model), compiled=COMPILE, **cfg["batch_one"])
    elif name == "prefix":
        out["prefix_lab"] = prefix_lab(model, **cfg["prefix"])
    elif name == "step_profile":
        out["step_profile"] = step_profile(model, quick)
    elif name == "base":
        out["versus_base"] = versus_base(model, shape, workload, cfg, seats, ample, cfg["base_rounds"])
    elif name == "equal_memory":
        tight = cfg["tight_blocks"]  # the same, tight KV memory for both policies
        em = {p: run_policy(p, model, workload, 2 * seats, tight)[0] for p in ("continuous", "static_padded")}
        em["continuous_vs_static_padded_cpu"] = ratio(em["continuous"], em["static_padded"])
        em["step_ratio"] = round(em["static_padded"]["steps"] / em["continuous"]["steps"], 2)
        em["slots"], em["seats"] = tight * 16, 2 * seats
        out["equal_memory"] = em
    else:
        raise ValueError(f"unknown part {name!r}")
    out["seconds"] = round(time.perf_counter() - started, 1)
    out["load_average_1min_end"] = round(os.getloadavg()[0], 2)
    return out


def reuse_parts(path, which: str, names, r) -> dict[str, dict]:
    """Parts of an earlier run (same workload and seats), rebuilt from its engine.json."""
    old = json.loads(Path(path).read_text())
    same = lambda x: (x.get("requests"), x.get("seats"), x.get("model"), x.get("quick"),  # noqa: E731
                      x["workload"]["prompt_tokens"], x["workload"]["output_tokens"])
    for key, a, b in zip(("requests", "seats", "model", "quick", "prompt tokens", "output tokens"),
                         same(old), same(r)):
        if a != b:
            raise ValueError(f"--reuse {path}: its {key!r} differs from this run's; rerun every part")
    out = {}
    for name in [w.strip() for w in which.split(",") if w.strip()]:
        if name not in names:
            raise ValueError(f"--reuse-parts: unknown part {name!r}; parts are {names}")
        same_code = old.get("code") is not None and old.get("code") == r.get("code")
        if not same_code and name != "transformers" and not name.startswith("sweep:"):
            raise ValueError(f"--reuse-parts: only transformers and sweep:N can be reused from a run of other "
                             f"code, not {name!r}")
        info = dict(old["parts"][name])
        info.setdefault("reused_from", f"the run of {old['machine']['date']}"
                        + (f", code {old['code']}" if old.get("code") else ""))
        if name == "transformers":
            info["transformers"] = old["transformers"]
        elif name.startswith("sweep:"):
            info["row"] = next(x for x in old["seat_sweep"] if x["seats"] == int(name.split(":")[1]))
            if info["row"]["seats"] == r["seats"]:
                info["kv_memory"] = old["kv_memory"]
        elif name == "batch_one":
            info["batch_one"] = old["batch_one"]
        elif name == "prefix":
            info["prefix_lab"] = old["prefix_lab"]
        elif name == "base":
            info["versus_base"] = old["versus_base"]
        elif name == "step_profile":
            info["step_profile"] = old["step_profile"]
        out[name] = info
    return out


def run_parts(names, quick: bool, jobs: int, log) -> dict[str, dict]:
    """Every part, ``jobs`` worker processes at a time (1: all in this process, in order)."""
    if jobs <= 1:
        results = {}
        for name in names:
            results[name] = run_part(name, quick)
            log(name, f"{results[name]['seconds']} s")
        return results
    results, running, queue = {}, {}, list(names)
    with tempfile.TemporaryDirectory() as tmp:
        while queue or running:
            while queue and len(running) < jobs:
                name = queue.pop(0)
                path = Path(tmp) / (name.replace(":", "_") + ".json")
                cmd = [sys.executable, str(Path(__file__).resolve()), "--part", name, "--part-out", str(path)]
                if quick:
                    cmd.append("--quick")
                running[name] = (subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                                  text=True), path)
            time.sleep(0.2)
            for name, (proc, path) in list(running.items()):
                if proc.poll() is None:
                    continue
                del running[name]
                if proc.returncode != 0:
                    for other, _ in running.values():
                        other.kill()
                    raise RuntimeError(f"part {name} failed:\n{proc.stderr.read()[-3000:]}")
                results[name] = json.loads(path.read_text())
                log(name, f"{results[name]['seconds']} s")
    return results


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny workload, seconds; needs --out")
    ap.add_argument("--out", default=None, help="folder for engine.md/engine.json (default benchmarks/results)")
    ap.add_argument("--no-base", action="store_true", help=f"skip the run of the engine at {BASE_COMMIT}")
    ap.add_argument("--equal-memory", action="store_true",
                    help="also compare continuous and padded static waves in the same tight KV pool")
    ap.add_argument("--jobs", type=int, default=1,
                    help="run the independent parts in this many processes at once (default 1)")
    ap.add_argument("--reuse", metavar="ENGINE_JSON",
                    help="an earlier full run's engine.json to take the --reuse-parts from")
    ap.add_argument("--reuse-parts", default="transformers",
                    help="comma-separated parts taken from --reuse instead of measured (default: "
                         "transformers, which does not depend on this engine's code)")
    ap.add_argument("--code", default=None,
                    help="what code is measured, for the record (default: the checkout's HEAD commit, "
                         "plus '+ local changes' when lib/ differs from it)")
    ap.add_argument("--base-rounds", type=int, default=None,
                    help="interleaved rounds of this engine and the one at BASE_COMMIT (default 2)")
    ap.add_argument("--trace", default=None,
                    help="take the workload from this JSONL trace (servelab.workload's format; arrivals unused: "
                         "every request queued at t=0) instead of the log-normal/exponential mix")
    ap.add_argument("--part", help=argparse.SUPPRESS)
    ap.add_argument("--part-out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.trace:
        os.environ[TRACE_ENV] = str(Path(args.trace).resolve())  # the parts' processes inherit it
    if args.base_rounds:
        QUICK["base_rounds"] = FULL["base_rounds"] = args.base_rounds
    if args.part:
        Path(args.part_out).write_text(json.dumps(run_part(args.part, args.quick)))
        return 0
    if args.quick and args.out is None:
        ap.error("--quick needs --out FOLDER (a smoke run never overwrites benchmarks/results)")
    out_dir = Path(args.out) if args.out else RESULTS
    cfg, shape, _, workload = setup(args.quick)
    started = time.perf_counter()
    desc = workload_description(cfg["workload"])
    if os.environ.get(TRACE_ENV):
        desc = {"prompt": f"from the trace {Path(os.environ[TRACE_ENV]).name}",
                "output": "from the same trace", "trace": os.environ[TRACE_ENV]}
    r = {"quick": args.quick, "machine": machine(), "model": shape, "requests": cfg["requests"],
         "seats": cfg["seats"], "jobs": max(args.jobs, 1), "code": args.code or code_version(),
         "workload": {**desc, "prompt_tokens": sum(len(w.prompt_token_ids) for w in workload),
                      "output_tokens": sum(w.max_tokens for w in workload), "arrival": "all at t=0"},
         "published_static_vs_continuous": published()}

    def log(msg, value=None):
        print(f"[{time.perf_counter() - started:6.0f} s] {msg}" + (f": {value}" if value is not None else ""),
              flush=True)

    names = part_names(cfg, args.equal_memory, not args.no_base)
    reused = reuse_parts(args.reuse, args.reuse_parts, names, r) if args.reuse else {}
    parts = run_parts([n for n in names if n not in reused], args.quick, args.jobs, log)
    parts.update(reused)
    kept = ("started", "seconds", "load_average_1min_start", "load_average_1min_end", "reused_from", "remeasured")
    r["parts"] = {n: {k: parts[n][k] for k in kept if k in parts[n]} for n in names}
    r["seat_sweep"] = [parts[f"sweep:{k}"]["row"] for k in cfg["sweep"]]
    add_wave_model(r)
    headline = parts[f"sweep:{cfg['seats']}"]
    r["kv_memory"] = headline["kv_memory"]
    r["headline"] = headline["row"]
    r["policies"] = {p: headline["row"][p] for p in POLICIES}
    r["transformers"] = parts["transformers"]["transformers"]
    r["batch_one"] = parts["batch_one"]["batch_one"]
    r["prefix_lab"] = parts["prefix"]["prefix_lab"]
    if "step_profile" in parts:
        r["step_profile"] = parts["step_profile"]["step_profile"]
    r["versus_base"] = parts["base"]["versus_base"] if "base" in parts else \
        {"commit": BASE_COMMIT, "ran": False, "why": "--no-base"}
    if "equal_memory" in parts:
        r["equal_memory"] = parts["equal_memory"]["equal_memory"]
    p = r["policies"]
    r["decomposition"] = {
        "policy": ratio(p["continuous"], p["static_padded"]),          # same engine, padded waves -> continuous
        "implementation": ratio(p["static_padded"], r["transformers"]),  # same padded waves, transformers -> engine
        "total": ratio(p["continuous"], r["transformers"]),
        "waiting": ratio(p["continuous"], p["static_ragged"]),          # ragged waves -> continuous
        "padding": ratio(p["static_ragged"], p["static_padded"]),       # padded -> ragged, same waves
        "total_wall": ratio(p["continuous"], r["transformers"], "tokens_per_s"),
        "step_ratio_static_over_continuous": round(p["static_padded"]["steps"] / p["continuous"]["steps"], 2),
        "note": "output tokens per CPU-second; policy x implementation = total; policy = waiting x padding"}
    r["machine"]["load_average_1min_end"] = round(os.getloadavg()[0], 2)
    r["run_seconds"] = round(time.perf_counter() - started, 1)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "engine.json").write_text(json.dumps(r, indent=2) + "\n")
    (out_dir / "engine.md").write_text(report(r))
    print(f"wrote {out_dir / 'engine.md'} in {r['run_seconds']} s")
    return 0


def add_wave_model(r) -> dict:
    """Each seat-sweep row gets the capped, finite-wave model's prediction of the step ratio
    (:func:`servelab.engine.workload.static_over_continuous_steps`, as chapter 17 uses it)."""
    w = r["workload"].get("parameters")
    if w is None:  # a trace's workload: no distribution to model the waves by
        return r
    cap = w["output_cap"] / w["output_mean"]
    for row in r["seat_sweep"]:
        k = row["seats"]
        row["waves"] = round(r["requests"] / k, 2)
        row["expected_longest_capped"] = round(expected_longest(k, cap), 2)
        row["predicted_step_ratio"] = round(static_over_continuous_steps(r["requests"], k, cap), 2)
    return r


def report(r) -> str:
    wp = r["workload"].get("parameters")
    wave_cap = (f"{wp['output_cap'] / wp['output_mean']:.2f}" if wp else
                "n/a: lengths from a trace, not modelled;")
    m, p, t, d = r["machine"], r["policies"], r["transformers"], r["decomposition"]
    k, b, x, em, vb = r["kv_memory"], r["batch_one"], r["prefix_lab"], r.get("equal_memory"), r["versus_base"]
    pub = r["published_static_vs_continuous"]
    yes = lambda ok: "met" if ok else "NOT met"  # noqa: E731

    t_reused = "reused_from" in r.get("parts", {}).get("transformers", {})

    def row(name, s):
        return (f"| {name} | {s['tokens_per_s']:,} | {s['tokens_per_cpu_s']:,} | {s['steps']:,} | "
                f"{s['rows_per_useful_token']} | {s['latency_p50_s']} | {s['latency_p95_s']} |")

    head = ("| system | output tok/s (wall) | tok per CPU-s | steps | rows computed per useful token | "
            "p50 latency (s) | p95 latency (s) |")
    lines = [
        "# Engine benchmarks", "",
        f"Machine: {m['cpu']}, {m['platform']}, {m['threads']} thread; Python {m['python']}, "
        f"torch {m['torch']}, numpy {m['numpy']}, transformers {m['transformers']}; {m['date']}; "
        f"1-minute load average {m.get('load_average_1min')} at the start and "
        f"{m.get('load_average_1min_end')} at the end, on {m.get('logical_cpus')} logical CPUs shared with "
        f"other work. Whole run: {r['run_seconds']:,} s, its independent parts in {r['jobs']} process(es) "
        f"at once (each builds the same model and workload; ratios compare CPU-seconds): "
        + "; ".join(f"{n} {v['seconds']} s" + (f" from {v['started'][11:16]} UTC" if "started" in v else "")
                    + (f" at load {v['load_average_1min_start']}-{v['load_average_1min_end']}"
                       if "load_average_1min_start" in v else "")
                    + (f" (taken from an earlier run: {v['reused_from']})" if "reused_from" in v else "")
                    + (f" ({v['remeasured']})" if "remeasured" in v else "")
                    for n, v in r["parts"].items()) + ".",
        "Command: `.venv/bin/python benchmarks/bench_engine.py" + (" --quick" if r["quick"] else "")
        + (f" --jobs {r['jobs']}" if r.get("jobs", 1) > 1 else "")
        + (" --reuse ENGINE_JSON" if any("reused_from" in v for v in r.get("parts", {}).values()) else "")
        + "`", "",
        f"Code measured: {r.get('code', 'not recorded')}.", "",
        f"Model: random-weight Llama, d={r['model']['hidden_size']}, {r['model']['num_hidden_layers']} layers, "
        f"{r['model']['num_attention_heads']} query / {r['model']['num_key_value_heads']} KV heads, "
        f"vocab {r['model']['vocab_size']}, fp32.",
        f"Workload: {r['requests']} requests, all queued at t=0; prompts {r['workload']['prompt']}; "
        f"outputs {r['workload']['output']} ({r['workload']['prompt_tokens']:,} prompt and "
        f"{r['workload']['output_tokens']:,} output tokens). "
        + ("A smoke run: tiny model and workload, numbers mean nothing." if r["quick"] else
           "Smaller than earlier runs (256 requests, prompts up to 1,024 tokens, outputs up to 512) so "
           "that the whole run takes minutes of CPU time on a shared machine: half the requests, and "
           "the longest prompts and outputs clipped at half the length."), "",
        f"## Three policies, {r['seats']} seats, memory to spare", "",
        "Every row runs the same requests through the same model runner, sampler and step preparation "
        "(`prepare_step`). What differs:", "",
        "* **static, padded**: waves of up to the seat count; the next wave starts when the last member "
        "is done. Every prompt is padded to the wave's longest and every finished member stays in the "
        "batch as a padding row until the wave ends: the rows one batched tensor computes, as "
        "`transformers` does.",
        "* **static, ragged**: the same waves and the same steps, but only useful rows are computed (no "
        "prompt padding; a finished member leaves the compute). Against continuous batching only the "
        "waiting differs, plus one detail: a static wave prefills all its prompts in one step, while "
        "the engine splits prefills into chunks under its token budget (2,048).",
        "* **continuous**: a finished request's seat is refilled in the next step.",
        "* **transformers `generate`**: the padded waves again (left padding, one tensor), in "
        "Hugging Face's implementation.", "",
        "Tokens per CPU-second of this single-threaded process move less with other processes' load "
        "than wall-clock tokens per second; both are shown, and ratios use CPU-seconds.", "",
        head, "|---|---:|---:|---:|---:|---:|---:|",
        row("continuous batching (servelab engine)", p["continuous"]),
        row("static waves, ragged (same runner)", p["static_ragged"]),
        row("static waves, padded (same runner)", p["static_padded"]),
        row("transformers `generate`, padded waves" + (" (earlier run)" if t_reused else ""), t), "",
        f"Continuous / transformers = **{d['total']}x** per CPU-second ("
        + ("no wall-clock ratio: the transformers part comes from an earlier run, under another load"
           if t_reused else f"{d['total_wall']}x wall-clock") + ") = "
        f"policy **{d['policy']}x** (continuous vs padded waves, same engine) x implementation "
        f"**{d['implementation']}x** (the engine vs `transformers`, same padded waves). The policy part "
        f"splits again into waiting ({d['waiting']}x, ragged waves to continuous) x padding "
        f"({d['padding']}x, padded to ragged, same waves).", "",
        f"Steps: the static waves take **{d['step_ratio_static_over_continuous']}x** the steps of continuous "
        "batching, the ratio a memory-bound GPU would see (there a step costs about the same with few "
        f"rows as with many), beside **{d['policy']}x** in CPU time ({p['continuous']['tokens_per_s'] / p['static_padded']['tokens_per_s']:.2f}x wall-clock) "
        "on this CPU, where a step costs about in proportion to its rows.", "",
        f"Published for comparison ({pub['source']}, {pub['url']}): about {pub['static_tokens_per_s']:,.0f} "
        f"output tok/s with static batching against about {pub['continuous_tokens_per_s']:,.0f} with "
        f"continuous batching ({pub['continuous_tokens_per_s'] / pub['static_tokens_per_s']:.0f}x): "
        f"{pub['setting']}.", "",
        "### Wave size", "",
        "A static wave runs until its longest member is done. The step ratio is predicted by "
        "`servelab.engine.workload.static_over_continuous_steps` (the model chapter 17 uses): output "
        "lengths exponential and capped as this workload draws them (cap "
        f"{wave_cap} "
        "means), so a wave lasts L, the expected longest of its members, at most the cap however many "
        "seats; with w waves static takes about w L mean lengths and continuous about w - 1 + L (every "
        "seat busy until the queue empties, then its last requests drain), a ratio of w L / (w - 1 + L), "
        "near 1 with one wave. Prefill is left out of the model. On this CPU a step costs about in "
        "proportion to its rows, so waiting itself costs little CPU time: continuous / ragged in CPU "
        "time mostly measures how well each step's fixed cost is shared. Same workload, memory to "
        "spare, only the seat count changes (output tokens per CPU-second):", "",
        "| seats | waves | L (capped longest / mean) | steps static / continuous: predicted | measured | "
        "continuous | static ragged | static padded | continuous / ragged | continuous / padded |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        *[f"| {s['seats']} | {s.get('waves', '-')} | {s.get('expected_longest_capped', '-')} | "
          f"{s.get('predicted_step_ratio', '-')}x | "
          f"{s['step_ratio']}x | {s['continuous']['tokens_per_cpu_s']:,} | "
          f"{s['static_ragged']['tokens_per_cpu_s']:,} | {s['static_padded']['tokens_per_cpu_s']:,} | "
          f"{s['continuous_vs_static_ragged_cpu']}x | {s['continuous_vs_static_padded_cpu']}x |"
          for s in r["seat_sweep"]], "",
        "## Speed targets (issue 10, item 5)", "",
        "| target | measured | met? |", "|---|---:|---|",
        f"| batch of one >= {b['target']}x `transformers` `generate` ({b['prompt_tokens']}-token prompt, "
        f"{b['new_tokens']} new tokens, {b['timing']}) | {b['speedup']}x ({b['engine_tokens_per_s']} vs "
        f"{b['transformers_tokens_per_s']} tok/s) | {yes(b['met'])} |",
    ]
    bc = b.get("compiled")
    if bc:
        lines.append(f"| the same, both compiled ({bc['how']}) | {bc['speedup']}x ({bc['engine_tokens_per_s']} "
                     f"vs {bc['transformers_tokens_per_s']} tok/s) | {yes(bc['met'])} |")
    sp = r.get("step_profile")
    if sp:
        one = sp["runs"][0]
        n_pairs = len(sp.get("pairs", [])) or 1
        paired = "eager_step_ms_median" in sp
        eager_ms = sp["eager_step_ms_median"] if paired else one["step_ms"]
        lines.append(f"| a batch-1 step <= {sp['target']}x the time to read its weights once at the "
                     f"mat-vec bandwidth (medians of {n_pairs} pairs) | {sp['batch1_over_weights_read']}x "
                     f"({eager_ms:.2f} ms against {sp['weights_read_ms']:.2f} ms at "
                     f"{sp['matvec_GB_per_s']} GB/s) | {yes(sp['met'])} |")
        if "compiled_run" in sp:
            compiled_ms = sp["compiled_step_ms_median"] if paired else sp["compiled_run"]["step_ms"]
            lines.append(f"| the same, compiled (`enforce_eager=False`) | {sp['compiled_batch1_over_weights_read']}x "
                         f"({compiled_ms:.2f} ms) | {yes(sp['met_compiled'])} |")
        if "matmuls_alone_over_weights_read" in sp:
            lines.append(f"| (for scale: the step's matrix products alone, back to back, same layout) | "
                         f"{sp['matmuls_alone_over_weights_read']}x | - |")
    if vb.get("ran"):
        lines.append(f"| {vb['seats']}-seat continuous >= {vb['target']}x the engine at {vb['commit']} "
                     f"({vb['rounds']} interleaved rounds) | {vb['speedup_cpu']}x per CPU-second "
                     f"({vb['speedup']}x wall; rounds {[round(x, 2) for x in vb['round_ratios_cpu']]}) | "
                     f"{yes(vb['met'])} |")
        if "compiled_speedup_cpu" in vb:
            lines.append(f"| the same, this engine compiled (`enforce_eager=False`) | "
                         f"{vb['compiled_speedup_cpu']}x per CPU-second ({vb['compiled_speedup']}x wall; rounds "
                         f"{[round(x, 2) for x in vb['compiled_round_ratios_cpu']]}) | "
                         f"{yes(vb['met_compiled'])} |")
    else:
        lines.append(f"| continuous >= {TARGET_CONTINUOUS_VS_BASE}x the engine at {vb['commit']} | "
                     f"not run ({vb['why']}) | - |")
    if em:
        lines += ["", f"## Equal KV memory ({em['slots']:,} slots, up to {em['seats']} seats)", "",
                  "Static batching must reserve each wave's padded rectangle (longest prompt + largest "
                  "max_tokens, for every member), so the same memory holds fewer members; the paged engine "
                  "admits by what is actually written.", "", head, "|---|---:|---:|---:|---:|---:|---:|",
                  row("continuous batching", em["continuous"]), row("static waves, padded", em["static_padded"]),
                  "", f"Continuous / static at equal memory: **{em['continuous_vs_static_padded_cpu']}x** per "
                  f"CPU-second, **{em['step_ratio']}x** in steps; preemptions: {em['continuous']['preemptions']}."]
    if vb.get("ran"):
        lines += ["", f"How: {vb['how']}. Rounds (tok per CPU-s), this engine "
                  f"{[s['tokens_per_cpu_s'] for s in vb['now']]}"
                  + (f", compiled {[s['tokens_per_cpu_s'] for s in vb['compiled']]} (compiling took "
                     f"{vb['compile_seconds']} s, not counted)" if "compiled" in vb else "")
                  + f", at {vb['commit']} {[s['tokens_per_cpu_s'] for s in vb['base']]}."]
    if bc:
        lines += ["", f"Batch of one, compiled: the first (compiling) run took {bc['first_run_seconds']['engine']} s "
                  f"for the engine and {bc['first_run_seconds']['transformers']} s for `transformers`, not counted."]
    if sp:
        phases = list(sp["runs"][0]["phases_ms"])
        lines += ["", f"### Where a decode step's time goes ({sp['how']})", "",
                  "| phase | " + " | ".join(f"batch {x['seats']} (ms)" for x in sp["runs"]) + " |",
                  "|---|" + "---:|" * len(sp["runs"]),
                  *[f"| {ph} | " + " | ".join(f"{x['phases_ms'][ph]:.3f}" for x in sp["runs"]) + " |"
                    for ph in phases],
                  "| whole step | " + " | ".join(f"{x['step_ms']:.3f}" for x in sp["runs"]) + " |"]
    lines += [
        "", "## KV memory waste (same workload, continuous, time-averaged over steps)", "",
        "| scheme | waste (reserved but empty slots) |", "|---|---:|",
        f"| paged, blocks of 16 | {k['paged_waste']:.1%} |",
        f"| reserve prompt + max_tokens per request | {k['reserve_prompt_plus_max_tokens_waste']:.1%} |",
        f"| reserve the whole context (max_model_len) per request | {k['reserve_max_model_len_waste']:.1%} |", "",
        "## Prefix lab", "",
        f"A {x['preamble_tokens']:,}-token preamble plus a {x['question_tokens']}-token question, one token out "
        f"({x['timing']}). Cached: first token in {x['cached_ttft_ms']} ms; prompt tokens served from the "
        f"prefix cache, each repeat: {x['cached_tokens_hit_each']}. Edited (first preamble token changed, so "
        f"every block's chained hash changes): first token in {x['edited_ttft_ms']} ms; tokens hit, each "
        f"repeat: {x['edited_tokens_hit_each']}. Cached is **{x['speedup']}x** faster.", "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
