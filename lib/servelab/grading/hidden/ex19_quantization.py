"""Exercise 19 · Quantization: group-wise int4 round trip, bits per weight with scales, and the
step time of a memory-bound model at a new precision. Hidden tests.

Q2's and Q3's expected values come from :mod:`servelab.quant` (``bits_per_weight`` of the
library's formats, ``memory_bound_step_seconds``). Q1's come from the float64 reference
below: the library rounds each scale to bf16 as its kernels store it, which an interview
answer need not do; :func:`test_reference_matches_the_library` in the mutant tests checks
that the two agree when the scales are exact in bf16.
"""
import math

import numpy as np

from servelab import quant
from servelab.grading import Case, Question


def _int4_ref(weights, group):
    """Symmetric int4 per group: scale = max|w| / 7, codes round-half-even, clamped to -8..7."""
    if isinstance(group, bool) or not isinstance(group, int) or group < 1:
        raise ValueError("group must be a positive whole number")
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 1 or len(w) % group:
        raise ValueError("the number of weights must be a multiple of group")
    if not np.isfinite(w).all():
        raise ValueError("weights must be finite")
    g = w.reshape(-1, group)
    scale = np.abs(g).max(axis=1, keepdims=True) / 7
    safe = np.where(scale > 0, scale, 1.0)
    codes = np.clip(np.round(g / safe), -8, 7)
    return (codes * scale).reshape(-1).tolist()


def _rand(seed, n, scale=0.02):
    return np.round(np.random.default_rng(seed).normal(size=n) * scale, 5).tolist()


def _int4_case(weights, group, label):
    # rel 1e-6: a float32 answer passes; every classic mistake is off by a whole code step
    return Case(args=(weights, group), expected=_int4_ref(weights, group), rel=1e-6, abs=1e-9, label=label)


_VISIBLE = [0.7, -0.35, 0.1, 0.0, -1.4, 0.2, 0.05, 0.6]
_OUTLIER_GROUPS = [0.01, -0.02, 0.015, 0.005] + [3.5, -0.02, 0.01, 0.03]

Q1 = Question(
    id="q1", title="Group-wise int4 round trip", function="int4_roundtrip", points=4, level="medium",
    minutes=12,
    visible=[_int4_case(_VISIBLE, 4, "8 weights, groups of 4")],
    hidden=[
        _int4_case(_rand(1, 64), 32, "64 random weights, groups of 32"),
        _int4_case(_rand(2, 256), 128, "256 random weights, groups of 128"),
        _int4_case(_OUTLIER_GROUPS, 4, "an outlier in the second group only: the first keeps its fine scale"),
        _int4_case([-0.5, -2.0, -1.25, -0.01], 4, "a negative-only group (max of |w|, not of w)"),
        _int4_case([0.0, 0.0, 0.0, 0.0, 1.0, -1.0, 0.6, 0.25], 4, "a group of zeros (no division by zero)"),
        # (0.6, not 0.5: 0.5 / (1/7) is an exact tie that float rounding of the scale decides)
        _int4_case([7.0, -7.0, 3.5, 0.5, 1.5, 2.5, -0.5, -2.5], 8, "scale 1: +-max exact, ties to even"),
        _int4_case([0.3], 1, "a group of one weight comes back exactly"),
        _int4_case([], 4, "no weights"),
        Case(args=([0.1, 0.2, 0.3], 2), raises=ValueError, label="3 weights in groups of 2"),
        Case(args=([0.1, 0.2], 0), raises=ValueError, label="group 0"),
        Case(args=([0.1, float("nan")], 2), raises=ValueError, label="a NaN"),
    ],
)


def _bits_case(name, in_features=None):
    fmt = quant.get_format(name)
    group = fmt.group or in_features
    return Case(args=(fmt.element_bits, group, fmt.scale_bits),
                expected=quant.bits_per_weight(name, in_features=in_features),
                label=f"{name}: {fmt.element_bits}-bit elements, {fmt.scale_bits}-bit scale per {group}")


Q2 = Question(
    id="q2", title="Bits per weight, scales included", function="bits_per_weight", points=3, level="easy",
    minutes=6,
    visible=[_bits_case("int4-g128")],
    hidden=[
        _bits_case("int4-g32"),
        _bits_case("mxfp4"),
        _bits_case("nvfp4"),
        _bits_case("int8", in_features=4096),
        Case(args=(4, 1, 16), expected=20.0, label="a scale per weight costs 16 bits each"),
        Case(args=(8, 4096, 32), expected=8 + 32 / 4096, label="int8, fp32 scale per row of 4096"),
        Case(args=(4, 0, 16), raises=ValueError, label="group 0"),
        Case(args=(4, -32, 16), raises=ValueError, label="a negative group"),
        Case(args=(0, 32, 16), raises=ValueError, label="0-bit elements"),
    ],
)


def _step_case(params, bits, bandwidth_gb_s, overhead_ms, label):
    expected = quant.memory_bound_step_seconds(params, bits, bandwidth_gb_s * 1e9) * 1e3 + overhead_ms
    return Case(args=(params, bits, bandwidth_gb_s, overhead_ms), expected=expected, rel=1e-9, label=label)


Q3 = Question(
    id="q3", title="Step time at a new precision", function="step_time_ms", points=3, level="medium",
    minutes=8,
    visible=[_step_case(8.03e9, 16, 3350, 0.0, "8B parameters, bf16, 3,350 GB/s")],
    hidden=[
        _step_case(8.03e9, 4.125, 3350, 0.0, "8B parameters, int4 g128 (4.125 bits), 3,350 GB/s"),
        _step_case(70.6e9, 8, 8000, 0.0, "70B parameters, 8-bit, 8,000 GB/s"),
        _step_case(70.6e9, 4.5, 8000, 2.0, "70B, 4.5 bits, 8,000 GB/s, plus 2 ms of overhead"),
        _step_case(213e6, 32, 15, 0.0, "a 213M model in fp32 on one CPU core (15 GB/s)"),
        _step_case(1, 1, 1, 0.0, "one 1-bit weight at 1 GB/s"),
        Case(args=(8e9, 0, 3350, 0.0), raises=ValueError, label="0 bits"),
        Case(args=(8e9, 4, 0, 0.0), raises=ValueError, label="0 GB/s"),
        Case(args=(-8e9, 4, 3350, 0.0), raises=ValueError, label="negative parameters"),
        Case(args=(8e9, 4, 3350, -1.0), raises=ValueError, label="negative overhead"),
    ],
)

QUESTIONS = [Q1, Q2, Q3]
assert math.isclose(Q3.visible[0].expected, 8.03e9 * 2 / 3350e9 * 1e3)
