"""Exercise 23: each question's classic mistakes, as mutants of the worked solution.

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
EXERCISE = "ex23_pool"
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
    ("q1", "ignores the safety margin", "room = (card_bytes - weights_bytes) * (1 - margin)",
     "room = card_bytes - weights_bytes", ""),
    ("q1", "sizes a seat by the prompt alone", "seat = (prompt_tokens + answer_tokens) * kv_bytes_per_token",
     "seat = prompt_tokens * kv_bytes_per_token", ""),
    ("q1", "rounds to the nearest seat", "return int(room // seat)", "return round(room / seat)", ""),
    ("q1", "takes the whole card as room", "room = (card_bytes - weights_bytes) * (1 - margin)",
     "room = card_bytes * (1 - margin)", ""),
    ("q2", "int(x) + 1 instead of a ceiling", "return math.ceil(in_flight / (seats * utilisation))",
     "return int(in_flight / (seats * utilisation)) + 1", ""),
    ("q2", "rounds instead of a ceiling", "return math.ceil(in_flight / (seats * utilisation))",
     "return round(in_flight / (seats * utilisation))", ""),
    ("q2", "forgets the first-token time", "request_s = ttft_s + output_tokens / tokens_per_s_per_seat",
     "request_s = output_tokens / tokens_per_s_per_seat", ""),
    ("q2", "multiplies by the utilisation", "return math.ceil(in_flight / (seats * utilisation))",
     "return math.ceil(in_flight * utilisation / seats)", ""),
    ("q3", "forgets the chips per replica", "chips = replicas * chips_per_replica", "chips = replicas", ""),
    ("q3", "a 720-hour month", "HOURS_PER_MONTH = 365 * 24 / 12   # 730", "HOURS_PER_MONTH = 720", ""),
    ("q3", "per thousand tokens, not per million", "return monthly_usd, monthly_usd / tokens_per_month * 1e6",
     "return monthly_usd, monthly_usd / tokens_per_month * 1e3", ""),
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
