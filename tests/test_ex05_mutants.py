"""Exercise 5's classic mistakes each lose their question's points."""
import math

import numpy as np
import pytest

from mutants_common import assert_keeps, assert_loses, solution_functions

EX = "ex05_attention"
SOL = solution_functions(EX)


def _rope(x, position, theta=10000.0, layout="half", exponent=2):
    d = len(x)
    if d % 2:
        raise ValueError("odd length")
    out = list(x)
    for i in range(d // 2):
        angle = position * theta ** (-exponent * i / d)
        c, s = math.cos(angle), math.sin(angle)
        a_i, b_i = (i, i + d // 2) if layout == "half" else (2 * i, 2 * i + 1)
        a, b = x[a_i], x[b_i]
        out[a_i], out[b_i] = a * c - b * s, a * s + b * c
    return out


def rope_no_check(x, position, theta=10000.0):  # odd length silently accepted
    out = list(x)
    half = len(x) // 2
    for i in range(half):
        angle = position * theta ** (-2 * i / len(x))
        c, s = math.cos(angle), math.sin(angle)
        a, b = x[i], x[i + half]
        out[i], out[i + half] = a * c - b * s, a * s + b * c
    return out


def _attention(q, k, v, mask=True, scale="sqrt", stable=True):
    q, k, v = (np.asarray(a, dtype=float) for a in (q, k, v))
    d = q.shape[-1]
    scores = q @ k.T / {"sqrt": math.sqrt(d), "d": d, "none": 1.0}[scale]
    if mask:
        scores[np.triu(np.ones(scores.shape, dtype=bool), k=1)] = -np.inf
    if stable:
        scores = scores - scores.max(axis=1, keepdims=True)
    with np.errstate(over="ignore", invalid="ignore"):  # the unstable mutant
        w = np.exp(scores)
        return w / w.sum(axis=1, keepdims=True) @ v


def _gqa(q, k, v, theta=10000.0, mapping="block", rope_keys=True, check=True,
         rope_values=False):
    q, k, v = (np.asarray(a, dtype=float) for a in (q, k, v))
    n_heads, n_kv = q.shape[0], k.shape[0]
    if check and n_heads % n_kv:
        raise ValueError("heads must be a multiple of KV heads")
    group = max(1, n_heads // n_kv)
    out = []
    for h in range(n_heads):
        kv = h // group if mapping == "block" else h % n_kv
        qh = np.array([_rope(list(r), p, theta) for p, r in enumerate(q[h])])
        kh = np.array([_rope(list(r), p, theta) for p, r in enumerate(k[kv])]) if rope_keys else k[kv]
        vh = v[kv]
        if rope_values:
            vh = np.array([_rope(list(r), p, theta) for p, r in enumerate(vh)])
        out.append(_attention(qh, kh, vh))
    return np.array(out)


def merge_forgets_acc(a, b):  # rescales the sums but not the accumulated values
    (m1, l1, x1), (m2, l2, x2) = a, b
    m = max(m1, m2)
    f1 = 0.0 if m1 == -math.inf else math.exp(m1 - m)
    f2 = 0.0 if m2 == -math.inf else math.exp(m2 - m)
    return m, l1 * f1 + l2 * f2, [u + w for u, w in zip(x1, x2)]


def merge_nan_on_empty(a, b):  # exp(-inf - -inf) is nan when a part is empty
    (m1, l1, x1), (m2, l2, x2) = a, b
    m = max(m1, m2)
    f1, f2 = math.exp(m1 - m), math.exp(m2 - m)
    return m, l1 * f1 + l2 * f2, [u * f1 + w * f2 for u, w in zip(x1, x2)]


def merge_through_exp_m(a, b):  # multiplies exp(m) back in: overflows near 1,000
    (m1, l1, x1), (m2, l2, x2) = a, b
    m = max(m1, m2)
    e1, e2 = (0.0 if mi == -math.inf else math.exp(mi) for mi in (m1, m2))
    return m, (l1 * e1 + l2 * e2) / math.exp(m), [(u * e1 + w * e2) / math.exp(m) for u, w in zip(x1, x2)]


@pytest.mark.parametrize("qid, name", [("q1", "rope_rotate"), ("q2", "causal_attention"),
                                       ("q3", "gqa_rope_attention"), ("q4", "merge_partials")])
def test_the_worked_solution_keeps_its_points(qid, name):
    assert_keeps(EX, qid, SOL[name])


@pytest.mark.parametrize("qid, mutant, why", [
    ("q1", lambda x, p, theta=10000.0: _rope(x, p, theta, layout="pairs"), "neighbour pairs (2i, 2i+1)"),
    ("q1", lambda x, p, theta=10000.0: _rope(x, p, theta, exponent=1), "theta^(-i/d) instead of -2i/d"),
    ("q1", rope_no_check, "odd length accepted"),
    ("q2", lambda q, k, v: _attention(q, k, v, mask=False), "no causal mask"),
    ("q2", lambda q, k, v: _attention(q, k, v, scale="d"), "divided by d, not sqrt(d)"),
    ("q2", lambda q, k, v: _attention(q, k, v, scale="none"), "unscaled scores"),
    ("q2", lambda q, k, v: _attention(q, k, v, stable=False), "softmax without subtracting the maximum"),
    ("q3", lambda q, k, v, theta=10000.0: _gqa(q, k, v, theta, mapping="mod"), "head h reads KV head h % n_kv"),
    ("q3", lambda q, k, v, theta=10000.0: _gqa(q, k, v, theta, rope_keys=False), "RoPE on queries only"),
    ("q3", lambda q, k, v, theta=10000.0: _gqa(q, k, v, theta, check=False), "uneven groups accepted"),
    ("q3", lambda q, k, v, theta=10000.0: _gqa(q, k, v, theta, rope_values=True), "RoPE on the values too"),
    ("q4", merge_forgets_acc, "accumulators not rescaled"),
    ("q4", merge_nan_on_empty, "an empty part gives nan"),
    ("q4", merge_through_exp_m, "exp(m) multiplied back in"),
])
def test_each_classic_mistake_loses_its_question(qid, mutant, why):
    assert_loses(EX, qid, mutant, why)
