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

Quality: ``servelab.quant.quality_table`` on the committed course model and the
corpus's validation split (perplexity, top-1 agreement and KL vs fp32).
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from servelab import quant as Q
from servelab import roofline as rl
from servelab.machine import describe

RESULTS = Path(__file__).resolve().parent / "results"
VARIANTS = ("fp32", "bf16", "int8", "int4-g128", "int4-g32")
FLAT = 1.25   # a step within this factor of batch 1 counts as flat
GOALS = (("int8", "fp32", 2.5), ("int8", "bf16", 1.5))
QUICK_SHAPE = dict(vocab_size=2048, hidden_size=512, intermediate_size=1536, num_hidden_layers=4,
                   num_attention_heads=8, num_key_value_heads=4)


def build_variants(shape) -> dict:
    base = rl.build_sweep_model(shape, "fp32")
    bf16 = rl.build_sweep_model(shape, "bf16")
    models = {"fp32": base, "bf16": bf16}
    quant_seconds = {}
    for scheme in VARIANTS[2:]:
        t0 = time.perf_counter()
        models[scheme] = Q.quantize_model(copy.deepcopy(bf16), scheme)
        quant_seconds[scheme] = time.perf_counter() - t0
    return models, quant_seconds


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
        return rl._median_seconds(self, repeats, warmup=1)


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
    models, quant_seconds = build_variants(shape)
    params = sum(p.numel() for p in models["fp32"].parameters())
    bw_rows = rl.measure_bandwidth(64 if quick else 512, repeats=3)
    matvec = next(r for r in bw_rows if r["name"] == "matrix-vector")["GB_per_s"]
    inter = interleaved(models, rounds=3 if quick else 9, repeats=3, context=context)
    formats = {}
    for name, model in models.items():
        nbytes = bytes_read(model, 1, context)
        sec = inter["median_s"][name]
        bits = {"fp32": 32.0, "bf16": 16.0}.get(name) or Q.bits_per_weight(name, in_features=shape["hidden_size"])
        formats[name] = {"bits_per_weight": bits, "kernel": "dense" if name in ("fp32", "bf16") else
                         Q.get_format(name).kernel, "step_ms": sec * 1e3, "bytes_read": nbytes,
                         "GB_per_s": nbytes / sec / 1e9, "matvec_share": nbytes / sec / 1e9 / matvec,
                         "projection_bytes": Q.linear_weight_bytes(model)["projections"],
                         "quantize_seconds": quant_seconds.get(name)}
    batches = (1, 2, 4, 8, 16) if quick else (1, 2, 4, 8, 16, 32)
    sw = sweep(models, batches, repeats=2 if quick else 3, context=context)
    goals = []
    for fast, slow, target in GOALS:
        ratio = inter["speedup"][f"{slow}/{fast}"]
        goals.append({"goal": f"{fast} step >= {target}x faster than {slow}", "ratio": ratio, "target": target,
                      "met": ratio >= target})
    t_quality = time.perf_counter()
    quality = Q.quality_table(max_tokens=2_048 if quick else 16_384, seq_len=256)
    quality_seconds = time.perf_counter() - t_quality
    return {"quick": quick, "machine": describe(threads=1), "load_before": load_before, "load_after": load(),
            "model": {"shape": shape, "params": params, "context_tokens": context},
            "matvec_GB_per_s": matvec, "formats": formats, "interleaved": inter, "goals": goals,
            "sweep": sw, "flat_factor": FLAT, "kernel_max_rows": Q.KERNEL_MAX_ROWS,
            "quality": quality, "quality_seconds": quality_seconds,
            "run_seconds": time.perf_counter() - t_start}


def markdown(r: dict) -> str:
    m = r["machine"]
    lines = [f"# Quantization benchmark{' (quick)' if r['quick'] else ''}", "",
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
    lines += ["", "## Goals", ""]
    for g in r["goals"]:
        lines.append(f"- {g['goal']}: measured {g['ratio']:.2f}x, {'met' if g['met'] else 'NOT met'}")
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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small model, few rounds (a smoke run)")
    parser.add_argument("--out", type=Path, default=None, help="folder for quant.md/json (default results/)")
    args = parser.parse_args(argv)
    if args.quick and args.out is None:
        print("--quick writes a smoke run; pass --out DIR so it does not overwrite the recorded results",
              file=sys.stderr)
        return 2
    out = args.out or RESULTS
    out.mkdir(parents=True, exist_ok=True)
    r = run(args.quick)
    (out / "quant.json").write_text(json.dumps(r, indent=1))
    (out / "quant.md").write_text(markdown(r))
    print(markdown(r))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
