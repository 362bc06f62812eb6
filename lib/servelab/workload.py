"""Workloads and traces: one module for request lengths, arrivals, traces and percentiles.

The simulator (:mod:`servelab.sim`), the load generator (:mod:`servelab.loadgen`)
and the engine benchmark all draw their requests from here, and read and write
one JSONL trace format, so a trace recorded against the server replays in the
simulator and back.

* Length distributions (:class:`Fixed`, :class:`Uniform`, :class:`LogNormal`,
  :class:`Exponential`, :class:`Mixture`): ``sample(np_rng, n)`` draws many at
  once (numpy), ``draw(rng)`` one at a time from a :class:`random.Random` (the
  load generator's and :func:`mixed_workload`'s streams); both round alike.
  :func:`parse_length` reads ``fixed:N``, ``uniform:A:B``,
  ``lognormal:MEDIAN:SIGMA``, ``exponential:MEAN``.
* Arrivals: :func:`poisson_arrivals` and :func:`gamma_arrivals` (numpy, by the
  coefficient of variation) and :func:`arrival_times` (``random.Random``, by the
  gamma shape, as vLLM's benchmark calls it *burstiness*).
* :class:`Trace`: a column table of requests (numpy arrays, one row per
  request, sorted by arrival): ``arrival_s``, ``prompt_tokens``,
  ``output_tokens``, ``prefix_group`` (-1 = none) and ``prefix_tokens`` (how many
  leading prompt tokens the request shares with its group: a system prompt, a
  document everyone asks about), optionally the ``prompts`` themselves. Build one
  with :func:`synthetic` or read one with :func:`load_trace`.
* :func:`trace_prompts`: token ids for a trace (a group's members share their
  leading ``prefix_tokens`` ids).
* :func:`percentile` / :func:`percentiles`: linear interpolation (numpy's
  default), the one used by the load generator, the engine benchmark and the
  simulator's metrics.

The trace format, one request per line (``save_trace`` writes it)::

    {"arrival_s": 0.12, "prompt_tokens": 300, "output_tokens": 80, "prefix_group": 2, "prefix_tokens": 256}

Optional per line: ``"prompt"`` (token ids, or text with its ``prompt_tokens``).
Also read, for older files: ``timestamp`` for ``arrival_s``, ``prompt_len`` for
``prompt_tokens``, ``max_tokens`` or ``output_len`` for ``output_tokens``. A file
whose lines carry no arrival time at all is an *untimed* trace (``Trace.timed``
false, every arrival 0): the load generator then sends it at a rate.

Pure Python + numpy.
"""
from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

__all__ = ["Trace", "Fixed", "LogNormal", "Exponential", "Uniform", "Mixture", "parse_length", "synthetic",
           "poisson_arrivals", "gamma_arrivals", "arrival_times", "load_trace", "save_trace", "trace_prompts",
           "percentile", "percentiles", "PERCENTILES", "WorkloadRequest", "mixed_workload", "trace_workload"]

#: The percentiles reported by default.
PERCENTILES = (50, 90, 95, 99)


# ---------------------------------------------------------------------------
# Length distributions
# ---------------------------------------------------------------------------

def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f"{name} must be a positive whole number, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class Fixed:
    """Every request has the same length."""

    tokens: int

    def __post_init__(self):
        _positive_int("Fixed.tokens", self.tokens)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.full(n, self.tokens, dtype=np.int64)

    def draw(self, rng: random.Random) -> int:
        return int(self.tokens)

    @property
    def max(self) -> int:
        return self.tokens


@dataclass(frozen=True)
class LogNormal:
    """Log-normal lengths (most short, a long tail), clipped to [lo, hi]."""

    median: float
    sigma: float = 0.8
    lo: int = 1
    hi: int = 8192

    def __post_init__(self):
        if not self.median > 0 or not self.sigma >= 0:
            raise ValueError(f"LogNormal needs median > 0 and sigma >= 0, got {self.median!r}, {self.sigma!r}")
        if not 1 <= self.lo <= self.hi:
            raise ValueError(f"LogNormal needs 1 <= lo <= hi, got lo={self.lo!r}, hi={self.hi!r}")

    def sample(self, rng, n):
        x = rng.lognormal(math.log(self.median), self.sigma, n)
        return np.clip(np.floor(x), self.lo, self.hi).astype(np.int64)

    def draw(self, rng: random.Random) -> int:
        return int(min(max(rng.lognormvariate(math.log(self.median), self.sigma), self.lo), self.hi))

    @property
    def max(self) -> int:
        return self.hi


@dataclass(frozen=True)
class Exponential:
    """Exponential lengths with a mean, at least ``lo``, capped at ``cap``."""

    mean: float
    cap: int = 4096
    lo: int = 1

    def __post_init__(self):
        if not self.mean > 0:
            raise ValueError(f"Exponential.mean must be positive, got {self.mean!r}")
        if not 1 <= self.lo <= self.cap:
            raise ValueError(f"Exponential needs 1 <= lo <= cap, got lo={self.lo!r}, cap={self.cap!r}")

    def sample(self, rng, n):
        return np.clip(np.rint(rng.exponential(self.mean, n)), self.lo, self.cap).astype(np.int64)

    def draw(self, rng: random.Random) -> int:
        return int(min(max(round(rng.expovariate(1 / self.mean)), self.lo), self.cap))

    @property
    def max(self) -> int:
        return self.cap


@dataclass(frozen=True)
class Uniform:
    """Whole numbers uniform in [lo, hi]."""

    lo: int
    hi: int

    def __post_init__(self):
        if not 1 <= self.lo <= self.hi:
            raise ValueError(f"Uniform needs 1 <= lo <= hi, got lo={self.lo!r}, hi={self.hi!r}")

    def sample(self, rng, n):
        return rng.integers(self.lo, self.hi + 1, n).astype(np.int64)

    def draw(self, rng: random.Random) -> int:
        return rng.randint(self.lo, self.hi)

    @property
    def max(self) -> int:
        return self.hi


@dataclass(frozen=True)
class Mixture:
    """A mix of distributions: ``Mixture(((0.8, Fixed(200)), (0.2, Fixed(4000))))``."""

    parts: tuple

    def __post_init__(self):
        if not self.parts or any(w < 0 for w, _ in self.parts) or sum(w for w, _ in self.parts) <= 0:
            raise ValueError("Mixture needs (weight, distribution) pairs with non-negative weights summing > 0")

    def sample(self, rng, n):
        w = np.array([w for w, _ in self.parts], dtype=float)
        which = rng.choice(len(w), size=n, p=w / w.sum())
        out = np.empty(n, dtype=np.int64)
        for k, (_, dist) in enumerate(self.parts):
            idx = np.flatnonzero(which == k)
            out[idx] = dist.sample(rng, len(idx))
        return out

    def draw(self, rng: random.Random) -> int:
        w = [w for w, _ in self.parts]
        return self.parts[rng.choices(range(len(w)), weights=w)[0]][1].draw(rng)

    @property
    def max(self) -> int:
        return max(d.max for _, d in self.parts)


#: Lengths a distribution read by :func:`parse_length` may not exceed (no cap of its own).
UNCAPPED = 1 << 20


def parse_length(spec: str | int):
    """A distribution from ``"fixed:N"`` (or ``N``), ``"uniform:A:B"``,
    ``"lognormal:MEDIAN:SIGMA"`` or ``"exponential:MEAN"`` (lengths >= 1)."""
    if isinstance(spec, (int, np.integer)) and not isinstance(spec, bool):
        spec = f"fixed:{spec}"
    if not isinstance(spec, str):
        raise TypeError(f"a length distribution is a string like 'fixed:128', got {spec!r}")
    kind, *args = spec.split(":")
    if kind.isdigit() and not args:
        kind, args = "fixed", [kind]
    try:
        nums = [float(a) for a in args]
    except ValueError:
        raise ValueError(f"bad numbers in length distribution {spec!r}") from None
    want = {"fixed": 1, "uniform": 2, "lognormal": 2, "exponential": 1}
    if kind not in want:
        raise ValueError(f"unknown length distribution {kind!r} in {spec!r}; use one of "
                         f"fixed:N, uniform:A:B, lognormal:MEDIAN:SIGMA, exponential:MEAN")
    if len(nums) != want[kind] or any(x <= 0 and not (kind == "lognormal" and i == 1 and x == 0)
                                      for i, x in enumerate(nums)):
        raise ValueError(f"{kind} needs {want[kind]} positive number(s), got {spec!r}")
    if kind in ("fixed", "uniform") and any(x != int(x) for x in nums):
        raise ValueError(f"{kind} lengths are token counts: give whole numbers >= 1, got {spec!r} "
                         f"(for a mean that is not whole, use exponential:MEAN or lognormal:MEDIAN:SIGMA)")
    if kind == "fixed":
        return Fixed(int(nums[0]))
    if kind == "uniform":
        if nums[1] < nums[0]:
            raise ValueError(f"uniform:A:B needs A <= B, got {spec!r}")
        return Uniform(int(nums[0]), int(nums[1]))
    if kind == "lognormal":
        return LogNormal(nums[0], nums[1], 1, UNCAPPED)
    return Exponential(nums[0], UNCAPPED)


def _as_dist(name: str, spec):
    if isinstance(spec, (int, np.integer)) and not isinstance(spec, bool):
        return Fixed(int(spec))
    if hasattr(spec, "sample"):
        return spec
    raise TypeError(f"{name} must be a whole number of tokens or a distribution "
                    f"(Fixed, LogNormal, Exponential, Uniform, Mixture), got {spec!r}")


# ---------------------------------------------------------------------------
# Arrivals
# ---------------------------------------------------------------------------

def _check_rate(rate) -> float:
    if isinstance(rate, bool) or not isinstance(rate, (int, float, np.floating, np.integer)) \
            or not math.isfinite(rate) or rate <= 0:
        raise ValueError(f"rate (requests per second) must be a positive number, got {rate!r}")
    return float(rate)


def poisson_arrivals(n: int, rate: float, rng: np.random.Generator) -> np.ndarray:
    """Arrival times of a Poisson stream: exponential gaps with mean 1/rate."""
    rate = _check_rate(rate)
    return np.cumsum(rng.exponential(1.0 / rate, n))


def gamma_arrivals(n: int, rate: float, cv: float, rng: np.random.Generator) -> np.ndarray:
    """Bursty arrivals: gamma gaps with mean 1/rate and coefficient of variation ``cv``.

    ``cv`` = 1 is Poisson; above 1 requests come in bursts with lulls between.
    """
    rate = _check_rate(rate)
    if not cv > 0:
        raise ValueError(f"cv (burstiness) must be positive, got {cv!r}")
    shape = 1.0 / cv ** 2
    return np.cumsum(rng.gamma(shape, 1.0 / (rate * shape), n))


def arrival_times(n: int, rate: float, burstiness: float = 1.0, seed: int = 0) -> list[float]:
    """Send times (s after the start) of ``n`` requests at ``rate`` per second on average.

    Gaps are gamma-distributed with shape ``burstiness`` and mean ``1 / rate``
    (drawn from a :class:`random.Random`): ``burstiness = 1`` is a Poisson
    process; below 1 the requests come in bursts, above 1 more evenly (the same
    gaps as :func:`gamma_arrivals` with ``cv = 1 / sqrt(burstiness)``).
    ``rate = inf`` sends everything at once.
    """
    if not (isinstance(rate, (int, float)) and rate > 0):
        raise ValueError(f"rate must be > 0 requests/s (inf = all at once), got {rate!r}")
    if not (isinstance(burstiness, (int, float)) and burstiness > 0):
        raise ValueError(f"burstiness must be > 0 (1 = Poisson), got {burstiness!r}")
    if math.isinf(rate):
        return [0.0] * n
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.gammavariate(burstiness, 1.0 / (rate * burstiness))
    return out


# ---------------------------------------------------------------------------
# The trace
# ---------------------------------------------------------------------------

@dataclass
class Trace:
    """Requests as columns, sorted by arrival."""

    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    prefix_group: np.ndarray | None = None
    prefix_tokens: np.ndarray | None = None
    #: Optional: each request's prompt (token ids or text; None where not given).
    prompts: list | None = None
    #: False for a file whose lines carried no arrival times (every arrival 0: send at a rate).
    timed: bool = True

    def __post_init__(self):
        self.arrival_s = np.asarray(self.arrival_s, dtype=float)
        n = len(self.arrival_s)
        self.prompt_tokens = np.asarray(self.prompt_tokens, dtype=np.int64)
        self.output_tokens = np.asarray(self.output_tokens, dtype=np.int64)
        self.prefix_group = (np.full(n, -1, dtype=np.int64) if self.prefix_group is None
                             else np.asarray(self.prefix_group, dtype=np.int64))
        self.prefix_tokens = (np.zeros(n, dtype=np.int64) if self.prefix_tokens is None
                              else np.asarray(self.prefix_tokens, dtype=np.int64))
        if n == 0:
            raise ValueError("the trace is empty: it needs at least one request")
        if self.prompts is not None:
            self.prompts = list(self.prompts)
            if len(self.prompts) != n:
                raise ValueError(f"prompts has {len(self.prompts)} rows but arrival_s has {n}")
        for name in ("prompt_tokens", "output_tokens", "prefix_group", "prefix_tokens"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"{name} has {len(getattr(self, name))} rows but arrival_s has {n}")
        if not np.all(np.isfinite(self.arrival_s)) or np.any(self.arrival_s < 0):
            raise ValueError("arrival_s must be finite and non-negative (seconds from the start)")
        if np.any(np.diff(self.arrival_s) < 0):
            order = np.argsort(self.arrival_s, kind="stable")
            for name in ("arrival_s", "prompt_tokens", "output_tokens", "prefix_group", "prefix_tokens"):
                setattr(self, name, getattr(self, name)[order])
            if self.prompts is not None:
                self.prompts = [self.prompts[i] for i in order.tolist()]
        if np.any(self.prompt_tokens <= 0):
            raise ValueError("prompt_tokens must be at least 1 for every request")
        if np.any(self.output_tokens <= 0):
            raise ValueError("output_tokens must be at least 1 for every request")
        if np.any(self.prefix_tokens < 0) or np.any(self.prefix_tokens > self.prompt_tokens):
            raise ValueError("prefix_tokens must lie in [0, prompt_tokens] for every request")

    def __len__(self) -> int:
        return len(self.arrival_s)

    @property
    def duration_s(self) -> float:
        return float(self.arrival_s[-1] - self.arrival_s[0]) if len(self) > 1 else 0.0

    @property
    def rate(self) -> float:
        """Mean arrivals per second over the trace."""
        return (len(self) - 1) / self.duration_s if self.duration_s > 0 else float("inf")

    def subset(self, index) -> "Trace":
        prompts = None
        if self.prompts is not None:
            prompts = [self.prompts[i] for i in np.arange(len(self))[index].tolist()]
        return Trace(self.arrival_s[index], self.prompt_tokens[index], self.output_tokens[index],
                     self.prefix_group[index], self.prefix_tokens[index], prompts, self.timed)

    def scaled(self, rate_factor: float) -> "Trace":
        """The same requests arriving ``rate_factor`` times faster."""
        if not rate_factor > 0:
            raise ValueError(f"rate_factor must be positive, got {rate_factor!r}")
        return Trace(self.arrival_s / rate_factor, self.prompt_tokens, self.output_tokens,
                     self.prefix_group, self.prefix_tokens, self.prompts, self.timed)

    def records(self) -> list[dict]:
        """One dict per request in the JSONL format (see the module doc)."""
        out = []
        for i in range(len(self)):
            r = {"prompt_tokens": int(self.prompt_tokens[i]), "output_tokens": int(self.output_tokens[i])}
            if self.timed:
                r = {"arrival_s": round(float(self.arrival_s[i]), 6), **r}
            if self.prefix_group[i] >= 0:
                r["prefix_group"] = int(self.prefix_group[i])
                r["prefix_tokens"] = int(self.prefix_tokens[i])
            if self.prompts is not None and self.prompts[i] is not None:
                r["prompt"] = self.prompts[i]
            out.append(r)
        return out


def synthetic(n: int, rate: float, *, prompt=LogNormal(256, 0.8, 8, 4096), output=Exponential(128, 1024),
              arrival: str = "poisson", cv: float = 1.0, prefix_groups: int = 0, prefix_tokens: int = 0,
              prefix_share: float = 1.0, seed: int = 0) -> Trace:
    """``n`` requests at ``rate`` per second.

    ``arrival``: ``"poisson"`` or ``"gamma"`` (with burstiness ``cv``).
    ``prompt``/``output``: a whole number or a distribution.
    ``prefix_groups`` > 0: a share ``prefix_share`` of requests belongs to one of
    that many groups (uniformly) whose members start with the same
    ``prefix_tokens`` tokens (added in front of the drawn prompt).
    """
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n <= 0:
        raise ValueError(f"n (number of requests) must be a positive whole number, got {n!r}")
    rng = np.random.default_rng(seed)
    if arrival == "poisson":
        t = poisson_arrivals(n, rate, rng)
    elif arrival == "gamma":
        t = gamma_arrivals(n, rate, cv, rng)
    else:
        raise ValueError(f"arrival must be 'poisson' or 'gamma', got {arrival!r}")
    p = _as_dist("prompt", prompt).sample(rng, n)
    o = _as_dist("output", output).sample(rng, n)
    group = np.full(n, -1, dtype=np.int64)
    pre = np.zeros(n, dtype=np.int64)
    if prefix_groups:
        _positive_int("prefix_groups", prefix_groups)
        _positive_int("prefix_tokens", prefix_tokens)
        if not 0 <= prefix_share <= 1:
            raise ValueError(f"prefix_share is a fraction in [0, 1], got {prefix_share!r}")
        member = rng.random(n) < prefix_share
        group[member] = rng.integers(0, prefix_groups, int(member.sum()))
        pre[member] = prefix_tokens
        p = p + pre
    return Trace(t, p, o, group, pre)


# ---------------------------------------------------------------------------
# JSONL
# ---------------------------------------------------------------------------

def _count(path, lineno, key, v) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise ValueError(f"{path}:{lineno}: {key} must be a positive whole number, got {v!r}")
    return v


def load_trace(path: str | Path) -> Trace:
    """Read a JSONL trace (the format in the module doc; the older field names too).

    ``prefix_group`` (any string or number) comes with ``prefix_tokens`` (how many
    leading tokens the group shares; default: the shortest prompt in the group).
    A ``prompt`` of token ids gives ``prompt_tokens`` itself; a text prompt needs its
    ``prompt_tokens`` (the simulator needs the count).
    """
    path = Path(path)
    if not path.exists():
        raise ValueError(f"trace file {str(path)!r} does not exist")
    rows, groups, prompts, timed = [], {}, [], []
    with path.open() as f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
            if not isinstance(r, dict):
                raise ValueError(f"{path}:{lineno}: each line must be a JSON object")
            prompt = r.get("prompt")
            if prompt is not None and not isinstance(prompt, str) and not (
                    isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool)
                                                                  for t in prompt)):
                raise ValueError(f"{path}:{lineno}: prompt must be text or a non-empty list of token ids")
            n_in = r.get("prompt_tokens", r.get("prompt_len"))
            if n_in is None:
                if isinstance(prompt, list):
                    n_in = len(prompt)
                else:
                    raise ValueError(f"{path}:{lineno}: missing field 'prompt_tokens' (or a 'prompt' of token ids)")
            n_in = _count(path, lineno, "prompt_tokens", n_in)
            key = next((k for k in ("output_tokens", "max_tokens", "output_len") if k in r), None)
            if key is None:
                raise ValueError(f"{path}:{lineno}: missing field 'output_tokens' (or 'max_tokens')")
            n_out = _count(path, lineno, key, r[key])
            a = r.get("arrival_s", r.get("timestamp"))
            timed.append(a is not None)
            if a is None:
                a = 0.0
            if isinstance(a, bool) or not isinstance(a, (int, float)) or not math.isfinite(a) or a < 0:
                raise ValueError(f"{path}:{lineno}: arrival_s must be a non-negative number, got {a!r}")
            g = r.get("prefix_group")
            gid = -1 if g is None else groups.setdefault(g, len(groups))
            pt = r.get("prefix_tokens", 0 if g is None else -1)
            if pt == -1 and g is not None:
                pass  # filled in below: the group's shortest prompt
            elif isinstance(pt, bool) or not isinstance(pt, int) or not 0 <= pt <= n_in:
                raise ValueError(f"{path}:{lineno}: prefix_tokens must be a whole number in "
                                 f"[0, prompt_tokens], got {pt!r}")
            rows.append((float(a), n_in, n_out, gid, pt))
            prompts.append(prompt)
    if not rows:
        raise ValueError(f"trace file {str(path)!r} is empty: it needs one request per line")
    if any(timed) and not all(timed):
        raise ValueError(f"{path}: some lines have an arrival time (arrival_s) and some do not: "
                         f"give every line one, or none (then the load generator sends at a rate)")
    a, p, o, g, pt = (np.array(col) for col in zip(*rows))
    for gid in set(g[pt == -1].tolist()):
        members = g == gid
        pt[members & (pt == -1)] = p[members].min()
    return Trace(a, p, o, g, pt, prompts if any(x is not None for x in prompts) else None, all(timed))


def save_trace(trace: Trace, path: str | Path) -> Path:
    """Write ``trace`` as JSONL (one request per line, the module doc's format)."""
    path = Path(path)
    with path.open("w") as f:
        for r in trace.records():
            f.write(json.dumps(r) + "\n")
    return path


def trace_prompts(trace: Trace, vocab_size: int, seed: int = 0, avoid=()) -> list[list[int]]:
    """Token ids per request: the trace's own prompts where it has token ids, else random ids
    from ``vocab_size`` (never an id in ``avoid``), a group's members sharing their leading
    ``prefix_tokens``."""
    rng = np.random.default_rng(seed)
    avoid = set(int(a) for a in avoid)
    pool = np.array([t for t in range(vocab_size) if t not in avoid])
    longest: dict[int, int] = {}
    for g, p in zip(trace.prefix_group.tolist(), trace.prefix_tokens.tolist()):
        if g >= 0:
            longest[g] = max(longest.get(g, 0), p)
    prefix = {g: rng.choice(pool, size=m).tolist() for g, m in sorted(longest.items())}
    given = trace.prompts or [None] * len(trace)
    out = []
    for g, p, n, own in zip(trace.prefix_group.tolist(), trace.prefix_tokens.tolist(), trace.prompt_tokens.tolist(),
                            given):
        if isinstance(own, list):
            out.append(list(own))
            continue
        head = prefix[g][:p] if g >= 0 else []
        out.append(head + rng.choice(pool, size=n - len(head)).tolist())
    return out


# ---------------------------------------------------------------------------
# Percentiles
# ---------------------------------------------------------------------------

def percentile(values, q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation (numpy's default)."""
    xs = np.sort(np.asarray(values, dtype=float), kind="stable") if isinstance(values, np.ndarray) \
        else sorted(values)
    n = len(xs)
    if not n:
        raise ValueError("percentile of an empty list")
    if not 0 <= q <= 100:
        raise ValueError(f"q is a percentile in [0, 100], got {q!r}")
    k = (n - 1) * q / 100
    lo = math.floor(k)
    hi = min(lo + 1, n - 1)
    return float(xs[lo] + (xs[hi] - xs[lo]) * (k - lo))


def percentiles(values: Iterable[float], ps: Sequence[float] = PERCENTILES) -> dict:
    """``{"mean", "n", "p50", ...}`` of ``values`` (None entries skipped; None when empty)."""
    xs = sorted(v for v in values if v is not None)
    out = {"mean": (sum(xs) / len(xs)) if xs else None, "n": len(xs)}
    for p in ps:
        out[f"p{p}"] = percentile(xs, p) if xs else None
    return out


# ---------------------------------------------------------------------------
# An offline request mix (the engine benchmark's and chapters 13 and 17's)
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class WorkloadRequest:
    prompt_token_ids: list[int]
    max_tokens: int


def mixed_workload(n: int, *, vocab_size: int, seed: int = 0, prompt_median: float = 128,
                   prompt_sigma: float = 0.8, prompt_min: int = 8, prompt_max: int = 1024,
                   output_mean: float = 96, output_cap: int = 512) -> list[WorkloadRequest]:
    """``n`` requests, all at once, with log-normal prompts (``LogNormal(prompt_median,
    prompt_sigma, prompt_min, prompt_max)``) and capped exponential outputs
    (``Exponential(output_mean, output_cap)``), random token ids (:func:`synthetic`
    makes timed streams)."""
    if n < 0 or vocab_size <= 0:
        raise ValueError(f"need n >= 0 and vocab_size > 0, got n={n}, vocab_size={vocab_size}")
    rng = random.Random(seed)
    prompt = LogNormal(prompt_median, prompt_sigma, prompt_min, prompt_max)
    output = Exponential(output_mean, output_cap)
    out = []
    for _ in range(n):
        p = prompt.draw(rng)
        o = output.draw(rng)
        out.append(WorkloadRequest([rng.randrange(vocab_size) for _ in range(p)], o))
    return out


def trace_workload(trace: Trace, vocab_size: int, seed: int = 0, avoid=()) -> list[WorkloadRequest]:
    """A trace's requests as an offline workload (arrival times dropped: all queued at once),
    with :func:`trace_prompts`' token ids: how the engine benchmark reads a trace."""
    ids = trace_prompts(trace, vocab_size, seed, avoid)
    return [WorkloadRequest(p, int(o)) for p, o in zip(ids, trace.output_tokens.tolist())]
