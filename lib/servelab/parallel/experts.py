"""A mixture-of-experts layer in PyTorch, a tiny MoE course model, and expert parallelism.

:class:`MoELayer` replaces a layer's MLP: a router (one ``hidden x E`` table)
scores every expert for each token, the top ``k`` are kept, their scores are
turned into weights by a softmax over those ``k`` (Mixtral's rule), and the
token's output is the weighted blend of its ``k`` experts' outputs. Each expert
is the course model's own SwiGLU :class:`servelab.model.MLP`.

:func:`moe_model` builds the course model's architecture with every MLP
replaced by an MoE layer. Its weights are random (``init_weights`` with a seed),
not trained: it exists to show routing, coverage and expert parallelism.

:func:`expert_parallel_forward` runs one MoE layer across processes: each rank
holds a slice of the tokens and ``E / world`` experts (plus any copies). Every
rank routes its tokens, sends each (token, expert) pair to a rank that holds the
expert with ``all_to_all_single``, the experts run where they live, and a second
``all_to_all_single`` brings the outputs home to be blended. The result equals
the single-process layer.
"""
from __future__ import annotations

import time
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from servelab.model import MLP, LlamaConfig, LlamaModel
from servelab.moe import place_experts
from servelab.parallel.launch import DEFAULT_TIMEOUT_S, launch

__all__ = ["MoELayer", "route", "moe_model", "expert_parallel_forward"]


def route(router_logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-``k`` experts per token and their blend weights (softmax over the ``k`` kept scores).

    ``router_logits [tokens, E]`` -> ``(weights [tokens, k], experts [tokens, k])``.
    """
    if not 1 <= k <= router_logits.shape[-1]:
        raise ValueError(f"k={k} must be between 1 and the number of experts ({router_logits.shape[-1]})")
    top, experts = router_logits.topk(k, dim=-1)
    return F.softmax(top.float(), dim=-1).to(router_logits.dtype), experts


class MoELayer(nn.Module):
    """Router + ``num_experts`` SwiGLU experts, ``top_k`` per token, softmax-weighted blend.

    ``forward(x [..., hidden]) -> [..., hidden]``; ``last_counts`` holds how many
    tokens each expert received in the last call.
    """

    def __init__(self, hidden_size: int, intermediate_size: int, num_experts: int, top_k: int):
        super().__init__()
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"top_k={top_k} must be between 1 and num_experts={num_experts}")
        self.hidden_size, self.num_experts, self.top_k = hidden_size, num_experts, top_k
        self.router = nn.Linear(hidden_size, num_experts, bias=False)
        spec = SimpleNamespace(hidden_size=hidden_size, intermediate_size=intermediate_size, mlp_bias=False)
        self.experts = nn.ModuleList(MLP(spec) for _ in range(num_experts))
        self.router_bias = None  # optional fixed bias on the router scores (to make experts hot)
        self.last_counts: list[int] = [0] * num_experts

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.router(x)
        if self.router_bias is not None:
            logits = logits + self.router_bias
        return route(logits, self.top_k)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, self.hidden_size)
        weights, experts = self.route(flat)
        out = torch.zeros_like(flat)
        counts = []
        for e, expert in enumerate(self.experts):
            token, slot = (experts == e).nonzero(as_tuple=True)
            counts.append(int(token.numel()))
            if token.numel():
                out.index_add_(0, token, expert(flat[token]) * weights[token, slot, None])
        self.last_counts = counts
        return out.view(shape)


def moe_model(config: LlamaConfig, num_experts: int, top_k: int, seed: int = 0,
              expert_intermediate_size: int | None = None) -> LlamaModel:
    """The course architecture with each MLP replaced by an :class:`MoELayer` (random weights)."""
    model = LlamaModel(config)
    width = expert_intermediate_size or config.intermediate_size
    for layer in model.layers:
        layer.mlp = MoELayer(config.hidden_size, width, num_experts, top_k)
    return model.init_weights(seed=seed).eval()


# ---------------------------------------------------------------------------
# expert parallelism
# ---------------------------------------------------------------------------

def _ep_worker(rank: int, world: int, layer_state: dict, shape: tuple, x: torch.Tensor,
               placement: list[list[int]], router_bias, repeats: int) -> dict:
    hidden, inter, num_experts, top_k = shape
    full = MoELayer(hidden, inter, num_experts, top_k)
    full.load_state_dict(layer_state)
    full.router_bias = router_bias
    mine = {e: full.experts[e] for e in placement[rank]}  # this rank keeps only its experts
    router = full.router
    del full
    holders: dict[int, list[int]] = {}
    for r, experts in enumerate(placement):
        for e in experts:
            holders.setdefault(e, []).append(r)
    tokens = x.tensor_split(world)[rank]  # this rank's share of the batch
    times, received = [], 0
    with torch.no_grad():
        for _ in range(repeats):
            logits = router(tokens) + (router_bias if router_bias is not None else 0)
            weights, experts = route(logits, top_k)
            pair_token = torch.arange(tokens.shape[0]).repeat_interleave(top_k)
            pair_expert = experts.reshape(-1)
            pair_weight = weights.reshape(-1)
            # which copy serves each pair: spread a popular expert's pairs over its holders
            dest = torch.tensor([holders[int(e)][i % len(holders[int(e)])]
                                 for i, e in enumerate(pair_expert.tolist())], dtype=torch.long)
            order = dest.argsort(stable=True)
            send_counts = torch.bincount(dest, minlength=world)
            recv_counts = torch.empty_like(send_counts)
            dist.all_to_all_single(recv_counts, send_counts)
            send_x = tokens[pair_token[order]]
            send_e = pair_expert[order]
            n_in = int(recv_counts.sum())
            recv_x = torch.empty(n_in, hidden)
            recv_e = torch.empty(n_in, dtype=torch.long)
            splits_out, splits_in = send_counts.tolist(), recv_counts.tolist()
            dist.all_to_all_single(recv_x, send_x, splits_in, splits_out)
            dist.all_to_all_single(recv_e, send_e, splits_in, splits_out)
            t0 = time.perf_counter()
            y = torch.empty_like(recv_x)
            for e, expert in mine.items():
                idx = (recv_e == e).nonzero(as_tuple=True)[0]
                if idx.numel():
                    y[idx] = expert(recv_x[idx])
            times.append(time.perf_counter() - t0)
            back = torch.empty(send_x.shape[0], hidden)
            dist.all_to_all_single(back, y, splits_out, splits_in)
            out = torch.zeros_like(tokens)
            out.index_add_(0, pair_token[order], back * pair_weight[order, None])
            received = n_in
    return {"out": out, "pairs_received": received, "expert_seconds": sorted(times)[len(times) // 2],
            "experts_held": placement[rank]}


def expert_parallel_forward(layer: MoELayer, x: torch.Tensor, world_size: int,
                            replicas: dict[int, int] | None = None, repeats: int = 1,
                            timeout: float = DEFAULT_TIMEOUT_S) -> tuple[torch.Tensor, list[dict]]:
    """Run ``layer`` on ``x [tokens, hidden]`` across ``world_size`` processes with ``all_to_all_single``.

    Each rank holds ``E / world`` experts (:func:`servelab.moe.place_experts`,
    ``replicas={e: copies}`` adds copies of popular experts) and a slice of the
    tokens. Returns the output (ranks' slices in order) and, per rank, the
    (token, expert) pairs it served and the median seconds its experts took
    over ``repeats`` runs.
    """
    if x.dim() != 2 or x.shape[-1] != layer.hidden_size:
        raise ValueError(f"x must be [tokens, {layer.hidden_size}], got {tuple(x.shape)}")
    placement = place_experts(layer.num_experts, world_size, replicas)
    state = {k: v.detach() for k, v in layer.state_dict().items()}
    shape = (layer.hidden_size, layer.experts[0].gate_proj.out_features, layer.num_experts, layer.top_k)
    results = launch(_ep_worker, world_size,
                     (state, shape, x.detach(), placement, layer.router_bias, repeats), timeout)
    return torch.cat([r["out"] for r in results]), results
