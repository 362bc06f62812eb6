"""Exercise 8 · The roofline: lone-request ceiling, ridge point, balance batch. Hidden tests.

Expected values come from :mod:`servelab.roofline`.
"""
from servelab import roofline as rl
from servelab.grading import Case, Question

GB, TB = 1e9, 1e12

Q1 = Question(
    id="q1", title="The lone-request decode ceiling", function="lone_request_ceiling", points=2, level="easy",
    minutes=5,
    visible=[Case(args=(70e9, 2, 3.35 * TB), expected=rl.lone_request_tokens_per_s(140 * GB, 3.35 * TB), rel=1e-6,
                  label="70B, bf16, 3.35 TB/s")],
    hidden=[
        Case(args=(8e9, 2, 3.35 * TB), expected=rl.lone_request_tokens_per_s(16 * GB, 3.35 * TB), rel=1e-6),
        Case(args=(200e9, 1, 64 * TB), expected=rl.lone_request_tokens_per_s(200 * GB, 64 * TB), rel=1e-6,
             label="200B at 8 bits over 8 B200s"),
        Case(args=(405e9, 0.5, 8 * TB), expected=rl.lone_request_tokens_per_s(202.5 * GB, 8 * TB), rel=1e-6,
             label="405B at 4 bits"),
        Case(args=(70e9, 2, 3.35 * TB), kwargs={"efficiency": 0.6},
             expected=rl.lone_request_tokens_per_s(140 * GB, 3.35 * TB, 0.6), rel=1e-6, label="at 60% efficiency"),
        Case(args=(0, 2, 3.35 * TB), raises=ValueError, label="zero parameters"),
        Case(args=(70e9, 2, -1.0), raises=ValueError, label="negative bandwidth"),
        Case(args=(70e9, 2, 3.35 * TB), kwargs={"efficiency": 0}, raises=ValueError, label="efficiency 0"),
        Case(args=(70e9, 2, 3.35 * TB), kwargs={"efficiency": 1.2}, raises=ValueError, label="efficiency 1.2"),
    ],
)

Q2 = Question(
    id="q2", title="The ridge point", function="ridge_point", points=2, level="easy", minutes=5,
    visible=[Case(args=(4.5e15, 8e12), expected=562.5, label="B200 at 8 bits")],
    hidden=[
        Case(args=(989.4e12, 3.35e12), expected=989.4e12 / 3.35e12, rel=1e-9, label="H100 bf16"),
        Case(args=(4.5e15, 8e12), kwargs={"compute_efficiency": 0.5, "bandwidth_efficiency": 0.6},
             expected=rl.ridge_point("B200", "fp8", 0.5, 0.6), rel=1e-9, label="B200 at 50% / 60%"),
        Case(args=(1.2e12, 15e9), expected=80.0, rel=1e-9, label="a CPU core in bf16"),
        Case(args=(0, 8e12), raises=ValueError, label="zero peak"),
        Case(args=(4.5e15, 8e12), kwargs={"bandwidth_efficiency": 0}, raises=ValueError, label="efficiency 0"),
    ],
)

Q3 = Question(
    id="q3", title="The balance batch", function="balance_batch", points=3, level="medium", minutes=8,
    visible=[Case(args=(4.5e15, 8e12, 1, 0.5, 0.6),
                  expected=rl.balance_batch("B200", "fp8", 1, 0.5, 0.6), rel=1e-9,
                  label="B200, 8-bit weights, 50% arithmetic, 60% bandwidth")],
    hidden=[
        Case(args=(989.4e12, 3.35e12, 2, 1.0, 1.0), expected=rl.balance_batch("H100 SXM", "bf16", 2, 1.0, 1.0),
             rel=1e-9, label="H100, bf16 weights, peak rates"),
        Case(args=(9e15, 8e12, 0.5, 0.5, 0.6), expected=rl.balance_batch("B200", "fp4", 0.5, 0.5, 0.6), rel=1e-9,
             label="B200, 4-bit weights"),
        Case(args=(4.5e15, 8e12, 1, 1.0, 0.3), expected=rl.balance_batch("B200", "fp8", 1, 1.0, 0.3), rel=1e-9),
        Case(args=(4.5e15, 8e12, 0, 0.5, 0.6), raises=ValueError, label="zero bytes per parameter"),
        Case(args=(4.5e15, 8e12, 1, 1.5, 0.6), raises=ValueError, label="efficiency above 1"),
        Case(args=(4.5e15, 8e12, 1, 0.5, -0.6), raises=ValueError, label="negative efficiency"),
    ],
)

# --------------------------------------------------------------------------- Q4

def _compute_bound_batch(params, bytes_per_param, kv_bytes_per_token, context, peak_flops, bandwidth):
    """Smallest batch whose decode step is compute-bound once every sequence's KV cache is read, or None."""
    import math

    for name, v in (("params", params), ("bytes_per_param", bytes_per_param), ("peak_flops", peak_flops),
                    ("bandwidth", bandwidth)):
        if v <= 0:
            raise ValueError(f"{name} must be positive")
    if kv_bytes_per_token < 0 or context < 0:
        raise ValueError("KV bytes and context cannot be negative")
    gain = 2 * params * bandwidth - peak_flops * context * kv_bytes_per_token   # per sequence
    if gain <= 0:
        return None
    b = peak_flops * params * bytes_per_param / gain
    return max(1, math.ceil(b - 1e-9))


def _c8(*args, label=""):
    return Case(args=args, expected=_compute_bound_batch(*args), label=label)


_H100 = (989e12, 3.35e12)   # dense bf16 peak, HBM3 bandwidth

Q4 = Question(
    id="q4", title="Does a bigger batch ever make decode compute-bound?", function="compute_bound_batch",
    points=5, level="hard", minutes=15,
    visible=[_c8(8e9, 2, 131_072, 100, *_H100, label="Llama 3 8B in bf16 at 100 tokens of context, H100")],
    hidden=[
        _c8(8e9, 2, 131_072, 0, *_H100, label="no context: the plain ridge-point batch"),
        _c8(8e9, 2, 131_072, 1000, *_H100, label="1,000 tokens: the cache reads outgrow the compute (None)"),
        _c8(70e9, 2, 327_680, 4000, *_H100, label="Llama 3 70B at 4,000 tokens"),
        _c8(70e9, 1, 163_840, 2000, *_H100, label="8-bit weights and cache"),
        _c8(1e9, 2, 0, 5000, *_H100, label="no KV cache at all"),
        _c8(1e12, 2, 10, 10, 1e6, 1e12, label="a chip with more bandwidth than compute: batch 1"),
        _c8(3.35e12 / 2, 1, 0, 0, 3.35e12, 3.35e12, label="exactly on the ridge at batch 1 (no float noise)"),
        Case(args=(0, 2, 131_072, 1000) + _H100, raises=ValueError, label="no parameters"),
        Case(args=(8e9, 2, -1, 1000) + _H100, raises=ValueError, label="negative KV bytes"),
        Case(args=(8e9, 2, 131_072, 1000, 0, 3.35e12), raises=ValueError, label="no compute"),
    ],
)

QUESTIONS = [Q1, Q2, Q3, Q4]
