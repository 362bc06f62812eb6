"""Exercise 3's classic mistakes each lose their question's points."""
import math

import pytest

from mutants_common import assert_keeps, assert_loses, solution_functions

EX = "ex03_sampling"
SOL = solution_functions(EX)


def softmax_no_max(logits, temperature):  # overflows on logits near 1,000
    if temperature < 0:
        raise ValueError("negative temperature")
    if temperature == 0:
        best = max(range(len(logits)), key=logits.__getitem__)
        return [1.0 if i == best else 0.0 for i in range(len(logits))]
    e = [math.exp(x / temperature) for x in logits]
    return [x / sum(e) for x in e]


def softmax_times_t(logits, temperature):  # multiplies by the temperature
    if temperature < 0:
        raise ValueError("negative temperature")
    if temperature == 0:
        best = max(range(len(logits)), key=logits.__getitem__)
        return [1.0 if i == best else 0.0 for i in range(len(logits))]
    m = max(logits)
    e = [math.exp((x - m) * temperature) for x in logits]
    return [x / sum(e) for x in e]


def softmax_zero_divides(logits, temperature):  # temperature 0 is not special-cased
    if temperature < 0:
        raise ValueError("negative temperature")
    m = max(logits)
    e = [math.exp((x - m) / temperature) for x in logits]
    return [x / sum(e) for x in e]


def softmax_greedy_last_max(logits, temperature):  # a tie at T = 0 goes to the last maximum
    if temperature < 0:
        raise ValueError("negative temperature")
    if temperature == 0:
        best = max(range(len(logits)), key=lambda i: (logits[i], i))
        return [1.0 if i == best else 0.0 for i in range(len(logits))]
    m = max(logits)
    e = [math.exp((x - m) / temperature) for x in logits]
    return [x / sum(e) for x in e]


def top_p_ties_to_larger_index(probs, p):  # sorted((p, i), reverse=True): ties keep the larger index
    if not 0 < p <= 1:
        raise ValueError("p must be in (0, 1]")
    kept, mass = [], 0.0
    for _, i in sorted(zip(probs, range(len(probs))), reverse=True):
        if mass >= p:
            break
        kept.append(i)
        mass += probs[i]
    total = sum(probs[i] for i in kept)
    return [probs[i] / total if i in kept else 0.0 for i in range(len(probs))]


def _top_p(probs, p, keep_crossing=True, renormalise=True, sort=True):
    if not 0 < p <= 1:
        raise ValueError("p must be in (0, 1]")
    order = sorted(range(len(probs)), key=lambda i: -probs[i]) if sort else list(range(len(probs)))
    kept, mass = set(), 0.0
    for i in order:
        if mass >= p or (not keep_crossing and mass + probs[i] > p and kept):
            break
        kept.add(i)
        mass += probs[i]
    total = sum(probs[i] for i in kept) if renormalise else 1.0
    return [probs[i] / total if i in kept else 0.0 for i in range(len(probs))]


@pytest.mark.parametrize("qid, name", [("q1", "softmax_with_temperature"), ("q2", "top_p_filter"),
                                       ("q3", "sample_token")])
def test_the_worked_solution_keeps_its_points(qid, name):
    assert_keeps(EX, qid, SOL[name])


def sample_boundary_stays(probs, u):  # u on a boundary stays with the earlier token
    if not 0 <= u < 1:
        raise ValueError("u must be in [0, 1)")
    total = 0.0
    for i, p in enumerate(probs):
        total += p
        if u <= total:
            return i
    return len(probs) - 1


def sample_no_range_check(probs, u):  # accepts u = 1 and negative u
    total = 0.0
    for i, p in enumerate(probs):
        total += p
        if u < total:
            return i
    return max(i for i, p in enumerate(probs) if p > 0)


def sample_last_index_fallback(probs, u):  # rounding fallback returns a zero-probability token
    if not 0 <= u < 1:
        raise ValueError("u must be in [0, 1)")
    total = 0.0
    for i, p in enumerate(probs):
        total += p
        if u < total:
            return i
    return len(probs) - 1


def sample_argmax(probs, u):  # ignores u: greedy
    if not 0 <= u < 1:
        raise ValueError("u must be in [0, 1)")
    return max(range(len(probs)), key=probs.__getitem__)


@pytest.mark.parametrize("qid, mutant, why", [
    ("q1", softmax_no_max, "no max subtraction"),
    ("q1", softmax_times_t, "logits multiplied by T"),
    ("q1", softmax_zero_divides, "T = 0 divided by"),
    ("q1", softmax_greedy_last_max, "a greedy tie sent to the last maximum"),
    ("q2", top_p_ties_to_larger_index, "equal probabilities broken towards the larger index"),
    ("q2", lambda probs, p: _top_p(probs, p, keep_crossing=False), "the token that crosses p dropped"),
    ("q2", lambda probs, p: _top_p(probs, p, renormalise=False), "kept mass not renormalised"),
    ("q2", lambda probs, p: _top_p(probs, p, sort=False), "vocabulary order taken as probability order"),
    ("q3", sample_boundary_stays, "u on a boundary kept by the earlier token"),
    ("q3", sample_no_range_check, "u outside [0, 1) accepted"),
    ("q3", sample_argmax, "u ignored"),
    ("q3", sample_last_index_fallback, "rounding fallback draws a zero-probability token"),
])
def test_each_classic_mistake_loses_its_question(qid, mutant, why):
    assert_loses(EX, qid, mutant, why)
