"""Exercise 7's classic mistakes each lose their question's points."""
import math

import pytest

from mutants_common import assert_keeps, assert_loses, question, solution_functions

EX = "ex07_weights"
SOL = solution_functions(EX)
GROUPS = (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 72)  # powers of two in a box, then whole boxes
OLD_GROUPS = (8, 16, 32, 64, 72)  # the course's first rule: a replica was at least a box
POWERS_OF_TWO = (1, 2, 4, 8, 16, 32, 64, 72)
WHOLE_BOXES = tuple(range(8, 73, 8))


def _chips(weights, usable, share=0.6, rounding="ceil", group=True, check=True, groups=GROUPS):
    if check and (weights <= 0 or not 0 < share <= 1):
        raise ValueError("bad input")
    x = weights / (usable * share)
    n = math.ceil(x - 1e-12) if rounding == "ceil" else int(x) + 1
    if not group:
        return n
    for g in groups:
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
    ("q1", lambda w, u, share=0.6: _chips(w, u, share, groups=OLD_GROUPS),
     "every replica at least a box (8, 16, 32, 64, 72)"),
    ("q1", lambda w, u, share=0.6: _chips(w, u, share, groups=WHOLE_BOXES), "whole boxes even under 8 chips"),
    ("q1", lambda w, u, share=0.6: _chips(w, u, share, groups=POWERS_OF_TWO),
     "powers of two past one box (17 chips -> 32)"),
    ("q1", lambda w, u, share=0.6: _chips(w, u, 1.0), "the share ignored"),
    ("q1", lambda w, u, share=0.6: _chips(w, u, share, check=False), "past 72 chips or bad share accepted"),
    ("q2", lambda *a, **k: _seats(*a, **k, where="total"), "margin taken off the whole memory"),
    ("q2", lambda *a, **k: _seats(*a, **k, rounding="round"), "seats rounded, not floored"),
    ("q2", lambda *a, **k: _seats(*a, **k, check=False), "weights that do not fit give 0, not an error"),
])
def test_each_classic_mistake_loses_its_question(qid, mutant, why):
    assert_loses(EX, qid, mutant, why)


def test_the_hidden_expectations_follow_the_library():
    """Q1's typed counts are what servelab.arith.chips_per_replica gives on such a chip."""
    from servelab import arith
    from servelab.specs import Chip

    assert arith.GROUP_SIZES == GROUPS
    for case in [*question(EX, "q1").visible, *question(EX, "q1").hidden]:
        if case.raises is not None:
            continue
        weights, usable = case.args
        chip = Chip(name="test", memory_bytes=usable, hbm_bandwidth=1e12, flops={"bf16": 1e15})
        assert arith.chips_per_replica(weights, chip, **case.kwargs) == case.expected, case.label
