"""The matrix product each engine runs on CPU, at the larger checkpoint's shapes.

    flock /work/coord/bench.lock .venv-vllm/bin/python benchmarks/vs_vllm_gemm.py OUT.json   # ~1 min

vLLM's CPU build does not call ``torch.nn.functional.linear`` for a float32
projection: at load time it hands each weight to oneDNN
(``vllm._custom_ops.create_onednn_mm``, which keeps oneDNN's matmul primitive for
that weight) and runs ``onednn_mm`` each step
(``vllm.model_executor.layers.utils.dispatch_cpu_unquantized_gemm``). servelab
calls ``F.linear`` (torch's own CPU GEMM) on float32 weights it stores
column-major (``LlamaModel.fuse_projections(column_major=True)``, asked for by
the engine's runner). This times oneDNN and ``F.linear`` on both layouts
(row-major ``[N, K]`` as ``nn.Linear`` stores it, and the engine's
``w.t().contiguous().t()``) on the same inputs,
one thread, for the four projections of one layer of each checkpoint (fused
QKV, output, fused gate-up, down) and its vocabulary head, at M = 1 row (one
request decoding) and M = 64 rows (64 seats). Both give the same product (checked).
Runs in ``.venv-vllm``: it needs vLLM's compiled ops; torch is the course's own version.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time

import torch

#: (hidden, intermediate, query heads, KV heads, head dim) of the two checkpoints; vocabulary 4,096
MODELS = {"servelab-main": (256, 768, 8, 4, 32), "servelab-large": (768, 2048, 12, 4, 64)}
VOCAB = 4096
ROWS = (1, 64)


def shapes(hidden, inter, heads, kv_heads, head_dim) -> dict:
    """(K, N) of one layer's four products and the vocabulary head."""
    return {"qkv": (hidden, (heads + 2 * kv_heads) * head_dim), "o": (heads * head_dim, hidden),
            "gate_up": (hidden, 2 * inter), "down": (inter, hidden), "lm_head": (hidden, VOCAB)}


def best_of(fn, reps: int, rounds: int = 7) -> float:
    """Median over ``rounds`` of the mean seconds per call over ``reps`` calls."""
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        times.append((time.perf_counter() - t0) / reps)
    return statistics.median(times)


def main(out: str) -> None:
    from vllm import _custom_ops as ops
    load_before = os.getloadavg()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    rows = []
    for model, dims in MODELS.items():
        rows += time_model(model, shapes(*dims), ops)
    layer = {}
    for model in MODELS:
        for m in ROWS:  # one decoder layer's four products, summed
            sel = [r for r in rows if r["model"] == model and r["m"] == m and r["name"] != "lm_head"]
            t, d = sum(r["torch_us"] for r in sel), sum(r["onednn_us"] for r in sel)
            e = sum(r["engine_us"] for r in sel)
            layer[f"{model} M={m}"] = {"model": model, "m": m, "torch_us": t, "engine_us": e, "onednn_us": d,
                                       "torch_over_onednn": t / d, "engine_over_onednn": e / d}
    result = {"torch": torch.__version__, "threads": torch.get_num_threads(), "load_average_before": load_before,
              "load_average": os.getloadavg(),
              "cpu_capability": torch.backends.cpu.get_cpu_capability(), "rows": rows, "layer": layer}
    with open(out, "w") as f:
        json.dump(result, f, indent=1)


def time_model(model: str, shape: dict, ops) -> list:
    rows = []
    for name, (k, n) in shape.items():
        w = torch.randn(n, k) * 0.02  # [N, K], as nn.Linear stores it
        w_col = w.t().contiguous().t()  # the engine's layout: same values, column-major
        handler = ops.create_onednn_mm(w.t(), 32)
        for m in ROWS:
            x = torch.randn(m, k)
            ref, got = torch.nn.functional.linear(x, w), ops.onednn_mm(handler, x, None)
            assert torch.allclose(ref, got, atol=1e-4, rtol=1e-4)
            assert torch.allclose(ref, torch.nn.functional.linear(x, w_col), atol=1e-4, rtol=1e-4)
            reps = max(3, int(2e8 / (2 * m * n * k)))  # about 0.2 GFLOP a timing
            for _ in range(3):  # warm-up
                torch.nn.functional.linear(x, w)
                torch.nn.functional.linear(x, w_col)
                ops.onednn_mm(handler, x, None)
            t_torch = best_of(lambda: torch.nn.functional.linear(x, w), reps)
            t_eng = best_of(lambda: torch.nn.functional.linear(x, w_col), reps)
            t_dnnl = best_of(lambda: ops.onednn_mm(handler, x, None), reps)
            rows.append({"model": model, "name": name, "m": m, "k": k, "n": n, "torch_us": t_torch * 1e6, "engine_us": t_eng * 1e6,
                         "onednn_us": t_dnnl * 1e6, "torch_over_onednn": t_torch / t_dnnl, "engine_over_onednn": t_eng / t_dnnl,
                         "torch_gflops": 2 * m * n * k / t_torch / 1e9, "onednn_gflops": 2 * m * n * k / t_dnnl / 1e9})
            print(f"{model} {name:8s} M={m:3d} {k}x{n}: F.linear {t_torch * 1e6:8.1f} us, column-major {t_eng * 1e6:8.1f} us, "
                  f"onednn_mm {t_dnnl * 1e6:8.1f} us ({t_torch / t_dnnl:.2f}x, {t_eng / t_dnnl:.2f}x)", flush=True)
    return rows


if __name__ == "__main__":
    main(sys.argv[1])
