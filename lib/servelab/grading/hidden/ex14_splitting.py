"""Exercise 14 · Splitting a model: pipeline bubbles and what each chip reads. Hidden tests.

Expected values come from :mod:`servelab.comm`.
"""
import math

from servelab import comm
from servelab.grading import Case, Question


def _needed(stages, max_bubble):
    # smallest m with (p - 1) / (m + p - 1) <= f, found by counting up (no float edge)
    m = 1
    while comm.bubble_fraction(stages, m) > max_bubble + 1e-12:
        m += 1
    return m


Q1 = Question(
    id="q1", title="Bubble fraction", function="bubble_fraction", points=2, level="easy", minutes=5,
    visible=[Case(args=(4, 8), expected=comm.bubble_fraction(4, 8), label="4 stages, 8 micro-batches")],
    hidden=[
        Case(args=(1, 5), expected=0.0, abs=1e-12, label="one stage: no bubble"),
        Case(args=(4, 1), expected=0.75, label="one micro-batch: only one stage works at a time"),
        Case(args=(8, 64), expected=comm.bubble_fraction(8, 64)),
        Case(args=(2, 1000), expected=comm.bubble_fraction(2, 1000)),
        Case(args=(0, 4), raises=ValueError, label="zero stages"),
        Case(args=(4, 0), raises=ValueError, label="zero micro-batches"),
    ],
)

Q2 = Question(
    id="q2", title="Micro-batches for a bubble budget", function="microbatches_needed", points=3,
    level="medium", minutes=8,
    visible=[Case(args=(4, 0.1), expected=_needed(4, 0.1), label="4 stages, at most 10% idle")],
    hidden=[
        Case(args=(4, 0.25), expected=_needed(4, 0.25), label="exactly on the boundary (3/12)"),
        Case(args=(8, 0.05), expected=_needed(8, 0.05)),
        Case(args=(2, 0.5), expected=_needed(2, 0.5), label="2 stages, half idle allowed: one micro-batch"),
        Case(args=(1, 0.01), expected=1, label="one stage never idles"),
        Case(args=(16, 0.2), expected=_needed(16, 0.2)),
        Case(args=(4, 0.0), raises=ValueError, label="a zero bubble is impossible"),
        Case(args=(4, 1.5), raises=ValueError, label="a fraction above 1"),
    ],
)


def _read(weight_bytes, chips, bandwidth, mode):
    return comm.weight_bytes_per_chip(weight_bytes, chips, mode)["read_in_series"] / bandwidth


Q3 = Question(
    id="q3", title="Reading time per step: tensor vs pipeline", function="step_read_seconds", points=3,
    level="medium", minutes=8,
    visible=[Case(args=(200e9, 8, 3.35e12, "tensor"), expected=_read(200e9, 8, 3.35e12, "tensor"),
                  label="200 GB on 8 chips, tensor")],
    hidden=[
        Case(args=(200e9, 8, 3.35e12, "pipeline"), expected=_read(200e9, 8, 3.35e12, "pipeline"),
             label="200 GB on 8 chips, pipeline"),
        Case(args=(140e9, 2, 4.8e12, "pipeline"), expected=_read(140e9, 2, 4.8e12, "pipeline")),
        Case(args=(140e9, 1, 4.8e12, "tensor"), expected=_read(140e9, 1, 4.8e12, "tensor")),
        Case(args=(16e9, 4, 2e12, "tensor"), expected=_read(16e9, 4, 2e12, "tensor")),
        Case(args=(16e9, 4, 2e12, "expert"), raises=ValueError, label="unknown mode"),
        Case(args=(16e9, 0, 2e12, "tensor"), raises=ValueError, label="zero chips"),
    ],
)

assert math.isclose(_needed(4, 0.25), 9)


# --------------------------------------------------------------------------- Q4

def _kv_split(num_kv_heads, tp, head_dim, num_layers, bytes_per_value):
    """Which KV heads each of ``tp`` cards holds, and the KV bytes per token on each card."""
    for name, v in (("num_kv_heads", num_kv_heads), ("tp", tp), ("head_dim", head_dim),
                    ("num_layers", num_layers)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive integer")
    if bytes_per_value <= 0:
        raise ValueError("bytes_per_value must be positive")
    if num_kv_heads % tp and tp % num_kv_heads:
        raise ValueError("the cards must split the KV heads evenly, or the KV heads the cards")
    if tp <= num_kv_heads:
        per = num_kv_heads // tp
        heads = [list(range(c * per, (c + 1) * per)) for c in range(tp)]
    else:  # fewer KV heads than cards: each head is replicated on tp / num_kv_heads cards
        heads = [[c // (tp // num_kv_heads)] for c in range(tp)]
    return heads, [2 * len(h) * head_dim * num_layers * bytes_per_value for h in heads]


def _c4(*args, label=""):
    return Case(args=args, expected=_kv_split(*args), label=label)


Q4 = Question(
    id="q4", title="Tensor parallelism with fewer KV heads than cards", function="kv_heads_per_card",
    points=5, level="hard", minutes=15,
    visible=[_c4(8, 4, 128, 32, 2, label="8 KV heads on 4 cards")],
    hidden=[
        _c4(8, 16, 128, 80, 2, label="Llama 3 70B's 8 KV heads on 16 cards: each head on two cards"),
        _c4(2, 8, 64, 4, 1, label="2 KV heads on 8 cards"),
        _c4(1, 4, 128, 2, 2, label="one KV head (multi-query): every card holds it"),
        _c4(8, 8, 128, 1, 2, label="one head per card"),
        _c4(8, 1, 128, 2, 1, label="one card holds everything"),
        _c4(4, 2, 16, 3, 0.5, label="4-bit values"),
        Case(args=(8, 3, 128, 2, 2), raises=ValueError, label="8 heads on 3 cards"),
        Case(args=(3, 8, 128, 2, 2), raises=ValueError, label="3 heads on 8 cards"),
        Case(args=(8, 0, 128, 2, 2), raises=ValueError, label="no cards"),
        Case(args=(8, 4, 128, 2, 0), raises=ValueError, label="0 bytes per value"),
    ],
)

QUESTIONS = [Q1, Q2, Q3, Q4]
