"""Exercise 7's classic mistakes each lose their question's points."""
import math

import pytest

from mutants_common import assert_keeps, assert_loses, solution_functions

EX = "ex07_weights"
SOL = solution_functions(EX)
GROUPS = (8, 16, 32, 64, 72)


def _chips(weights, usable, share=0.6, rounding="ceil", group=True, check=True):
    if check and (weights <= 0 or not 0 < share <= 1):
        raise ValueError("bad input")
    x = weights / (usable * share)
    n = math.ceil(x - 1e-12) if rounding == "ceil" else int(x) + 1
    if not group:
        return n
    for g in GROUPS:
        if n <= g:
            return g
    if check:
        raise ValueError("more than 72 chips")
    return n


def _seats(weights, usable, chips, bpt, tokens, margin=0.05, where="remainder", rounding="floor",
           check=True):
    if check and (chips <= 0 or tokens <= 0):
        raise ValueError("bad input")
    total = chips * usable
    if weights > total:
        if check:
            raise ValueError("the weights do not fit")
        return 0
    free = (total - weights) * (1 - margin) if where == "remainder" else total * (1 - margin) - weights
    seats = free / (bpt * tokens)
    return math.floor(seats) if rounding == "floor" else round(seats)


@pytest.mark.parametrize("qid, name", [("q1", "chips_per_replica"), ("q2", "seats_left")])
def test_the_worked_solution_keeps_its_points(qid, name):
    assert_keeps(EX, qid, SOL[name])


def test_the_reference_functions_here_are_right():
    assert_keeps(EX, "q1", _chips)
    assert_keeps(EX, "q2", _seats)


@pytest.mark.parametrize("qid, mutant, why", [
    ("q1", lambda w, u, share=0.6: _chips(w, u, share, rounding="int+1"), "int(x) + 1 instead of a ceiling"),
    ("q1", lambda w, u, share=0.6: _chips(w, u, share, group=False), "no rounding to a group"),
    ("q1", lambda w, u, share=0.6: _chips(w, u, 1.0), "the share ignored"),
    ("q1", lambda w, u, share=0.6: _chips(w, u, share, check=False), "past 72 chips or bad share accepted"),
    ("q2", lambda *a, **k: _seats(*a, **k, where="total"), "margin taken off the whole memory"),
    ("q2", lambda *a, **k: _seats(*a, **k, rounding="round"), "seats rounded, not floored"),
    ("q2", lambda *a, **k: _seats(*a, **k, check=False), "weights that do not fit give 0, not an error"),
])
def test_each_classic_mistake_loses_its_question(qid, mutant, why):
    assert_loses(EX, qid, mutant, why)
