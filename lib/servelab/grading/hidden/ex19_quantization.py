"""Exercise 19 · Quantization: group-wise int4 round trip, bits per weight with scales, the
step time of a memory-bound model at a new precision, and the weight and KV formats to pick for
a memory and quality target. Hidden tests.

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


# --------------------------------------------------------------------------- Q4

def _choose_formats(model, weight_formats, kv_formats, card_bytes, seats, context):
    """Reference: every (weight, KV) pair that fits weights plus every seat's cache on the card;
    the least summed loss, then the fewest bytes, then the names."""
    sizes = (model["params"], model["num_layers"], model["num_kv_heads"], model["head_dim"])
    if min(sizes) <= 0 or card_bytes <= 0 or seats < 1 or context < 1:
        raise ValueError("sizes, the card, the seats and the context must be positive")

    def bits(fmt):                       # a value's bits, its share of the scale included
        element_bits, group, scale_bits, _ = fmt
        if element_bits <= 0 or group < 0:
            raise ValueError(f"not a format: {fmt}")
        return element_bits + (scale_bits / group if group else 0)

    params, layers, kv_heads, head_dim = sizes
    values_per_token = 2 * layers * kv_heads * head_dim     # a key and a value per KV head, every layer
    best = None
    for w_name, w in weight_formats.items():
        for kv_name, kv in kv_formats.items():
            used = params * bits(w) / 8 + seats * context * values_per_token * bits(kv) / 8
            if used > card_bytes:
                continue
            loss = w[3] + kv[3]                              # the two losses add
            choice = (loss, used, w_name, kv_name)           # least loss, then fewest bytes
            if best is None or choice < best:
                best = choice
    return None if best is None else (best[2], best[3])


# (element bits, values per scale (0: none), scale bits, quality loss): stated inputs, not measurements
_W = {"bf16": (16, 0, 0, 0.0), "fp8": (8, 0, 0, 0.25), "int4-g128": (4, 128, 16, 1.5),
      "nvfp4": (4, 16, 8, 1.0), "mxfp4": (4, 32, 8, 2.0)}
_K = {"bf16": (16, 0, 0, 0.0), "fp8": (8, 0, 0, 0.25), "int4-g128": (4, 128, 16, 1.25)}
_70B = {"params": 70.6e9, "num_layers": 80, "num_kv_heads": 8, "head_dim": 128}
_8B = {"params": 8.03e9, "num_layers": 32, "num_kv_heads": 8, "head_dim": 128}


# nvfp4 weights (4.5 bits) and an fp8 cache for 16 seats of 8,192 tokens, to the byte (exact in
# binary: every format's bits are a whole number plus a power-of-two fraction)
_EXACT_FIT = 70.6e9 * 4.5 / 8 + 16 * 8192 * (2 * 80 * 8 * 128) * 8 / 8
# two KV formats that cost the same bits and loss, the later name listed first
_K_TIE = {"bf16": (16, 0, 0, 0.0), "fp8-e5m2": (8, 0, 0, 0.25), "fp8-e4m3": (8, 0, 0, 0.25),
          "int4-g128": (4, 128, 16, 1.25)}


def _c4(model, card, seats, context, label, weights=_W, kv=_K):
    return Case(args=(model, weights, kv, card, seats, context),
                expected=_choose_formats(model, weights, kv, card, seats, context), label=label)


Q4 = Question(
    id="q4", title="Pick the formats: the best quality that fits", function="choose_formats",
    points=5, level="hard", minutes=20,
    visible=[_c4(_70B, 75e9, 16, 8192, "a 70B model, 16 seats of 8,192 tokens, 75 GB")],
    hidden=[
        _c4(_70B, 40e9, 1, 8192, "70B, one seat, 40 GB"),
        _c4(_70B, 40e9, 4, 8192, "70B, 4 seats, 40 GB"),
        _c4(_70B, 75e9, 4, 8192, "70B, 4 seats, 75 GB"),
        _c4(_70B, 75e9, 1, 8192, "70B, one seat, 75 GB"),
        _c4(_70B, 141e9, 32, 8192, "70B, 32 seats, 141 GB"),
        _c4(_70B, 180e9, 16, 8192, "70B, 16 seats, 180 GB: two pairs lose the same, the smaller wins"),
        _c4(_70B, 75e9, 64, 8192, "70B, 64 seats, 75 GB: nothing fits (None)"),
        _c4(_8B, 40e9, 32, 8192, "8B, 32 seats, 40 GB"),
        _c4(_8B, 40e9, 128, 8192, "8B, 128 seats, 40 GB"),
        _c4(_8B, 75e9, 256, 8192, "8B, 256 seats, 75 GB"),
        _c4(_8B, 180e9, 8, 8192, "8B, 8 seats, 180 GB: no need to quantize"),
        _c4(_70B, _EXACT_FIT, 16, 8192, "70B, 16 seats: nvfp4 weights and an fp8 cache fill the card to the byte"),
        _c4(_70B, 75e9, 16, 8192, "two fp8 caches tie on loss and bytes: the names decide (e4m3 before e5m2)",
            kv=_K_TIE),
        Case(args=(_8B, _W, _K, 75e9, 0, 8192), raises=ValueError, label="no seats"),
        Case(args=(_8B, _W, _K, 75e9, 8, 0), raises=ValueError, label="no context"),
        Case(args=(dict(_8B, params=0), _W, _K, 75e9, 8, 8192), raises=ValueError, label="no parameters"),
        Case(args=(_8B, _W, _K, 0, 8, 8192), raises=ValueError, label="a card with no memory"),
    ],
)

QUESTIONS = [Q1, Q2, Q3, Q4]
assert math.isclose(Q3.visible[0].expected, 8.03e9 * 2 / 3350e9 * 1e3)
assert _choose_formats(_70B, _W, _K, _EXACT_FIT, 16, 8192) != _choose_formats(_70B, _W, _K, _EXACT_FIT - 1, 16, 8192)
