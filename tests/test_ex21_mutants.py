"""Exercise 21: each question's classic mistakes, as mutants of the worked solution.

Every mutant is the solution notebook's code with one small edit; the hidden tests must take
that question's points away and leave the other questions alone. Graded in-process through the
hidden module's questions (about a second).
"""
import pytest

from mutants_common import SolutionMutants, assert_keeps, assert_loses, solution_functions
from servelab import kernels
from servelab.grading.hidden import ex21_kernels as hidden

EX = "ex21_kernels"
NAMES = {"q1": "bytes_moved", "q2": "overhead_share", "q3": "tile_bytes"}


_mutant = SolutionMutants(EX).functions


def test_the_solution_scores_every_question():
    fns = solution_functions(EX)
    for qid, name in NAMES.items():
        assert_keeps(EX, qid, fns[name])


MUTANTS = [
    ("q1", "unfused = sum(reads + writes for reads, writes in ops)",
     "unfused = sum(writes for reads, writes in ops)", "counting only the writes"),
    ("q1", "unfused = sum(reads + writes for reads, writes in ops)",
     "unfused = sum(reads for reads, writes in ops)", "counting only the reads"),
    ("q1", "fused = fused_reads + fused_writes",
     "fused = sum(reads + writes for reads, writes in ops)", "fusion keeps the intermediates' traffic"),
    ("q2", "fixed_ms = ops * per_op_us / 1000", "fixed_ms = ops * per_op_us", "microseconds taken as ms"),
    ("q2", "return min(1.0, fixed_ms / step_ms)", "return fixed_ms / step_ms", "no cap at 1"),
    ("q3", "inputs = (block_q + 2 * block_k) * head_dim * bytes_per_element",
     "inputs = (block_q + block_k) * head_dim * bytes_per_element", "forgetting the V tile"),
    ("q3", "scores = block_q * block_k * 4", "scores = block_q * block_k * bytes_per_element",
     "scores in the input precision"),
    ("q3", "row_stats = 2 * block_q * 4", "row_stats = 0", "forgetting the running max and sum"),
    ("q3", "output = block_q * head_dim * 4", "output = block_q * head_dim * bytes_per_element",
     "the output accumulator in the input precision"),
    ("q3", "inputs = (block_q + 2 * block_k) * head_dim * bytes_per_element",
     "inputs = 3 * block_q * head_dim * bytes_per_element", "K and V tiles sized by the query block"),
]


@pytest.mark.parametrize("qid,old,new,why", MUTANTS, ids=[m[3] for m in MUTANTS])
def test_each_mutant_loses_exactly_its_question(qid, old, new, why):
    fns = _mutant(old, new)
    assert_loses(EX, qid, fns[NAMES[qid]], why)
    for other, name in NAMES.items():
        if other != qid:
            assert_keeps(EX, other, fns[name])


def test_visible_numbers_in_the_statement():
    assert hidden.Q3.visible[0].expected == kernels.tile_bytes(128, 64, 128, 2)["total"] == 164_864
    assert hidden.Q1.visible[0].expected == [10_000_000, 6_000_000]
