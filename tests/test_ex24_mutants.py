"""Exercise 24: each question's classic mistakes, as mutants of the worked solution.

Every mutant is the solution notebook's code with one small edit (the mistake a
candidate makes); the hidden tests must take that question's points away. The
functions are graded directly through the hidden module's questions, so this
file runs in about a second.
"""
import json
from pathlib import Path

import pytest

from servelab.grading import grade_question, load_questions

ROOT = Path(__file__).resolve().parents[1]
EXERCISE = "ex24_cost"
QUESTIONS = {q.id: q for q in load_questions(EXERCISE)}


def _solution_source() -> str:
    cells = json.loads((ROOT / "solutions" / f"{EXERCISE}.ipynb").read_text())["cells"]
    code = ("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    keep = [src for src in code if "check(" not in src and "import check" not in src]
    return "\n\n".join(keep)


SOURCE = _solution_source()


def _functions(old: str | None = None, new: str | None = None) -> dict:
    source = SOURCE
    if old is not None:
        assert source.count(old) == 1, f"the mutant's text must occur once in the solution: {old!r}"
        source = source.replace(old, new)
    namespace: dict = {}
    exec(compile(source, f"{EXERCISE} (mutant)", "exec"), namespace)
    return namespace


def _grade(qid: str, namespace: dict):
    question = QUESTIONS[qid]
    return grade_question(question, namespace.get(question.function))


def test_the_solution_scores_every_question():
    namespace = _functions()
    for qid in QUESTIONS:
        result = _grade(qid, namespace)
        assert result.passed, f"{qid}: {result.reason}"


# (question, the mistake, text in the solution, the mistaken text, words the reason must contain)
MUTANTS = [
    ('q1', 'forgets the chips', 'chip_seconds_per_token = num_chips * step_seconds / batch', 'chip_seconds_per_token = step_seconds / batch', ''),
    ('q1', 'forgets the batch', 'chip_seconds_per_token = num_chips * step_seconds / batch', 'chip_seconds_per_token = num_chips * step_seconds', ''),
    ('q1', 'per thousand, not per million', 'return chip_seconds_per_token * price_per_chip_hour / 3600 * 1e6', 'return chip_seconds_per_token * price_per_chip_hour / 3600 * 1e3', ''),
    ('q2', 'ignores the cached share', 'chip_seconds_per_input_token = (1 - cached_share) * chip_seconds_per_fresh_token', 'chip_seconds_per_input_token = chip_seconds_per_fresh_token', ''),
    ('q2', 'bills cached tokens, not fresh ones', 'chip_seconds_per_input_token = (1 - cached_share) * chip_seconds_per_fresh_token', 'chip_seconds_per_input_token = max(cached_share, 1e-9) * chip_seconds_per_fresh_token', ''),
    ('q2', 'one operation per parameter', 'seconds_per_fresh_token = 2 * params / (num_chips * flops_per_chip * efficiency)', 'seconds_per_fresh_token = params / (num_chips * flops_per_chip * efficiency)', ''),
    ('q3', 'inverts the ratio', 'return output_chip_seconds / input_chip_seconds', 'return input_chip_seconds / output_chip_seconds', ''),
    ('q3', 'forgets the chips in the output token', 'output_chip_seconds = num_chips * step_seconds / batch', 'output_chip_seconds = step_seconds / batch', ''),
]


@pytest.mark.parametrize("qid, mistake, old, new, reason", MUTANTS, ids=[f"{m[0]}-{m[1]}" for m in MUTANTS])
def test_each_classic_mistake_loses_its_question(qid, mistake, old, new, reason):
    result = _grade(qid, _functions(old, new))
    assert not result.passed and result.points == 0, f"{qid} {mistake}: the hidden tests let it through"
    if reason:
        assert reason in result.reason, result.reason


def test_every_question_has_two_or_more_mistakes():
    counts = {qid: sum(m[0] == qid for m in MUTANTS) for qid in QUESTIONS}
    assert all(n >= 2 for n in counts.values()), counts
