"""Kernels measured: fusion, per-op overhead, compiled steps, FlashAttention's loop nest, overlap.

The torch half of :mod:`servelab.kernels` (the arithmetic is in
:mod:`servelab.kernels_arith`, which needs no torch); every name here is also
importable from :mod:`servelab.kernels`.

Every timing function runs on the CPU by default and on a GPU with ``device="cuda"``
(functions given a model use the model's device): tensors are made on the device,
the device is synchronised before the clock starts and after each timed call
(:func:`servelab.timing.time_call`), and an unknown device, or "cuda" without a
GPU, is a ValueError that says so.
"""
from __future__ import annotations

import statistics
import threading
import time
from collections import Counter
from typing import Any, Callable

import torch
import torch.nn.functional as F

from servelab.kernels_arith import SEQUENCES, bytes_moved
from servelab.timing import check_device, synchronizer, time_call

__all__ = [
    "rmsnorm_residual", "swiglu", "fusion_measurement", "op_overhead_seconds", "count_ops", "decode_step",
    "step_overhead", "compiled_step", "compile_step", "flash_attention", "overlap_measurement",
]

def _sync(device) -> None:
    """Wait for everything queued on ``device`` (a GPU runs its kernels after the call returns)."""
    synchronizer(device)()


def _check_device(device) -> torch.device:
    """``device`` ("cpu", "cuda", "cuda:N" or a ``torch.device``) checked by
    :func:`servelab.timing.check_device`: anything else is a ValueError."""
    return torch.device(check_device(device))


def _model_device(model) -> torch.device:
    param = next(model.parameters(), None)
    return _check_device(param.device if param is not None else "cpu")


# ---------------------------------------------------------------- fusion: the functions and their timing

def rmsnorm_residual(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6):
    """``h = x + residual; y = h / rms(h) * weight``, written as separate ops (eager: one kernel each).

    Returns ``(y, h)``: the normalised input of the next sub-layer and the new residual stream.
    """
    h = x + residual
    ms = (h * h).mean(-1, keepdim=True)
    return h * torch.rsqrt(ms + eps) * weight, h


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up``: the element-wise middle of a SwiGLU MLP."""
    return F.silu(gate) * up


def _fusion_inputs(kind: str, rows: int, width: int, device, dtype):
    g = torch.Generator(device=device).manual_seed(0)   # made on the device, not copied there
    mk = lambda *shape: torch.randn(*shape, generator=g, device=device).to(dtype)  # noqa: E731
    if kind == "rmsnorm_residual":
        return rmsnorm_residual, (mk(rows, width), mk(rows, width), mk(width))
    if kind == "swiglu":
        return swiglu, (mk(rows, width), mk(rows, width))
    raise ValueError(f"unknown sequence {kind!r}; choose from {sorted(SEQUENCES)}")


def fusion_measurement(kind: str = "swiglu", rows: int = 256, width: int = 8192, repeats: int = 10,
                       device="cpu", dtype=torch.float32, compile: bool = True) -> dict[str, Any]:
    """Eager (one kernel per op) against ``torch.compile`` (one generated loop) on one sequence.

    Tensors are ``rows x width`` (default 2M elements, 8 MB in fp32: beyond
    most caches per op). Returns times, bytes each version moves by
    :func:`bytes_moved`, effective GB/s, the compile time, and whether the
    two results agree.
    """
    dev = _check_device(device)
    fn, args = _fusion_inputs(kind, rows, width, dev, dtype)
    numel = rows * width
    elem = torch.empty((), dtype=dtype).element_size()
    with torch.inference_mode():
        eager_s = time_call(lambda: fn(*args), repeats, device=dev, statistic="min")
        out = {"kind": kind, "numel": numel, "dtype": str(dtype).replace("torch.", ""),
               "eager_s": eager_s, "unfused_bytes": bytes_moved(kind, numel, elem),
               "fused_bytes": bytes_moved(kind, numel, elem, fused=True)}
        out["eager_GB_per_s"] = out["unfused_bytes"] / eager_s / 1e9
        if compile:
            compiled = torch.compile(fn, dynamic=False)
            t0 = time.perf_counter()
            result = compiled(*args)
            _sync(dev)
            out["compile_s"] = time.perf_counter() - t0
            fused_s = time_call(lambda: compiled(*args), repeats, device=dev, statistic="min")
            ref = fn(*args)
            pairs = zip(result, ref) if isinstance(ref, tuple) else [(result, ref)]
            out["agree"] = all(torch.allclose(a, b, rtol=1e-4, atol=1e-5) for a, b in pairs)
            out["fused_s"] = fused_s
            out["fused_GB_per_s"] = out["fused_bytes"] / fused_s / 1e9
            out["speedup"] = eager_s / fused_s
    return out


# ---------------------------------------------------------------- per-op overhead

def op_overhead_seconds(repeats: int = 2000, device="cpu") -> float:
    """Time of one trivial op (adding 1 to a one-element tensor): the fixed cost per launched op.

    Median over batches of ``repeats / 20`` calls, so one stall does not set it.
    """
    dev = _check_device(device)
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 20:
        raise ValueError(f"repeats must be a whole number >= 20, got {repeats!r}")
    x = torch.zeros(1, device=dev)
    per_batch = repeats // 20

    def batch():
        for _ in range(per_batch):
            x.add_(1)

    with torch.inference_mode():
        return time_call(batch, 20, warmup=1, device=dev) / per_batch


def count_ops(fn: Callable[[], Any]) -> Counter:
    """Every ATen operation ``fn()`` dispatches, counted by name (views and copies included)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    counts: Counter = Counter()

    class _Counter(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            counts[str(func.overloadpacket.__name__)] += 1
            return func(*args, **(kwargs or {}))

    with _Counter():
        fn()
    return counts


def decode_step(model, batch: int = 1, context: int = 16):
    """A repeatable decode step of ``model``: ``batch`` new tokens after ``context`` cached ones.

    Returns a function that runs one step and crops the cache back, so every call is the same step
    (its ``cache`` attribute is the cache). The cache and the token ids live on the model's device.
    """
    dev = _model_device(model)
    g = torch.Generator(device=dev).manual_seed(0)
    cache = model.new_cache(batch_size=batch, max_len=context + 1)
    cache.k.normal_(generator=g)
    cache.v.normal_(generator=g)
    cache.advance(context)
    ids = torch.randint(0, model.config.vocab_size, (batch, 1), generator=g, device=dev)

    def step():
        with torch.inference_mode():
            logits = model(ids, cache=cache)
        cache.crop(context)
        return logits

    step.cache = cache
    return step


def step_overhead(model, batch: int = 1, context: int = 16, repeats: int = 20,
                  op_seconds: float | None = None) -> dict[str, Any]:
    """A decode step of ``model``: its op count, its time, and the share the per-op cost explains.

    ``overhead_share = ops x op_seconds / step_seconds`` (capped at 1): the part of the
    step that would remain with infinitely fast arithmetic and memory.
    """
    dev = _model_device(model)
    step = decode_step(model, batch, context)
    step()  # the first call builds one-off tables (RoPE); count the steady step
    ops = count_ops(step)
    n_ops = sum(ops.values())
    op_s = op_overhead_seconds(device=dev) if op_seconds is None else op_seconds
    step_s = time_call(step, repeats, device=dev, statistic="min")
    return {"ops": n_ops, "op_seconds": op_s, "step_seconds": step_s,
            "overhead_share": min(1.0, n_ops * op_s / step_s), "top_ops": ops.most_common(8)}


def compiled_step(model, batch: int = 1, context: int = 16, repeats: int = 20,
                  backend: str = "inductor") -> dict[str, Any]:
    """A decode step of a copy of ``model`` under ``torch.compile(backend=...)``: first-call and step time.

    ``backend="inductor"`` captures, fuses and generates kernels; ``backend="eager"``
    only captures the graph (TorchDynamo) and runs the same ATen ops, with no fusion
    and no generated code. ``out`` is the first call's logits.
    """
    import copy

    dev = _model_device(model)
    compiled_model = copy.deepcopy(model)
    compiled_model.forward = torch.compile(compiled_model.forward, backend=backend, dynamic=False)
    cstep = decode_step(compiled_model, batch, context)
    _sync(dev)
    t0 = time.perf_counter()
    out = cstep()
    _sync(dev)
    first_s = time.perf_counter() - t0
    return {"first_call_s": first_s, "step_s": time_call(cstep, repeats, device=dev, statistic="min"),
            "out": out}


def compile_step(model, batch: int = 1, context: int = 16, repeats: int = 20) -> dict[str, Any]:
    """The same decode step eager, graph-captured only, and under ``torch.compile`` (inductor).

    The compiled step replaces the model's forward for a fixed shape; a new
    shape (another batch or context) would compile again. ``captured_s`` is the
    step under ``backend="eager"``: the model's Python gone, the same ATen ops,
    no fusion. ``compile_s`` is inductor's first call, cold when the caller
    gives it an empty cache directory.
    """
    dev = _model_device(model)
    step = decode_step(model, batch, context)
    eager_s = time_call(step, repeats, device=dev, statistic="min")
    ref = step()
    ind = compiled_step(model, batch, context, repeats, backend="inductor")
    cap = compiled_step(model, batch, context, repeats, backend="eager")
    compiled_s, compile_s = ind["step_s"], ind["first_call_s"]
    return {"eager_s": eager_s, "compiled_s": compiled_s, "compile_s": compile_s,
            "speedup": eager_s / compiled_s, "max_abs_diff": (ind["out"] - ref).abs().max().item(),
            "captured_s": cap["step_s"], "captured_speedup": eager_s / cap["step_s"],
            "steps_to_repay_compile": compile_s / max(eager_s - compiled_s, 1e-12)}


# ---------------------------------------------------------------- FlashAttention's tiling

def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True,
                    block_q: int = 64, block_k: int = 64, scale: float | None = None,
                    return_stats: bool = False):
    """Attention tiled over queries *and* keys, as the FlashAttention kernel does.

    The outer loop takes a block of ``block_q`` queries (on a GPU: one thread
    block, its Q tile in shared memory); the inner loop streams blocks of
    ``block_k`` keys and values past it, keeping the online softmax's running
    max ``m``, sum ``l`` and output ``acc`` for that query block only
    (:func:`servelab.attention.online_softmax_fold`, the same step as
    :func:`servelab.attention.tiled_attention`'s). Under a
    causal mask, key blocks entirely in a query block's future are skipped.
    Equal to :func:`servelab.attention.naive_attention` (same conventions: the
    queries are the last ``q_time`` positions). With ``return_stats=True`` also
    returns the number of (query, key) block pairs computed and skipped and the
    largest live tile in elements.
    """
    from servelab.attention import online_softmax_finish, online_softmax_fold, online_softmax_start, tiled_inputs

    for name, b in (("block_q", block_q), ("block_k", block_k)):
        if isinstance(b, bool) or not isinstance(b, int) or b < 1:
            raise ValueError(f"{name} must be a positive whole number, got {b!r}")
    k, v, scale = tiled_inputs(q, k, v, causal, scale)
    q_time, kv_time = q.shape[-2], k.shape[-2]
    offset = kv_time - q_time            # query i sits at position offset + i
    out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    computed = skipped = 0
    for qs in range(0, q_time, block_q):
        qb = q[..., qs:qs + block_q, :].float()
        nq = qb.shape[-2]
        q_pos = torch.arange(offset + qs, offset + qs + nq, device=q.device) if causal else None
        state = online_softmax_start(qb)
        last_visible = offset + qs + nq - 1
        for ks in range(0, kv_time, block_k):
            if causal and ks > last_visible:
                skipped += 1
                continue
            computed += 1
            kb, vb = k[..., ks:ks + block_k, :].float(), v[..., ks:ks + block_k, :].float()
            k_pos = torch.arange(ks, ks + kb.shape[-2], device=q.device) if causal else None
            state = online_softmax_fold(state, qb, kb, vb, scale, q_pos, k_pos)
        out[..., qs:qs + nq, :] = online_softmax_finish(state)
    result = out.to(q.dtype)
    if return_stats:
        return result, {"blocks_computed": computed, "blocks_skipped": skipped,
                        "largest_tile_elements": min(block_q, q_time) * min(block_k, kv_time)}
    return result


# ---------------------------------------------------------------- overlap

def overlap_measurement(n: int = 768, copy_mb: int = 64, repeats: int = 5, device="cpu") -> dict[str, Any]:
    """A matrix product and an independent memory copy, one after the other vs side by side.

    The copy stands in for communication (an all-reduce's transfer): it needs
    memory bandwidth, not arithmetic. On the CPU, side by side means each runs
    in its own thread (PyTorch releases the GIL inside ops; one intra-op thread
    each). On a GPU (``device="cuda"``) the products run on the default stream
    and the copy, from pinned host memory to the GPU (the bus a transfer between
    chips would use), on a second stream, as an engine overlaps communication.
    ``hidden`` is the fraction of the shorter job's time that disappeared:
    ``(compute + copy - together) / min(compute, copy)``; 1 means fully hidden.
    Needs two free cores to show overlap on a CPU; on a loaded machine it shows contention.
    """
    for name, value in (("n", n), ("copy_mb", copy_mb), ("repeats", repeats)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
    dev = _check_device(device)
    if dev.type == "cuda":
        return _overlap_cuda(n, copy_mb, repeats, dev)
    a = torch.randn(n, n)
    b = torch.randn(n, n)
    src = torch.ones(copy_mb * 250_000)
    dst = torch.empty_like(src)

    def compute():
        for _ in range(3):
            torch.mm(a, b)

    def copy():
        for _ in range(3):
            dst.copy_(src)

    def together():
        t = threading.Thread(target=copy)
        t.start()
        compute()
        t.join()

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        rows = {"compute": [], "copy": [], "together": []}
        for _ in range(repeats):   # interleaved, so drift hits all three alike
            for name, fn in (("compute", compute), ("copy", copy), ("together", together)):
                rows[name].append(time_call(fn, 1, warmup=0))
    finally:
        torch.set_num_threads(old)
    c, x, t = (statistics.median(rows[k]) for k in ("compute", "copy", "together"))
    return {"compute_s": c, "copy_s": x, "together_s": t, "sum_s": c + x,
            "hidden": (c + x - t) / min(c, x), "device": "cpu"}


def _overlap_cuda(n: int, copy_mb: int, repeats: int, dev: torch.device) -> dict[str, Any]:
    """:func:`overlap_measurement` on a GPU: two CUDA streams instead of two threads."""
    g = torch.Generator(device=dev).manual_seed(0)
    a = torch.randn(n, n, generator=g, device=dev)
    b = torch.randn(n, n, generator=g, device=dev)
    src = torch.ones(copy_mb * 250_000, pin_memory=True)   # host memory the GPU can read directly
    dst = torch.empty(src.shape, device=dev)
    side = torch.cuda.Stream(device=dev)

    def compute():
        for _ in range(3):
            torch.mm(a, b)

    def copy():
        with torch.cuda.stream(side):
            for _ in range(3):
                dst.copy_(src, non_blocking=True)

    def together():   # both queued at once; the device runs the two streams side by side
        copy()
        compute()

    rows = {"compute": [], "copy": [], "together": []}
    for _ in range(repeats):
        for name, fn in (("compute", compute), ("copy", copy), ("together", together)):
            rows[name].append(time_call(fn, 1, warmup=1, device=dev))
    c, x, t = (statistics.median(rows[k]) for k in ("compute", "copy", "together"))
    return {"compute_s": c, "copy_s": x, "together_s": t, "sum_s": c + x,
            "hidden": (c + x - t) / min(c, x), "device": str(dev)}
