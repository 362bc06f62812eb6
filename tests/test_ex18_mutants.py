"""Exercise 18: each question's classic mistakes, as mutants of the worked solution.

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
EXERCISE = "ex18_prefill_decode"
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
    ("q1", "forgets the decode rows", "room = itl_target_s - base_s - per_decode_row_s * decode_rows",
     "room = itl_target_s - base_s", ""),
    ("q1", "rounds up", "chunk = math.floor(room / per_prompt_token_s + 1e-9)",
     "chunk = math.ceil(room / per_prompt_token_s)", ""),
    ("q1", "loses the exact fit to floating point", "chunk = math.floor(room / per_prompt_token_s + 1e-9)",
     "chunk = int(room / per_prompt_token_s)", ""),
    ("q1", "returns 0 instead of raising", 'raise ValueError("the decodes alone use up the target")',
     "return 0", ""),
    ("q2", "splits by the ratio of loads, rounded", "    best, best_busy = None, None\n",
     "    return max(1, min(gpus - 1, round(gpus * prefill_load / (prefill_load + decode_load))))\n", ""),
    ("q2", "takes the last of a tie", "if best_busy is None or busy < best_busy:",
     "if best_busy is None or busy <= best_busy:", ""),
    ("q2", "balances the less busy pool", "busy = max(prefill_load / p, decode_load / (gpus - p))",
     "busy = min(prefill_load / p, decode_load / (gpus - p))", ""),
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
