"""Synthetic offline workloads: many requests, lengths with a long tail.

Real chat traffic is lopsided: most prompts and answers are short, a few are
very long. Static batching suffers from exactly that tail (a wave waits for its
longest member), so a fair benchmark has to include it:

* prompt lengths ~ log-normal (median ``prompt_median``, spread ``prompt_sigma``),
* output lengths ~ exponential (mean ``output_mean``), capped at ``output_cap``.

Token ids are random; with random-weight models the content does not matter,
and ``ignore_eos`` makes every request produce exactly its drawn length.

The request mix (:func:`mixed_workload`) and :func:`percentile` live in
:mod:`servelab.workload` (re-exported here); this module keeps the arithmetic of
static waves against continuous batching.
"""
from __future__ import annotations

import math

from servelab.workload import WorkloadRequest, mixed_workload, percentile  # one module for workloads

__all__ = ["WorkloadRequest", "mixed_workload", "percentile", "expected_longest",
           "static_over_continuous_steps"]



def expected_longest(n: int, cap: float | None = None) -> float:
    """Expected longest of ``n`` exponential output lengths, in units of their mean.

    Uncapped it is H_n = 1 + 1/2 + ... + 1/n (the minimum of n exponentials has
    mean 1/n, the gap to the next 1/(n-1), and so on). A static wave of n members
    runs for its longest member, so on average it lasts H_n mean lengths while
    each member needed one: about 3.4 at 16 seats, 4.1 at 32, 4.7 at 64.

    ``cap`` (in mean lengths, e.g. ``output_cap / output_mean``) caps every length,
    as ``mixed_workload`` does; then the longest is at most ``cap`` and the
    result is the integral of P(longest > t) = 1 - (1 - e^-t)^n from 0 to cap.
    The cap matters once H_n nears it: with a cap of 2.67 means the longest of
    64 is about 2.67, not 4.7.
    """
    if n < 1:
        raise ValueError(f"need at least one member, got n={n}")
    if cap is None:
        return sum(1 / k for k in range(1, n + 1))
    if not cap > 0:
        raise ValueError(f"cap is in mean lengths and must be > 0, got cap={cap}")
    steps = 2000  # Simpson's rule; the integrand is smooth and lies in [0, 1]
    h = cap / steps

    def tail(t: float) -> float:
        return 1 - (1 - math.exp(-t)) ** n

    inner = sum((4 if i % 2 else 2) * tail(i * h) for i in range(1, steps))
    return h / 3 * (tail(0.0) + inner + tail(cap))


def static_over_continuous_steps(requests: int, seats: int, cap: float | None = None) -> float:
    """Predicted decode steps of static waves over continuous batching, all requests at t=0.

    A simple model of exponential output lengths (mean 1, optionally capped at
    ``cap`` means), prefill ignored. Static batching runs ``requests / seats``
    waves, each lasting the longest of ``seats`` (``expected_longest``).
    Continuous batching keeps every seat busy, about ``requests / seats - 1``
    mean lengths, until the queue is empty; then its last ``seats`` requests
    drain, and by memorylessness that drain also lasts about the longest of
    ``seats``. So the ratio is w L / (w - 1 + L) with w waves and L the longest:
    it tends to L only when there are many waves, and is near 1 with one wave.
    """
    if requests < 1 or seats < 1:
        raise ValueError(f"need requests >= 1 and seats >= 1, got {requests}, {seats}")
    waves = requests / seats
    if waves < 1:
        raise ValueError(f"fewer requests ({requests}) than seats ({seats}): one partial wave; "
                         "pass seats <= requests")
    longest = expected_longest(seats, cap)
    return waves * longest / (waves - 1 + longest)
