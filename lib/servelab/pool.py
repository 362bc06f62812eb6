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
- replicas: Little's law, peak arrivals x request duration / seats, rounded up;
- the percentiles: the pool at its peak, simulated (:mod:`servelab.sim`): Poisson
  arrivals split over the replicas, each replica admitting, batching and queueing
  as the engine does, with the roofline step model of the tier. TTFT p95 and
  TPOT p95 include the wait for a seat and for other prompts' prefill.

Prefix hits are one shared prefix (a system prompt or a shared preamble), as
:func:`simulate_peak` models it: its blocks are held once for all seats
(chapter 13's shared blocks), and each seat holds only its cache-miss tokens and
its answer. A decode step still reads the whole context for every seat (a paged
attention kernel reads each sequence's blocks, shared or not).

Defaults follow a widely shared interview-prep pool lab: 16 seats, 1,200-token
prompt, 30% prefix hits -> 840 cache-miss tokens, ~464k KV tokens of room, TTFT ~27 ms,
~1,698 tokens/s of aggregate decode and ~$2,913 a month. (That lab charges every
seat its whole prompt, ~22k tokens in use; here the shared prefix is charged once.)
``spares`` adds whole replicas beyond the plan (N+1: one spare for a lost replica).
Pure Python + numpy.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from servelab import arith, kvcache, roofline

#: Hours in the billing month that pool lab uses (365 x 24 / 12 = 730).
HOURS_PER_MONTH = 730.0
#: Dollars per H100-hour of dedicated capacity. That pool lab does not print its
#: rate; $3.99 is the value that reproduces its $2,913 month on one card
#: (3.99 x 730 = 2,912.70). Pass your own quote as ``price_per_chip_hour``.
POOL_CHIP_HOURLY_USD = 3.99
#: Efficiencies of that lab's arithmetic: decode reads at 60% of peak
#: bandwidth, prefill computes at 50% of peak bf16 operations.
BANDWIDTH_EFFICIENCY = 0.6
COMPUTE_EFFICIENCY = 0.5


@dataclass(frozen=True)
class Workload:
    """Traffic at the peak minute and what each request looks like."""

    name: str
    peak_arrivals_per_s: float
    output_tokens: int
    prompt_tokens: int = 1200
    slo_ttft_s: float = 1.2          # first token within 1,200 ms at p95
    slo_tpot_s: float = 0.1          # a request's average gap between tokens (TPOT) under 100 ms, at p95
    budget_usd_per_month: float = 6500.0

    def __post_init__(self) -> None:
        if not self.peak_arrivals_per_s > 0:
            raise ValueError(f"{self.name}: peak_arrivals_per_s must be positive, got {self.peak_arrivals_per_s!r}")
        for field in ("output_tokens", "prompt_tokens"):
            v = getattr(self, field)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"{self.name}: {field} must be a positive whole number, got {v!r}")


#: The two workloads of the lab (the course's stated assumptions): a chat
#: product with short prompts and answers, and document analysis: rarer
#: requests, each carrying a long document and asking for a long answer.
WORKLOADS = {
    "chat": Workload("chat", peak_arrivals_per_s=4.0, output_tokens=200, prompt_tokens=1200),
    "documents": Workload("document analysis", peak_arrivals_per_s=0.5, output_tokens=600, prompt_tokens=20_000),
}

#: Batching policies the pool can run (the scheduler of chapter 17).
POLICIES = ("continuous", "static")
#: Requests simulated per replica for the percentiles (a few minutes of peak traffic).
SIM_REQUESTS = 1500
#: The planner looks for replicas meeting the SLO up to this many times Little's law.
MAX_HEADROOM = 16


def _ms(seconds: float) -> str:
    """Milliseconds, or whole seconds once it is past ten (a queue that grows without bound)."""
    return f"{seconds * 1e3:,.0f} ms" if seconds < 10 else f"{seconds:,.0f} s"


@dataclass(frozen=True)
class PoolReadout:
    workload: str
    requested_seats: int
    live_seats: int                 # what memory grants, at most the requested seats
    kv_tokens_per_seat: int         # a seat's own tokens: cache-miss prompt tokens + answer
    kv_tokens_in_use: int           # the shared prefix once, plus every live seat's own tokens
    kv_token_budget: int            # all the tokens the KV room holds
    prompt_tokens: int
    miss_tokens: int                # prompt tokens prefilled on arrival
    ttft_s: float                   # prefill of the miss tokens alone, no queueing
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
    policy: str = "continuous"
    ttft_p50_s: float = math.nan    # simulated at the peak, queueing included
    ttft_p95_s: float = math.nan
    tpot_p50_s: float = math.nan
    tpot_p95_s: float = math.nan
    busy_share: float = math.nan    # share of the time a replica is computing
    littles_law_replicas: int = 0   # replicas by Little's law alone (every seat busy on average)
    shared_prefix_tokens: int = 0   # the cached prefix, held once per replica for all its seats
    spare_replicas: int = 0         # whole replicas beyond the plan (N+1), included in replicas and the bill

    def verdict(self) -> str:
        marks = {True: "pass", False: "FAIL"}
        return (f"{self.workload}: latency {marks[self.latency_ok]}, capacity {marks[self.capacity_ok]}, "
                f"cost {marks[self.cost_ok]}")

    @property
    def passes(self) -> bool:
        return self.latency_ok and self.capacity_ok and self.cost_ok

    def line(self) -> str:
        """One line of numbers for stories and tables."""
        return (f"TTFT p95 {_ms(self.ttft_p95_s)}, TPOT p95 {_ms(self.tpot_p95_s)}, "
                f"{self.live_seats}/{self.requested_seats} seats, {self.replicas} x {self.chips // self.replicas} "
                f"card(s), ${self.monthly_usd:,.0f}/month")


def _workload(workload) -> Workload:
    w = WORKLOADS[workload] if isinstance(workload, str) and workload in WORKLOADS else workload
    if not isinstance(w, Workload):
        raise ValueError(f"unknown workload {workload!r}; choose one of {sorted(WORKLOADS)} or pass a Workload")
    return w


def size_pool(seats: int = 16, tier: str = "small", prompt_tokens: int | None = None, prefix_hit_rate: float = 0.30,
              workload: str | Workload = "chat", cache_dtype: str = "bf16",
              price_per_chip_hour: float = POOL_CHIP_HOURLY_USD, policy: str = "continuous",
              simulate: bool = True, spares: int = 0) -> PoolReadout:
    """The pool lab: knobs and a workload in, seats / TTFT / decode rate / bill out.

    ``prompt_tokens`` defaults to the workload's own prompt length. Replicas
    start from Little's law (every seat busy on average). With ``simulate`` the
    pool is then simulated at its peak (:func:`simulate_peak`) and planned for
    the percentiles: the fewest replicas whose simulated TTFT p95 and TPOT p95
    meet the SLO (up to ``MAX_HEADROOM`` x Little's law); the latency check
    reads those p95s. Without ``simulate``, replicas are Little's law's and the
    latency check reads the prefill time alone (no queueing).

    The prefix hits are one shared prefix, held once: a seat holds its
    cache-miss tokens and its answer, and memory grants
    ``(room - shared prefix) // (miss + answer)`` seats. ``spares`` whole
    replicas are added after planning (N+1 keeps the SLO with one replica down)
    and billed; the cost check includes them.
    """
    if isinstance(seats, bool) or not isinstance(seats, int) or seats <= 0:
        raise ValueError(f"seats must be a positive whole number, got {seats!r}")
    w = _workload(workload)
    if prompt_tokens is None:
        prompt_tokens = w.prompt_tokens
    if isinstance(prompt_tokens, bool) or not isinstance(prompt_tokens, int) or prompt_tokens <= 0:
        raise ValueError(f"prompt_tokens must be a positive whole number, got {prompt_tokens!r}")
    if not 0 <= prefix_hit_rate <= 1:
        raise ValueError(f"prefix_hit_rate is a fraction in [0, 1], got {prefix_hit_rate!r}")
    if not price_per_chip_hour > 0:
        raise ValueError(f"price_per_chip_hour must be positive, got {price_per_chip_hour!r}")
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    if isinstance(spares, bool) or not isinstance(spares, int) or spares < 0:
        raise ValueError(f"spares must be a whole number of replicas, 0 or more, got {spares!r}")
    t = kvcache.get_tier(tier)

    tokens_per_seat = prompt_tokens + w.output_tokens      # the context a seat's decode step reads
    # Prefix hits skip prefill for the cached share of the prompt; the rest is computed.
    miss = round(prompt_tokens * (1 - prefix_hit_rate))
    shared = prompt_tokens - miss                          # one shared prefix, held once
    own = miss + w.output_tokens                           # what each seat adds to memory
    memory = kvcache.kv_calculator(t, cache_dtype, seq_len=tokens_per_seat, concurrent=seats)
    budget = memory.max_sequence_tokens
    live = min(seats, max(0, (budget - shared) // own)) if budget >= shared + own else 0
    if live == 0:
        raise ValueError(f"not one seat of {tokens_per_seat:,} tokens fits in the KV room of the {t.label}: "
                         "shorten the prompt or answer, or use an fp8 cache")
    ttft = (arith.prefill_seconds(arith.prefill_ops(t.num_params, miss), t.chip, t.num_chips,
                                  COMPUTE_EFFICIENCY, "bf16") if miss else 0.0)
    # Each live seat's attention reads its whole context, shared prefix included.
    step = roofline.decode_step_seconds(t.weights_bytes, memory.bytes_per_token, live, tokens_per_seat,
                                        t.num_chips * t.chip.hbm_bandwidth, BANDWIDTH_EFFICIENCY, overhead_s=0.0)
    per_seat = roofline.per_person_tokens_per_s(step)
    duration = ttft + w.output_tokens / per_seat
    # Little's law: requests in flight at the peak = arrivals x duration; each replica runs `live` of them.
    littles = max(1, math.ceil(w.peak_arrivals_per_s * duration / live))
    sim = {}
    replicas = littles
    if simulate:
        def run(n):
            return simulate_peak(w.peak_arrivals_per_s / n, live, prompt_tokens, w.output_tokens, miss,
                                 memory.max_sequence_tokens, tier if isinstance(tier, str) else "small",
                                 cache_dtype, policy)

        def ok(p):
            return p[1] <= w.slo_ttft_s and p[3] <= w.slo_tpot_s

        # Plan for the percentiles: the fewest replicas (from Little's law up) whose p95s meet the SLO.
        # Hopeless cases stop early: the prefill alone, or a lone stream's pace, already misses it.
        p = run(littles)
        hopeless = ttft > w.slo_ttft_s or step > w.slo_tpot_s
        if not ok(p) and not hopeless:
            lo, hi = littles, None
            n = littles
            while n < littles * MAX_HEADROOM:
                n = min(n * 2, littles * MAX_HEADROOM)
                if ok(run(n)):
                    hi = n
                    break
                lo = n
            if hi is not None:
                while hi - lo > 1:
                    mid = (lo + hi) // 2
                    lo, hi = (lo, mid) if ok(run(mid)) else (mid, hi)
                replicas = hi
                p = run(hi)
        sim = dict(ttft_p50_s=p[0], ttft_p95_s=p[1], tpot_p50_s=p[2], tpot_p95_s=p[3], busy_share=p[4])
        latency_ok = ok(p)
    else:
        latency_ok = ttft <= w.slo_ttft_s
    replicas += spares
    chips = replicas * t.num_chips
    monthly = chips * price_per_chip_hour * HOURS_PER_MONTH
    return PoolReadout(
        workload=w.name, requested_seats=seats, live_seats=live, kv_tokens_per_seat=own,
        kv_tokens_in_use=shared + live * own, kv_token_budget=budget,
        prompt_tokens=prompt_tokens, miss_tokens=miss, ttft_s=ttft, step_s=step, per_seat_tokens_per_s=per_seat,
        aggregate_tokens_per_s=roofline.replica_tokens_per_s(live, step), request_seconds=duration,
        replicas=replicas, chips=chips, monthly_usd=monthly,
        latency_ok=latency_ok, capacity_ok=live == seats,
        cost_ok=monthly <= w.budget_usd_per_month, policy=policy, littles_law_replicas=littles,
        shared_prefix_tokens=shared, spare_replicas=spares, **sim)


def pool_step_model(tier: str = "small", cache_dtype: str = "bf16"):
    """The roofline step model of a pool tier, at the lab's efficiencies and no fixed overhead."""
    from servelab.sim import RooflineStepModel
    return RooflineStepModel.for_tier(tier, cache_dtype=cache_dtype, bandwidth_efficiency=BANDWIDTH_EFFICIENCY,
                                      compute_efficiency=COMPUTE_EFFICIENCY, overhead_s=0.0)


@functools.lru_cache(maxsize=512)
def simulate_peak(rate_per_replica: float, seats: int, prompt_tokens: int, output_tokens: int, miss_tokens: int,
                  kv_tokens: int, tier: str = "small", cache_dtype: str = "bf16", policy: str = "continuous",
                  requests: int = SIM_REQUESTS, seed: int = 0) -> tuple[float, float, float, float, float]:
    """(TTFT p50, TTFT p95, TPOT p50, TPOT p95, busy share) of one replica at its share of the peak.

    Poisson arrivals (a random split of Poisson traffic over the replicas is
    Poisson again); every request carries the same prompt and answer lengths;
    the cached share of the prompt is one shared prefix (a system prompt),
    computed once and then hit. Chunked prefill with an 8,192-token budget.
    """
    from servelab.sim import Fixed, ReplicaConfig, simulate, synthetic
    block = 16
    cached = prompt_tokens - miss_tokens
    trace = synthetic(requests, rate_per_replica, prompt=Fixed(max(miss_tokens, 1)),
                      output=Fixed(output_tokens), prefix_groups=1 if cached else 0,
                      prefix_tokens=cached, seed=seed)
    cfg = ReplicaConfig(max_num_seqs=seats, max_num_batched_tokens=max(8192, seats), block_size=block,
                        num_kv_blocks=max(kv_tokens // block, 1), policy=policy)
    r = simulate(trace, pool_step_model(tier, cache_dtype), cfg, progress=False, timeline_points=0)
    # the first minute warms the pool up (empty queue, cold prefix cache): leave it out
    steady = r.arrival_s >= min(60.0, r.arrival_s[len(r) // 10])
    ttft = r.ttft[steady]
    many = steady & (r.output_tokens > 1)
    tpot = (r.finish_s[many] - r.first_token_s[many]) / (r.output_tokens[many] - 1)
    return (float(np.percentile(ttft, 50)), float(np.percentile(ttft, 95)), float(np.percentile(tpot, 50)),
            float(np.percentile(tpot, 95)), float(r.utilisation))


def p95_over_seeds(replicas: int, seeds=range(10), workload: str | Workload = "chat",
                   **knobs) -> list[tuple[float, float]]:
    """(TTFT p95, TPOT p95) of a pool of ``replicas`` at its peak, one pair per simulation seed.

    ``knobs`` are :func:`size_pool`'s (seats, tier, prompt_tokens, prefix_hit_rate,
    cache_dtype, policy). One seed's p95 is a sample: near the promise another
    seed can flip the verdict, so a plan that must hold every time reads them all.
    """
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas <= 0:
        raise ValueError(f"replicas must be a positive whole number, got {replicas!r}")
    w = _workload(workload)
    r = size_pool(workload=w, simulate=False, **knobs)
    tier = knobs.get("tier", "small")
    out = []
    for s in seeds:
        p = simulate_peak(w.peak_arrivals_per_s / replicas, r.live_seats, r.prompt_tokens, w.output_tokens,
                          r.miss_tokens, r.kv_token_budget, tier if isinstance(tier, str) else "small",
                          knobs.get("cache_dtype", "bf16"), knobs.get("policy", "continuous"), seed=int(s))
        out.append((p[1], p[3]))
    return out


def knee(loads, seats: int = 16, tier: str = "small", workload: str | Workload = "chat",
         prefix_hit_rate: float = 0.30, cache_dtype: str = "bf16", policy: str = "continuous",
         prompt_tokens: int | None = None) -> list[dict]:
    """One replica's simulated percentiles as its arrival rate grows (the latency-vs-load curve)."""
    base = size_pool(seats, tier, prompt_tokens, prefix_hit_rate, workload, cache_dtype, policy=policy,
                     simulate=False)
    rows = []
    for rate in loads:
        if not rate > 0:
            raise ValueError(f"loads must be positive arrival rates, got {rate!r}")
        p = simulate_peak(float(rate), base.live_seats, base.prompt_tokens, _workload(workload).output_tokens,
                          base.miss_tokens, base.kv_token_budget, tier, cache_dtype, policy)
        rows.append({"rate": float(rate), "ttft_p50_s": p[0], "ttft_p95_s": p[1], "tpot_p50_s": p[2],
                     "tpot_p95_s": p[3], "busy_share": p[4]})
    return rows


@dataclass(frozen=True)
class Failure:
    """A classic mis-sizing: knobs that break one check, and a change that passes every check."""

    title: str
    check: str        # "latency" | "capacity" | "cost"
    story: str
    broken: dict
    fix: dict
    workload: str = "chat"
    fix_story: str = ""


def _seats_that_fit(prompt_tokens: int, output_tokens: int, tier: str = "small", cache_dtype: str = "bf16",
                    prefix_hit_rate: float = 0.30) -> int:
    """Seats memory grants when a shared prefix (the hits) is held once and each seat holds the rest."""
    budget = kvcache.kv_calculator(tier, cache_dtype, seq_len=prompt_tokens + output_tokens,
                                   concurrent=1).max_sequence_tokens
    miss = round(prompt_tokens * (1 - prefix_hit_rate))
    return max(0, (budget - (prompt_tokens - miss)) // (miss + output_tokens))


_CHAT_SEATS_THAT_FIT = _seats_that_fit(WORKLOADS["chat"].prompt_tokens, WORKLOADS["chat"].output_tokens)
_CHAT_OWN_TOKENS = round(WORKLOADS["chat"].prompt_tokens * 0.7) + WORKLOADS["chat"].output_tokens

FAMOUS_FAILURES = {
    "convoy": Failure(
        "The convoy: static batching at the peak", "latency",
        "A static batcher admits a wave only into an empty replica and runs it until its longest "
        "answer ends, so a request arriving just after a wave starts waits a whole wave for its "
        "first token. No number of replicas up to the planner's limit brings p95 under the SLO.",
        broken=dict(policy="static"), fix=dict(policy="continuous"),
        fix_story="Continuous batching admits the newcomer at the next step."),
    "memory wall": Failure(
        "The memory wall: more seats than memory holds", "capacity",
        "The scheduler was told to run 512 requests at once; the KV room holds the shared prefix once "
        f"and fewer seats of {_CHAT_OWN_TOKENS:,} tokens of their own. The extra requests queue with no "
        "error anywhere, and the config lies about its capacity.",
        broken=dict(seats=512), fix=dict(seats=_CHAT_SEATS_THAT_FIT),
        fix_story="Ask for the seats memory grants (or store the cache in fp8)."),
    "timestamp in the preamble": Failure(
        "A fresh timestamp at the top of a shared 60k-token preamble", "latency",
        "One changed token at the start voids every cached block after it, so each arrival "
        "prefills the whole preamble again: the prefill alone outlasts the first-token SLO, and no "
        "number of replicas helps.",
        broken=dict(prompt_tokens=60_000, seats=14, cache_dtype="fp8", prefix_hit_rate=0.0),
        fix=dict(prompt_tokens=60_000, seats=14, cache_dtype="fp8", prefix_hit_rate=0.9),
        workload="documents",
        fix_story="Move the timestamp to the end: the preamble is byte-identical again and 90% of "
                  "the prompt comes from the cache."),
    "quality upgrade": Failure(
        "The quality upgrade that blew the budget", "cost",
        "Swapping the 8B class for the 70B class: two cards a replica, each seat's cache more "
        "than twice the bytes and a slower step, so at 16 seats the peak needs several "
        "two-card replicas.",
        broken=dict(tier="large"), fix=dict(tier="large", seats=96, cache_dtype="fp8"),
        fix_story="Keep the 70B, run 96 seats on an fp8 cache (memory grants 111): one two-card "
                  "replica keeps the promise. At 64 seats it would sit on the knee."),
    "long prompts": Failure(
        "Long documents crowd out the seats", "capacity",
        "Even with 60% of each 20k-token prompt a shared preamble held once, each seat's own document "
        "and answer are 8.6k tokens, so memory grants fewer seats than the scheduler asks for and the "
        "rest wait with no error.",
        broken=dict(seats=64, prefix_hit_rate=0.6), fix=dict(seats=64, prefix_hit_rate=0.6, cache_dtype="fp8"),
        workload="documents", fix_story="An fp8 cache halves each seat's bytes: all 64 seats fit."),
}


def famous_failure(name: str, workload: str | Workload | None = None) -> tuple[PoolReadout, PoolReadout]:
    """The broken and the fixed readouts of one famous failure (on its own workload by default)."""
    try:
        f = FAMOUS_FAILURES[name]
    except KeyError:
        raise ValueError(f"unknown failure {name!r}; choose one of {sorted(FAMOUS_FAILURES)}") from None
    w = f.workload if workload is None else workload
    return size_pool(workload=w, **f.broken), size_pool(workload=w, **f.fix)


def failure_story(name: str) -> str:
    """The failure told with its numbers: what broke, before and after the fix."""
    f = FAMOUS_FAILURES[name]
    broken, fixed = famous_failure(name)
    return (f"{f.title} ({_workload(f.workload).name})\n  {f.story}\n"
            f"  before: {broken.verdict().split(': ', 1)[1]}\n          {broken.line()}\n"
            f"  fix:    {f.fix_story}\n"
            f"  after:  {fixed.verdict().split(': ', 1)[1]}\n          {fixed.line()}")


#: The one-knob changes of "what mattered and what was noise".
KNOB_CHANGES = {
    "seats 16 -> 32": dict(seats=32),
    "70B class": dict(tier="large"),
    "prompt x 4": "prompt x 4",
    "prefix hits 30% -> 90%": dict(prefix_hit_rate=0.9),
    "fp8 cache": dict(cache_dtype="fp8"),
    "static batching": dict(policy="static"),
}


def what_mattered(workload: str | Workload = "chat") -> list[dict]:
    """Each one-knob change from the defaults: its readouts and which checks it flipped."""
    w = _workload(workload)
    base = size_pool(workload=w)
    rows = []
    for label, change in KNOB_CHANGES.items():
        kw = dict(prompt_tokens=4 * w.prompt_tokens) if change == "prompt x 4" else change
        try:
            r = size_pool(workload=w, **kw)
        except ValueError:
            rows.append({"change": label, "readout": None, "flipped": ["does not fit"]})
            continue
        flipped = [c for c in ("latency", "capacity", "cost") if getattr(r, f"{c}_ok") != getattr(base, f"{c}_ok")]
        rows.append({"change": label, "readout": r, "flipped": flipped})
    return rows


def what_mattered_table(workload: str | Workload = "chat") -> str:
    """:func:`what_mattered` as a table: each one-knob change, the verdicts it flipped and its readouts.

    A change that flips no verdict says "none" and still shows how far it moved
    the bill and the p95s against the defaults (the first row).
    """
    w = _workload(workload)
    base = size_pool(workload=w)

    def cells(r):
        return f"${r.monthly_usd:,.0f}", _ms(r.ttft_p95_s), _ms(r.tpot_p95_s), f"{r.live_seats}/{r.requested_seats}"

    head = ("change", "verdicts flipped", "bill/month", "TTFT p95", "TPOT p95", "seats")
    rows = [("defaults", "", *cells(base))]
    for row in what_mattered(w):
        r = row["readout"]
        if r is None:
            rows.append((row["change"], ", ".join(row["flipped"]), "", "", "", ""))
            continue
        moves = [f"{c} " + ("pass->FAIL" if getattr(base, f"{c}_ok") else "FAIL->pass") for c in row["flipped"]]
        rows.append((row["change"], ", ".join(moves) or "none", *cells(r)))
    widths = [max(len(str(x[i])) for x in [head, *rows]) for i in range(len(head))]
    lines = [w.name] + ["  " + "  ".join(str(c).ljust(n) for c, n in zip(x, widths)).rstrip() for x in [head, *rows]]
    return "\n".join(lines)
