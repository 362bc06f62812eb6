"""Quantization benchmark: decode-step speed per weight format, and quality on the course model.

Run:  .venv/bin/python benchmarks/bench_quant.py                       # ~3-5 min
      .venv/bin/python benchmarks/bench_quant.py --quick --out /tmp/x  # smoke run, seconds

Writes quant.md and quant.json into benchmarks/results/ (or ``--out``).

Speed: the ~213M-parameter benchmark decoder (``servelab.roofline``'s "large"
sweep model, random weights) at batch 1, one thread, with 32 tokens cached.
Variants: fp32 and bf16 (fused projections, as in the roofline benchmark), and
the bf16 model with its projections quantized by ``servelab.quant`` to int8
(per channel), int4 g128 and int4 g32: weight-only, activations in bf16, the
output head left in bf16. Steps are timed in interleaved rounds (every variant
once per round, the median of a few steps each) and each ratio is the median
over rounds of the per-round ratio: single-thread bandwidth on shared VMs
drifts by tens of percent between minutes, a ratio within a round does not.
Goals (issue 13): int8 step >= 2.5x faster than fp32 and >= 1.5x faster than
bf16, reported whether met or not. Also: bytes each step reads and the share of
the machine's matrix-vector bandwidth that makes, and a batch sweep with the
largest batch whose step is still within 1.25x of batch 1 ("flat").

Extras, timed in the same rounds but kept out of the format table: int8 with
each projection its own kernel call (no Q/K/V, gate/up fusion), int8 with the
output head quantized too, and fp32/bf16 with their matrices stored column-major
where the model offers it (the fastest dense layout on some CPUs). Goals are
also checked against the fastest dense step measured.

Where the int8 step's time goes: the step profiled (``torch.profiler``), its
int8 kernel calls grouped by matrix shape, each next to the same kernel timed
alone at that shape with the weights cold (rotating copies larger than the
caches) and hot (one copy, in cache), and an fp32 mat-vec at the same shape;
the rest of the step split into the output head, attention, other ops and
Python. The kernel's cold time against its hot compute time and the memory
rate of a plain read says whether it overlaps reading and arithmetic.

Quality: ``servelab.quant.quality_table`` on the committed course model and the
corpus's validation split (perplexity, top-1 agreement and KL vs fp32).
"""
from __future__ import annotations

import copy
import inspect
import os
import statistics
import time

import torch

from servelab import quant as Q
from servelab import quant_layers as QL
from servelab import roofline as rl
from servelab.timing import time_call
from servelab.machine import describe

from _common import parser, results_folder, write_results
VARIANTS = ("fp32", "bf16", "int8", "int4-g128", "int4-g32")
FLAT = 1.25   # a step within this factor of batch 1 counts as flat
SPLIT_K = 256  # the row-block size tried in the kernel-alone measurements (rows cut into blocks of this many)
GOALS = (("int8", "fp32", 2.5), ("int8", "bf16", 1.5))
QUICK_SHAPE = dict(vocab_size=2048, hidden_size=512, intermediate_size=1536, num_hidden_layers=4,
                   num_attention_heads=8, num_key_value_heads=4)


def build_variants(shape) -> tuple[dict, dict, dict]:
    """The five formats, and the extras (see the module docstring)."""
    base = rl.build_sweep_model(shape, "fp32")
    bf16 = rl.build_sweep_model(shape, "bf16")
    models = {"fp32": base, "bf16": bf16}
    quant_seconds = {}
    for scheme in VARIANTS[2:]:
        t0 = time.perf_counter()
        models[scheme] = Q.quantize_model(copy.deepcopy(bf16), scheme)
        quant_seconds[scheme] = time.perf_counter() - t0
    extras = {"int8, unfused": Q.quantize_model(copy.deepcopy(bf16), "int8", fuse=False),
              "int8, head too": Q.quantize_model(copy.deepcopy(bf16), "int8", lm_head=True)}
    if "column_major" in inspect.signature(base.fuse_projections).parameters:
        extras["fp32, column-major"] = copy.deepcopy(base).fuse_projections(column_major=True)
        extras["bf16, column-major"] = copy.deepcopy(bf16).fuse_projections(column_major=True)
    return models, extras, quant_seconds


def bytes_read(model, batch: int, context: int) -> int:
    """Bytes one decode step reads: projections as held, the other weights except the
    embedding table (one row is looked up; a tied table is read whole as the head), the KV."""
    b = Q.linear_weight_bytes(model)
    emb = model.embed_tokens.weight
    emb_bytes = emb.numel() * emb.element_size()
    other = b["other"] - (0 if model.config.tie_word_embeddings else emb_bytes)
    cfg = model.config
    kv = 2 * cfg.num_hidden_layers * batch * cfg.num_key_value_heads * (context + 1) * cfg.head_dim * emb.element_size()
    return b["projections"] + other + kv


class Step:
    """One decode step at ``batch`` with ``context`` tokens cached, repeatable (the cache is cropped back)."""

    def __init__(self, model, batch: int, context: int):
        g = torch.Generator().manual_seed(0)
        self.model, self.context = model, context
        self.cache = model.new_cache(batch_size=batch, max_len=context + 1)
        self.cache.k.normal_(generator=g)
        self.cache.v.normal_(generator=g)
        self.cache.advance(context)
        self.ids = torch.randint(0, model.config.vocab_size, (batch, 1), generator=g)

    def __call__(self):
        with torch.inference_mode():
            self.model(self.ids, cache=self.cache)
        self.cache.crop(self.context)

    def seconds(self, repeats: int) -> float:
        return time_call(self, repeats, warmup=1)


def interleaved(models: dict, rounds: int, repeats: int, context: int) -> dict:
    steps = {name: Step(m, 1, context) for name, m in models.items()}
    times = {name: [] for name in models}
    for _ in range(rounds):
        for name, step in steps.items():
            times[name].append(step.seconds(repeats))
    ratios = {}
    for name in models:
        for ref in ("fp32", "bf16"):
            per_round = [a / b for a, b in zip(times[ref], times[name])]
            ratios[f"{ref}/{name}"] = statistics.median(per_round)
    if "int8, unfused" in models:
        ratios["int8, unfused/int8"] = statistics.median(
            a / b for a, b in zip(times["int8, unfused"], times["int8"]))
    return {"times_s": times, "median_s": {k: statistics.median(v) for k, v in times.items()}, "speedup": ratios}


def sweep(models: dict, batches, repeats: int, context: int, rounds: int = 2) -> dict:
    """Step time per batch and format, interleaved (every format at one batch, then the next),
    the fastest of ``rounds`` passes: the formats share whatever the machine was doing."""
    steps = {(name, b): Step(m, b, context) for b in batches for name, m in models.items()}
    best = {key: float("inf") for key in steps}
    for _ in range(rounds):
        for key, step in steps.items():
            best[key] = min(best[key], step.seconds(repeats))
    out = {}
    for name in models:
        rows = [{"batch": b, "seconds": best[(name, b)]} for b in batches]
        base = rows[0]["seconds"]
        for r in rows:
            r["vs_batch1"] = r["seconds"] / base
        last_flat = rows[0]["batch"]   # the last batch before the first one that is not flat
        for r in rows:
            if r["vs_batch1"] > FLAT:
                break
            last_flat = r["batch"]
        out[name] = {"rows": rows, "last_flat_batch": last_flat}
    return out


def _profile_step(step, repeats: int) -> dict:
    """Self time per step of each op in ``step`` (torch.profiler), int8 kernel calls by matrix shape."""
    from torch.profiler import ProfilerActivity, profile

    step()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(repeats):
            step()
    shapes, ops = {}, {}
    for e in prof.key_averages(group_by_input_shape=True):
        ms = e.self_cpu_time_total / repeats / 1e3
        ops[e.key] = ops.get(e.key, 0.0) + ms
        if e.key == "aten::_weight_int8pack_mm":
            n, k = e.input_shapes[1]
            row = shapes.setdefault((n, k), {"calls": 0.0, "ms": 0.0})
            row["calls"] += e.count / repeats
            row["ms"] += ms
    return {"ops_ms": ops, "int8_shapes": shapes}


def _isolated(n: int, k: int, cold_bytes: float, rounds: int, calls: int = 20) -> dict:
    """The int8 kernel alone at ``[n, k]`` (bf16 activation row): weights cold (a rotation of
    copies larger than the caches) and hot (one copy, over and over), and an fp32 mat-vec, cold."""
    g = torch.Generator().manual_seed(0)
    mm = torch.ops.aten._weight_int8pack_mm
    n8 = max(2, -(-int(cold_bytes) // (n * k)))
    n32 = max(2, -(-int(cold_bytes) // (n * k * 4)))
    w8 = [torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=g) for _ in range(n8)]
    w32 = [torch.randn(n, k, generator=g) for _ in range(n32)]
    scales = (torch.rand(n, generator=g) + 0.5).to(torch.bfloat16)
    x = torch.randn(1, k, generator=g)
    xb = x.to(torch.bfloat16)

    def per_call(fn, count):
        t0 = time.perf_counter()
        for i in range(count):
            fn(i)
        return (time.perf_counter() - t0) / count

    jobs = {"int8_cold": (lambda i: mm(xb, w8[i % n8], scales), n8 * max(1, calls // n8)),
            "int8_hot": (lambda i: mm(xb, w8[0], scales), calls),
            "fp32_cold": (lambda i: torch.nn.functional.linear(x, w32[i % n32]), n32 * max(1, calls // n32))}
    parts = k // SPLIT_K if k % SPLIT_K == 0 and k > SPLIT_K else 0
    if parts:
        # the same product with every row cut into blocks of SPLIT_K weights, stored block after block:
        # one kernel call per block and the partial results added (in bf16)
        blocks = [w.view(n, parts, SPLIT_K).transpose(0, 1).contiguous() for w in w8]
        xs = xb.view(parts, SPLIT_K)

        def split(i):
            b = blocks[i % n8]
            y = mm(xs[0:1], b[0], scales)
            for j in range(1, parts):
                y = y + mm(xs[j:j + 1], b[j], scales)
            return y

        jobs["int8_split_cold"] = (split, n8 * max(1, calls // n8))
    times = {name: [] for name in jobs}
    for fn, count in jobs.values():
        per_call(fn, count)   # warm-up: pages touched, code loaded
    with torch.inference_mode():
        for _ in range(rounds):
            for name, (fn, count) in jobs.items():
                times[name].append(per_call(fn, count))
    out = {name: statistics.median(t) for name, t in times.items()}
    cold, hot = out["int8_cold"], out["int8_hot"]
    extra = {"split_k": SPLIT_K, "int8_split_cold_GB_per_s": n * k / out["int8_split_cold"] / 1e9} if parts else {}
    return {**extra, "int8_cold_ms": cold * 1e3, "int8_hot_ms": hot * 1e3, "fp32_cold_ms": out["fp32_cold"] * 1e3,
            "int8_cold_GB_per_s": n * k / cold / 1e9, "int8_hot_Gweights_per_s": n * k / hot / 1e9,
            "fp32_cold_GB_per_s": 4 * n * k / out["fp32_cold"] / 1e9,
            # if reading and arithmetic did not overlap, cold = hot + read: the read rate that implies
            "implied_read_GB_per_s": n * k / (cold - hot) / 1e9 if cold > hot else None}


def _without_kernels(step, rounds: int, repeats: int) -> tuple[float, float]:
    """Median step time as it is and with every int8 kernel call replaced by a stub that returns
    zeros of the right shape (all other work unchanged), interleaved round by round."""
    real = QL._low_bit_matmul  # the layers look the kernel up in their own module

    def stub(kernel, x2, codes, scales, group):
        return torch.zeros(x2.shape[0], codes.shape[0], dtype=x2.dtype)

    with_k, without_k = [], []
    try:
        for _ in range(rounds):
            QL._low_bit_matmul = real
            with_k.append(step.seconds(repeats))
            QL._low_bit_matmul = stub
            without_k.append(step.seconds(repeats))
    finally:
        QL._low_bit_matmul = real
    return statistics.median(with_k), statistics.median(without_k)


def where_int8_time_goes(int8_model, fp32_model, context: int, quick: bool) -> dict:
    """The int8 and fp32 steps profiled, and each int8 kernel shape timed alone (see the module docstring)."""
    repeats, rounds = (3, 2) if quick else (5, 3)
    step8, step32 = Step(int8_model, 1, context), Step(fp32_model, 1, context)
    runs8, runs32 = [], []
    for _ in range(rounds):   # interleaved; the round with the least op time was the least disturbed
        runs8.append(_profile_step(step8, repeats))
        runs32.append(_profile_step(step32, repeats))
    prof8 = min(runs8, key=lambda p: sum(p["ops_ms"].values()))
    prof32 = min(runs32, key=lambda p: sum(p["ops_ms"].values()))
    shapes = []
    for (n, k), row in sorted(prof8["int8_shapes"].items()):
        iso = _isolated(n, k, 8e6 if quick else 96e6, rounds=3 if quick else 9)
        per_call = row["ms"] / row["calls"]
        shapes.append({"n": n, "k": k, "calls_per_step": row["calls"], "step_ms": row["ms"],
                       "in_step_ms_per_call": per_call, "in_step_GB_per_s": n * k / per_call / 1e6, **iso})
    ops8 = prof8["ops_ms"]
    kernel = sum(r["step_ms"] for r in shapes)
    head = ops8.get("aten::mm", 0.0)
    attention = sum(v for key, v in ops8.items() if "scaled_dot_product" in key)
    total8 = sum(ops8.values())
    ops32 = prof32["ops_ms"]
    dense32 = ops32.get("aten::mm", 0.0) + ops32.get("aten::addmm", 0.0)
    total32 = sum(ops32.values())
    step_s, stub_s = _without_kernels(step8, rounds=3 if quick else 9, repeats=3)
    # does the kernel's speed depend on the shape? rows of K weights, about the same bytes each time,
    # and one output count that is not a multiple of the kernel's block of 4 rows
    weights = 2 ** 20 if quick else 2 ** 22
    sweep_shapes = [(weights // k, k) for k in ((256, 512, 1024) if quick else (512, 1024, 2048, 4096, 8192))]
    sweep_shapes.append((weights // 1024 - 2, 1024))
    by_shape = [{"n": n, "k": k, **_isolated(n, k, 8e6 if quick else 96e6, rounds=3 if quick else 7)}
                for n, k in sweep_shapes]
    return {"repeats": repeats, "rounds": rounds, "shapes": shapes, "step_with_kernels_ms": step_s * 1e3,
            "step_without_kernels_ms": stub_s * 1e3, "by_shape": by_shape, "int8_kernel_ms": kernel, "head_ms": head,
            "attention_ms": attention, "other_ops_ms": total8 - kernel - head - attention,
            "profiled_ms": total8, "fp32_matmul_ms": dense32, "fp32_other_ops_ms": total32 - dense32,
            "fp32_profiled_ms": total32}


def load() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def run(quick: bool) -> dict:
    torch.set_num_threads(1)
    t_start = time.perf_counter()
    shape = QUICK_SHAPE if quick else rl.SWEEP_MODELS["large"]
    context = 32
    load_before = load()
    models, extras, quant_seconds = build_variants(shape)
    params = sum(p.numel() for p in models["fp32"].parameters())
    bw_rows = rl.measure_bandwidth(64 if quick else 512, repeats=3)
    matvec = next(r for r in bw_rows if r["name"] == "matrix-vector")["GB_per_s"]
    inter = interleaved({**models, **extras}, rounds=3 if quick else 9, repeats=3, context=context)

    def describe_step(name, model, kernel, bits):
        nbytes = bytes_read(model, 1, context)
        sec = inter["median_s"][name]
        return {"bits_per_weight": bits, "kernel": kernel, "step_ms": sec * 1e3, "bytes_read": nbytes,
                "GB_per_s": nbytes / sec / 1e9, "matvec_share": nbytes / sec / 1e9 / matvec,
                "projection_bytes": Q.linear_weight_bytes(model)["projections"],
                "quantize_seconds": quant_seconds.get(name)}

    formats = {}
    for name, model in models.items():
        bits = {"fp32": 32.0, "bf16": 16.0}.get(name) or Q.bits_per_weight(name, in_features=shape["hidden_size"])
        formats[name] = describe_step(name, model, "dense" if name in ("fp32", "bf16") else
                                      Q.get_format(name).kernel, bits)
    extra_rows = {name: describe_step(name, model, "int8pack" if name.startswith("int8") else "dense",
                                      Q.bits_per_weight("int8", in_features=shape["hidden_size"])
                                      if name.startswith("int8") else (32.0 if name.startswith("fp32") else 16.0))
                  for name, model in extras.items()}
    batches = (1, 2, 4, 8, 16) if quick else (1, 2, 4, 8, 16, 32)
    sw = sweep(models, batches, repeats=2 if quick else 3, context=context)
    goals = []
    for fast, slow, target in GOALS:
        ratio = inter["speedup"][f"{slow}/{fast}"]
        # the fastest dense step of that precision measured (the default layout or column-major)
        layouts = [n for n in (slow, f"{slow}, column-major") if n in inter["median_s"]]
        best = min(layouts, key=lambda n: inter["median_s"][n])
        best_ratio = statistics.median(a / b for a, b in zip(inter["times_s"][best], inter["times_s"][fast]))
        goals.append({"goal": f"{fast} step >= {target}x faster than {slow}", "ratio": ratio, "target": target,
                      "met": ratio >= target, "fastest_dense": best, "ratio_vs_fastest_dense": best_ratio,
                      "met_vs_fastest_dense": best_ratio >= target})
    where = where_int8_time_goes(models["int8"], models["fp32"], context, quick)
    t_quality = time.perf_counter()
    quality = Q.quality_table(max_tokens=2_048 if quick else 16_384, seq_len=256)
    quality_seconds = time.perf_counter() - t_quality
    return {"quick": quick, "machine": describe(threads=1), "load_before": load_before, "load_after": load(),
            "model": {"shape": shape, "params": params, "context_tokens": context},
            "matvec_GB_per_s": matvec, "formats": formats, "extras": extra_rows, "interleaved": inter,
            "goals": goals, "int8_time": where,
            "sweep": sw, "flat_factor": FLAT, "kernel_max_rows": Q.KERNEL_MAX_ROWS,
            "quality": quality, "quality_seconds": quality_seconds,
            "run_seconds": time.perf_counter() - t_start}


def markdown(r: dict) -> str:
    m = r["machine"]
    lines = [f"# Quantization benchmark{' (quick)' if r['quick'] else ''}", "",
             "Command: `.venv/bin/python benchmarks/bench_quant.py`", "",
             f"Machine: {m['cpu']}, {m['logical_cpus']} logical CPUs, one thread; torch {m['torch']}; "
             f"{m['date']}. Load average (1 min) before {r['load_before']}, after {r['load_after']}: other work "
             "shared the cores, so read the ratios (interleaved) rather than the absolute times.", "",
             f"Decoder: {r['model']['params'] / 1e6:.0f}M parameters, batch 1, {r['model']['context_tokens']} "
             f"tokens cached. Matrix-vector bandwidth this run: {r['matvec_GB_per_s']:.1f} GB/s.", "",
             "| format | bits/weight | path | step (ms) | bytes read (MB) | GB/s | share of mat-vec | x fp32 | x bf16 |",
             "|---|---|---|---|---|---|---|---|---|"]
    sp = r["interleaved"]["speedup"]
    for name, f in r["formats"].items():
        lines.append(f"| {name} | {f['bits_per_weight']:.3f} | {f['kernel']} | {f['step_ms']:.1f} | "
                     f"{f['bytes_read'] / 1e6:.0f} | {f['GB_per_s']:.1f} | {f['matvec_share']:.2f} | "
                     f"{sp[f'fp32/{name}']:.2f} | {sp[f'bf16/{name}']:.2f} |")
    ex = r.get("extras", {})
    if ex:
        lines += ["", "Extras, timed in the same rounds:", "",
                  "| variant | step (ms) | bytes read (MB) | GB/s | x fp32 | x bf16 |", "|---|---|---|---|---|---|"]
        for name, f in ex.items():
            lines.append(f"| {name} | {f['step_ms']:.1f} | {f['bytes_read'] / 1e6:.0f} | {f['GB_per_s']:.1f} | "
                         f"{sp[f'fp32/{name}']:.2f} | {sp[f'bf16/{name}']:.2f} |")
        if "int8, unfused/int8" in sp:
            lines += ["", f"Fusing Q/K/V and gate/up into one int8 matrix each: the unfused int8 step takes "
                          f"{sp['int8, unfused/int8']:.2f}x the fused one."]
    lines += ["", "## Goals", ""]
    for g in r["goals"]:
        lines.append(f"- {g['goal']}: measured {g['ratio']:.2f}x, {'met' if g['met'] else 'NOT met'}")
        if g.get("fastest_dense", g["goal"].split()[-1]) != g["goal"].split()[-1]:
            lines.append(f"  (against the fastest dense layout measured, {g['fastest_dense']}: "
                         f"{g['ratio_vs_fastest_dense']:.2f}x, {'met' if g['met_vs_fastest_dense'] else 'NOT met'})")
    w = r.get("int8_time")
    if w:
        lines += where_markdown(r, w)
    lines += ["", f"## Batch sweep (step time / batch-1 step; flat = within {r['flat_factor']}x)", "",
              "| format | " + " | ".join(f"b={row['batch']}" for row in next(iter(r['sweep'].values()))['rows'])
              + " | last flat batch |",
              "|---|" + "---|" * (len(next(iter(r['sweep'].values()))['rows']) + 1)]
    for name, s in r["sweep"].items():
        lines.append(f"| {name} | " + " | ".join(f"{row['vs_batch1']:.2f}" for row in s["rows"])
                     + f" | {s['last_flat_batch']} |")
    lines += ["", f"Above {r['kernel_max_rows']} rows the quantized layers dequantize and call a dense matmul.",
              "", "## Quality (course model, validation split)", "",
              "| variant | bits/weight | perplexity | change | top-1 agreement | KL vs fp32 (nats) |",
              "|---|---|---|---|---|---|"]
    for q in r["quality"]:
        lines.append(f"| {q['variant']} | {q['bits_per_weight']} | {q['perplexity']:.3f} | "
                     f"{q['perplexity_change'] * 100:+.2f}% | {q['top1_agreement']:.4f} | {q['mean_kl']:.5f} |")
    lines += ["", f"Scored on {r['quality'][0]['tokens']:,} tokens. Run time {r['run_seconds']:.0f} s."]
    return "\n".join(lines) + "\n"


def where_markdown(r: dict, w: dict) -> list[str]:
    """The int8 step's time, split and explained (every sentence computed from the run)."""
    step8 = r["formats"]["int8"]["step_ms"]
    step32 = r["formats"]["fp32"]["step_ms"]
    sh = w["shapes"]
    lines = ["", "## Where the int8 step's time goes", "",
             f"Profiled (torch.profiler, {w['repeats']} steps, the least disturbed of {w.get('rounds', 1)} "
             f"rounds; op self times per step): int8 kernels "
             f"{w['int8_kernel_ms']:.1f} ms, output head (bf16 matmul) {w['head_ms']:.1f} ms, attention "
             f"{w['attention_ms']:.1f} ms, every other op {w['other_ops_ms']:.1f} ms; ops total "
             f"{w['profiled_ms']:.1f} ms, against a {step8:.1f} ms step timed without the profiler (at "
             f"another moment). The fp32 step: "
             f"matmuls {w['fp32_matmul_ms']:.1f} ms, other ops {w['fp32_other_ops_ms']:.1f} ms.", "",
             "Each int8 kernel shape in the step, and the same kernel alone (cold: weights rotated through "
             "copies larger than the caches; hot: one copy again and again), next to an fp32 mat-vec (cold):", "",
             "| N x K | calls/step | in step (ms/call) | in step GB/s | alone cold GB/s | alone hot Gweights/s "
             "| implied read GB/s | fp32 cold GB/s |", "|---|---|---|---|---|---|---|---|"]
    for x in sh:
        implied = f"{x['implied_read_GB_per_s']:.1f}" if x["implied_read_GB_per_s"] else "-"
        lines.append(f"| {x['n']} x {x['k']} | {x['calls_per_step']:.0f} | {x['in_step_ms_per_call']:.3f} | "
                     f"{x['in_step_GB_per_s']:.1f} | {x['int8_cold_GB_per_s']:.1f} | "
                     f"{x['int8_hot_Gweights_per_s']:.1f} | {implied} | {x['fp32_cold_GB_per_s']:.1f} |")
    cold = [x["int8_cold_GB_per_s"] for x in sh]
    hot = [x["int8_hot_Gweights_per_s"] for x in sh]
    f32 = [x["fp32_cold_GB_per_s"] for x in sh]
    # the split that needs no profiler: the same step with its int8 kernels stubbed out, interleaved;
    # kernel time = step - stubbed step, rest = stubbed step, scaled to the table's step time
    with_k, without_k = w["step_with_kernels_ms"], w["step_without_kernels_ms"]
    share = (with_k - without_k) / with_k
    kernel_ms = share * step8
    rest = step8 - kernel_ms
    # the int8 kernels at the fp32 mat-vec's byte rate, shape by shape
    at_fp32_rate = sum(x["calls_per_step"] * x["n"] * x["k"] / (x["fp32_cold_GB_per_s"] * 1e6) for x in sh)
    ratio = statistics.median(c / f for c, f in zip(cold, f32))
    lines += ["", f"- The kernel reads its weights cold at {min(cold):.1f}-{max(cold):.1f} GB/s, where an fp32 "
              f"mat-vec of the same shape reads {min(f32):.1f}-{max(f32):.1f} GB/s; hot (in cache) it turns "
              f"{min(hot):.1f}-{max(hot):.1f} G weights/s. The int8 matrices hold a quarter of the fp32 bytes, "
              f"but the kernel streams them at {ratio:.2f} of the fp32 rate (median over shapes), so its "
              f"weight reads are only {4 * ratio:.1f}x faster than fp32's.",
              f"- With every int8 kernel call replaced by a stub returning zeros, the step took "
              f"{without_k:.1f} ms against {with_k:.1f} ms with them (medians, interleaved): the kernels are "
              f"{share:.0%} of the step, {kernel_ms:.1f} ms of the table's {step8:.1f} ms. If nothing else took "
              f"any time, the step would be {kernel_ms:.1f} ms, {step32 / kernel_ms:.2f}x the fp32 step; "
              f"everything else (head, attention, small ops, Python) takes {rest:.1f} ms.",
              f"- With the kernels reading at the fp32 mat-vec's rate shape by shape and the rest as measured, "
              f"the step would be {at_fp32_rate + rest:.1f} ms: {step32 / (at_fp32_rate + rest):.2f}x fp32."]
    bs = w.get("by_shape")
    if bs:
        lines += ["", "The kernel alone (cold) at other shapes of about the same bytes: does its speed depend on the "
                  "row length K, or on N being a multiple of its block of 4 output rows?", "",
                  "| N x K | alone cold GB/s | alone hot Gweights/s | fp32 cold GB/s |", "|---|---|---|---|"]
        for x in bs:
            lines.append(f"| {x['n']} x {x['k']} | {x['int8_cold_GB_per_s']:.1f} | "
                         f"{x['int8_hot_Gweights_per_s']:.1f} | {x['fp32_cold_GB_per_s']:.1f} |")
        even = [x for x in bs if x["n"] % 4 == 0]
        odd = next((x for x in bs if x["n"] % 4), None)
        twin = next((x for x in even if odd and x["k"] == odd["k"]), None)
        slowest = min(even, key=lambda x: x["int8_cold_GB_per_s"])
        words = ("- Cold rate by row length: " + ", ".join(f"K = {x['k']} {x['int8_cold_GB_per_s']:.1f}"
                                                         for x in sorted(even, key=lambda x: x["k"]))
                 + f" GB/s (slowest at K = {slowest['k']})")
        if odd and twin:
            words += (f"; N = {odd['n']} (not a multiple of 4) read at {odd['int8_cold_GB_per_s']:.1f} GB/s against "
                      f"{twin['int8_cold_GB_per_s']:.1f} for N = {twin['n']}")
        words += (". The benchmark decoder's projections have K = "
                  + " or ".join(sorted({str(x["k"]) for x in sh}, key=int)) + ", set by its widths")
        split = [x for x in sh if "int8_split_cold_GB_per_s" in x]
        if split:
            gain = [x["int8_split_cold_GB_per_s"] / x["int8_cold_GB_per_s"] for x in split]
            # the step's kernels with split rows where that was faster, whole rows elsewhere
            best = sum(x["calls_per_step"] * x["n"] * x["k"]
                       / (max(x["int8_cold_GB_per_s"], x.get("int8_split_cold_GB_per_s", 0)) * 1e6) for x in sh)
            whole = sum(x["calls_per_step"] * x["n"] * x["k"] / (x["int8_cold_GB_per_s"] * 1e6) for x in sh)
            est = step8 - kernel_ms + kernel_ms * best / whole
            words += (f". Cutting the decoder's rows into blocks of {split[0]['split_k']} (one kernel call per block, "
                      f"partial results added) changed the cold rate by {min(gain):.2f}-{max(gain):.2f}x at "
                      + ", ".join(f"{x['n']} x {x['k']}" for x in split)
                      + f"; with the faster layout per shape the step would be about {est:.1f} ms, "
                      f"{step32 / est:.2f}x fp32 (servelab.quant keeps whole rows: a layout tuned to one CPU's "
                      "kernel is not a portable fix)")
        lines.append("")
        lines.append(words + ".")
    goal = next((g for g in r["goals"] if g["goal"].endswith("fp32")), None)
    if goal is not None and not goal["met"]:
        target = goal["target"]
        if step32 / kernel_ms < target:
            lines.append(f"- So the {target}x mark against fp32 is out of reach with this kernel here: the int8 "
                         f"kernels alone would cap the ratio at {step32 / kernel_ms:.2f}x even if the rest of the "
                         "step were free.")
        if step32 / (at_fp32_rate + rest) < target:
            budget = step32 / target - rest
            weights_mb = sum(x["calls_per_step"] * x["n"] * x["k"] for x in sh) / 1e6
            need = (f"{budget:.1f} ms for its {weights_mb:.0f} MB of int8 weights: "
                    f"{weights_mb / budget:.1f} GB/s needed" if budget > 0 else "no time for the weights at all")
            lines.append(f"- The rest of the int8 step ({rest:.1f} ms) leaves, of the {step32 / target:.1f} ms "
                         f"a {target}x step may take, {need}.")
    return lines


def main(argv=None) -> int:
    p = parser(__doc__.splitlines()[0], quick_help="small model, few rounds (a smoke run)")
    args = p.parse_args(argv)
    out = results_folder(p, args)
    r = run(args.quick)
    report = markdown(r)
    write_results(out, "quant", r, report)
    print(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
