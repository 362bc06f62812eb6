"""Exercise 3 · From scores to a token: a top-p sampler. Hidden tests.

Expected answers come from :mod:`servelab.sampling`, so the exercise and the
library cannot drift apart.
"""
import math

import torch

from servelab.grading import Case, Question
from servelab.sampling import SamplingParams, sampling_probs, top_p_filter as _lib_top_p


def _softmax_t(logits, temperature):
    if temperature == 0:
        return sampling_probs(torch.tensor(logits, dtype=torch.float64), SamplingParams(temperature=0)).tolist()
    return torch.softmax(torch.tensor(logits, dtype=torch.float64) / temperature, -1).tolist()


def _top_p(probs, p):
    logits = torch.tensor(probs, dtype=torch.float64).log()
    return torch.softmax(_lib_top_p(logits, p), -1).tolist()


Q1 = Question(
    id="q1", title="Softmax with a temperature", function="softmax_with_temperature", points=3, level="easy",
    minutes=6,
    visible=[Case(args=([2.0, 1.0, 0.0], 1.0), expected=_softmax_t([2.0, 1.0, 0.0], 1.0), rel=1e-6, abs=1e-9),
             Case(args=([2.0, 1.0, 0.0], 0.0), expected=[1.0, 0.0, 0.0])],
    hidden=[
        Case(args=([2.0, 1.0, 0.0], 0.5), expected=_softmax_t([2.0, 1.0, 0.0], 0.5), rel=1e-6, abs=1e-9),
        Case(args=([2.0, 1.0, 0.0], 10.0), expected=_softmax_t([2.0, 1.0, 0.0], 10.0), rel=1e-6, abs=1e-9),
        Case(args=([1000.0, 999.0, 0.0], 1.0), expected=_softmax_t([1000.0, 999.0, 0.0], 1.0), rel=1e-6,
             abs=1e-9, label="huge logits (subtract the max first)"),
        Case(args=([5.0], 0.7), expected=[1.0], rel=1e-9, label="a one-token vocabulary"),
        Case(args=([-1.0, 3.0, 3.5, 0.0], 0.0), expected=[0.0, 0.0, 1.0, 0.0], label="greedy picks index 2"),
        Case(args=([3.0, 1.0, 3.0], 0.0), expected=[1.0, 0.0, 0.0], label="greedy on a tie: the first maximum"),
        Case(args=([0.0, 0.0, 0.0, 0.0], 2.0), expected=[0.25] * 4, rel=1e-9),
        Case(args=([1.0, 2.0], -1.0), raises=ValueError, label="negative temperature"),
    ],
)

Q2 = Question(
    id="q2", title="Top-p (nucleus) filter", function="top_p_filter", points=4, level="medium", minutes=12,
    visible=[Case(args=([0.5, 0.3, 0.15, 0.05], 0.6), expected=[0.625, 0.375, 0.0, 0.0], rel=1e-6, abs=1e-9)],
    hidden=[
        Case(args=([0.5, 0.3, 0.15, 0.05], 0.5), expected=[1.0, 0.0, 0.0, 0.0], rel=1e-6, abs=1e-9,
             label="mass exactly p after the first token"),
        Case(args=([0.5, 0.3, 0.15, 0.05], 0.9), expected=_top_p([0.5, 0.3, 0.15, 0.05], 0.9), rel=1e-6,
             abs=1e-9, label="the token that crosses p is kept"),
        Case(args=([0.05, 0.15, 0.5, 0.3], 0.6), expected=[0.0, 0.0, 0.625, 0.375], rel=1e-6, abs=1e-9,
             label="vocabulary not sorted by probability"),
        Case(args=([0.2, 0.2, 0.2, 0.2, 0.2], 1.0), expected=[0.2] * 5, rel=1e-6, label="p = 1 keeps all"),
        Case(args=([0.1, 0.7, 0.2], 0.01), expected=[0.0, 1.0, 0.0], rel=1e-6, abs=1e-9,
             label="tiny p keeps the top token"),
        Case(args=([0.2, 0.4, 0.2, 0.2], 0.5), expected=_top_p([0.2, 0.4, 0.2, 0.2], 0.5), rel=1e-6,
             abs=1e-9, label="equal probabilities: the smaller index is kept first"),
        Case(args=([1.0], 0.3), expected=[1.0], rel=1e-9),
        Case(args=([0.6, 0.4], 0.0), raises=ValueError, label="p = 0"),
        Case(args=([0.6, 0.4], 1.2), raises=ValueError, label="p > 1"),
    ],
)


def _inverse_cdf(probs, u):
    total = 0.0
    for i, p in enumerate(probs):
        total += p
        if u < total:
            return i
    return max(i for i, p in enumerate(probs) if p > 0)


def _q3_frequencies(func):
    probs = [0.1, 0.0, 0.6, 0.3]
    counts = [0] * 4
    n = 1000
    for j in range(n):
        counts[func(probs, (j + 0.5) / n)] += 1
    for i, p in enumerate(probs):
        assert math.isclose(counts[i] / n, p, abs_tol=0.002), \
            f"sample_token: with u spread evenly over [0, 1) token {i} came out {counts[i] / n:.3f} " \
            f"of the time, expected {p}"


Q3 = Question(
    id="q3", title="Draw a token from a uniform number", function="sample_token", points=3, level="easy",
    minutes=6,
    visible=[Case(args=([0.2, 0.5, 0.3], 0.1), expected=0), Case(args=([0.2, 0.5, 0.3], 0.65), expected=1)],
    hidden=[
        Case(args=([0.2, 0.5, 0.3], 0.0), expected=0),
        Case(args=([0.2, 0.5, 0.3], 0.2), expected=1, label="u on a boundary goes to the next token"),
        Case(args=([0.2, 0.5, 0.3], 0.999999), expected=2),
        Case(args=([0.0, 0.0, 1.0], 0.0), expected=2, label="zero-probability tokens are never drawn"),
        Case(args=([0.5, 0.5, 0.0], 0.9999999999), expected=_inverse_cdf([0.5, 0.5, 0.0], 0.9999999999)),
        # Ten 0.1s add up to 0.9999999999999999 in floating point, so this u passes every
        # cumulative sum: the draw must fall back to the last token that can be drawn.
        Case(args=([0.1] * 10 + [0.0], 0.9999999999999999), expected=9,
             label="rounding leaves u past the last sum: the last token with p > 0"),
        Case(args=([0.3, 0.7], 1.0), raises=ValueError, label="u = 1 is outside [0, 1)"),
        Case(args=([0.3, 0.7], -0.1), raises=ValueError, label="negative u"),
    ],
    test=_q3_frequencies,
)

QUESTIONS = [Q1, Q2, Q3]
