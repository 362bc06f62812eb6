"""Exercise 14: each classic mistake loses its question (graded in-process through QUESTIONS)."""
import math

from servelab.grading import grade_question
from servelab.grading.hidden import ex14_splitting as hidden

Q = {q.id: q for q in hidden.QUESTIONS}


def _passes(qid, func):
    return grade_question(Q[qid], func).passed


def _check(stages, microbatches):
    for v in (stages, microbatches):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError("positive integers please")


def right_bubble(p, m):
    _check(p, m)
    return (p - 1) / (m + p - 1)


def test_reference_answers_pass():
    assert _passes("q1", right_bubble)


def test_bubble_off_by_one_loses_q1():
    def off_by_one(p, m):
        _check(p, m)
        return (p - 1) / (m + p)

    def over_m(p, m):
        _check(p, m)
        return (p - 1) / m

    def over_p(p, m):      # idle share of one micro-batch's crossing
        _check(p, m)
        return (p - 1) / p

    for mutant in (off_by_one, over_m, over_p):
        assert not _passes("q1", mutant), mutant.__name__


def _valid(p, f):
    if isinstance(p, bool) or not isinstance(p, int) or p < 1 or not 0 < f < 1:
        raise ValueError("bad input")


def test_microbatch_mistakes_lose_q2():
    def from_off_by_one_formula(p, f):   # solved (p - 1)/(m + p) <= f
        _valid(p, f)
        return max(1, math.ceil((p - 1) / f - p))

    def floor_instead_of_ceil(p, f):
        _valid(p, f)
        return max(1, math.floor((p - 1) * (1 - f) / f))

    def float_noise_at_the_boundary(p, f):   # no tolerance: 9.000000000000002 -> 10
        _valid(p, f)
        return max(1, math.ceil((p - 1) * (1 - f) / f + 1e-9))

    for mutant in (from_off_by_one_formula, floor_instead_of_ceil, float_noise_at_the_boundary):
        assert not _passes("q2", mutant), mutant.__name__


def test_pipeline_read_time_mistakes_lose_q3():
    def pipeline_divides_too(w, c, bw, mode):
        if mode not in ("tensor", "pipeline") or min(w, c, bw) <= 0:
            raise ValueError("bad")
        return w / c / bw

    def tensor_does_not_divide(w, c, bw, mode):
        if mode not in ("tensor", "pipeline") or min(w, c, bw) <= 0:
            raise ValueError("bad")
        return w / bw

    for mutant in (pipeline_divides_too, tensor_does_not_divide):
        assert not _passes("q3", mutant), mutant.__name__


# ---------------------------------------------------------------- Q4: fewer KV heads than cards
from mutants_common import SolutionMutants, lost  # noqa: E402

Q4_MUTANTS = [
    ("divides the cache by the cards past one head per card (a fraction of a head each)",
     "return heads, [len(h) * per_head for h in heads]",
     "return heads, [num_kv_heads / tp * per_head for h in heads]"),
    ("forgets that a head stores a K and a V vector",
     "per_head = 2 * head_dim * num_layers * bytes_per_value",
     "per_head = head_dim * num_layers * bytes_per_value"),
    ("gives the extra cards no heads (floor division)",
     "heads = [[c // copies] for c in range(tp)]",
     "heads = [list(range(c * (num_kv_heads // tp), (c + 1) * (num_kv_heads // tp))) for c in range(tp)]"),
    ("deals heads round-robin instead of by consecutive query groups",
     "heads = [[c // copies] for c in range(tp)]",
     "heads = [[c % num_kv_heads] for c in range(tp)]"),
]


def test_the_q4_solution_passes():
    m = SolutionMutants("ex14_splitting")
    assert m.grade("q4", m.functions()).passed


def test_q4_mistakes_lose_q4():
    m = SolutionMutants("ex14_splitting")
    for why, old, new in Q4_MUTANTS:
        assert lost(m.grade("q4", m.functions(old, new))), why


# ---------------------------------------------------------------- Q5: cutting layers into stages
Q5_MUTANTS = [
    ('ignores the cards\' memory', 'if m[i] - m[j] <= card_bytes:', 'if True:', ''),
    ('equal layer counts per card', 'slowest = best[stages][n]',
     'slowest = max(t[(k + 1) * n // stages] - t[k * n // stages] for k in range(stages))', ''),
    ('the equal-stage finish (micro-batches + stages - 1) x slowest',
     'finish = t[n] + (microbatches - 1) * slowest', 'finish = (microbatches + stages - 1) * slowest', ''),
    ('the equal-stage bubble formula', 'idle = 1 - microbatches * t[n] / (stages * finish)',
     'idle = (stages - 1) / (microbatches + stages - 1)', ''),
]


def test_the_q5_solution_passes():
    m = SolutionMutants("ex14_splitting")
    assert m.grade("q5", m.functions()).passed


def test_q5_mistakes_lose_q5():
    m = SolutionMutants("ex14_splitting")
    for why, old, new, _ in Q5_MUTANTS:
        assert lost(m.grade("q5", m.functions(old, new))), why
