"""Exercise 20: each question's classic mistakes lose that question's points."""
import pytest

from servelab.grading import grade_question
from servelab.grading.hidden import ex20_speculative as ex


def _draw(probs, u):
    total = 0.0
    for j, pj in enumerate(probs):
        total += pj
        if u < total:
            return j
    return max(j for j, pj in enumerate(probs) if pj > 0)


def make_accept(*, bonus=True, residual=True, ratio_test="lt", keep_rejected=False, bonus_row=None):
    def accept_step(draft, p, q, u, final_u):
        out = []
        for i, x in enumerate(draft):
            ratio = p[i][x] / q[i][x]
            keep = {"lt": u[i] < ratio, "le": u[i] <= ratio, "p_beats_q": p[i][x] >= q[i][x]}[ratio_test]
            if keep:
                out.append(x)
                continue
            if keep_rejected:                      # off by one: the rejected draft is emitted too
                out.append(x)
            if residual:
                r = [max(0.0, a - b) for a, b in zip(p[i], q[i])]
                out.append(_draw([v / sum(r) for v in r], final_u))
            else:                                  # resample from p instead of the residual
                out.append(_draw(p[i], final_u))
            return out
        if bonus:
            row = p[len(draft)] if bonus_row is None else p[bonus_row(len(draft))]
            out.append(_draw(row, final_u))
        return out
    return accept_step


def tokens_right(a, k):
    if not 0 <= a <= 1 or k < 0:
        raise ValueError("bad input")
    return float(k + 1) if a == 1 else (1 - a ** (k + 1)) / (1 - a)


def choose_right(a, c, k_max, *, speed=None, floor=True):
    if c < 0 or k_max < 1:
        raise ValueError("bad input")
    speed = speed or (lambda a, k, c: tokens_right(a, k) / (k * c + 1))
    best_k, best = (0, 1.0) if floor else (1, speed(a, 1, c))
    for k in range(1, k_max + 1):
        if speed(a, k, c) > best:
            best_k, best = k, speed(a, k, c)
    return best_k


def test_right_answers_pass():
    assert grade_question(ex.Q1, make_accept()).passed
    assert grade_question(ex.Q2, tokens_right).passed
    assert grade_question(ex.Q3, choose_right).passed


@pytest.mark.parametrize("name, mutant", [
    ("forgets the bonus token", make_accept(bonus=False)),
    ("resamples from p, not the residual", make_accept(residual=False)),
    ("emits the rejected draft too (off by one)", make_accept(keep_rejected=True)),
    ("accepts when u <= p/q", make_accept(ratio_test="le")),
    ("accepts only when p >= q", make_accept(ratio_test="p_beats_q")),
    ("bonus from the last draft's row", make_accept(bonus_row=lambda k: k - 1)),
])
def test_q1_mistakes_lose_q1(name, mutant):
    assert not grade_question(ex.Q1, mutant).passed, name


@pytest.mark.parametrize("name, mutant", [
    ("exponent k, forgetting the target's own token", lambda a, k: (1 - a ** k) / (1 - a) if a < 1 else k),
    ("divides by zero at a = 1", lambda a, k: (1 - a ** (k + 1)) / (1 - a)),
    ("a times k plus one", lambda a, k: a * k + 1),
    ("no input checks", lambda a, k: float(k + 1) if a == 1 else (1 - a ** (k + 1)) / (1 - a)),
])
def test_q2_mistakes_lose_q2(name, mutant):
    assert not grade_question(ex.Q2, mutant).passed, name


@pytest.mark.parametrize("name, mutant", [
    ("ignores the draft cost", lambda a, c, m: choose_right(a, 0.0, m) if c >= 0 and m >= 1 else choose_right(a, c, m)),
    ("forgets the verifying pass (+1)", lambda a, c, m: choose_right(
        a, c, m, speed=lambda a, k, c: tokens_right(a, k) / (k * c) if c else float("inf"))),
    ("never switches speculation off", lambda a, c, m: choose_right(a, c, m, floor=False)),
])
def test_q3_mistakes_lose_q3(name, mutant):
    assert not grade_question(ex.Q3, mutant).passed, name


# ---------------------------------------------------------------- Q4: speculation as the batch grows
from mutants_common import SolutionMutants, lost  # noqa: E402

Q4_MUTANTS = [
    ("verifies k + 1 tokens a sequence at the price of one",
     "verify = target_pass(batch * (k + 1))   # k drafts + 1 per sequence", "verify = target_pass(batch)"),
    ("counts 1 + a * k tokens a round", "return k + 1 if alpha == 1 else (1 - alpha ** (k + 1)) / (1 - alpha)",
     "return 1 + alpha * k"),
    ("leaves out the draft's own steps", "drafting = k * draft_fraction * target_pass(batch)", "drafting = 0.0"),
    ("divides by zero at a = 1", "return k + 1 if alpha == 1 else (1 - alpha ** (k + 1)) / (1 - alpha)",
     "return (1 - alpha ** (k + 1)) / (1 - alpha)"),
    ("keeps the larger k on a tie", "if speedup > best * (1 + 1e-12):", "if speedup >= best:"),
]


def test_the_q4_solution_passes():
    m = SolutionMutants("ex20_speculative")
    assert m.grade("q4", m.functions()).passed


@pytest.mark.parametrize("why, old, new", Q4_MUTANTS, ids=[m[0] for m in Q4_MUTANTS])
def test_q4_mistakes_lose_q4(why, old, new):
    m = SolutionMutants("ex20_speculative")
    assert lost(m.grade("q4", m.functions(old, new))), why
