"""Exercise 16: each classic mistake loses its question (graded in-process through QUESTIONS)."""
from servelab.grading import grade_question
from servelab.grading.hidden import ex16_moe as hidden

Q = {q.id: q for q in hidden.QUESTIONS}


def _passes(qid, func):
    return grade_question(Q[qid], func).passed


def _valid(k, e, b):
    if not 1 <= k <= e or b < 0:
        raise ValueError("bad")


def test_coverage_mistakes_lose_q1():
    def k_and_e_swapped(k, e, b):
        _valid(k, e, b)
        return 1 - (1 - e / k) ** b

    def swapped_in_the_fraction(k, e, b):
        _valid(k, e, b)
        return 1 - (1 - 1 / (k * e)) ** b

    def untouched_instead(k, e, b):
        _valid(k, e, b)
        return (1 - k / e) ** b

    def linear(k, e, b):
        _valid(k, e, b)
        return min(1.0, b * k / e)

    for mutant in (k_and_e_swapped, swapped_in_the_fraction, untouched_instead, linear):
        assert not _passes("q1", mutant), mutant.__name__


def test_bytes_read_mistakes_lose_q2():
    def active_only(total, experts, k, e, b, bpp):
        if not 0 <= experts <= total or not 1 <= k <= e:
            raise ValueError("bad")
        return (total - experts + k / e * experts) * bpp

    def everything_always(total, experts, k, e, b, bpp):
        if not 0 <= experts <= total or not 1 <= k <= e:
            raise ValueError("bad")
        return total * bpp

    def independent_picks(total, experts, k, e, b, bpp):
        if not 0 <= experts <= total or not 1 <= k <= e:
            raise ValueError("bad")
        return (total - experts + (1 - (1 - 1 / e) ** (b * k)) * experts) * bpp

    for mutant in (active_only, everything_always):
        assert not _passes("q2", mutant), mutant.__name__
    # spreading k picks as k*B independent single picks is close but not the model asked for
    assert not _passes("q2", independent_picks)


def test_mean_instead_of_max_loses_q3():
    def mean_load(tokens, ranks):
        if ranks < 1 or len(tokens) % ranks:
            raise ValueError("bad")
        return sum(tokens) / ranks

    def round_robin(tokens, ranks):   # expert e on rank e % ranks: a different placement
        if ranks < 1 or len(tokens) % ranks:
            raise ValueError("bad")
        return max(sum(tokens[r::ranks]) for r in range(ranks))

    for mutant in (mean_load, round_robin):
        assert not _passes("q3", mutant), mutant.__name__
