"""Exercise 5 · Attention: causal attention with RoPE, and the online softmax. Hidden tests.

Expected values of Q2 and Q3 come from :mod:`servelab.attention` (in float64);
Q1's from the rotation formula written out directly; Q4's from the partial
result of the union of the keys, computed directly (not by merging).
"""
import math

import numpy as np
import torch

from servelab.attention import apply_rope, naive_attention, rope_cos_sin, rope_inv_freq
from servelab.grading import Case, Question


def _rand(seed, *shape):
    return np.round(np.random.default_rng(seed).normal(size=shape), 3).tolist()


def _rope_ref(x, position, theta=10000.0):
    d = len(x)
    half = d // 2
    out = list(x)
    for i in range(half):
        angle = position * theta ** (-2 * i / d)
        c, s = math.cos(angle), math.sin(angle)
        a, b = x[i], x[i + half]
        out[i], out[i + half] = a * c - b * s, a * s + b * c
    return out


def _attn_ref(q, k, v):
    t = lambda a: torch.tensor(a, dtype=torch.float64)[None, None]  # noqa: E731
    return naive_attention(t(q), t(k), t(v))[0, 0].tolist()


def _gqa_rope_ref(q, k, v, theta=10000.0):
    q64, k64, v64 = (torch.tensor(a, dtype=torch.float64)[None] for a in (q, k, v))
    n, d = q64.shape[2], q64.shape[3]
    cos, sin = rope_cos_sin(torch.arange(n), rope_inv_freq(d, theta), torch.float64)
    return naive_attention(apply_rope(q64, cos, sin), apply_rope(k64, cos, sin), v64)[0].tolist()


TOL = dict(rel=1e-5, abs=1e-5)
_X8 = _rand(1, 8)

Q1 = Question(
    id="q1", title="Rotate a vector by its position (RoPE)", function="rope_rotate", points=3, level="easy",
    minutes=8,
    visible=[Case(args=([1.0, 0.0, 0.0, 0.0], 1), expected=_rope_ref([1.0, 0.0, 0.0, 0.0], 1), **TOL)],
    hidden=[
        Case(args=(_X8, 0), expected=_X8, **TOL, label="position 0 leaves the vector alone"),
        Case(args=(_X8, 5), expected=_rope_ref(_X8, 5), **TOL, label="8 dims, position 5"),
        Case(args=(_X8, 3000), expected=_rope_ref(_X8, 3000), **TOL, label="8 dims, position 3000"),
        Case(args=(_X8, 7), kwargs={"theta": 500000.0}, expected=_rope_ref(_X8, 7, 500000.0), **TOL,
             label="theta = 500,000 (Llama 3)"),
        Case(args=([0.0, 1.0, 2.0, 3.0], 2), expected=_rope_ref([0.0, 1.0, 2.0, 3.0], 2), **TOL,
             label="pairs are (i, i + d/2), not neighbours"),
        Case(args=([1.0, 2.0, 3.0], 1), raises=ValueError, label="odd length"),
    ],
)

_Q, _K, _V = _rand(2, 5, 4), _rand(3, 5, 4), _rand(4, 5, 4)

Q2 = Question(
    id="q2", title="Causal attention, one head", function="causal_attention", points=4, level="medium",
    minutes=12,
    visible=[Case(args=([[1.0, 0.0], [0.0, 1.0]], [[1.0, 0.0], [0.0, 1.0]], [[1.0, 2.0], [3.0, 4.0]]),
                  expected=_attn_ref([[1.0, 0.0], [0.0, 1.0]], [[1.0, 0.0], [0.0, 1.0]], [[1.0, 2.0], [3.0, 4.0]]),
                  **TOL)],
    hidden=[
        Case(args=(_Q, _K, _V), expected=_attn_ref(_Q, _K, _V), **TOL, label="5 tokens, 4 dims"),
        Case(args=([[0.3, -0.2]], [[1.0, 1.0]], [[5.0, 6.0]]), expected=[[5.0, 6.0]], **TOL,
             label="one token attends only to itself"),
        Case(args=([[10.0] * 4] * 3, [[10.0] * 4, [-10.0] * 4, [10.0] * 4], _rand(5, 3, 4)),
             expected=_attn_ref([[10.0] * 4] * 3, [[10.0] * 4, [-10.0] * 4, [10.0] * 4], _rand(5, 3, 4)),
             **TOL, label="large scores (scaled by sqrt(d))"),
        Case(args=([[30.0] * 4] * 3, [[30.0] * 4, [-30.0] * 4, [30.0] * 4], _rand(5, 3, 4)),
             expected=_attn_ref([[30.0] * 4] * 3, [[30.0] * 4, [-30.0] * 4, [30.0] * 4], _rand(5, 3, 4)),
             **TOL, label="scores near 1,800: exp overflows unless each row's maximum is subtracted"),
        Case(args=(_rand(6, 6, 8), _rand(7, 6, 8), _rand(8, 6, 8)),
             expected=_attn_ref(_rand(6, 6, 8), _rand(7, 6, 8), _rand(8, 6, 8)), **TOL, label="6 tokens, 8 dims"),
    ],
)

_QH, _KH, _VH = _rand(9, 4, 5, 4), _rand(10, 2, 5, 4), _rand(11, 2, 5, 4)

Q3 = Question(
    id="q3", title="Grouped-query attention with RoPE", function="gqa_rope_attention", points=5, level="hard",
    minutes=20,
    visible=[Case(args=(_rand(12, 2, 3, 4), _rand(13, 1, 3, 4), _rand(14, 1, 3, 4)),
                  expected=_gqa_rope_ref(_rand(12, 2, 3, 4), _rand(13, 1, 3, 4), _rand(14, 1, 3, 4)), **TOL,
                  label="2 query heads sharing 1 KV head, 3 tokens")],
    hidden=[
        Case(args=(_QH, _KH, _VH), expected=_gqa_rope_ref(_QH, _KH, _VH), **TOL,
             label="4 query heads, 2 KV heads: head h reads KV head h // 2"),
        Case(args=(_QH, _rand(15, 4, 5, 4), _rand(16, 4, 5, 4)),
             expected=_gqa_rope_ref(_QH, _rand(15, 4, 5, 4), _rand(16, 4, 5, 4)), **TOL, label="plain MHA"),
        Case(args=(_QH, _KH, _VH), kwargs={"theta": 100.0}, expected=_gqa_rope_ref(_QH, _KH, _VH, 100.0),
             **TOL, label="theta = 100"),
        Case(args=(_rand(17, 3, 2, 4), _rand(18, 2, 2, 4), _rand(19, 2, 2, 4)), raises=ValueError,
             label="3 query heads cannot share 2 KV heads"),
    ],
)



def _partial(q, keys, values):
    """(m, l, acc) of one query over some keys, computed in one go in float64."""
    q, keys, values = (np.asarray(a, dtype=np.float64) for a in (q, keys, values))
    if len(keys) == 0:
        return (float("-inf"), 0.0, [0.0] * values.shape[-1])
    scores = keys @ q / math.sqrt(q.shape[0])
    m = scores.max()
    w = np.exp(scores - m)
    return (float(m), float(w.sum()), (w @ values).tolist())


def _merge_case(seed, n_a, n_b, d=4, scale=1.0, label=""):
    rng = np.random.default_rng(seed)
    q = (rng.normal(size=d) * scale).round(3)
    keys = rng.normal(size=(n_a + n_b, d)).round(3)
    values = rng.normal(size=(n_a + n_b, d)).round(3)
    a = _partial(q, keys[:n_a], values[:n_a])
    b = _partial(q, keys[n_a:], values[n_a:].reshape(n_b, d))
    return Case(args=(a, b), expected=_partial(q, keys, values), **TOL, label=label)


Q4 = Question(
    id="q4", title="Merge two partial attention results (the online softmax)", function="merge_partials",
    points=4, level="medium", minutes=15,
    visible=[Case(args=((1.0, 1.0, [2.0, 0.0]), (1.0, 1.0, [0.0, 4.0])), expected=(1.0, 2.0, [2.0, 4.0]), **TOL,
                  label="two blocks with the same maximum")],
    hidden=[
        _merge_case(20, 3, 5, label="3 keys + 5 keys"),
        _merge_case(21, 6, 2, label="6 keys + 2 keys, the first block holds the maximum"),
        _merge_case(22, 4, 4, scale=400.0, label="scores near 1,000 (no overflow: rescale, never exp(m))"),
        _merge_case(23, 0, 5, label="an empty first block (-inf, 0, zeros)"),
        _merge_case(24, 5, 0, label="an empty second block"),
        _merge_case(25, 1, 1, d=8, label="one key each, the second holds the maximum, 8 dims"),
        Case(args=((float("-inf"), 0.0, [0.0, 0.0, 0.0]), (float("-inf"), 0.0, [0.0, 0.0, 0.0])),
             expected=(float("-inf"), 0.0, [0.0, 0.0, 0.0]), **TOL,
             label="both parts empty (exp(-inf - -inf) is nan: skip empty parts)"),
    ],
)

QUESTIONS = [Q1, Q2, Q3, Q4]
