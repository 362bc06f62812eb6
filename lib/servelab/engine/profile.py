"""Where an engine step's time goes, by phase: ``python -m servelab.engine.profile``.

Runs the engine on a model the size of the engine benchmark's (or ``--quick``:
a tiny one) in two situations, a lone request decoding (batch 1) and a full
house of ``--seats`` requests decoding together, and splits each step's wall
time into phases by timing the functions that do them:

* ``schedule``   - the scheduler's plan (``Scheduler.schedule``)
* ``prepare``    - flattening the plan into rows (``prepare_step``)
* ``context``    - building the step's index tensors (``ModelRunner.context``)
* ``attention``  - writing K/V and attending through the pool (``PagedStepContext.attend``)
* ``layers``     - everything else of the forward pass: embedding, RoPE, norms,
  projections, MLP (the runner's time minus the phases inside it)
* ``head``       - final norm and output head (``LlamaModel.logits``); with
  ``--compile`` it is inside the compiled graph and counted in ``layers``
* ``sample``     - choosing the tokens (``Sampler``)
* ``finish``     - commit, stop checks, outputs (the rest of ``LLMEngine.step``)

Times are CPU time of the running thread (``time.thread_time``), so a busy,
shared machine inflates them far less than wall time; the step's wall time is
reported beside them.

It also reports the batch-1 step against the time to read that step's weights
once at the machine's measured matrix-vector bandwidth: a step cannot beat
that, and the ratio says how much a step spends beyond streaming its weights.
The bandwidth is measured twice: by :func:`servelab.roofline.measure_bandwidth`
(wall time, the benchmarks' figure) and by the same mat-vec timed in CPU time
(the ratio uses this one, so both sides are on the same clock). One thread, as
the benchmarks run; the numbers are for this machine and this load.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from contextlib import contextmanager

__all__ = ["PhaseTimer", "profile_engine", "weights_read_seconds", "matmuls_alone_seconds", "main"]

#: The engine benchmark's model shape (benchmarks/bench_engine.py MODEL).
BENCH_MODEL = dict(vocab_size=4096, hidden_size=256, intermediate_size=768, num_hidden_layers=6,
                   num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=4096,
                   tie_word_embeddings=True, eos_token_id=4091)
QUICK_MODEL = dict(BENCH_MODEL, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2)
PHASES = ("schedule", "prepare", "context", "attention", "layers", "head", "sample", "finish")


class PhaseTimer:
    """Accumulates wall time per phase by wrapping functions (inner phases are
    subtracted from the phase that contains them)."""

    def __init__(self):
        self.seconds = {p: 0.0 for p in PHASES}
        self.steps = 0
        self._stack: list[list[float]] = []
        self._wrapped: list = []

    @contextmanager
    def phase(self, name: str):
        self._stack.append([0.0])
        t0 = time.thread_time()
        try:
            yield
        finally:
            dt = time.thread_time() - t0
            inner = self._stack.pop()[0]
            self.seconds[name] += dt - inner
            if self._stack:
                self._stack[-1][0] += dt

    def wrap(self, obj, attr: str, name: str, record: bool = True):
        fn = getattr(obj, attr)

        def timed(*args, **kwargs):
            with self.phase(name):
                return fn(*args, **kwargs)
        setattr(obj, attr, timed)
        if record:  # a step's context is thrown away after the step: nothing to undo
            self._wrapped.append((obj, attr))

    def unwrap(self) -> None:
        """Remove every wrapper (the instance attributes ``wrap`` set): a model profiled
        twice must not time its head through two wrappers, or a compiled graph trace one."""
        for obj, attr in reversed(self._wrapped):
            vars(obj).pop(attr, None)
        self._wrapped.clear()

    def per_step_ms(self) -> dict[str, float]:
        n = max(self.steps, 1)
        return {p: 1e3 * s / n for p, s in self.seconds.items()}


def instrument(engine) -> PhaseTimer:
    """Wrap the engine's phases (works on the engine of any recent servelab)."""
    import servelab.engine.engine as engine_module

    timer = PhaseTimer()
    runner = engine.runner
    timer.wrap(engine.scheduler, "schedule", "schedule")
    prepare = engine_module.prepare_step
    timer.wrap(engine_module, "prepare_step", "prepare", record=False)  # a module: restore() puts it back
    timer.wrap(runner, "execute", "layers")
    if hasattr(runner, "context"):
        make = runner.context

        def context(step):
            with timer.phase("context"):
                ctx = make(step)
            timer.wrap(ctx, "attend", "attention", record=False)
            return ctx
        runner.context = context
    if not getattr(runner, "compiled", False):  # a compiled step's head is inside its graph
        timer.wrap(runner.model, "logits", "head")
    timer.wrap(engine, "sampler", "sample")
    step = engine.step

    def timed_step():
        with timer.phase("finish"):
            out = step()
        timer.steps += 1
        return out
    engine.step = timed_step
    def restore():
        engine_module.prepare_step = prepare
        timer.unwrap()
        vars(engine).pop("step", None)
        vars(runner).pop("context", None)
    timer.restore = restore
    return timer


def build_model(quick: bool = False, seed: int = 0):
    import torch

    from servelab.model import LlamaConfig, LlamaModel
    torch.manual_seed(seed)
    return LlamaModel(LlamaConfig(**(QUICK_MODEL if quick else BENCH_MODEL))).init_weights(seed=seed).eval()


def profile_engine(model, seats: int, prompt_len: int, new_tokens: int, warmup_steps: int = 3,
                   enforce_eager: bool = True) -> dict:
    """Per-phase milliseconds per decode step with ``seats`` requests running together."""
    from servelab.engine import LLMEngine
    from servelab.sampling import SamplingParams

    eng = LLMEngine.from_model(model, block_size=16, num_kv_blocks=max(64, seats * 24),
                               max_num_seqs=seats, max_num_batched_tokens=4096,
                               enforce_eager=enforce_eager)
    for i in range(seats):
        prompt = [(7 * i + j) % 4000 + 1 for j in range(prompt_len)]
        eng.add_request(str(i), prompt, SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True))
    for _ in range(warmup_steps):  # the prefill and first decodes are not what is profiled
        eng.step()
    timer = instrument(eng)
    t0, w0 = time.thread_time(), time.perf_counter()
    try:
        while eng.has_unfinished_requests():
            eng.step()
    finally:
        timer.restore()
    cpu, wall = time.thread_time() - t0, time.perf_counter() - w0
    ms = timer.per_step_ms()
    n = max(timer.steps, 1)
    return {"seats": seats, "steps": timer.steps, "step_ms": 1e3 * cpu / n, "step_wall_ms": 1e3 * wall / n,
            "phases_ms": {k: round(v, 4) for k, v in ms.items()}}


def matvec_bandwidth_cpu_time(size_mb: int = 256, repeats: int = 5) -> float:
    """Bytes per CPU-second of a large fp32 matrix-vector product (the lower quartile of runs):
    :func:`servelab.roofline.measure_bandwidth`'s mat-vec, on the thread's CPU clock."""
    import math

    import torch
    side = int(math.sqrt(size_mb * 1_000_000 // 4))
    w = torch.full((side, side), 0.5)
    x = torch.full((side,), 0.5)
    torch.mv(w, x)
    times = []
    for _ in range(repeats):
        t = time.thread_time()
        torch.mv(w, x)
        times.append(time.thread_time() - t)
    times.sort()
    return side * side * 4 / times[len(times) // 4]


def matmuls_alone_seconds(model, repeats: int = 100) -> float:
    """CPU seconds of a batch-1 step's matrix products alone: every linear of the model
    (as the engine stores them: fused, column-major in fp32) applied to one row, back
    to back, nothing in between. The floor under a batch-1 step's cost, to set beside
    :func:`weights_read_seconds` (small matrices stream slower than one large one)."""
    import torch
    import torch.nn.functional as F
    mats = []
    for layer in model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        for fused, parts in ((attn.fused_qkv, (attn.q_proj, attn.k_proj, attn.v_proj)),
                             (None, (attn.o_proj,)), (mlp.fused_gate_up, (mlp.gate_proj, mlp.up_proj)),
                             (None, (mlp.down_proj,))):
            mats += [fused.weight] if fused is not None else [p.weight for p in parts]
    mats.append(model.lm_head.weight)
    rows = {w.shape[1]: torch.ones(1, w.shape[1], dtype=w.dtype) for w in mats}
    with torch.inference_mode():
        for _ in range(max(repeats // 10, 1)):
            for w in mats:
                F.linear(rows[w.shape[1]], w)
        t = time.thread_time()
        for _ in range(repeats):
            for w in mats:
                F.linear(rows[w.shape[1]], w)
        return (time.thread_time() - t) / repeats


def weights_read_seconds(model, bandwidth: float) -> float:
    """Time to stream a batch-1 step's matrices once (projections, MLP, output head) at ``bandwidth``.

    Counted from the model's own matrices (the same number as
    ``servelab.arith.count_params(config).matmul_active``).
    """
    mats = [m.weight for m in model.modules() if isinstance(m, __import__("torch").nn.Linear)]
    return sum(w.numel() * w.element_size() for w in mats) / bandwidth


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m servelab.engine.profile", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny model, few steps (seconds)")
    parser.add_argument("--seats", type=int, default=None, help="requests decoding together (default 32)")
    parser.add_argument("--new-tokens", type=int, default=None)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3, help="runs per situation; the fastest is kept")
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    parser.add_argument("--compile", action="store_true",
                        help="compile the model's forward (LLM(..., enforce_eager=False))")
    a = parser.parse_args(argv)
    import torch

    from servelab import roofline
    torch.set_num_threads(a.threads)
    model = build_model(a.quick)
    seats = a.seats or (4 if a.quick else 32)
    new = a.new_tokens or (8 if a.quick else 64)
    prompt_len = 16 if a.quick else 64
    rows = []
    for n in (1, seats):  # the fastest of a few runs: the machine may be shared
        runs = [profile_engine(model, n, prompt_len, new, enforce_eager=not a.compile)
                for _ in range(max(a.repeats, 1))]
        rows.append(min(runs, key=lambda r: r["step_ms"]))
    size = 32 if a.quick else 256
    wall_bw = next(r for r in roofline.measure_bandwidth(size_mb=size, repeats=3)
                   if r["name"] == "matrix-vector")["GB_per_s"] * 1e9
    bw = matvec_bandwidth_cpu_time(size)
    read_ms = 1e3 * weights_read_seconds(model, bw)
    result = {"threads": a.threads, "compiled": a.compile,
              "load": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
              "matvec_GB_per_s": round(bw / 1e9, 2), "matvec_GB_per_s_wall": round(wall_bw / 1e9, 2),
              "weights_read_ms": round(read_ms, 4),
              "batch1_over_weights_read": round(rows[0]["step_ms"] / read_ms, 2), "runs": rows}
    print(f"{'phase':<10}" + "".join(f"{'batch ' + str(r['seats']):>14}" for r in rows))
    for p in PHASES:
        print(f"{p:<10}" + "".join(f"{r['phases_ms'][p]:>11.3f} ms" for r in rows))
    print(f"{'step':<10}" + "".join(f"{r['step_ms']:>11.3f} ms" for r in rows))
    print(f"{'wall':<10}" + "".join(f"{r['step_wall_ms']:>11.3f} ms" for r in rows))
    print(f"batch-1 step {rows[0]['step_ms']:.3f} ms = {result['batch1_over_weights_read']}x the time to read "
          f"its weights once ({read_ms:.3f} ms at {result['matvec_GB_per_s']} GB/s mat-vec, CPU time; "
          f"{result['matvec_GB_per_s_wall']} GB/s by roofline.measure_bandwidth's wall clock); "
          f"load {result['load']}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
