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


# --------------------------------------------------------------------------- Q5

def _pipeline_plan(layer_ms, layer_bytes, stages, card_bytes, microbatches):
    """Reference: the contiguous cut that minimises the slowest stage within each card's memory
    (by brute force over the cut points for few layers, dynamic programming otherwise), then the
    run of ``microbatches`` identical micro-batches through the unequal stages."""
    n = len(layer_ms)
    if n == 0 or len(layer_bytes) != n or not 1 <= stages <= n or microbatches < 1 or card_bytes <= 0:
        raise ValueError("bad layers, stages, micro-batches or card size")
    t, m = [0.0], [0.0]
    for ms, b in zip(layer_ms, layer_bytes):
        t.append(t[-1] + ms)
        m.append(m[-1] + b)
    best = {(0, 0): 0.0}
    for s in range(1, stages + 1):
        for i in range(s, n + 1):
            options = [max(best[s - 1, j], t[i] - t[j]) for j in range(s - 1, i)
                       if (s - 1, j) in best and m[i] - m[j] <= card_bytes]
            if options:
                best[s, i] = min(options)
    if (stages, n) not in best:
        return None
    slowest = best[stages, n]
    # one micro-batch crosses every stage; after it, one leaves per slowest-stage time
    finish = t[n] + (microbatches - 1) * slowest
    return (slowest, finish, 1 - microbatches * t[n] / (stages * finish))


def _c5(*args, label=""):
    return Case(args=args, expected=_pipeline_plan(*args), abs=1e-9, label=label)


_TOY = ([1] * 7 + [3], [4] * 7 + [8])                        # the last layer carries the output head
_8B = ([0.4] + [1.0] * 32 + [3.2], [1.05] + [0.87] * 32 + [1.05])  # embedding, 32 layers, head

Q5 = Question(
    id="q5", title="Cut the layers into pipeline stages", function="pipeline_plan",
    points=6, level="hard", minutes=25,
    visible=[_c5(*_TOY, 4, 16, 8, label="8 layers, the last one heavy, on 4 cards of 16 GB, 8 micro-batches")],
    hidden=[
        _c5(*_TOY, 4, 8, 8, label="cards of 8 GB: no cut fits (None)"),
        _c5([4, 1, 1, 1, 1, 1, 1, 1, 1], [1] * 8 + [4], 3, 5, 6,
            label="the fastest cut does not fit: memory forces a slower one"),
        _c5([1.5, 2.5, 1.0], [1, 1, 1], 1, 10, 5, label="one stage: never idle"),
        _c5(*_TOY, 4, 16, 1, label="one micro-batch"),
        _c5([2, 1, 3, 1], [1, 1, 1, 1], 4, 1, 6, label="a stage per layer"),
        _c5(*_8B, 4, 80, 16, label="an 8B-like model with its embedding and head, 4 cards"),
        _c5(*_8B, 8, 4.5, 16, label="the same on 8 cards of 4.5 GB"),
        _c5(*_8B, 8, 4.0, 16, label="8 cards of 4 GB: None"),
        _c5([5, 1, 1, 1, 1, 1, 1, 1], [1] * 8, 3, 100, 10, label="a heavy first layer"),
        _c5([3, 1, 1, 3, 1, 1, 3], [1] * 7, 3, 100, 4, label="equal layer counts are not the best cut"),
        Case(args=(*_TOY, 9, 16, 8), raises=ValueError, label="more stages than layers"),
        Case(args=(*_TOY, 0, 16, 8), raises=ValueError, label="no stages"),
        Case(args=([1, 1], [1], 1, 16, 8), raises=ValueError, label="a size missing"),
        Case(args=(*_TOY, 4, 16, 0), raises=ValueError, label="no micro-batches"),
    ],
)

QUESTIONS = [Q1, Q2, Q3, Q4, Q5]
