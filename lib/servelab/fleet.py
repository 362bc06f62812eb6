"""Running a fleet: rate limits, priorities, routing, shedding, rollouts, demand over a day.

Everything here sits in front of, or around, the replicas of :mod:`servelab.sim`:

* :class:`TokenBucket` and :class:`RateLimiter` - per-account requests- and
  tokens-per-minute limits that reject with a retry time (HTTP 429 and
  ``Retry-After``), as public APIs do.
* :func:`route` - which replica serves each request (:func:`servelab.sim.pools.route`,
  re-exported here): ``random``,
  ``round_robin``, ``least_outstanding`` (fewest requests in flight, as the
  router itself counts them) and ``prefix_affinity`` (a group's requests go to
  the replica that holds its prefix, unless that replica is ``slack`` requests
  busier than the least loaded: cache hits traded against load balance).
* :func:`serve` - route a trace over replicas and simulate each one.
* :func:`shed` - under overload, drop the lowest priority first, or cap output lengths.
* :func:`canary` - a new model version takes a trickle, then a growing share.
* :func:`diurnal_rates`, :func:`arrivals_from_rates`, :func:`replicas_for_peak` -
  demand over a day (weekday peaks, a launch surge) and the capacity for its peak.

Interactive and batch traffic share replicas through ``simulate(priority=...)``:
batch requests are admitted only when no interactive request waits, and are
sold at a discount because they take what is left. Pure Python + numpy.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from servelab.sim import ReplicaConfig, StepModel, Trace, simulate
from servelab.sim.metrics import SimResult
from servelab.sim.pools import ROUTERS, merge_results, route, simulate_routed  # the one router

__all__ = ["TokenBucket", "RateLimiter", "Decision", "ROUTERS", "route", "serve", "FleetResult", "shed",
           "canary", "CanaryResult", "diurnal_rates", "arrivals_from_rates", "max_rate_for_slo",
           "replicas_for_peak", "output_weight", "BATCH_DISCOUNT", "highway", "HighwayReadout", "HIGHWAY_DEFAULTS"]

#: Batch (asynchronous, 24-hour) traffic is commonly sold at half the interactive price
#: (OpenAI's and Anthropic's batch APIs both list a 50% discount).
BATCH_DISCOUNT = 0.5


# ---------------------------------------------------------------------------
# Rate limits
# ---------------------------------------------------------------------------

class TokenBucket:
    """A bucket of ``capacity`` units refilled at ``per_minute`` units a minute.

    ``take(now, amount)`` returns 0.0 and removes ``amount`` if the bucket holds
    it, else the seconds until it will (and removes nothing). A request larger
    than the whole bucket can never pass: ``ValueError``.
    """

    def __init__(self, per_minute: float, capacity: float | None = None):
        if not per_minute > 0:
            raise ValueError(f"per_minute must be positive, got {per_minute!r}")
        self.rate = per_minute / 60.0
        self.capacity = float(per_minute if capacity is None else capacity)
        if not self.capacity > 0:
            raise ValueError(f"capacity must be positive, got {capacity!r}")
        self.level = self.capacity
        self.time = 0.0

    def _refill(self, now: float) -> None:
        if now < self.time:
            raise ValueError(f"time went backwards: {now} after {self.time}; feed requests in arrival order")
        self.level = min(self.capacity, self.level + (now - self.time) * self.rate)
        self.time = now

    def wait(self, now: float, amount: float = 1.0) -> float:
        """Seconds until ``amount`` is available (0.0 if it is now); takes nothing."""
        if amount > self.capacity:
            raise ValueError(f"a request of {amount:g} can never pass a bucket of {self.capacity:g}; "
                             "raise the limit or split the request")
        self._refill(now)
        return 0.0 if self.level >= amount else (amount - self.level) / self.rate

    def take(self, now: float, amount: float = 1.0) -> float:
        retry = self.wait(now, amount)
        if retry == 0.0:
            self.level -= amount
        return retry


@dataclass
class Decision:
    ok: bool
    retry_after_s: float = 0.0
    reason: str = ""


class RateLimiter:
    """Per-account limits: requests per minute and tokens (prompt + max output) per minute."""

    def __init__(self, requests_per_minute: float, tokens_per_minute: float):
        self.rpm, self.tpm = requests_per_minute, tokens_per_minute
        TokenBucket(requests_per_minute), TokenBucket(tokens_per_minute)  # validate now
        self.buckets: dict[str, tuple[TokenBucket, TokenBucket]] = {}

    def admit(self, account: str, now: float, tokens: int) -> Decision:
        if account not in self.buckets:
            self.buckets[account] = (TokenBucket(self.rpm), TokenBucket(self.tpm))
        req, tok = self.buckets[account]
        if tokens > tok.capacity:
            return Decision(False, math.inf, f"{tokens} tokens exceed the {tok.capacity:g} tokens-per-minute limit")
        wait = max(req.wait(now, 1), tok.wait(now, tokens))
        if wait > 0:
            which = "requests" if req.wait(now, 1) >= tok.wait(now, tokens) else "tokens"
            return Decision(False, wait, f"{which} per minute exceeded")
        req.take(now, 1)
        tok.take(now, tokens)
        return Decision(True)

    def filter(self, trace: Trace, accounts) -> tuple[np.ndarray, np.ndarray]:
        """(admitted mask, retry-after seconds) for a trace with one account per request."""
        ok = np.zeros(len(trace), dtype=bool)
        retry = np.zeros(len(trace))
        for i, (t, p, o) in enumerate(zip(trace.arrival_s.tolist(), trace.prompt_tokens.tolist(),
                                          trace.output_tokens.tolist())):
            d = self.admit(str(accounts[i]), t, p + o)
            ok[i], retry[i] = d.ok, d.retry_after_s
        return ok, retry


# ---------------------------------------------------------------------------
# Routing
# ---------------------------------------------------------------------------

@dataclass
class FleetResult:
    result: SimResult
    replica_of: np.ndarray
    per_replica: list

    @property
    def prefix_hit_share(self) -> float:
        """Share of prompt tokens served from the prefix cache."""
        return float(self.result.cached_tokens.sum() / self.result.prompt_tokens.sum())

    @property
    def load_imbalance(self) -> float:
        """Busiest replica's requests over the mean (1.0 = perfectly even)."""
        counts = np.bincount(self.replica_of, minlength=len(self.per_replica))
        return float(counts.max() / counts.mean())


def serve(trace: Trace, step_model: StepModel, config: ReplicaConfig | None = None, *, replicas: int = 1,
          router: str = "round_robin", slack: int = 4, priority=None, seed: int = 0) -> FleetResult:
    """Route ``trace`` over ``replicas`` and simulate each replica."""
    cfg = config or ReplicaConfig()
    where = route(trace, replicas, router, step_model=step_model, seats=cfg.max_num_seqs, slack=slack, seed=seed)
    parts = simulate_routed(trace, step_model, cfg, where, replicas, priority=priority, progress=False)
    return FleetResult(merge_results(parts, trace), where, [r for _, r in parts])


# ---------------------------------------------------------------------------
# Shedding
# ---------------------------------------------------------------------------

def output_weight(step_model: StepModel, prompt_tokens: int, output_tokens: int, seats: int) -> float:
    """Chip time of one decoded token, in prompt tokens of the same replica (for :func:`shed`).

    A decode step with every seat busy, at the mean context of a request
    (its prompt plus half its answer), divided among the seats; against one
    prompt's prefill divided by its tokens. The ratio grows with the context
    and falls as the seats grow.
    """
    from servelab.sim import StepShape
    if min(prompt_tokens, output_tokens, seats) <= 0:
        raise ValueError("prompt_tokens, output_tokens and seats must be positive")
    context = prompt_tokens + output_tokens // 2
    decode = step_model.step_s(StepShape(decode_rows=seats, decode_context=seats * context)) / seats
    prefill = step_model.step_s(StepShape(prefill_tokens=prompt_tokens, prefill_seqs=1)) / prompt_tokens
    return float(decode / prefill)


def shed(trace: Trace, capacity_tokens_per_s: float, *, priority=None, policy: str = "drop_lowest",
         window_s: float = 10.0, min_output: int = 16, batch_reserve: float = 0.1,
         output_weight: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Load shedding in front of the pool. Returns (kept mask, output tokens after capping).

    Work is counted in prompt-token equivalents, ``prompt + output_weight x
    output``: a decode token costs several prompt tokens of chip time (one step
    shared by the batch against a share of one prefill pass; about 3.9x for
    chapter 24's example replica, ``cost.chat_cost().output_to_input_ratio``;
    :func:`output_weight` for a simulator replica), so pass that ratio; the default 1.0 counts them alike. The work is held against an allowance that
    refills continuously at ``capacity_tokens_per_s`` (in the same units) and holds at most
    ``window_s`` seconds of it (a token bucket, starting full). ``drop_lowest``:
    an interactive request (priority 0) is admitted while the allowance holds its
    work; a batch request (priority 1) only while the allowance would keep a
    reserve of ``batch_reserve`` x the bucket after it, so batch takes only what
    interactive traffic leaves and interactive traffic within the capacity is
    never dropped for batch. ``cap_output``: nobody is dropped; an answer is cut
    (down to ``min_output``) to what the allowance holds.
    """
    if not capacity_tokens_per_s > 0:
        raise ValueError(f"capacity_tokens_per_s must be positive, got {capacity_tokens_per_s!r}")
    if policy not in ("drop_lowest", "cap_output"):
        raise ValueError(f"policy must be 'drop_lowest' or 'cap_output', got {policy!r}")
    if isinstance(output_weight, bool) or not isinstance(output_weight, (int, float)) or not output_weight > 0:
        raise ValueError(f"output_weight must be a positive number of prompt tokens per output token, "
                         f"got {output_weight!r}")
    if not window_s > 0 or not 0 <= batch_reserve < 1:
        raise ValueError(f"window_s must be positive and batch_reserve in [0, 1), got {window_s!r}, "
                         f"{batch_reserve!r}")
    n = len(trace)
    low = np.zeros(n, dtype=bool) if priority is None else np.asarray(priority).astype(bool)
    keep = np.ones(n, dtype=bool)
    out = trace.output_tokens.copy()
    burst = capacity_tokens_per_s * window_s
    reserve = batch_reserve * burst
    level = burst
    last = float(trace.arrival_s[0]) if n else 0.0
    for i, t in enumerate(trace.arrival_s.tolist()):
        level = min(burst, level + (t - last) * capacity_tokens_per_s)
        last = t
        work = float(trace.prompt_tokens[i] + output_weight * out[i])
        if policy == "drop_lowest":
            if level < work + (reserve if low[i] else 0.0):
                keep[i] = False
                continue
        elif level < work:
            room = (level - trace.prompt_tokens[i]) / output_weight
            out[i] = int(max(min_output, min(out[i], room)))
            work = float(trace.prompt_tokens[i] + output_weight * out[i])
        level -= work
    return keep, out


# ---------------------------------------------------------------------------
# Canary rollout
# ---------------------------------------------------------------------------

@dataclass
class CanaryResult:
    version: np.ndarray            # 0 = old, 1 = new, per request
    old: SimResult | None
    new: SimResult | None
    schedule: list = field(default_factory=list)

    def share_new(self, t0: float, t1: float, arrival_s: np.ndarray) -> float:
        m = (arrival_s >= t0) & (arrival_s < t1)
        return float(self.version[m].mean()) if m.any() else float("nan")


def canary(trace: Trace, old_model: StepModel, new_model: StepModel, config: ReplicaConfig | None = None, *,
           schedule=((0.0, 0.01), (0.25, 0.05), (0.5, 0.25), (0.75, 1.0)), replicas_old: int = 2,
           replicas_new: int = 2, seed: int = 0) -> CanaryResult:
    """Roll a new version out: ``schedule`` = (fraction of the trace's duration, share to the new
    version from then on). Each request draws its version at arrival; the old replicas keep
    serving what they hold and drain once the share reaches 1."""
    rng = np.random.default_rng(seed)
    start, span = trace.arrival_s[0], max(trace.duration_s, 1e-9)
    steps = sorted(schedule)
    if any(not 0 <= s <= 1 for _, s in steps) or any(not 0 <= f <= 1 for f, _ in steps):
        raise ValueError("schedule entries are (fraction of the duration, share) pairs, both in [0, 1]")
    share = np.zeros(len(trace))
    for f, s in steps:
        share[trace.arrival_s >= start + f * span] = s
    version = (rng.random(len(trace)) < share).astype(np.int64)
    res = {}
    for v, model, reps in ((0, old_model, replicas_old), (1, new_model, replicas_new)):
        idx = np.flatnonzero(version == v)
        res[v] = serve(trace.subset(idx), model, config, replicas=reps).result if len(idx) else None
    return CanaryResult(version, res[0], res[1], list(steps))


# ---------------------------------------------------------------------------
# Demand over a day, and capacity for its peak
# ---------------------------------------------------------------------------

def diurnal_rates(hours: float = 24.0, *, mean_rate: float = 10.0, peak_to_trough: float = 4.0,
                  peak_hour: float = 14.0, weekday: bool = True, weekend_factor: float = 0.6,
                  surge: tuple | None = None, step_s: float = 60.0) -> tuple[np.ndarray, np.ndarray]:
    """(times, requests/s) on a grid: a daily sine peaking at ``peak_hour`` whose peak is
    ``peak_to_trough`` times its trough; weekends run at ``weekend_factor``; ``surge`` =
    (start hour, hours, multiplier) adds a launch."""
    if not mean_rate > 0 or not peak_to_trough >= 1:
        raise ValueError("mean_rate must be positive and peak_to_trough at least 1")
    t = np.arange(0.0, hours * 3600, step_s)
    h = t / 3600 % 24
    amp = (peak_to_trough - 1) / (peak_to_trough + 1)
    rate = mean_rate * (1 + amp * np.cos(2 * np.pi * (h - peak_hour) / 24))
    if not weekday:
        rate = rate * weekend_factor
    if surge is not None:
        s0, dur, mult = surge
        on = (t / 3600 >= s0) & (t / 3600 < s0 + dur)
        rate[on] *= mult
    return t, rate


def arrivals_from_rates(times: np.ndarray, rates: np.ndarray, *, prompt=None, output=None,
                        seed: int = 0) -> Trace:
    """A non-homogeneous Poisson stream following ``rates`` (piecewise constant on ``times``)."""
    from servelab.sim.workload import Exponential, LogNormal, _as_dist
    rng = np.random.default_rng(seed)
    dt = np.diff(np.append(times, times[-1] + (times[-1] - times[-2] if len(times) > 1 else 60.0)))
    counts = rng.poisson(rates * dt)
    arr = np.concatenate([t0 + np.sort(rng.random(c)) * d for t0, d, c in zip(times, dt, counts)])
    if len(arr) == 0:
        raise ValueError("the rates produce no requests; raise them or lengthen the day")
    p = _as_dist("prompt", prompt or LogNormal(800, 0.6, 16, 8000)).sample(rng, len(arr))
    o = _as_dist("output", output or Exponential(200, 2000)).sample(rng, len(arr))
    return Trace(arr, p, o)


def max_rate_for_slo(step_model: StepModel, config: ReplicaConfig, *, ttft_p95_s: float, prompt=None,
                     output=None, n: int = 10_000, seed: int = 0) -> float:
    """The highest Poisson rate one replica serves with TTFT p95 within the SLO (bisection).

    The p95 is taken over the later half of the ``n`` requests: the first arrivals meet an
    empty replica, and near saturation the queue keeps growing through a short run, so a
    short run, or one judged from its start, claims a rate the replica cannot hold (with the
    course's 8B replica, 10.7 requests a second from 800 requests judged whole, 9.8 from
    10,000 judged on their later half)."""
    from servelab.sim import synthetic
    from servelab.sim.workload import Exponential, LogNormal
    kw = dict(prompt=prompt or LogNormal(800, 0.6, 16, 8000), output=output or Exponential(200, 2000))

    def p95(rate):
        r = simulate(synthetic(n, rate, seed=seed, **kw), step_model, config, progress=False, timeline_points=0)
        return np.percentile(r.ttft[n // 2:], 95)  # after the warm-up

    lo, hi = 1e-3, 1.0
    while p95(hi) <= ttft_p95_s:
        lo, hi = hi, hi * 2
        if hi > 1e5:
            raise ValueError("the replica meets the SLO at any rate tried; check the step model")
    for _ in range(20):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if p95(mid) <= ttft_p95_s else (lo, mid)
    return lo


def replicas_for_peak(rates: np.ndarray, per_replica_rate: float, headroom: float = 1.0) -> int:
    """Replicas for the busiest minute: ceil(peak rate x headroom / what one replica serves at the SLO)."""
    if not per_replica_rate > 0:
        raise ValueError(f"per_replica_rate must be positive, got {per_replica_rate!r}")
    return int(math.ceil(float(np.max(rates)) * headroom / per_replica_rate))


# ---------------------------------------------------------------------------
# The request highway: edge cache -> guardrails -> rate limiter -> pool
# ---------------------------------------------------------------------------

@dataclass
class HighwayReadout:
    offered: int          # requests that arrived
    edge_hits: int        # answered from the edge cache (no model call)
    blocked: int          # stopped by the guardrails
    rejected: int         # 429: over an account's rate limit
    admitted: int         # reached the pool
    ttft_p95_s: float     # of admitted requests, queueing included
    max_queue: int        # most requests waiting at once in one replica
    replicas_up: int
    minute_p95_s: np.ndarray = field(default_factory=lambda: np.zeros(0))  # TTFT p95 per minute
    minute_admitted: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def line(self) -> str:
        return (f"offered {self.offered:,}: edge cache {self.edge_hits:,}, blocked {self.blocked:,}, "
                f"rate-limited {self.rejected:,}, admitted {self.admitted:,}; TTFT p95 "
                f"{self.ttft_p95_s * 1e3:,.0f} ms; longest queue {self.max_queue}")


HIGHWAY_DEFAULTS = dict(base_rate=12.0, minutes=5.0, replicas=2, accounts=40, edge_hit_rate=0.1,
                        guardrail_block_rate=0.02, guardrail_s=0.03, requests_per_minute=120,
                        tokens_per_minute=240_000)


def highway(surge: float = 1.0, outage: bool = False, *, base_rate: float = 12.0, minutes: float = 5.0,
            replicas: int = 2, accounts: int = 40, edge_hit_rate: float = 0.1,
            guardrail_block_rate: float = 0.02, guardrail_s: float = 0.03, requests_per_minute: float = 120,
            tokens_per_minute: float = 240_000, seed: int = 0) -> HighwayReadout:
    """One pass of traffic down the highway; ``surge`` multiplies the arrivals, ``outage``
    takes one replica down. Accounts are skewed (a few send most traffic), so a surge
    trips their limits first. TTFT counts the guardrail check before the pool."""
    if not surge > 0:
        raise ValueError(f"surge must be positive, got {surge!r}")
    if replicas < 1 or (outage and replicas < 2):
        raise ValueError("need at least one replica up: with outage=True give replicas >= 2")
    from servelab.sim import Exponential, LogNormal, synthetic
    rng = np.random.default_rng(seed)
    n = max(int(base_rate * surge * minutes * 60), 1)
    tr = synthetic(n, base_rate * surge, prompt=LogNormal(800, 0.6, 16, 6000), output=Exponential(200, 1200),
                   seed=seed)
    weights = 1.0 / np.arange(1, accounts + 1) ** 1.1
    acct = rng.choice(accounts, size=n, p=weights / weights.sum())
    edge = rng.random(n) < edge_hit_rate
    blocked = ~edge & (rng.random(n) < guardrail_block_rate)
    lim = RateLimiter(requests_per_minute, tokens_per_minute)
    passed = ~edge & ~blocked
    ok = np.zeros(n, dtype=bool)
    for i in np.flatnonzero(passed):
        ok[i] = lim.admit(str(acct[i]), float(tr.arrival_s[i]), int(tr.prompt_tokens[i] + tr.output_tokens[i])).ok
    idx = np.flatnonzero(ok)
    up = replicas - (1 if outage else 0)
    cfg = ReplicaConfig(max_num_seqs=32, max_num_batched_tokens=8192, num_kv_blocks=29_000)
    from servelab.pool import pool_step_model
    shifted = Trace(tr.arrival_s[idx] + guardrail_s, tr.prompt_tokens[idx], tr.output_tokens[idx])
    res = serve(shifted, pool_step_model("small"), cfg, replicas=up)
    ttft = res.result.ttft + guardrail_s
    minute = (tr.arrival_s[idx] // 60).astype(int)
    m_count = int(np.ceil(minutes))
    p95_m = np.array([np.percentile(ttft[minute == k], 95) if np.any(minute == k) else np.nan
                      for k in range(m_count)])
    adm_m = np.bincount(minute, minlength=m_count)[:m_count]
    return HighwayReadout(offered=n, edge_hits=int(edge.sum()), blocked=int(blocked.sum()),
                          rejected=int(passed.sum() - ok.sum()), admitted=len(idx),
                          ttft_p95_s=float(np.percentile(ttft, 95)) if len(idx) else float("nan"),
                          max_queue=int(max(r.timeline_waiting.max() if len(r.timeline_waiting) else 0
                                            for r in res.per_replica)),
                          replicas_up=up, minute_p95_s=p95_m, minute_admitted=adm_m)
