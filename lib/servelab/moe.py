"""Mixture of experts: the arithmetic of coverage, bytes read and load (pure Python + numpy).

A mixture-of-experts (MoE) layer holds ``E`` expert MLPs; a router picks ``k``
of them for each token. Three facts follow, each a function here:

* **Coverage.** If each token picks ``k`` distinct experts uniformly, a given
  expert is untouched by one token with probability ``1 - k/E``, by a batch of
  ``B`` tokens with probability ``(1 - k/E)^B``. So a step reads a fraction
  ``1 - (1 - k/E)^B`` of the experts (:func:`coverage`): 3% for one token of
  DeepSeek-V3 (8 of 256), 87% at 64 tokens (13% untouched), nearly all at 256.
  :func:`simulate_coverage` routes random tokens and counts, to check the formula.
* **Bytes vs compute.** Per step the chip reads the shared weights plus the
  covered experts (:func:`bytes_read_per_step`): at serving batch sizes that is
  close to a dense model of the *total* size, while the arithmetic per token
  stays at the *active* size.
* **Load.** With experts spread over ranks (expert parallelism), a rank's work
  is the tokens its experts receive; the slowest rank sets the step
  (:func:`rank_loads`). Copying a popular expert onto another rank splits its
  tokens (:func:`place_experts` with ``replicas``).

The torch layer (router, top-k, softmax blend), a tiny MoE variant of the course
model and expert parallelism over processes live in
:mod:`servelab.parallel.experts`; ``servelab.moe.MoELayer`` etc. load it on first use.
"""
from __future__ import annotations

from typing import Mapping, Sequence

from servelab.specs import ModelConfig, get_model

__all__ = [
    "coverage", "untouched_fraction", "experts_touched", "simulate_coverage", "routing_counts",
    "bytes_read_per_step", "place_experts", "rank_loads", "load_imbalance", "zipf_probs",
]

_TORCH_NAMES = {"MoELayer", "moe_model", "expert_parallel_forward", "route"}


def __getattr__(name):  # the torch half, imported only when asked for
    if name in _TORCH_NAMES:
        from servelab.parallel import experts
        return getattr(experts, name)
    raise AttributeError(f"module 'servelab.moe' has no attribute {name!r}")


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


def bytes_read_per_step(model: ModelConfig | str | Mapping, batch: int, bytes_per_param: float = 1.0) -> dict:
    """Weight bytes one decode step of ``batch`` tokens reads, vs what it computes with.

    ``read = (total - experts + coverage(B) * experts) * bytes``: attention,
    shared experts, embeddings and head are read in full every step; of the
    routed experts, only the covered fraction. ``active_bytes`` is what one token
    multiplies by (the compute side). For a dense model ``read == total``.
    """
    from servelab.arith import count_params

    if isinstance(model, Mapping):
        model = ModelConfig.from_hf_dict(model)
    c = get_model(model)
    _check_batch(batch)
    if not bytes_per_param > 0:
        raise ValueError(f"bytes_per_param must be positive, got {bytes_per_param!r}")
    p = count_params(c)
    cov = coverage(c.num_experts_per_tok, c.num_experts, batch) if c.is_moe else 1.0
    read = (p.total - p.experts + cov * p.experts) * bytes_per_param
    return {"coverage": cov, "read_bytes": read, "total_bytes": p.total * bytes_per_param,
            "active_bytes": p.active * bytes_per_param, "read_share_of_total": read / (p.total * bytes_per_param)}


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
    """``max / mean`` of the ranks' loads: how much longer the step takes than a balanced one."""
    if not loads:
        raise ValueError("loads is empty")
    mean = sum(loads) / len(loads)
    return max(loads) / mean if mean else 1.0
