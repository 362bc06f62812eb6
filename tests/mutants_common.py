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
    cells = json.loads((ROOT / "solutions" / f"{exercise}.ipynb").read_text())["cells"]
    namespace: dict = {}
    for cell in cells:
        source = "".join(cell["source"])
        if cell["cell_type"] != "code" or "check(" in source or "import check" in source:
            continue
        exec(compile(source, f"{exercise}.ipynb", "exec"), namespace)
    return namespace


def assert_loses(exercise: str, qid: str, mutant, why: str) -> None:
    result = grade_question(question(exercise, qid), mutant)
    assert result.points == 0, f"{exercise}.{qid}: the mutant '{why}' kept its points ({result.reason})"


def assert_keeps(exercise: str, qid: str, func) -> None:
    result = grade_question(question(exercise, qid), func)
    assert result.passed, f"{exercise}.{qid}: the worked solution failed: {result.reason}"
