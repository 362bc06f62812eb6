"""Mixture of experts: the arithmetic of coverage, bytes read and load (pure Python + numpy).

A mixture-of-experts (MoE) layer holds ``E`` expert MLPs; a router picks ``k``
of them for each token. Four facts follow, each a function here:

* **Coverage.** If each token picks ``k`` distinct experts uniformly, a given
  expert is untouched by one token with probability ``1 - k/E``, by a batch of
  ``B`` tokens with probability ``(1 - k/E)^B``. So a step reads a fraction
  ``1 - (1 - k/E)^B`` of the experts (:func:`coverage`): 3% for one token of
  DeepSeek-V3 (8 of 256), 87% at 64 tokens (13% untouched), nearly all at 256.
  :func:`simulate_coverage` routes random tokens and counts, to check the formula.
* **Bytes vs compute.** Per step a replica reads the non-expert weights plus the
  covered experts (:func:`bytes_read_per_step`): one token reads only its active
  weights, but at serving batch sizes the step reads close to the *total*, while
  the arithmetic per token stays at the *active* size. Under expert parallelism
  (``chips``) attention runs data-parallel: every chip keeps a full copy of the
  non-expert weights and reads it each step, plus its share of the experts.
* **Load and its cost.** With experts spread over ranks, a rank's work is the
  (token, expert) pairs its experts receive (:func:`rank_loads`); the slowest
  rank sets the step. What the imbalance costs depends on the regime
  (:func:`rank_expert_seconds`, :func:`imbalance_cost`): a rank's expert time
  is ``max(weight read, pairs x 2 x expert FLOPs / peak)``. Below the ridge
  (:func:`ridge_tokens_per_expert`: about 295 tokens per expert on an H100) the
  weight read wins, so a busy rank costs little more than an idle one, and a
  copy of a hot expert (:func:`place_experts` with ``replicas``) adds a weight
  read to the rank that takes it. Above the ridge time follows the pairs, and
  :func:`load_imbalance` (max / mean pairs) is the step's slowdown.
* **Capacity.** Training-era MoEs (GShard, Switch) give each expert a fixed
  capacity, ``capacity_factor x B x k / E`` slots (:func:`expert_capacity`), and
  drop the pairs beyond it (:func:`dropped_pairs`). Serving engines run dropless:
  every pair is computed, and the busiest expert's rank pays for it in time.

The torch layer (router, top-k, softmax blend), a tiny MoE variant of the course
model and expert parallelism over processes live in
:mod:`servelab.parallel.experts`, which builds on these calculators (this module
never imports it: the layering runs one way).
"""
from __future__ import annotations

from typing import Mapping, Sequence

import math

from servelab.specs import Chip, ModelConfig, get_chip, get_model

__all__ = [
    "coverage", "untouched_fraction", "experts_touched", "simulate_coverage", "routing_counts",
    "bytes_read_per_step", "place_experts", "rank_loads", "load_imbalance", "zipf_probs",
    "expert_params_per_layer", "ridge_tokens_per_expert", "rank_expert_seconds", "imbalance_cost",
    "expert_capacity", "dropped_pairs",
]

def _check_k_e(k, num_experts) -> None:
    for name, v in (("k", k), ("num_experts", num_experts)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    if k > num_experts:
        raise ValueError(f"k={k} experts per token cannot exceed num_experts={num_experts} "
                         "(did you swap k and E?)")


def _check_batch(batch) -> None:
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 0:
        raise ValueError(f"batch must be a whole number of tokens >= 0, got {batch!r}")


def untouched_fraction(k: int, num_experts: int, batch: int) -> float:
    """``(1 - k/E)^B``: chance that a given expert is picked by none of ``B`` tokens."""
    _check_k_e(k, num_experts)
    _check_batch(batch)
    return (1 - k / num_experts) ** batch


def coverage(k: int, num_experts: int, batch: int) -> float:
    """``1 - (1 - k/E)^B``: expected fraction of experts a batch of ``B`` tokens reads."""
    return 1 - untouched_fraction(k, num_experts, batch)


def experts_touched(k: int, num_experts: int, batch: int) -> float:
    """Expected number of distinct experts a batch reads: ``E * coverage``."""
    return num_experts * coverage(k, num_experts, batch)


def zipf_probs(num_experts: int, skew: float) -> list[float]:
    """Router popularity ``p_e ~ 1 / (e + 1)^skew`` (``skew=0`` is uniform)."""
    if isinstance(num_experts, bool) or not isinstance(num_experts, int) or num_experts < 1:
        raise ValueError(f"num_experts must be a positive integer, got {num_experts!r}")
    if skew < 0:
        raise ValueError(f"skew must be >= 0, got {skew!r}")
    w = [1 / (e + 1) ** skew for e in range(num_experts)]
    total = sum(w)
    return [x / total for x in w]


def _route(rng, k: int, num_experts: int, batch: int, probs):
    """``[batch, k]`` distinct expert ids per token."""
    import numpy as np

    if probs is None:
        # k distinct of E, uniformly: argsort of random keys
        return np.argsort(rng.random((batch, num_experts)), axis=1)[:, :k]
    p = np.asarray(probs, dtype=float)
    # weighted sampling without replacement (Efraimidis-Spirakis keys)
    keys = rng.random((batch, num_experts)) ** (1 / p)
    return np.argsort(-keys, axis=1)[:, :k]


def routing_counts(k: int, num_experts: int, batch: int, seed: int = 0,
                   probs: Sequence[float] | None = None) -> list[int]:
    """Tokens each expert receives when ``batch`` tokens each pick ``k`` distinct experts.

    ``probs`` (e.g. :func:`zipf_probs`) makes some experts popular; None is uniform.
    """
    import numpy as np

    _check_k_e(k, num_experts)
    _check_batch(batch)
    if probs is not None and len(probs) != num_experts:
        raise ValueError(f"probs has {len(probs)} entries for {num_experts} experts")
    rng = np.random.default_rng(seed)
    choice = _route(rng, k, num_experts, batch, probs)
    return np.bincount(choice.ravel(), minlength=num_experts).tolist()


def simulate_coverage(k: int, num_experts: int, batch: int, trials: int = 200, seed: int = 0,
                      probs: Sequence[float] | None = None) -> float:
    """Mean fraction of experts touched over ``trials`` random batches (routing simulated)."""
    import numpy as np

    _check_k_e(k, num_experts)
    _check_batch(batch)
    if isinstance(trials, bool) or not isinstance(trials, int) or trials < 1:
        raise ValueError(f"trials must be a positive integer, got {trials!r}")
    rng = np.random.default_rng(seed)
    total = 0
    for _ in range(trials):
        choice = _route(rng, k, num_experts, batch, probs) if batch else np.empty((0, k), dtype=int)
        total += len(np.unique(choice))
    return total / (trials * num_experts)


def _model(model: ModelConfig | str | Mapping) -> ModelConfig:
    if isinstance(model, Mapping):
        model = ModelConfig.from_hf_dict(model)
    return get_model(model)


def bytes_read_per_step(model: ModelConfig | str | Mapping, batch: int, bytes_per_param: float = 1.0,
                        chips: int = 1) -> dict:
    """Weight bytes one decode step of ``batch`` tokens reads, vs what it computes with.

    ``read = (total - experts + coverage(B) * experts) * bytes``: attention,
    shared experts, embeddings and head are read in full every step; of the
    routed experts, only the covered fraction. ``active_bytes`` is what one token
    multiplies by (the compute side). For a dense model ``read == total``.

    ``chips`` spreads the routed experts over that many chips (expert
    parallelism) with attention data-parallel, as MoE deployments run it: each
    chip serves its own people's attention, so it keeps and reads a full copy of
    every non-expert weight (``dense_bytes``), plus ``1 / chips`` of the covered
    experts. ``batch`` is then the tokens of the whole group's step.
    ``read_bytes_per_chip`` is what one chip reads; ``read_bytes_all_chips``
    counts the replicated copies too (``read_bytes`` counts each weight once).
    """
    from servelab.arith import count_params

    c = _model(model)
    _check_batch(batch)
    if not bytes_per_param > 0:
        raise ValueError(f"bytes_per_param must be positive, got {bytes_per_param!r}")
    if isinstance(chips, bool) or not isinstance(chips, int) or chips < 1:
        raise ValueError(f"chips must be a positive integer, got {chips!r}")
    p = count_params(c)
    cov = coverage(c.num_experts_per_tok, c.num_experts, batch) if c.is_moe else 1.0
    dense = (p.total - p.experts) * bytes_per_param
    experts_read = cov * p.experts * bytes_per_param
    read = dense + experts_read
    return {"coverage": cov, "read_bytes": read, "total_bytes": p.total * bytes_per_param,
            "active_bytes": p.active * bytes_per_param, "read_share_of_total": read / (p.total * bytes_per_param),
            "chips": chips, "dense_bytes": dense, "expert_bytes_read": experts_read,
            "read_bytes_per_chip": dense + experts_read / chips,
            "read_bytes_all_chips": dense * chips + experts_read}


def place_experts(num_experts: int, ranks: int, replicas: Mapping[int, int] | None = None) -> list[list[int]]:
    """Which experts each rank holds: round-robin blocks, plus extra copies.

    Expert ``e`` lives on rank ``e // (E / ranks)``. ``replicas={e: n}`` puts
    ``n - 1`` more copies of expert ``e`` on the ranks after its home (wrapping).
    """
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        raise ValueError(f"ranks must be a positive integer, got {ranks!r}")
    _check_k_e(1, num_experts)
    if num_experts % ranks:
        raise ValueError(f"num_experts={num_experts} must divide by ranks={ranks} "
                         "(each rank holds the same number of experts)")
    per = num_experts // ranks
    placement = [list(range(r * per, (r + 1) * per)) for r in range(ranks)]
    for e, n in (replicas or {}).items():
        if not 0 <= e < num_experts:
            raise ValueError(f"replicas names expert {e}, outside [0, {num_experts})")
        if not 1 <= n <= ranks:
            raise ValueError(f"expert {e}: {n} copies; need 1 to {ranks} (one per rank at most)")
        home = e // per
        for j in range(1, n):
            placement[(home + j) % ranks].append(e)
    return placement


def rank_loads(expert_tokens: Sequence[int], placement: Sequence[Sequence[int]]) -> list[float]:
    """Tokens each rank processes: every expert's tokens split evenly over its copies."""
    holders: dict[int, int] = {}
    for experts in placement:
        for e in experts:
            holders[e] = holders.get(e, 0) + 1
    missing = [e for e in range(len(expert_tokens)) if e not in holders]
    if missing:
        raise ValueError(f"experts {missing[:5]} are on no rank; every expert needs a home")
    return [sum(expert_tokens[e] / holders[e] for e in experts) for experts in placement]


def load_imbalance(loads: Sequence[float]) -> float:
    """``max / mean`` of the ranks' loads (tokens or pairs).

    The step's slowdown only when every rank is compute-bound (above
    :func:`ridge_tokens_per_expert`); below it a rank's time is its weight read,
    and :func:`imbalance_cost` gives the slowdown.
    """
    if not loads:
        raise ValueError("loads is empty")
    mean = sum(loads) / len(loads)
    return max(loads) / mean if mean else 1.0


# ---------------------------------------------------------------------------
# What an uneven load costs: max(weight read, arithmetic) per rank
# ---------------------------------------------------------------------------

def expert_params_per_layer(model: ModelConfig | str | Mapping) -> float:
    """Parameters of one routed expert in one MoE layer (DeepSeek-V3: 3 x 7,168 x 2,048 = 44M)."""
    from servelab.arith import count_params

    c = _model(model)
    if not c.is_moe:
        raise ValueError(f"{c.name} is not a mixture of experts (num_experts={c.num_experts})")
    moe_layers = c.num_hidden_layers - c.first_k_dense_replace
    return count_params(c).experts / (c.num_experts * moe_layers)


def _chip_rates(chip: Chip | str, dtype: str, bytes_per_param: float) -> tuple[float, float]:
    if not bytes_per_param > 0:
        raise ValueError(f"bytes_per_param must be positive, got {bytes_per_param!r}")
    c = get_chip(chip)
    return c.hbm_bandwidth, c.peak_flops(dtype)


def ridge_tokens_per_expert(chip: Chip | str, dtype: str = "fp8", bytes_per_param: float = 1.0) -> float:
    """Tokens an expert must serve per weight read before arithmetic, not the read, sets its time.

    Reading ``P`` weights takes ``P x bytes / bandwidth``; ``T`` tokens take
    ``2 T P / peak``. They are equal at ``T = peak x bytes / (2 x bandwidth)``:
    295 on an H100 (fp8 weights at fp8 rate, or bf16 at bf16 rate). Spec-sheet
    peaks; real kernels reach the ridge somewhat later.
    """
    bw, peak = _chip_rates(chip, dtype, bytes_per_param)
    return peak * bytes_per_param / (2 * bw)


def rank_expert_seconds(expert_tokens: Sequence[float], placement: Sequence[Sequence[int]],
                        expert_params: float, chip: Chip | str, bytes_per_param: float = 1.0,
                        dtype: str = "fp8") -> list[float]:
    """Seconds each rank spends on its experts in one step: ``max(weight read, arithmetic)``.

    A rank reads every expert copy it holds that received at least one token
    (``expert_params x bytes_per_param`` each) and does ``2 x expert_params``
    operations per (token, expert) pair it serves (:func:`rank_loads`: a copied
    expert's tokens split evenly over its copies). The roofline of the rank's
    whole expert kernel: whichever of the two takes longer sets its time.
    """
    if not expert_params > 0:
        raise ValueError(f"expert_params must be positive, got {expert_params!r}")
    bw, peak = _chip_rates(chip, dtype, bytes_per_param)
    pairs = rank_loads(expert_tokens, placement)
    out = []
    for experts, n in zip(placement, pairs):
        read = sum(1 for e in experts if expert_tokens[e] > 0) * expert_params * bytes_per_param / bw
        out.append(max(read, 2 * n * expert_params / peak))
    return out


def imbalance_cost(expert_tokens: Sequence[float], placement: Sequence[Sequence[int]],
                   expert_params: float, chip: Chip | str, bytes_per_param: float = 1.0,
                   dtype: str = "fp8") -> float:
    """The expert part of the step against a perfectly balanced one: ``max(rank seconds) / balanced``.

    Balanced: every rank holds ``E / ranks`` experts (one copy each) and serves
    the mean of the pairs. Above the ridge this is close to
    :func:`load_imbalance`; below it, close to the ratio of weight reads: an
    uneven load costs little, and each copy of a hot expert adds a read.
    """
    times = rank_expert_seconds(expert_tokens, placement, expert_params, chip, bytes_per_param, dtype)
    bw, peak = _chip_rates(chip, dtype, bytes_per_param)
    ranks, experts = len(placement), len(expert_tokens)
    mean_pairs = sum(expert_tokens) / ranks
    balanced = max(experts / ranks * expert_params * bytes_per_param / bw, 2 * mean_pairs * expert_params / peak)
    return max(times) / balanced


# ---------------------------------------------------------------------------
# Capacity and dropped tokens (GShard, Switch) versus dropless serving
# ---------------------------------------------------------------------------

def expert_capacity(batch: int, k: int, num_experts: int, capacity_factor: float = 1.25) -> int:
    """Slots each expert gets in a capacity-limited MoE: ``ceil(capacity_factor x B x k / E)``.

    ``capacity_factor = 1`` is exactly the even share; Switch Transformer trained
    with 1.0 to 1.25. Pairs beyond an expert's capacity are dropped
    (:func:`dropped_pairs`): the token skips that expert and rides the residual.
    """
    _check_k_e(k, num_experts)
    _check_batch(batch)
    if isinstance(capacity_factor, bool) or not capacity_factor > 0:
        raise ValueError(f"capacity_factor must be positive, got {capacity_factor!r}")
    return math.ceil(capacity_factor * batch * k / num_experts - 1e-9)


def dropped_pairs(expert_tokens: Sequence[int], capacity: int) -> int:
    """(token, expert) pairs over capacity: what a capacity-limited MoE drops, a dropless one computes."""
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 0:
        raise ValueError(f"capacity must be a whole number of slots >= 0, got {capacity!r}")
    return int(sum(max(0, t - capacity) for t in expert_tokens))
