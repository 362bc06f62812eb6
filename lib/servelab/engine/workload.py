"""Synthetic offline workloads: many requests, lengths with a long tail.

Real chat traffic is lopsided: most prompts and answers are short, a few are
very long. Static batching suffers from exactly that tail (a wave waits for its
longest member), so a fair benchmark has to include it:

* prompt lengths ~ log-normal (median ``prompt_median``, spread ``prompt_sigma``),
* output lengths ~ exponential (mean ``output_mean``), capped at ``output_cap``.

Token ids are random; with random-weight models the content does not matter,
and ``ignore_eos`` makes every request produce exactly its drawn length.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass

__all__ = ["WorkloadRequest", "mixed_workload", "percentile", "expected_longest"]



@dataclass(frozen=True)
class WorkloadRequest:
    prompt_token_ids: list[int]
    max_tokens: int


def mixed_workload(n: int, *, vocab_size: int, seed: int = 0, prompt_median: float = 128,
                   prompt_sigma: float = 0.8, prompt_min: int = 8, prompt_max: int = 1024,
                   output_mean: float = 96, output_cap: int = 512) -> list[WorkloadRequest]:
    """``n`` requests with log-normal prompts and capped exponential outputs."""
    if n < 0 or vocab_size <= 0:
        raise ValueError(f"need n >= 0 and vocab_size > 0, got n={n}, vocab_size={vocab_size}")
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        p = int(min(max(rng.lognormvariate(math.log(prompt_median), prompt_sigma), prompt_min), prompt_max))
        o = int(min(max(round(rng.expovariate(1 / output_mean)), 1), output_cap))
        out.append(WorkloadRequest([rng.randrange(vocab_size) for _ in range(p)], o))
    return out


def percentile(values, q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation (numpy's default)."""
    xs = sorted(values)
    if not xs:
        raise ValueError("percentile of an empty list")
    k = (len(xs) - 1) * q / 100
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def expected_longest(n: int) -> float:
    """Expected longest of ``n`` exponential output lengths, in units of their mean: H_n.

    H_n = 1 + 1/2 + ... + 1/n (the minimum of n exponentials has mean 1/n, the
    gap to the next 1/(n-1), and so on). A static wave of n members runs for its
    longest member, so on average it lasts H_n mean lengths while each member
    needed one: about 3.4 at 16 seats, 4.1 at 32, 4.7 at 64. The cap on output
    length trims this a little.
    """
    if n < 1:
        raise ValueError(f"need at least one member, got n={n}")
    return sum(1 / k for k in range(1, n + 1))
