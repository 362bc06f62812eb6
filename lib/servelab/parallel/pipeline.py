"""Pipeline parallelism: consecutive layers in separate processes, activations sent along.

Stage ``s`` holds layers ``[a_s, b_s)``; stage 0 also embeds the tokens and the
last stage applies the final norm and head. A batch is cut into
``m`` micro-batches; each stage receives a micro-batch's activations from the
stage before (``recv``), runs its layers and passes them on (``send``). The
stages work on different micro-batches at once, but the first stage starts
alone and the last finishes alone: the *bubble*, ``(p - 1) / (m + p - 1)`` of
the run when the stages take equal time (:func:`servelab.comm.bubble_fraction`).

Every stage records when it worked on each micro-batch, so the bubble is
measured from the timeline, not assumed. ``pad_s`` adds a fixed sleep to each
stage's work per micro-batch: on a machine with fewer cores than stages it
stands in for a chip's own compute, so the stages do not queue for the CPU.
"""
from __future__ import annotations

import time
from dataclasses import asdict

import torch
import torch.distributed as dist

from servelab.model import LlamaConfig, LlamaModel
from servelab.parallel.launch import DEFAULT_TIMEOUT_S, launch

__all__ = ["stage_bounds", "run_pipeline", "measured_bubble"]


def stage_bounds(num_layers: int, stages: int) -> list[tuple[int, int]]:
    """Layers of each stage, as even as possible: ``[(a_0, b_0), ...]``."""
    if isinstance(stages, bool) or not isinstance(stages, int) or stages < 1:
        raise ValueError(f"stages must be a positive integer, got {stages!r}")
    if stages > num_layers:
        raise ValueError(f"{stages} stages for {num_layers} layers: every stage needs at least one layer")
    return [(num_layers * s // stages, num_layers * (s + 1) // stages) for s in range(stages)]


def _stage_model(config: LlamaConfig, state: dict, a: int, b: int, first: bool, last: bool) -> LlamaModel:
    from dataclasses import replace
    local = LlamaModel(replace(config, num_hidden_layers=b - a, tie_word_embeddings=False))
    sd = {}
    for name, t in state.items():
        if name.startswith("layers."):
            i = int(name.split(".")[1])
            if a <= i < b:
                sd[name.replace(f"layers.{i}.", f"layers.{i - a}.", 1)] = t
    if first:
        sd["embed_tokens.weight"] = state["embed_tokens.weight"]
    if last:
        sd["norm.weight"] = state["norm.weight"]
        sd["lm_head.weight"] = state.get("lm_head.weight", state["embed_tokens.weight"])
    local.load_state_dict(sd, strict=False)
    return local.eval()


def _pipeline_worker(rank: int, world: int, config: dict, state_file: str, input_ids: torch.Tensor,
                     microbatches: int, pad_s: float) -> dict:
    config = LlamaConfig(**config)
    a, b = stage_bounds(config.num_hidden_layers, world)[rank]
    first, last = rank == 0, rank == world - 1
    state = torch.load(state_file, weights_only=True)
    model = _stage_model(config, state, a, b, first, last)
    del state  # the stage keeps only its layers
    chunks = input_ids.chunk(microbatches)
    t = input_ids.shape[1]
    cos, sin = model.rotary(torch.arange(t))
    timeline, outputs = [], []
    dist.barrier()
    with torch.no_grad():
        for i, ids in enumerate(chunks):
            if first:
                start = time.perf_counter()
                h = model.embed(ids)
            else:
                h = torch.empty(ids.shape[0], t, config.hidden_size)
                dist.recv(h, rank - 1)
                start = time.perf_counter()
            for layer in model.layers:
                h = layer(h, cos, sin, is_causal=True)
            if pad_s:
                time.sleep(pad_s)
            end = time.perf_counter()
            timeline.append((i, start, end))
            if last:
                outputs.append(model.logits(h))
            else:
                dist.send(h.contiguous(), rank + 1)
    return {"stage": rank, "layers": (a, b), "timeline": timeline,
            "logits": torch.cat(outputs) if last else None}


def measured_bubble(timelines: list[list[tuple[int, float, float]]]) -> dict:
    """Idle share of the run from per-stage timelines of ``(microbatch, start, end)``.

    ``span`` runs from the first start to the last end over all stages;
    ``bubble = 1 - mean(busy) / span``.
    """
    if not timelines or not all(timelines):
        raise ValueError("need a non-empty timeline for every stage")
    t0 = min(s for tl in timelines for _, s, _ in tl)
    t1 = max(e for tl in timelines for _, _, e in tl)
    span = t1 - t0
    busy = [sum(e - s for _, s, e in tl) for tl in timelines]
    return {"span_s": span, "busy_s": busy, "bubble": 1 - sum(busy) / len(busy) / span}


def run_pipeline(model: LlamaModel, input_ids, stages: int, microbatches: int, pad_s: float = 0.0,
                 timeout: float = DEFAULT_TIMEOUT_S) -> dict:
    """Run ``model`` as a ``stages``-process pipeline over ``microbatches`` micro-batches.

    Returns ``{"logits", "timelines" (per stage, times relative to the first start),
    "bubble" (measured), "span_s", "layers" (per stage)}``.
    """
    import tempfile
    from pathlib import Path

    ids = torch.as_tensor(input_ids, dtype=torch.long)
    if ids.dim() != 2 or ids.numel() == 0:
        raise ValueError(f"input_ids must be a non-empty [batch, time] tensor, got shape {tuple(ids.shape)}")
    if isinstance(microbatches, bool) or not isinstance(microbatches, int) or microbatches < 1:
        raise ValueError(f"microbatches must be a positive integer, got {microbatches!r}")
    if ids.shape[0] % microbatches:
        raise ValueError(f"batch of {ids.shape[0]} does not split into {microbatches} equal micro-batches")
    stage_bounds(model.config.num_hidden_layers, stages)
    if pad_s < 0:
        raise ValueError(f"pad_s must be >= 0 seconds, got {pad_s!r}")
    with tempfile.TemporaryDirectory(prefix="servelab-pp-") as tmp:
        path = Path(tmp) / "model.pt"
        torch.save({k: v.detach() for k, v in model.state_dict().items()}, path)
        results = launch(_pipeline_worker, stages,
                         (asdict(model.config), str(path), ids, microbatches, float(pad_s)), timeout)
    timelines = [r["timeline"] for r in results]
    t0 = min(s for tl in timelines for _, s, _ in tl)
    rel = [[(i, s - t0, e - t0) for i, s, e in tl] for tl in timelines]
    bubble = measured_bubble(timelines)
    return {"logits": results[-1]["logits"], "timelines": rel, "bubble": bubble["bubble"],
            "span_s": bubble["span_s"], "busy_s": bubble["busy_s"], "layers": [r["layers"] for r in results]}
