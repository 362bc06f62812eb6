"""Helpers for the exercise mutant tests (tests/test_exNN_mutants.py).

A *mutant* is a classic wrong answer to one graded question. Each must lose
that question's points under the hidden tests, while the worked solution keeps
them. Questions are graded in-process through the hidden module's QUESTIONS,
so these tests take milliseconds, not a kernel start.
"""
from __future__ import annotations

import json
from pathlib import Path

from servelab.grading import grade_question, load_questions

ROOT = Path(__file__).resolve().parents[1]


def question(exercise: str, qid: str):
    return next(q for q in load_questions(exercise) if q.id == qid)


def solution_functions(exercise: str) -> dict:
    """The functions the worked solution defines (its code cells, without the check calls)."""
    return SolutionMutants(exercise).functions()


def lost(result) -> bool:
    """A mutant loses its points: wrong math scores 0; right math with a missing input
    check loses the checks' share (servelab.grading.INPUT_SHARE)."""
    return not result.passed and result.points < result.max_points and (
        result.points == 0 or result.checks_passed is False)


def assert_loses(exercise: str, qid: str, mutant, why: str) -> None:
    result = grade_question(question(exercise, qid), mutant)
    assert lost(result), f"{exercise}.{qid}: the mutant '{why}' kept its points ({result.reason})"


def assert_keeps(exercise: str, qid: str, func) -> None:
    result = grade_question(question(exercise, qid), func)
    assert result.passed, f"{exercise}.{qid}: the worked solution failed: {result.reason}"


def solution_source(exercise: str) -> str:
    """The solution notebook's code cells, without the ``check(...)`` cells."""
    cells = json.loads((ROOT / "solutions" / f"{exercise}.ipynb").read_text())["cells"]
    code = ("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    keep = [src for src in code if "check(" not in src and "import check" not in src]
    return "\n\n".join(keep)


class SolutionMutants:
    """The questions of ``exercise`` and its solution's code, ready to be edited and graded."""

    def __init__(self, exercise: str):
        self.exercise = exercise
        self.questions = {q.id: q for q in load_questions(exercise)}
        self.source = solution_source(exercise)

    def functions(self, old: str | None = None, new: str | None = None) -> dict:
        """Run the solution's code, with ``old`` replaced by ``new`` (which must occur once)."""
        source = self.source
        if old is not None:
            assert source.count(old) == 1, f"the mutant's text must occur once in the solution: {old!r}"
            source = source.replace(old, new)
        namespace: dict = {}
        exec(compile(source, f"{self.exercise} (mutant)", "exec"), namespace)
        return namespace

    def grade(self, qid: str, namespace: dict):
        question = self.questions[qid]
        return grade_question(question, namespace.get(question.function))


def mutant_tests(exercise: str, mutants: list[tuple]):
    """The three tests every mutant file runs, for ``exercise`` and its ``mutants``:
    (question, the mistake, text in the solution, the mistaken text, words the reason must
    contain). Assign them to ``test_*`` names at module level so pytest collects them."""
    import pytest

    m = SolutionMutants(exercise)

    def test_the_solution_scores_every_question():
        namespace = m.functions()
        for qid in m.questions:
            result = m.grade(qid, namespace)
            assert result.passed, f"{qid}: {result.reason}"

    @pytest.mark.parametrize("qid, mistake, old, new, reason", mutants,
                             ids=[f"{x[0]}-{x[1]}" for x in mutants])
    def test_each_classic_mistake_loses_its_question(qid, mistake, old, new, reason):
        result = m.grade(qid, m.functions(old, new))
        assert lost(result), f"{qid} {mistake}: the hidden tests let it through"
        if reason:
            assert reason in result.reason, result.reason

    def test_every_question_has_two_or_more_mistakes():
        counts = {qid: sum(x[0] == qid for x in mutants) for qid in m.questions}
        assert all(n >= 2 for n in counts.values()), counts

    return (test_the_solution_scores_every_question, test_each_classic_mistake_loses_its_question,
            test_every_question_has_two_or_more_mistakes)
