"""Tensor parallelism of any Llama config over ``torch.distributed``.

Each rank runs the model's own forward path (:class:`servelab.model.LlamaModel`)
on a *shard*: a config with ``1/world`` of the query heads, of the K/V heads
(or one replicated K/V head when there are fewer K/V heads than ranks) and of
the MLP width, holding only those slices of the weights:

* ``q_proj``, ``k_proj``, ``v_proj``, ``gate_proj``, ``up_proj``: split by
  output rows (whole heads), so each rank computes its heads and its slice of
  the MLP with no communication;
* ``o_proj`` and ``down_proj``: split by input columns, so each rank holds a
  partial sum of the full output; :class:`RowParallelLinear` adds the partial
  sums with one ``all_reduce``. Two all-reduces per layer, nothing else;
* the embedding is replicated; the head is split by vocabulary
  (:class:`VocabParallelHead`) and the logits gathered.

Each rank's KV cache holds only its K/V heads. The weights never travel: a
rank reads its slices straight from the checkpoint (:func:`load_shard`).
"""
from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from servelab.model import LlamaConfig, LlamaModel, load_config, load_pretrained
from servelab.parallel.launch import DEFAULT_TIMEOUT_S, launch

__all__ = [
    "shard_config", "shard_plan", "shard_state_dict", "load_shard", "build_shard",
    "RowParallelLinear", "VocabParallelHead", "tensor_parallel_logits", "tensor_parallel_generate",
    "run_tensor_parallel", "comm_counters", "record_collectives",
]


# ---------------------------------------------------------------------------
# what each rank holds
# ---------------------------------------------------------------------------

def _check_world(world_size: int) -> int:
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive integer, got {world_size!r}")
    return world_size


def shard_config(config: LlamaConfig, world_size: int) -> LlamaConfig:
    """The config one rank runs: its heads, its K/V heads and its MLP width.

    Query heads and the MLP width must divide by ``world_size``. K/V heads are
    split when they divide too; when there are fewer K/V heads than ranks (and
    ``world_size`` is a multiple of them), each rank keeps the one K/V head its
    query heads read -- a copy, as real servers do.
    """
    w = _check_world(world_size)
    heads, kv, inter = config.num_attention_heads, config.num_key_value_heads, config.intermediate_size
    if heads % w:
        raise ValueError(f"num_attention_heads={heads} does not divide by world_size={w}: tensor splitting "
                         f"gives each rank whole heads; use a world size that divides {heads}")
    if inter % w:
        raise ValueError(f"intermediate_size={inter} does not divide by world_size={w}; "
                         f"use a world size that divides {inter}")
    if kv % w == 0:
        kv_local = kv // w
    elif w % kv == 0:
        kv_local = 1
    else:
        raise ValueError(f"num_key_value_heads={kv} and world_size={w}: K/V heads must split evenly "
                         f"(kv % world == 0) or be copied evenly (world % kv == 0)")
    return replace(config, num_attention_heads=heads // w, num_key_value_heads=kv_local,
                   intermediate_size=inter // w, head_dim=config.head_dim, tie_word_embeddings=False)


def _vocab_bounds(vocab: int, rank: int, world: int) -> tuple[int, int]:
    return vocab * rank // world, vocab * (rank + 1) // world


def shard_plan(config: LlamaConfig, rank: int, world_size: int) -> dict[str, tuple[int, int, int] | None]:
    """For every tensor of the full model: ``(dim, start, stop)`` of this rank's slice, or None (a copy)."""
    w = _check_world(world_size)
    if not 0 <= rank < w:
        raise ValueError(f"rank must be in [0, {w}), got {rank}")
    local = shard_config(config, w)
    hd = config.head_dim
    hq = local.num_attention_heads
    if config.num_key_value_heads % w == 0:
        kv0 = rank * local.num_key_value_heads
    else:  # replicated: the K/V head that this rank's first query head reads
        kv0 = (rank * hq) // config.kv_groups
    kv1 = kv0 + local.num_key_value_heads
    q_rows = (rank * hq * hd, (rank + 1) * hq * hd)
    kv_rows = (kv0 * hd, kv1 * hd)
    inter = local.intermediate_size
    mlp_rows = (rank * inter, (rank + 1) * inter)
    plan: dict[str, Any] = {"embed_tokens.weight": None, "norm.weight": None,
                            "lm_head.weight": (0, *_vocab_bounds(config.vocab_size, rank, w))}
    for i in range(config.num_hidden_layers):
        p = f"layers.{i}."
        plan[p + "input_layernorm.weight"] = None
        plan[p + "post_attention_layernorm.weight"] = None
        for name, rows in (("q_proj", q_rows), ("k_proj", kv_rows), ("v_proj", kv_rows)):
            plan[p + f"self_attn.{name}.weight"] = (0, *rows)
            if config.attention_bias:
                plan[p + f"self_attn.{name}.bias"] = (0, *rows)
        plan[p + "self_attn.o_proj.weight"] = (1, *q_rows)
        for name in ("gate_proj", "up_proj"):
            plan[p + f"mlp.{name}.weight"] = (0, *mlp_rows)
            if config.mlp_bias:
                plan[p + f"mlp.{name}.bias"] = (0, *mlp_rows)
        plan[p + "mlp.down_proj.weight"] = (1, *mlp_rows)
        if config.attention_bias:
            plan[p + "self_attn.o_proj.bias"] = None  # added once, after the all-reduce
        if config.mlp_bias:
            plan[p + "mlp.down_proj.bias"] = None
    return plan


def _slice(t: torch.Tensor, spec) -> torch.Tensor:
    if spec is None:
        return t.clone()
    dim, a, b = spec
    return t.narrow(dim, a, b - a).clone()


def shard_state_dict(state_dict: dict[str, torch.Tensor], config: LlamaConfig, rank: int,
                     world_size: int) -> dict[str, torch.Tensor]:
    """This rank's slices of a full ``LlamaModel.state_dict()`` (copies, so the full one can go)."""
    plan = shard_plan(config, rank, world_size)
    sd = dict(state_dict)
    if "lm_head.weight" not in sd or config.tie_word_embeddings:
        sd["lm_head.weight"] = sd["embed_tokens.weight"]
    missing = sorted(set(plan) - set(sd))
    if missing:
        raise ValueError(f"state dict is missing {missing[:5]}; is it a servelab LlamaModel's state_dict()?")
    return {name: _slice(sd[name], spec) for name, spec in plan.items()}


def load_shard(folder: str | Path, rank: int, world_size: int, dtype=torch.float32):
    """Read only this rank's slices from a safetensors checkpoint; returns ``(config, shard_state)``.

    ``safe_open(...).get_slice`` reads the rows or columns a rank needs from disk;
    no process ever holds the whole model.
    """
    from safetensors import safe_open

    from servelab.model import _checkpoint_files, _hf_to_servelab_name

    folder = Path(folder)
    config = load_config(folder)
    plan = shard_plan(config, rank, world_size)
    out: dict[str, torch.Tensor] = {}
    for file in _checkpoint_files(folder):
        with safe_open(str(file), framework="pt") as f:
            for key in f.keys():
                name = _hf_to_servelab_name(key)
                targets = [name]
                if name == "embed_tokens.weight" and config.tie_word_embeddings:
                    targets.append("lm_head.weight")
                for target in targets:
                    if target not in plan:
                        continue
                    spec = plan[target]
                    sl = f.get_slice(key)
                    if spec is None:
                        t = sl[:]
                    elif spec[0] == 0:
                        t = sl[spec[1]:spec[2]]
                    else:
                        t = sl[:, spec[1]:spec[2]]
                    out[target] = t.to(dtype)
    missing = sorted(set(plan) - set(out))
    if missing:
        raise ValueError(f"checkpoint {folder} lacks {missing[:5]}")
    return config, out


# ---------------------------------------------------------------------------
# the two modules that talk
# ---------------------------------------------------------------------------

class RowParallelLinear(nn.Module):
    """``y = all_reduce(x_local @ W_local^T) + b``: a linear split by its input columns.

    Each rank multiplies its slice of the input (its heads, or its slice of the
    MLP width) by its columns of the weight, giving a partial sum of the full
    output; one ``all_reduce`` adds the partial sums on every rank. The bias is
    added once, after the sum. ``calls`` and ``bytes`` count the traffic;
    ``seconds`` is the wall time spent inside ``all_reduce`` (the transfer plus
    any wait for a slower peer).

    The weight is stored as ``nn.Linear`` stores it, ``[out, in]``: the slice
    each rank holds is a set of *columns* of that matrix, which are *rows* of
    the ``W`` in ``y = x @ W`` (Megatron-LM's "row-parallel" layer).
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = False, group=None):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None
        self.group = group
        self.calls = 0
        self.bytes = 0
        self.seconds = 0.0
        self.log: list | None = None  # a list: every call appends (seconds, bytes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight)
        if self.group is not None or (dist.is_available() and dist.is_initialized()):
            t0 = time.perf_counter()
            dist.all_reduce(y, group=self.group)
            seconds = time.perf_counter() - t0
            self.seconds += seconds
            self.calls += 1
            nbytes = y.numel() * y.element_size()
            self.bytes += nbytes
            if self.log is not None:
                self.log.append((seconds, nbytes))
        return y if self.bias is None else y + self.bias


class VocabParallelHead(nn.Module):
    """The output head split by vocabulary rows; the logits are gathered onto every rank."""

    def __init__(self, hidden_size: int, vocab_size: int, rank: int, world_size: int, group=None):
        super().__init__()
        self.bounds = [_vocab_bounds(vocab_size, r, world_size) for r in range(world_size)]
        a, b = self.bounds[rank]
        self.weight = nn.Parameter(torch.empty(b - a, hidden_size))
        self.group = group
        self.calls = 0
        self.bytes = 0
        self.seconds = 0.0
        self.log: list | None = None  # a list: every call appends (seconds, bytes sent)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        local = F.linear(x, self.weight)
        talks = self.group is not None or (dist.is_available() and dist.is_initialized())
        if not talks or len(self.bounds) == 1:
            return local
        width = max(b - a for a, b in self.bounds)
        padded = F.pad(local, (0, width - local.shape[-1]))
        parts = [torch.empty_like(padded) for _ in self.bounds]
        t0 = time.perf_counter()
        dist.all_gather(parts, padded.contiguous(), group=self.group)
        seconds = time.perf_counter() - t0
        self.seconds += seconds
        self.calls += 1
        nbytes = padded.numel() * padded.element_size() * (len(self.bounds) - 1)
        self.bytes += nbytes
        if self.log is not None:
            self.log.append((seconds, nbytes))
        return torch.cat([p[..., : b - a] for p, (a, b) in zip(parts, self.bounds)], dim=-1)


def build_shard(config: LlamaConfig, shard_state: dict[str, torch.Tensor], rank: int,
                world_size: int, group=None) -> LlamaModel:
    """A :class:`LlamaModel` for one rank: the shard config, row-parallel o/down, vocab-parallel head.

    ``group``: the process group the collectives run on (default: the process's default group).
    """
    local = shard_config(config, world_size)
    model = LlamaModel(local)
    for layer in model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        attn.o_proj = RowParallelLinear(attn.num_heads * attn.head_dim, config.hidden_size, config.attention_bias,
                                        group=group)
        mlp.down_proj = RowParallelLinear(local.intermediate_size, config.hidden_size, config.mlp_bias, group=group)
    model.lm_head = VocabParallelHead(config.hidden_size, config.vocab_size, rank, world_size, group=group)
    dtype = shard_state["embed_tokens.weight"].dtype
    model = model.to(dtype)
    model.load_state_dict(shard_state, strict=True)
    return model.eval()


def record_collectives(model: LlamaModel, on: bool = True) -> list:
    """Start (or stop) logging every collective call of this rank's shard; returns the log.

    The log is one list, in call order: ``("all_reduce" | "gather", seconds, bytes)``.
    Every rank makes the same calls in the same order, so the logs of two ranks
    line up call by call.
    """
    log: list = []
    for m in model.modules():
        if isinstance(m, (RowParallelLinear, VocabParallelHead)):
            m.log = _KindLog(log, "all_reduce" if isinstance(m, RowParallelLinear) else "gather") if on else None
    return log


class _KindLog:
    """Appends ``(kind, seconds, bytes)`` to a shared list."""

    def __init__(self, log: list, kind: str):
        self.shared, self.kind = log, kind

    def append(self, item) -> None:
        self.shared.append((self.kind, *item))


def comm_counters(model: LlamaModel) -> dict[str, float]:
    """All-reduces and gathers this rank has made so far, their bytes, and the seconds spent in them.

    ``all_reduce_seconds`` and ``gather_seconds`` are wall time inside the
    collective calls: the transfer itself plus any wait for a slower peer.
    """
    reduces = [m for m in model.modules() if isinstance(m, RowParallelLinear)]
    heads = [m for m in model.modules() if isinstance(m, VocabParallelHead)]
    return {"all_reduces": sum(m.calls for m in reduces), "all_reduce_bytes": sum(m.bytes for m in reduces),
            "gathers": sum(m.calls for m in heads), "gather_bytes": sum(m.bytes for m in heads),
            "all_reduce_seconds": sum(m.seconds for m in reduces),
            "gather_seconds": sum(m.seconds for m in heads)}


# ---------------------------------------------------------------------------
# running it
# ---------------------------------------------------------------------------

def _greedy(model: LlamaModel, ids: torch.Tensor, max_new_tokens: int, eos: int | None,
            clock: dict | None = None) -> list[int]:
    """Greedy decoding with a KV cache; rank 0's choice is broadcast so every rank agrees.

    ``clock["broadcasts"]`` and ``clock["broadcast_seconds"]`` count the broadcasts, when given.
    """
    cache = model.new_cache(batch_size=1, max_len=ids.shape[-1] + max_new_tokens)
    out: list[int] = []
    step_ids = ids.view(1, -1)
    for _ in range(max_new_tokens):
        logits = model(step_ids, cache=cache)
        nxt = logits[0, -1].argmax().view(1)
        if dist.is_initialized():
            t0 = time.perf_counter()
            dist.broadcast(nxt, src=0)
            if clock is not None:
                clock["broadcasts"] = clock.get("broadcasts", 0) + 1
                clock["broadcast_seconds"] = clock.get("broadcast_seconds", 0.0) + time.perf_counter() - t0
        out.append(int(nxt))
        if eos is not None and out[-1] == eos:
            break
        step_ids = nxt.view(1, 1)
    return out


def _worker(rank: int, world_size: int, source: dict, jobs: list[dict]) -> list[dict]:
    """One rank: build its shard, run every job, report results and traffic."""
    if source["kind"] == "path":
        config, state = load_shard(source["path"], rank, world_size, source.get("dtype", torch.float32))
    else:
        config = LlamaConfig(**source["config"])
        state = torch.load(source["shards"][rank], weights_only=True)
    model = build_shard(config, state, rank, world_size)
    held = sum(t.numel() * t.element_size() for t in state.values())
    results = []
    with torch.no_grad():
        for job in jobs:
            before = comm_counters(model)
            clock: dict = {"broadcasts": 0, "broadcast_seconds": 0.0}
            dist.barrier()
            t0 = time.perf_counter()
            if job["kind"] == "logits":
                value = model(job["input_ids"])
            elif job["kind"] == "generate":
                value = _greedy(model, job["input_ids"], job["max_new_tokens"], job.get("eos"), clock)
            else:
                raise ValueError(f"unknown job kind {job['kind']!r}")
            seconds = time.perf_counter() - t0
            after = comm_counters(model)
            traffic = {k: after[k] - before[k] for k in after}
            traffic.update(clock)
            results.append({"value": value if rank == 0 else None, "traffic": traffic, "seconds": seconds,
                            "weight_bytes": held,
                            "kv_heads": model.config.num_key_value_heads,
                            "heads": model.config.num_attention_heads})
    return results


def _as_ids(input_ids) -> torch.Tensor:
    ids = torch.as_tensor(input_ids, dtype=torch.long)
    if ids.dim() == 1:
        ids = ids[None]
    if ids.dim() != 2 or ids.numel() == 0:
        raise ValueError(f"input_ids must be a non-empty [batch, time] (or [time]) tensor, got shape "
                         f"{tuple(ids.shape)}")
    return ids


def run_tensor_parallel(model_or_path, jobs: list[dict], world_size: int,
                        timeout: float = DEFAULT_TIMEOUT_S) -> list[list[dict]]:
    """Run several jobs on one tensor-parallel group; returns ``results[rank][job]``.

    ``model_or_path`` is a :class:`LlamaModel` (its shards are written to a
    temporary folder, one file per rank) or a checkpoint folder (each rank reads
    its own slices). A job is ``{"kind": "logits", "input_ids": ...}`` or
    ``{"kind": "generate", "input_ids": ..., "max_new_tokens": n}``. Each result
    holds the job's ``value`` (rank 0 only), its ``traffic`` (all-reduces, gathers,
    broadcasts, their bytes and the seconds spent inside each kind), ``seconds`` (wall time from a barrier to the job's end) and
    what the rank holds (``weight_bytes``, ``heads``, ``kv_heads``).
    """
    import tempfile

    _check_world(world_size)
    jobs = [dict(job, input_ids=torch.as_tensor(job["input_ids"], dtype=torch.long)) for job in jobs]
    if isinstance(model_or_path, (str, Path)):
        config = load_config(model_or_path)
        shard_config(config, world_size)  # fail here, not in the ranks
        return launch(_worker, world_size, ({"kind": "path", "path": str(model_or_path)}, jobs), timeout)
    if not isinstance(model_or_path, LlamaModel):
        raise TypeError(f"model_or_path must be a servelab LlamaModel or a checkpoint folder, "
                        f"got {type(model_or_path).__name__}")
    config = model_or_path.config
    shard_config(config, world_size)
    state = {k: v.detach() for k, v in model_or_path.state_dict().items()}
    with tempfile.TemporaryDirectory(prefix="servelab-tp-") as tmp:
        files = []
        for r in range(world_size):
            path = Path(tmp) / f"shard{r}.pt"
            torch.save(shard_state_dict(state, config, r, world_size), path)
            files.append(str(path))
        from dataclasses import asdict
        source = {"kind": "shards", "config": asdict(config), "shards": files}
        return launch(_worker, world_size, (source, jobs), timeout)


def tensor_parallel_logits(model_or_path, input_ids, world_size: int,
                           timeout: float = DEFAULT_TIMEOUT_S) -> torch.Tensor:
    """Logits ``[batch, time, vocab]`` computed by ``world_size`` processes splitting the model."""
    ids = _as_ids(input_ids)
    return run_tensor_parallel(model_or_path, [{"kind": "logits", "input_ids": ids}], world_size,
                               timeout)[0][0]["value"]


def tensor_parallel_generate(model_or_path, input_ids, max_new_tokens: int, world_size: int,
                             eos_token_id: int | None = None, timeout: float = DEFAULT_TIMEOUT_S) -> list[int]:
    """Greedy tokens from ``world_size`` processes, each with its own shard and KV cache."""
    ids = _as_ids(input_ids)
    if ids.shape[0] != 1:
        raise ValueError(f"tensor_parallel_generate takes one prompt, got a batch of {ids.shape[0]}")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
    job = {"kind": "generate", "input_ids": ids[0], "max_new_tokens": max_new_tokens, "eos": eos_token_id}
    return run_tensor_parallel(model_or_path, [job], world_size, timeout)[0][0]["value"]
