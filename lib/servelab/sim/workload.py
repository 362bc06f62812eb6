"""Request streams for the simulator: arrivals, lengths, prefix groups, traces.

A :class:`Trace` is a column table of requests (numpy arrays, one row per
request, sorted by arrival): ``arrival_s``, ``prompt_tokens``,
``output_tokens``, ``prefix_group`` (-1 = none) and ``prefix_tokens`` (how many
leading prompt tokens the request shares with its group: a system prompt, a
document everyone asks about). Build one with :func:`synthetic` (Poisson or
gamma arrivals, lengths from distributions) or read one from JSONL, one request
per line::

    {"arrival_s": 0.12, "prompt_tokens": 300, "output_tokens": 80, "prefix_group": "faq"}

Pure Python + numpy.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["Trace", "Fixed", "LogNormal", "Exponential", "Uniform", "Mixture", "synthetic",
           "poisson_arrivals", "gamma_arrivals", "load_trace", "save_trace"]


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

    @property
    def max(self) -> int:
        return max(d.max for _, d in self.parts)


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
        for name in ("prompt_tokens", "output_tokens", "prefix_group", "prefix_tokens"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"{name} has {len(getattr(self, name))} rows but arrival_s has {n}")
        if not np.all(np.isfinite(self.arrival_s)) or np.any(self.arrival_s < 0):
            raise ValueError("arrival_s must be finite and non-negative (seconds from the start)")
        if np.any(np.diff(self.arrival_s) < 0):
            order = np.argsort(self.arrival_s, kind="stable")
            for name in ("arrival_s", "prompt_tokens", "output_tokens", "prefix_group", "prefix_tokens"):
                setattr(self, name, getattr(self, name)[order])
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
        return Trace(self.arrival_s[index], self.prompt_tokens[index], self.output_tokens[index],
                     self.prefix_group[index], self.prefix_tokens[index])

    def scaled(self, rate_factor: float) -> "Trace":
        """The same requests arriving ``rate_factor`` times faster."""
        if not rate_factor > 0:
            raise ValueError(f"rate_factor must be positive, got {rate_factor!r}")
        return Trace(self.arrival_s / rate_factor, self.prompt_tokens, self.output_tokens,
                     self.prefix_group, self.prefix_tokens)

    def records(self) -> list[dict]:
        out = []
        for i in range(len(self)):
            r = {"arrival_s": round(float(self.arrival_s[i]), 6), "prompt_tokens": int(self.prompt_tokens[i]),
                 "output_tokens": int(self.output_tokens[i])}
            if self.prefix_group[i] >= 0:
                r["prefix_group"] = int(self.prefix_group[i])
                r["prefix_tokens"] = int(self.prefix_tokens[i])
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

def load_trace(path: str | Path) -> Trace:
    """Read a JSONL trace: one ``{"arrival_s", "prompt_tokens", "output_tokens"}`` per line.

    Optional per line: ``"prefix_group"`` (any string or number) with
    ``"prefix_tokens"`` (how many leading tokens the group shares; default:
    the shortest prompt in the group).
    """
    path = Path(path)
    if not path.exists():
        raise ValueError(f"trace file {str(path)!r} does not exist")
    rows, groups = [], {}
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
            for key in ("arrival_s", "prompt_tokens", "output_tokens"):
                if key not in r:
                    raise ValueError(f"{path}:{lineno}: missing field {key!r}")
            for key in ("prompt_tokens", "output_tokens"):
                v = r[key]
                if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                    raise ValueError(f"{path}:{lineno}: {key} must be a positive whole number, got {v!r}")
            a = r["arrival_s"]
            if isinstance(a, bool) or not isinstance(a, (int, float)) or not math.isfinite(a) or a < 0:
                raise ValueError(f"{path}:{lineno}: arrival_s must be a non-negative number, got {a!r}")
            g = r.get("prefix_group")
            gid = -1 if g is None else groups.setdefault(g, len(groups))
            pt = r.get("prefix_tokens", 0 if g is None else -1)
            if pt == -1 and g is not None:
                pass  # filled in below: the group's shortest prompt
            elif isinstance(pt, bool) or not isinstance(pt, int) or not 0 <= pt <= r["prompt_tokens"]:
                raise ValueError(f"{path}:{lineno}: prefix_tokens must be a whole number in "
                                 f"[0, prompt_tokens], got {pt!r}")
            rows.append((float(a), r["prompt_tokens"], r["output_tokens"], gid, pt))
    if not rows:
        raise ValueError(f"trace file {str(path)!r} is empty: it needs one request per line")
    a, p, o, g, pt = (np.array(col) for col in zip(*rows))
    for gid in set(g[pt == -1].tolist()):
        members = g == gid
        pt[members & (pt == -1)] = p[members].min()
    return Trace(a, p, o, g, pt)


def save_trace(trace: Trace, path: str | Path) -> Path:
    path = Path(path)
    with path.open("w") as f:
        for r in trace.records():
            f.write(json.dumps(r) + "\n")
    return path
