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
  + f*prefill_seqs`` (all coefficients >= 0; :func:`~servelab.sim.fit.fit_linear`).
* :class:`KindStepModel` - two fitted linear models, one for pure decode
  steps (with an offset per decode-row count: small matrices do not cost in
  proportion to their rows) and one for steps that compute prompt tokens
  (prefill chunks, alone or sharing the step with decode rows);
  :func:`~servelab.sim.fit.fit_by_kind`. The engine runs these two kinds through different
  code (a decode step attends one query row per sequence; a prompt chunk
  attends its rows against their past), so one line through both misses
  each by a share of its time.
* :class:`~servelab.sim.profiled.ProfiledStepModel` - a :class:`KindStepModel` whose steps with
  prompt tokens are multiplied by a factor measured per prompt-token count:
  a profiling sweep times the engine's prompt steps on a grid of sizes (the
  chunk and budget sizes the scheduler produces, each with its neighbours one
  token below and above), and a size's factor is how much faster or slower it
  ran, against the linear model, than its neighbours (so the machine's speed
  during the sweep cancels and only the *shape* is kept). Between grid points
  the factor is interpolated linearly; outside the grid it is 1 (the linear
  model); :func:`fit_profiled`. Vidur builds its step model the same way:
  from a profile of the engine's operations at the shapes the scheduler makes.
* :class:`RooflineStepModel` - a chip from the registry: the larger of the
  memory time (weights once, plus every KV byte read) and the compute time
  (2 x parameters per token, plus attention), plus a fixed overhead.

For a run of pure decode steps the context grows by ``decode_rows`` tokens a
step, so each model is a maximum of straight lines in the context; the
simulator sums whole runs in closed form (:meth:`StepModel.decode_run_s`).
Fitting them to measured steps is :mod:`servelab.sim.fit`. Pure Python + numpy.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import NamedTuple

import numpy as np

__all__ = ["StepShape", "StepModel", "LinearStepModel", "KindStepModel", "RooflineStepModel",
           "step_model_from_dict", "step_kind", "FEATURES", "STEP_KINDS", "STEP_MODEL_FORMAT",
           "after_prompt", "aftermath_position"]

#: Names of the fitted model's terms, in the order of its coefficients.
FEATURES = ("1", "prefill_tokens", "decode_rows", "decode_context", "prefill_pairs", "prefill_seqs")


class StepShape(NamedTuple):
    prefill_tokens: int = 0
    decode_rows: int = 0
    decode_context: int = 0
    prefill_pairs: float = 0.0
    prefill_seqs: int = 0
    prefill_context: int = 0
    #: Prompt tokens of the latest step that had them (:func:`after_prompt`): the decode steps
    #: after a prompt step run slower for a few steps
    after_prompt_tokens: int = 0
    #: Steps since that step (1: right after it; 0: none yet). A shape without it and with
    #: ``after_prompt_tokens`` is a step right after one (how format 5 and earlier counted).
    steps_after_prompt: int = 0

    def features(self) -> tuple:
        return (1.0, self.prefill_tokens, self.decode_rows, self.decode_context, self.prefill_pairs,
                self.prefill_seqs)


def after_prompt(shapes) -> list:
    """``shapes`` of consecutive steps, each marked with the prompt tokens of the latest step
    before it that had them, and how many steps ago that was (1: the step before)."""
    out, tokens, since = [], 0, 0
    for s in shapes:
        out.append(s._replace(after_prompt_tokens=tokens, steps_after_prompt=since + 1 if tokens else 0))
        if s.prefill_tokens:
            tokens, since = s.prefill_tokens, 0
        elif tokens:
            since += 1
    return out


def aftermath_position(shape: StepShape) -> int:
    """Which decode step after a prompt step ``shape`` is (1: right after; 0: none, or not a
    decode step)."""
    if shape.prefill_tokens or not shape.after_prompt_tokens:
        return 0
    return shape.steps_after_prompt or 1


#: Kinds of step, for fitting and for residuals: no prompt tokens; prompt tokens only; both.
STEP_KINDS = ("decode", "prefill", "mixed")

#: What a fitted model's row-count bins may count.
BIN_ON = ("rows", "decode_rows")

#: Version of the saved step-model format (``to_dict``/``step_model_from_dict``). Version 1 saved
#: ``kind`` "linear" or "roofline" without a version; version 2 adds "by_kind"; version 3 adds
#: "profiled" (a "by_kind" model with a measured per-size correction of its prompt steps); version 4
#: a "by_kind" model's cost of a decode step right after a prompt step; version 5 a linear
#: model's knee (a dearer price per context token beyond ``knee_context``); version 6 a "by_kind"
#: model's ``aftermath`` (the first few decode steps after a prompt step, each dearer by a share).
STEP_MODEL_FORMAT = 6


def ordinal(k: int) -> str:
    """1st, 2nd, 3rd, 4th, ..."""
    return f"{k}{'th' if 10 <= k % 100 < 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(k % 10, 'th')}"


def step_kind(shape: StepShape) -> str:
    """"decode" (no prompt tokens), "prefill" (prompt tokens only) or "mixed" (both)."""
    if not shape.prefill_tokens:
        return "decode"
    return "mixed" if shape.decode_rows else "prefill"


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

    #: How many decode steps after a prompt step can cost more than their line (0: none).
    aftermath_steps: int = 0

    def carryover_s(self, prompt_tokens: int, position: int = 1, line_s: float = 0.0) -> float:
        """Extra seconds of the ``position``-th pure decode step after a step of ``prompt_tokens``
        (1: right after it), whose line prices it at ``line_s`` seconds."""
        return 0.0

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


#: The fields of :class:`LinearStepModel` that are its coefficients, in the order of ``FEATURES``.
_COEFFICIENTS = ("a", "b_prefill", "c_decode", "d_context", "e_pairs", "f_chunks", "g_knee")


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
    #: What the bins count: "rows" (prompt tokens + decode rows) or "decode_rows".
    bin_on: str = "rows"
    #: Each decode-context token beyond ``knee_context`` (the step's total) costs ``g_knee``
    #: seconds more: past some size the keys and values a step reads outgrow a cache, so each
    #: further token is read from further away (:func:`~servelab.sim.fit.fit_by_kind` looks for the knee).
    knee_context: int = 0
    g_knee: float = 0.0

    def __post_init__(self):
        for name in _COEFFICIENTS:
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ValueError(f"LinearStepModel.{name} must be a finite number >= 0, got {v!r}")
        self.noise = tuple(float(x) for x in self.noise)
        self.bin_edges = tuple(int(x) for x in self.bin_edges)
        self.bin_costs = tuple(float(x) for x in self.bin_costs)
        if len(self.bin_edges) != len(self.bin_costs):
            raise ValueError("bin_edges and bin_costs must have the same length")
        if self.bin_on not in BIN_ON:
            raise ValueError(f"bin_on must be one of {BIN_ON}, got {self.bin_on!r}")
        if isinstance(self.knee_context, bool) or not isinstance(self.knee_context, int) or self.knee_context < 0:
            raise ValueError(f"LinearStepModel.knee_context must be an int >= 0, got {self.knee_context!r}")
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
        return replace(self, meta=dict(self.meta), noise=(), noise_seed=0)

    def scaled(self, factor: float) -> "LinearStepModel":
        """Every step ``factor`` times as long (a machine that runs slower or faster right now)."""
        if not factor > 0:
            raise ValueError(f"factor must be positive, got {factor!r}")
        coefficients = dict(zip(_COEFFICIENTS, (c * factor for c in self.coefficients)))
        return replace(self, **coefficients, meta=dict(self.meta), noise=tuple(x * factor for x in self.noise),
                       bin_costs=tuple(c * factor for c in self.bin_costs))

    @property
    def coefficients(self) -> tuple:
        return tuple(getattr(self, name) for name in _COEFFICIENTS)

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
        if self.g_knee:
            base += self.g_knee * max(shape.decode_context - self.knee_context, 0)
        if self.bin_edges:
            base += self._bin(shape.decode_rows if self.bin_on == "decode_rows"
                              else shape.prefill_tokens + shape.decode_rows)
        return self._jitter(base) if self.noise else base

    def decode_lines(self, rows):
        a = self.a + self.c_decode * rows + (self._bin(rows) if self.bin_edges else 0.0)
        if not self.g_knee:
            return [(a, self.d_context)]
        return [(a, self.d_context), (a - self.g_knee * self.knee_context, self.d_context + self.g_knee)]

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
            what = "decode rows" if self.bin_on == "decode_rows" else "rows"
            text += f", plus by {what} in the step: " + ", ".join(
                f">={e}: {c * 1e3:+.2f} ms" for e, c in zip(self.bin_edges, self.bin_costs))
        if self.g_knee:
            text += f", plus {self.g_knee * 1e9:.2f} ns/context token beyond {self.knee_context}"
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


@dataclass
class KindStepModel(StepModel):
    """A fitted model per step kind: ``decode`` for steps without prompt tokens,
    ``prefill`` for steps with them (prefill chunks, alone or mixed with decode rows)."""

    decode: LinearStepModel
    prefill: LinearStepModel
    meta: dict = field(default_factory=dict)
    #: A pure decode step right after a step with prompt tokens costs ``after_prompt_s`` more,
    #: plus ``after_prompt_token_s`` per prompt token of that step (format 4-5; fits now give
    #: ``aftermath`` instead).
    after_prompt_s: float = 0.0
    after_prompt_token_s: float = 0.0
    #: ``((a1, b1), (a2, b2), ...)``: the k-th pure decode step after a step with P prompt tokens
    #: costs its line times ``1 + a_k + b_k * P`` (:func:`~servelab.sim.fit.fit_by_kind`).
    aftermath: tuple = ()

    def __post_init__(self):
        for name in ("decode", "prefill"):
            if not isinstance(getattr(self, name), LinearStepModel):
                raise TypeError(f"KindStepModel.{name} must be a LinearStepModel, "
                                f"got {type(getattr(self, name)).__name__}")
        for name in ("after_prompt_s", "after_prompt_token_s"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ValueError(f"KindStepModel.{name} must be a finite number >= 0, got {v!r}")
        try:
            self.aftermath = tuple((float(a), float(b)) for a, b in self.aftermath)
        except (TypeError, ValueError):
            raise ValueError(f"KindStepModel.aftermath must be pairs (a, b), got {self.aftermath!r}") from None
        if any(not (math.isfinite(v) and v >= 0) for pair in self.aftermath for v in pair):
            raise ValueError(f"KindStepModel.aftermath must hold finite numbers >= 0, got {self.aftermath!r}")

    @property
    def aftermath_steps(self) -> int:
        if self.aftermath:
            return len(self.aftermath)
        return 1 if (self.after_prompt_s or self.after_prompt_token_s) else 0

    @property
    def noisy(self) -> bool:
        return self.decode.noisy or self.prefill.noisy

    def reset_noise(self) -> None:
        self.decode.reset_noise()
        self.prefill.reset_noise()

    def step_s(self, shape: StepShape) -> float:
        if shape.prefill_tokens:
            return self.prefill.step_s(shape)
        line = self.decode.step_s(shape)
        pos = aftermath_position(shape)
        return line + self.carryover_s(shape.after_prompt_tokens, pos, line) if pos else line

    def carryover_s(self, prompt_tokens: int, position: int = 1, line_s: float = 0.0) -> float:
        if prompt_tokens <= 0 or position < 1:
            return 0.0
        extra = self.after_prompt_s + self.after_prompt_token_s * prompt_tokens if position == 1 else 0.0
        if position <= len(self.aftermath):
            a, b = self.aftermath[position - 1]
            extra += line_s * (a + b * prompt_tokens)
        return extra

    def decode_lines(self, rows):
        return self.decode.decode_lines(rows)

    def _like(self, decode, prefill, factor: float = 1.0) -> "KindStepModel":
        return KindStepModel(decode, prefill, dict(self.meta), self.after_prompt_s * factor,
                             self.after_prompt_token_s * factor, self.aftermath)

    def scaled(self, factor: float) -> "KindStepModel":
        """Every step ``factor`` times as long."""
        return self._like(self.decode.scaled(factor), self.prefill.scaled(factor), factor)

    def without_noise(self) -> "KindStepModel":
        return self._like(self.decode.without_noise(), self.prefill.without_noise())

    def with_noise(self, shapes, durations, seed: int = 0) -> "KindStepModel":
        """A copy whose every step adds a residual drawn from those of the measured steps of its
        kind (``shapes``, ``durations``): the machine's own step-to-step noise, for asking how much
        a percentile moves under it."""
        shapes = list(shapes)
        y = np.asarray(durations, dtype=float)
        parts = []
        for part, want_prompt in ((self.decode, False), (self.prefill, True)):
            m = np.array([bool(sh.prefill_tokens) == want_prompt for sh in shapes])
            if not m.any():
                parts.append(part.without_noise())
                continue
            res = y[m] - np.array([self.step_s(sh) for sh, k in zip(shapes, m) if k])  # carryover in
            q = tuple(np.quantile(res, np.linspace(0, 1, 201)).tolist())
            parts.append(replace(part, meta=dict(part.meta), noise=q, noise_seed=seed + len(parts)))
        return self._like(parts[0], parts[1])

    def to_dict(self) -> dict:
        return {"kind": "by_kind", "format": STEP_MODEL_FORMAT, "decode": self.decode.to_dict(),
                "prefill": self.prefill.to_dict(), "meta": self.meta, "after_prompt_s": self.after_prompt_s,
                "after_prompt_token_s": self.after_prompt_token_s, "aftermath": [list(p) for p in self.aftermath]}

    def describe(self) -> str:
        d, p = self.decode, self.prefill
        text = (f"decode steps: {d.a * 1e3:.3f} ms + {d.c_decode * 1e6:.2f} us/row + "
                f"{d.d_context * 1e9:.2f} ns/context token")
        if d.g_knee:
            text += f" (+{d.g_knee * 1e9:.2f} beyond {d.knee_context} tokens)"
        if d.bin_edges:
            text += " + by rows: " + ", ".join(f">={e}: {c * 1e3:+.2f} ms"
                                                for e, c in zip(d.bin_edges, d.bin_costs))
        text += (f"; steps with prompt tokens: {p.a * 1e3:.3f} ms + {p.b_prefill * 1e6:.2f} us/prompt token + "
                 f"{p.e_pairs * 1e9:.2f} ns/attention pair + {p.f_chunks * 1e6:.1f} us/prompt chunk + "
                 f"{p.c_decode * 1e6:.2f} us/decode row + {p.d_context * 1e9:.2f} ns/context token")
        if p.bin_edges:
            text += "".join(f" + {c * 1e3:.2f} ms with >= {e} decode rows" for e, c in zip(p.bin_edges, p.bin_costs))
        if self.after_prompt_s or self.after_prompt_token_s:
            text += (f"; a decode step right after a prompt step: +{self.after_prompt_s * 1e3:.3f} ms + "
                     f"{self.after_prompt_token_s * 1e6:.2f} us per prompt token of that step")
        if self.aftermath:
            text += "; the decode steps after a prompt step of P tokens cost their line times " + ", ".join(
                f"{1 + a:.3f} + {b * 100:.4f} x P/100 ({ordinal(k)})" for k, (a, b) in enumerate(self.aftermath, 1))
        return text


#: Readers of saved kinds defined in other modules, by kind (servelab.sim.profiled adds its own).
READERS: dict = {}


def step_model_from_dict(d: dict) -> StepModel:
    """Read a step model saved by ``to_dict`` (any format up to :data:`STEP_MODEL_FORMAT`)."""
    if not isinstance(d, dict):
        raise ValueError(f"a saved step model is a JSON object, got {type(d).__name__}")
    d = dict(d)
    kind = d.pop("kind", None)
    fmt = d.pop("format", 1)
    if not isinstance(fmt, int) or fmt > STEP_MODEL_FORMAT:
        raise ValueError(f"step model format {fmt!r} is newer than this servelab reads "
                         f"(up to {STEP_MODEL_FORMAT}): update servelab or refit with "
                         f"`python -m servelab.sim calibrate`")
    if kind == "linear":
        return LinearStepModel(**d)
    if kind == "roofline":
        return RooflineStepModel(**d)
    if kind == "by_kind":
        try:
            return KindStepModel(step_model_from_dict(d["decode"]), step_model_from_dict(d["prefill"]),
                                 d.get("meta", {}), d.get("after_prompt_s", 0.0), d.get("after_prompt_token_s", 0.0),
                                 d.get("aftermath", ()))
        except KeyError as exc:
            raise ValueError(f"a 'by_kind' step model needs 'decode' and 'prefill' parts; {exc} is missing")
    if kind in READERS:  # kinds defined in other modules (servelab.sim.profiled)
        return READERS[kind](d)
    raise ValueError(f"unknown step model kind {kind!r}; expected 'linear', 'by_kind', 'profiled' or 'roofline'")

