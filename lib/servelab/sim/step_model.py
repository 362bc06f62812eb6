"""How long one engine step takes, from what the step computes.

A step is described by its *shape* (:class:`StepShape`): prompt tokens
computed (``prefill_tokens``), decode rows (``decode_rows``), the context the
decode rows read (``decode_context``: the sum of their lengths), the attention
pairs of the prompt chunks (``prefill_pairs``: each chunk token against its
past), the number of prompt chunks (``prefill_seqs``) and their end positions
(``prefill_context``).

Two step models turn a shape into seconds:

* :class:`LinearStepModel` - fitted to the real engine's measured steps:
  ``a + b*prefill_tokens + c*decode_rows + d*decode_context + e*prefill_pairs
  + f*prefill_seqs`` (all coefficients >= 0; :func:`fit_linear`).
* :class:`RooflineStepModel` - a chip from the registry: the larger of the
  memory time (weights once, plus every KV byte read) and the compute time
  (2 x parameters per token, plus attention), plus a fixed overhead.

For a run of pure decode steps the context grows by ``decode_rows`` tokens a
step, so each model is a maximum of straight lines in the context; the
simulator sums whole runs in closed form (:meth:`StepModel.decode_run_s`).
Pure Python + numpy.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass, field
from typing import NamedTuple

import numpy as np

__all__ = ["StepShape", "StepModel", "LinearStepModel", "RooflineStepModel", "fit_linear",
           "step_model_from_dict", "FEATURES"]

#: Names of the fitted model's terms, in the order of its coefficients.
FEATURES = ("1", "prefill_tokens", "decode_rows", "decode_context", "prefill_pairs", "prefill_seqs")


class StepShape(NamedTuple):
    prefill_tokens: int = 0
    decode_rows: int = 0
    decode_context: int = 0
    prefill_pairs: float = 0.0
    prefill_seqs: int = 0
    prefill_context: int = 0

    def features(self) -> tuple:
        return (1.0, self.prefill_tokens, self.decode_rows, self.decode_context, self.prefill_pairs,
                self.prefill_seqs)


def chunk_pairs(start: int, n: int) -> float:
    """Attention pairs of a chunk of ``n`` tokens starting at ``start``: sum of (start + i + 1)."""
    return n * start + n * (n + 1) / 2


def _line_sum(alpha: float, beta: float, k0: float, rows: int, i0: int, i1: int) -> float:
    """sum_{i0 <= i < i1} alpha + beta * (k0 + i * rows)."""
    m = i1 - i0
    if m <= 0:
        return 0.0
    return m * (alpha + beta * k0) + beta * rows * (i0 + i1 - 1) * m / 2


class StepModel:
    """Seconds per step. Subclasses give :meth:`step_s` and :meth:`decode_lines`.

    A *noisy* model (random jitter per step) makes the simulator take every step
    one at a time instead of summing decode runs in closed form.
    """

    overhead_s: float = 0.0
    noisy: bool = False

    def reset_noise(self) -> None:
        """Restart any random stream (deterministic runs)."""

    def step_s(self, shape: StepShape) -> float:
        raise NotImplementedError

    def decode_lines(self, rows: int) -> list[tuple[float, float]]:
        """Pure decode step time = overhead + max over lines of alpha + beta * context."""
        raise NotImplementedError

    def _lines(self, rows: int):
        cache = self.__dict__.get("_line_cache")
        if cache is None:
            cache = self.__dict__["_line_cache"] = {}
        lines = cache.get(rows)
        if lines is None:
            lines = cache[rows] = tuple(self.decode_lines(rows))
        return lines

    def decode_step_at(self, rows: int, context: float) -> float:
        """One pure decode step of ``rows`` rows reading ``context`` tokens."""
        return self.overhead_s + max(a + b * context for a, b in self._lines(rows))

    def decode_run_s(self, rows: int, context0: float, k: int) -> float:
        """Total seconds of ``k`` pure decode steps of ``rows`` rows, the first reading
        ``context0`` tokens, each next one ``rows`` more."""
        if k <= 0:
            return 0.0
        lines = self._lines(rows)
        total = k * self.overhead_s
        if len(lines) == 1:
            a, b = lines[0]
            return total + _line_sum(a, b, context0, rows, 0, k)
        if len(lines) != 2:
            return total + sum(max(a + b * (context0 + i * rows) for a, b in lines) for i in range(k))
        (a1, b1), (a2, b2) = lines
        # line 1 - line 2 is itself a line in i: it changes sign at most once
        da, db = a1 - a2, (b1 - b2)
        g0 = da + db * context0
        slope = db * rows
        if slope == 0:
            split = 0 if g0 < 0 else k  # line 1 wins for i < split
        else:
            root = -g0 / slope  # g(i) = g0 + slope * i == 0
            if slope > 0:  # line 2 wins before the root, line 1 after
                first1 = min(max(math.ceil(root), 0), k)
                return total + _line_sum(a2, b2, context0, rows, 0, first1) + \
                    _line_sum(a1, b1, context0, rows, first1, k)
            split = min(max(math.floor(root) + 1, 0), k)
        return total + _line_sum(a1, b1, context0, rows, 0, split) + _line_sum(a2, b2, context0, rows, split, k)

    def steps_to_reach(self, rows: int, context0: float, dt: float, k_max: int) -> int:
        """Smallest k >= 1 (at most ``k_max``) whose run of k decode steps lasts at least ``dt``."""
        if k_max <= 1 or self.decode_step_at(rows, context0) >= dt:
            return 1
        lines = self._lines(rows)
        if len(lines) == 1:  # a quadratic in k: solve it, then fix rounding
            a, b = lines[0]
            a += self.overhead_s + b * context0
            q = b * rows / 2  # run(k) = a k + q k (k - 1)
            if q > 0:
                lin = a - q
                k = math.ceil((-lin + math.sqrt(lin * lin + 4 * q * dt)) / (2 * q))
            else:
                k = math.ceil(dt / a)
            k = min(max(k, 1), k_max)
            while k > 1 and self.decode_run_s(rows, context0, k - 1) >= dt:
                k -= 1
            while k < k_max and self.decode_run_s(rows, context0, k) < dt:
                k += 1
            return k
        if self.decode_run_s(rows, context0, k_max) < dt:
            return k_max
        lo, hi = 1, k_max  # run(lo) < dt <= run(hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.decode_run_s(rows, context0, mid) >= dt:
                hi = mid
            else:
                lo = mid
        return hi

    def to_dict(self) -> dict:
        raise NotImplementedError


@dataclass
class LinearStepModel(StepModel):
    """``a + b*P + c*R + d*K + e*pairs + f*chunks`` seconds (see module doc)."""

    a: float
    b_prefill: float = 0.0
    c_decode: float = 0.0
    d_context: float = 0.0
    e_pairs: float = 0.0
    f_chunks: float = 0.0
    meta: dict = field(default_factory=dict)
    #: Jitter: quantiles of the measured steps' residuals (seconds, measured - fitted). When given,
    #: each step adds a residual drawn from them (the machine's noise: a shared CPU stalls).
    noise: tuple = ()
    noise_seed: int = 0
    #: Extra cost by the step's row count (prompt tokens + decode rows): ``bin_costs[k]`` seconds when
    #: ``bin_edges[k] <= rows < bin_edges[k + 1]`` (the last bin is open). Small matrices run
    #: kernels whose cost is not linear in their rows (on some CPUs 2-3 rows cost twice one).
    bin_edges: tuple = ()
    bin_costs: tuple = ()

    def __post_init__(self):
        for name in ("a", "b_prefill", "c_decode", "d_context", "e_pairs", "f_chunks"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ValueError(f"LinearStepModel.{name} must be a finite number >= 0, got {v!r}")
        self.noise = tuple(float(x) for x in self.noise)
        self.bin_edges = tuple(int(x) for x in self.bin_edges)
        self.bin_costs = tuple(float(x) for x in self.bin_costs)
        if len(self.bin_edges) != len(self.bin_costs):
            raise ValueError("bin_edges and bin_costs must have the same length")
        self.reset_noise()

    @property
    def noisy(self) -> bool:
        return bool(self.noise)

    def reset_noise(self) -> None:
        """Restart the jitter's random stream (the simulator calls it at the start of a run)."""
        self.__dict__["_rng"] = np.random.default_rng(self.noise_seed) if self.noise else None
        self.__dict__["_q"] = np.array(self.noise) if self.noise else None

    def _jitter(self, base: float) -> float:
        q = self.__dict__["_q"]
        u = self.__dict__["_rng"].random() * (len(q) - 1)
        k = int(u)
        e = q[k] + (q[min(k + 1, len(q) - 1)] - q[k]) * (u - k)
        return max(base + e, 0.2 * base)

    def without_noise(self) -> "LinearStepModel":
        return LinearStepModel(*self.coefficients, meta=dict(self.meta), bin_edges=self.bin_edges,
                               bin_costs=self.bin_costs)

    def scaled(self, factor: float) -> "LinearStepModel":
        """Every step ``factor`` times as long (a machine that runs slower or faster right now)."""
        if not factor > 0:
            raise ValueError(f"factor must be positive, got {factor!r}")
        return LinearStepModel(*(c * factor for c in self.coefficients), meta=dict(self.meta),
                               noise=tuple(x * factor for x in self.noise), noise_seed=self.noise_seed,
                               bin_edges=self.bin_edges, bin_costs=tuple(c * factor for c in self.bin_costs))

    @property
    def coefficients(self) -> tuple:
        return (self.a, self.b_prefill, self.c_decode, self.d_context, self.e_pairs, self.f_chunks)

    def _bin(self, rows: int) -> float:
        cost = 0.0
        for edge, c in zip(self.bin_edges, self.bin_costs):
            if rows >= edge:
                cost = c
            else:
                break
        return cost

    def step_s(self, shape: StepShape) -> float:
        base = (self.a + self.b_prefill * shape.prefill_tokens + self.c_decode * shape.decode_rows
                + self.d_context * shape.decode_context + self.e_pairs * shape.prefill_pairs
                + self.f_chunks * shape.prefill_seqs)
        if self.bin_edges:
            base += self._bin(shape.prefill_tokens + shape.decode_rows)
        return self._jitter(base) if self.noise else base

    def decode_lines(self, rows):
        return [(self.a + self.c_decode * rows + (self._bin(rows) if self.bin_edges else 0.0), self.d_context)]

    def to_dict(self) -> dict:
        d = asdict(self)
        d["noise"] = list(self.noise)
        d["bin_edges"], d["bin_costs"] = list(self.bin_edges), list(self.bin_costs)
        d["kind"] = "linear"
        return d

    def describe(self) -> str:
        text = (f"{self.a * 1e3:.3f} ms + {self.b_prefill * 1e6:.2f} us/prompt token + "
                f"{self.c_decode * 1e6:.2f} us/decode row + {self.d_context * 1e9:.2f} ns/context token + "
                f"{self.e_pairs * 1e9:.3f} ns/attention pair + {self.f_chunks * 1e6:.1f} us/prompt chunk")
        if self.bin_edges:
            text += ", plus by rows in the step: " + ", ".join(
                f">={e}: {c * 1e3:+.2f} ms" for e, c in zip(self.bin_edges, self.bin_costs))
        return text


@dataclass
class RooflineStepModel(StepModel):
    """A replica on registry chips: max(memory time, compute time) + overhead."""

    weights_bytes: float
    kv_bytes_per_token: float
    num_params: float
    attention_ops_per_context_token: float
    bandwidth: float            # bytes/s, whole replica
    peak_ops: float             # operations/s, whole replica
    bandwidth_efficiency: float = 0.6
    compute_efficiency: float = 0.5
    overhead_s: float = 0.0
    label: str = ""

    def __post_init__(self):
        for name in ("weights_bytes", "kv_bytes_per_token", "num_params", "bandwidth", "peak_ops"):
            v = getattr(self, name)
            if not v > 0:
                raise ValueError(f"RooflineStepModel.{name} must be positive, got {v!r}")
        for name in ("bandwidth_efficiency", "compute_efficiency"):
            v = getattr(self, name)
            if not 0 < v <= 1:
                raise ValueError(f"RooflineStepModel.{name} is a fraction in (0, 1], got {v!r}")
        if self.overhead_s < 0:
            raise ValueError(f"overhead_s must be >= 0, got {self.overhead_s!r}")

    @classmethod
    def for_tier(cls, tier="small", cache_dtype: str = "bf16", weight_dtype: str = "bf16",
                 bandwidth_efficiency: float = 0.6, compute_efficiency: float = 0.5,
                 overhead_s: float = 0.0) -> "RooflineStepModel":
        """A pool tier of :mod:`servelab.kvcache` ("small": 8B on one H100, "large": 70B on two)."""
        from servelab import arith, kvcache
        t = kvcache.get_tier(tier)
        return cls(weights_bytes=kvcache.weights_bytes(t.num_params, weight_dtype),
                   kv_bytes_per_token=kvcache.kv_bytes_per_token(t.config, cache_dtype),
                   num_params=t.num_params,
                   attention_ops_per_context_token=arith.attention_ops_per_token(t.config, 1),
                   bandwidth=t.num_chips * t.chip.hbm_bandwidth,
                   peak_ops=t.num_chips * t.chip.peak_flops(weight_dtype),
                   bandwidth_efficiency=bandwidth_efficiency, compute_efficiency=compute_efficiency,
                   overhead_s=overhead_s, label=f"{t.label} on {t.num_chips} x {t.chip.name}")

    @classmethod
    def for_chip(cls, model: str, num_params: float, chip: str = "H100 SXM", num_chips: int = 1,
                 weight_dtype: str = "bf16", cache_dtype: str = "bf16", bandwidth_efficiency: float = 0.6,
                 compute_efficiency: float = 0.5, overhead_s: float = 0.0) -> "RooflineStepModel":
        """Any registry model shape (:func:`servelab.specs.get_model`) on any registry chip, e.g.
        ``for_chip("Llama-3-70B", 70e9, "B200", num_chips=2, weight_dtype="fp8")``."""
        from servelab import arith, kvcache, specs
        cfg = specs.get_model(model)
        c = specs.get_chip(chip)
        if isinstance(num_chips, bool) or not isinstance(num_chips, int) or num_chips <= 0:
            raise ValueError(f"num_chips must be a positive whole number, got {num_chips!r}")
        return cls(weights_bytes=num_params * arith.bytes_per_param(weight_dtype),
                   kv_bytes_per_token=kvcache.kv_bytes_per_token(cfg, cache_dtype), num_params=num_params,
                   attention_ops_per_context_token=arith.attention_ops_per_token(cfg, 1),
                   bandwidth=num_chips * c.hbm_bandwidth, peak_ops=num_chips * c.peak_flops(weight_dtype),
                   bandwidth_efficiency=bandwidth_efficiency, compute_efficiency=compute_efficiency,
                   overhead_s=overhead_s, label=f"{model} on {num_chips} x {c.name}")

    def _mem(self):
        return self.bandwidth * self.bandwidth_efficiency

    def _ops(self):
        return self.peak_ops * self.compute_efficiency

    def step_s(self, shape: StepShape) -> float:
        mem = (self.weights_bytes + self.kv_bytes_per_token * (shape.decode_context + shape.prefill_context)) \
            / self._mem()
        ops = (2.0 * self.num_params * (shape.prefill_tokens + shape.decode_rows)
               + self.attention_ops_per_context_token * (shape.decode_context + shape.prefill_pairs)) / self._ops()
        return max(mem, ops) + self.overhead_s

    def decode_lines(self, rows):
        return [(self.weights_bytes / self._mem(), self.kv_bytes_per_token / self._mem()),
                (2.0 * self.num_params * rows / self._ops(), self.attention_ops_per_context_token / self._ops())]

    def to_dict(self) -> dict:
        d = asdict(self)
        d["kind"] = "roofline"
        return d


def step_model_from_dict(d: dict) -> StepModel:
    d = dict(d)
    kind = d.pop("kind", None)
    if kind == "linear":
        return LinearStepModel(**d)
    if kind == "roofline":
        return RooflineStepModel(**d)
    raise ValueError(f"unknown step model kind {kind!r}; expected 'linear' or 'roofline'")


def fit_linear(shapes, durations, features=FEATURES, meta: dict | None = None,
               weighting: str = "time", jitter: bool = False, bins: tuple = ()) -> LinearStepModel:
    """Least squares with every coefficient >= 0 (an exact search over active sets).

    ``shapes``: :class:`StepShape` per step; ``durations``: seconds per step.
    ``features``: which terms to fit (the others are 0); the constant is always
    kept. ``weighting="time"`` (default) minimises the squared error in seconds,
    so the fitted steps add up to the measured time (what a queue feels);
    ``"relative"`` weights each row by 1/duration (short decode steps count as
    much as long prefills, but the fit then runs low on noisy data).
    ``jitter``: keep the residuals' quantiles as the model's noise (see
    :class:`LinearStepModel`). ``bins``: row-count bin edges (e.g. ``(2, 4, 8)``);
    each bin gets its own offset, fitted without a sign constraint.
    """
    shapes = list(shapes)
    y = np.asarray(durations, dtype=float)
    if len(shapes) != len(y):
        raise ValueError(f"got {len(shapes)} step shapes but {len(y)} durations")
    if len(y) < len(features) + 1:
        raise ValueError(f"need at least {len(features) + 1} measured steps to fit {len(features)} terms, "
                         f"got {len(y)}")
    if np.any(~np.isfinite(y)) or np.any(y <= 0):
        raise ValueError("durations must be positive, finite seconds")
    unknown = set(features) - set(FEATURES)
    if unknown:
        raise ValueError(f"unknown features {sorted(unknown)}; choose from {FEATURES}")
    X = np.array([s.features() for s in shapes], dtype=float)
    bins = tuple(int(b) for b in bins)
    if bins:
        rows = np.array([s.prefill_tokens + s.decode_rows for s in shapes])
        edges = np.array(bins + (np.inf,))
        onehot = np.stack([(rows >= lo) & (rows < hi) for lo, hi in zip(edges[:-1], edges[1:])], axis=1)
        X = np.hstack([X, onehot.astype(float)])
    nb = len(bins)
    cols = [i for i, name in enumerate(FEATURES) if name in features or i == 0]
    if weighting not in ("time", "relative"):
        raise ValueError(f"weighting must be 'time' or 'relative', got {weighting!r}")
    w = 1.0 / y if weighting == "relative" else np.ones_like(y)
    scale = np.maximum(np.abs(X).max(axis=0), 1e-12)
    Xw = (X / scale) * w[:, None]
    yw = y * w
    best, best_err = None, math.inf
    others = cols[1:]
    free = list(range(len(FEATURES), len(FEATURES) + nb))  # bin offsets: any sign
    for r in range(len(others), -1, -1):
        for subset in itertools.combinations(others, r):
            use = [0, *subset, *free]
            coef, *_ = np.linalg.lstsq(Xw[:, use], yw, rcond=None)
            if np.any(coef[: len(use) - nb] < 0):
                continue
            err = float(np.sum((Xw[:, use] @ coef - yw) ** 2))
            if err < best_err - 1e-15:
                full = np.zeros(len(FEATURES) + nb)
                full[use] = coef / scale[use]
                best, best_err = full, err
    if best is None:
        raise ValueError("no non-negative fit exists (the constant alone came out negative)")
    info = dict(meta or {})
    pred = X @ best
    info.update(n_steps=int(len(y)), median_abs_rel_err=float(np.median(np.abs(pred - y) / y)),
                weighting=weighting)
    noise = tuple(np.quantile(y - pred, np.linspace(0, 1, 201)).tolist()) if jitter else ()
    base = best[:len(FEATURES)]
    a = float(base[0])
    costs = [float(c) for c in best[len(FEATURES):]]
    if costs and a + min(costs) < 0:  # keep every step's fixed part >= 0
        raise ValueError("the fitted row-count offsets make a step's fixed cost negative; use fewer bins")
    return LinearStepModel(*[float(c) for c in base], meta=info, noise=noise, bin_edges=bins,
                           bin_costs=tuple(costs))
