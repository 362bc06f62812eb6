"""Sizing a dedicated serving pool: seats, first-token time, decode rate and the monthly bill.

A dedicated pool is one tensor-parallel node per replica, rented by the hour and
sized for the peak minute. Four knobs (seats per replica, model tier, prompt
length, prefix-cache hit rate) and a workload (peak arrivals, answer length)
give the pool lab's readouts. Every step is an existing calculator:

- seats granted: :func:`servelab.kvcache.kv_calculator` at the KV tokens a seat holds;
- first-token time: prefill of the cache-miss tokens at 2 x parameters operations
  each, at an efficiency of the chips' bf16 peak (:func:`servelab.arith.prefill_seconds`);
- decode rate: the step-time model (:func:`servelab.roofline.decode_step_seconds`):
  weights plus every seat's cache read at an efficiency of peak bandwidth;
- replicas: Little's law, peak arrivals x request duration / seats, rounded up.

Defaults reproduce the seed's pool lab: 16 seats, 1,200-token prompt, 30% prefix
hits -> 840 cache-miss tokens, ~22k KV tokens in use of ~464k, TTFT ~27 ms,
~1,698 tokens/s of aggregate decode and ~$2,913 a month. Pure Python.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from servelab import arith, kvcache, roofline

#: Hours in the billing month the seed lab uses (365 x 24 / 12 = 730).
HOURS_PER_MONTH = 730.0
#: Dollars per H100-hour of dedicated capacity. The seed lab does not print its
#: rate; $3.99 is the value that reproduces its $2,913 month on one card
#: (3.99 x 730 = 2,912.70). Pass your own quote as ``price_per_chip_hour``.
POOL_CHIP_HOURLY_USD = 3.99
#: Efficiencies of the seed's arithmetic: decode reads at 60% of peak
#: bandwidth, prefill computes at 50% of peak bf16 operations.
BANDWIDTH_EFFICIENCY = 0.6
COMPUTE_EFFICIENCY = 0.5


@dataclass(frozen=True)
class Workload:
    """Traffic at the peak minute and what each request looks like."""

    name: str
    peak_arrivals_per_s: float
    output_tokens: int
    slo_ttft_s: float = 1.2          # first token within 1,200 ms at p95
    budget_usd_per_month: float = 6500.0

    def __post_init__(self) -> None:
        if not self.peak_arrivals_per_s > 0:
            raise ValueError(f"{self.name}: peak_arrivals_per_s must be positive, got {self.peak_arrivals_per_s!r}")
        if not isinstance(self.output_tokens, int) or self.output_tokens <= 0:
            raise ValueError(f"{self.name}: output_tokens must be a positive whole number, got {self.output_tokens!r}")


#: The two workloads of the lab (the course's stated assumptions): a chat
#: product with short answers, and document analysis with long ones, rarer.
WORKLOADS = {
    "chat": Workload("chat", peak_arrivals_per_s=4.0, output_tokens=200),
    "documents": Workload("document analysis", peak_arrivals_per_s=0.5, output_tokens=600),
}


@dataclass(frozen=True)
class PoolReadout:
    workload: str
    requested_seats: int
    live_seats: int                 # what memory grants, at most the requested seats
    kv_tokens_per_seat: int         # prompt + answer
    kv_tokens_in_use: int
    kv_token_budget: int            # all the tokens the KV room holds
    miss_tokens: int                # prompt tokens prefilled on arrival
    ttft_s: float                   # prefill of the miss tokens, no queueing
    step_s: float
    per_seat_tokens_per_s: float
    aggregate_tokens_per_s: float
    request_seconds: float          # first token plus the whole answer
    replicas: int
    chips: int
    monthly_usd: float
    latency_ok: bool
    capacity_ok: bool
    cost_ok: bool

    def verdict(self) -> str:
        marks = {True: "pass", False: "FAIL"}
        return (f"{self.workload}: latency {marks[self.latency_ok]}, capacity {marks[self.capacity_ok]}, "
                f"cost {marks[self.cost_ok]}")


def size_pool(seats: int = 16, tier: str = "small", prompt_tokens: int = 1200, prefix_hit_rate: float = 0.30,
              workload: str | Workload = "chat", cache_dtype: str = "bf16",
              price_per_chip_hour: float = POOL_CHIP_HOURLY_USD) -> PoolReadout:
    """The pool lab: knobs and a workload in, seats / TTFT / decode rate / bill out."""
    if isinstance(seats, bool) or not isinstance(seats, int) or seats <= 0:
        raise ValueError(f"seats must be a positive whole number, got {seats!r}")
    if isinstance(prompt_tokens, bool) or not isinstance(prompt_tokens, int) or prompt_tokens <= 0:
        raise ValueError(f"prompt_tokens must be a positive whole number, got {prompt_tokens!r}")
    if not 0 <= prefix_hit_rate <= 1:
        raise ValueError(f"prefix_hit_rate is a fraction in [0, 1], got {prefix_hit_rate!r}")
    if not price_per_chip_hour > 0:
        raise ValueError(f"price_per_chip_hour must be positive, got {price_per_chip_hour!r}")
    w = WORKLOADS[workload] if isinstance(workload, str) and workload in WORKLOADS else workload
    if not isinstance(w, Workload):
        raise ValueError(f"unknown workload {workload!r}; choose one of {sorted(WORKLOADS)} or pass a Workload")
    t = kvcache.get_tier(tier)

    tokens_per_seat = prompt_tokens + w.output_tokens
    memory = kvcache.kv_calculator(t, cache_dtype, seq_len=tokens_per_seat, concurrent=seats)
    live = memory.seats_granted
    if live == 0:
        raise ValueError(f"not one seat of {tokens_per_seat:,} tokens fits in the KV room of the {t.label}: "
                         "shorten the prompt or answer, or use an fp8 cache")
    # Prefix hits skip prefill for the cached share of the prompt; the rest is computed.
    miss = round(prompt_tokens * (1 - prefix_hit_rate))
    ttft = (arith.prefill_seconds(arith.prefill_ops(t.num_params, miss), t.chip, t.num_chips,
                                  COMPUTE_EFFICIENCY, "bf16") if miss else 0.0)
    # Each live seat holds on average its full prompt plus the answer (the lab's ledger figure).
    step = roofline.decode_step_seconds(t.weights_bytes, memory.bytes_per_token, live, tokens_per_seat,
                                        t.num_chips * t.chip.hbm_bandwidth, BANDWIDTH_EFFICIENCY, overhead_s=0.0)
    per_seat = roofline.per_person_tokens_per_s(step)
    duration = ttft + w.output_tokens / per_seat
    # Little's law: requests in flight at the peak = arrivals x duration; each replica runs `live` of them.
    replicas = max(1, math.ceil(w.peak_arrivals_per_s * duration / live))
    chips = replicas * t.num_chips
    monthly = chips * price_per_chip_hour * HOURS_PER_MONTH
    return PoolReadout(
        workload=w.name, requested_seats=seats, live_seats=live, kv_tokens_per_seat=tokens_per_seat,
        kv_tokens_in_use=live * tokens_per_seat, kv_token_budget=memory.max_sequence_tokens,
        miss_tokens=miss, ttft_s=ttft, step_s=step, per_seat_tokens_per_s=per_seat,
        aggregate_tokens_per_s=roofline.replica_tokens_per_s(live, step), request_seconds=duration,
        replicas=replicas, chips=chips, monthly_usd=monthly,
        latency_ok=ttft <= w.slo_ttft_s, capacity_ok=live == seats,
        cost_ok=monthly <= w.budget_usd_per_month)


@dataclass(frozen=True)
class Failure:
    """A classic mis-sizing: knobs that break one check, and the change that fixes it."""

    title: str
    check: str        # "latency" | "capacity" | "cost"
    story: str
    broken: dict
    fix: dict


FAMOUS_FAILURES = {
    "quality upgrade": Failure(
        "The quality upgrade that blew the budget", "cost",
        "Swapping the 8B class for the 70B class doubles the cards per replica and more than "
        "doubles the cache per token; at the same traffic the pool needs four times the cards.",
        broken=dict(tier="large"), fix=dict(tier="small")),
    "timestamp in the preamble": Failure(
        "A fresh timestamp at the top of a shared 60k-token preamble", "latency",
        "One changed token at the start voids every cached block after it, so each arrival "
        "prefills the whole preamble again and the first token misses the SLO.",
        broken=dict(prompt_tokens=60_000, seats=4, prefix_hit_rate=0.0),
        fix=dict(prompt_tokens=60_000, seats=4, prefix_hit_rate=0.9)),
    "long prompts": Failure(
        "Long prompts crowd out the seats", "capacity",
        "At 30k tokens a seat's cache is large, so memory grants fewer seats than the scheduler "
        "asks for and the rest wait with no error; an fp8 cache doubles the seats.",
        broken=dict(prompt_tokens=30_000, seats=24), fix=dict(prompt_tokens=30_000, seats=24, cache_dtype="fp8")),
}


def famous_failure(name: str, workload: str | Workload = "chat") -> tuple[PoolReadout, PoolReadout]:
    """The broken and the fixed readouts of one famous failure."""
    try:
        f = FAMOUS_FAILURES[name]
    except KeyError:
        raise ValueError(f"unknown failure {name!r}; choose one of {sorted(FAMOUS_FAILURES)}") from None
    return size_pool(workload=workload, **f.broken), size_pool(workload=workload, **f.fix)
