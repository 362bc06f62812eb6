"""The profiled step model: a fitted :class:`~servelab.sim.step_model.KindStepModel` whose
prompt steps carry a correction measured per prompt-token count (format 3 of a saved model;
see :mod:`servelab.sim.step_model`)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from servelab.sim.step_model import (READERS, STEP_MODEL_FORMAT, KindStepModel, StepModel, StepShape,
                                     step_model_from_dict)

__all__ = ["ProfiledStepModel", "fit_profiled", "PROFILE_TOKENS"]


#: The default profiling grid (prompt tokens in one step): the chunk and budget sizes the course's
#: configurations produce (32, 64, 128, 256, 512), each with the sizes one token below and above it.
PROFILE_TOKENS = (31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 256, 257, 511, 512, 513)


@dataclass
class ProfiledStepModel(StepModel):
    """A :class:`KindStepModel` (``base``) with a measured correction of its steps that compute
    prompt tokens: ``base.step_s(shape) * factor(shape.prefill_tokens)``, the factor interpolated
    linearly between the grid points ``tokens`` (strictly increasing) and 1.0 outside them. Pure
    decode steps are the base model's."""

    base: KindStepModel
    tokens: tuple
    factors: tuple
    meta: dict = field(default_factory=dict)

    def __post_init__(self):
        if not isinstance(self.base, KindStepModel):
            raise TypeError(f"ProfiledStepModel.base must be a KindStepModel, got {type(self.base).__name__}")
        try:
            tokens = tuple(int(t) for t in self.tokens)
            factors = tuple(float(f) for f in self.factors)
        except (TypeError, ValueError):
            raise TypeError("ProfiledStepModel.tokens and .factors must be sequences of numbers") from None
        if any(t != t0 for t, t0 in zip(tokens, self.tokens)):
            raise ValueError("ProfiledStepModel.tokens must be whole prompt-token counts")
        if len(tokens) != len(factors):
            raise ValueError(f"ProfiledStepModel needs one factor per grid point: {len(tokens)} tokens, "
                             f"{len(factors)} factors")
        if len(tokens) < 2:
            raise ValueError("ProfiledStepModel needs at least 2 grid points to interpolate between")
        if tokens[0] < 1 or any(b <= a for a, b in zip(tokens, tokens[1:])):
            raise ValueError(f"ProfiledStepModel.tokens must be >= 1 and strictly increasing, got {tokens}")
        if any(not math.isfinite(f) or f <= 0 for f in factors):
            raise ValueError(f"ProfiledStepModel.factors must be positive and finite, got {factors}")
        self.tokens, self.factors = tokens, factors
        self.__dict__["_t"] = np.array(tokens, dtype=float)
        self.__dict__["_f"] = np.array(factors, dtype=float)

    @property
    def overhead_s(self):
        return self.base.overhead_s

    @property
    def noisy(self) -> bool:
        return self.base.noisy

    def reset_noise(self) -> None:
        self.base.reset_noise()

    def factor(self, prefill_tokens: float) -> float:
        """The correction for a step with ``prefill_tokens`` prompt tokens (1.0 outside the grid)."""
        return float(np.interp(prefill_tokens, self.__dict__["_t"], self.__dict__["_f"],
                               left=1.0, right=1.0))

    def step_s(self, shape: StepShape) -> float:
        return self.base.step_s(shape) * self.factor(shape.prefill_tokens)

    def carryover_s(self, prompt_tokens: int, position: int = 1, line_s: float = 0.0) -> float:
        return self.base.carryover_s(prompt_tokens, position, line_s)

    @property
    def aftermath_steps(self) -> int:
        return self.base.aftermath_steps

    def decode_lines(self, rows):
        return self.base.decode_lines(rows)

    def _like(self, base: KindStepModel) -> "ProfiledStepModel":
        return ProfiledStepModel(base, self.tokens, self.factors, dict(self.meta))

    def scaled(self, factor: float) -> "ProfiledStepModel":
        """Every step ``factor`` times as long."""
        return self._like(self.base.scaled(factor))

    def without_noise(self) -> "ProfiledStepModel":
        return self._like(self.base.without_noise())

    def with_noise(self, shapes, durations, seed: int = 0) -> "ProfiledStepModel":
        """The base model's noise (residuals of the measured steps against the base model), with
        this model's correction on top (see :meth:`KindStepModel.with_noise`)."""
        return self._like(self.base.with_noise(shapes, durations, seed=seed))

    def to_dict(self) -> dict:
        return {"kind": "profiled", "format": STEP_MODEL_FORMAT, "base": self.base.to_dict(),
                "tokens": list(self.tokens), "factors": list(self.factors), "meta": self.meta}

    def describe(self) -> str:
        return (self.base.describe() + "; steps with prompt tokens multiplied by the profile's factor per "
                "prompt-token count: " + ", ".join(f"{t}: {f:.3f}" for t, f in zip(self.tokens, self.factors))
                + f" (interpolated between, 1 below {self.tokens[0]} and above {self.tokens[-1]})")


def fit_profiled(base: KindStepModel, shapes, durations, meta: dict | None = None) -> ProfiledStepModel:
    """A :class:`ProfiledStepModel` from a profiling sweep: ``shapes`` and ``durations`` are the
    profiled steps (each with prompt tokens; several timings per size). Per prompt-token count
    the sweep gives the median of measured over ``base``-predicted time; a size whose neighbours one
    token below and above were profiled too gets the factor ``its ratio / the mean of theirs``
    (how much cheaper or dearer that exact size runs than the sizes around it: the machine's speed
    during the sweep, and the line's trend, cancel), every other grid size the factor 1. So the
    fitted line keeps the trend and the profile adds only what the line cannot have: a step of
    exactly a chunk size costing other than its neighbours."""
    if not isinstance(base, KindStepModel):
        raise TypeError(f"base must be a KindStepModel (fit_by_kind), got {type(base).__name__}")
    shapes = list(shapes)
    y = np.asarray(durations, dtype=float)
    if len(shapes) != len(y):
        raise ValueError(f"got {len(shapes)} profiled step shapes but {len(y)} durations")
    if np.any(~np.isfinite(y)) or np.any(y <= 0):
        raise ValueError("profiled durations must be positive, finite seconds")
    if any(not s.prefill_tokens for s in shapes):
        raise ValueError("a profile times steps with prompt tokens; a shape without any was given")
    by_size: dict[int, list[float]] = {}
    for s, t in zip(shapes, y):
        by_size.setdefault(int(s.prefill_tokens), []).append(float(t) / base.step_s(s))
    tokens = sorted(by_size)
    ratio = {t: float(np.median(v)) for t, v in by_size.items()}
    centres = [t for t in tokens if t - 1 in ratio and t + 1 in ratio]
    if not centres:
        raise ValueError(f"a profile needs some size with both neighbours (n - 1 and n + 1 tokens) "
                         f"profiled too, got sizes {tokens}")
    factors = [ratio[t] / ((ratio[t - 1] + ratio[t + 1]) / 2) if t in centres else 1.0 for t in tokens]
    info = dict(meta or {})
    info.update(profile_steps=int(len(y)), profile_speed=float(np.median(list(ratio.values()))))
    return ProfiledStepModel(base, tuple(tokens), tuple(float(f) for f in factors), info)


def _read(d: dict) -> ProfiledStepModel:
    try:
        return ProfiledStepModel(step_model_from_dict(d["base"]), d["tokens"], d["factors"], d.get("meta", {}))
    except KeyError as exc:
        raise ValueError(f"a 'profiled' step model needs 'base', 'tokens' and 'factors'; {exc} is missing")


READERS["profiled"] = _read
