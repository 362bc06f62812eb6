"""Exercise 11: each question's classic mistakes, as mutants of the worked solution.

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
EXERCISE = "ex11_seats"
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
    ('q1', 'query heads instead of KV heads', 'kv_heads = config.get("num_key_value_heads") or heads', 'kv_heads = heads', ''),
    ('q1', 'ignores an explicit head_dim', 'head_dim = config.get("head_dim") or config["hidden_size"] // heads', 'head_dim = config["hidden_size"] // heads', 'head_dim'),
    ('q1', 'defaults head_dim to hidden / KV heads', 'head_dim = config.get("head_dim") or config["hidden_size"] // heads', 'head_dim = config.get("head_dim") or config["hidden_size"] // kv_heads', ''),
    ('q2', 'forgets the margin', 'room = (card_bytes - weights_bytes) * (1 - margin)', 'room = card_bytes - weights_bytes', ''),
    ('q2', 'takes the margin off the whole card', 'room = (card_bytes - weights_bytes) * (1 - margin)', 'room = card_bytes * (1 - margin) - weights_bytes', ''),
    ('q2', 'rounds a part seat up', 'return int(room // (seq_len * bytes_per_token))', 'return int(-(-room // (seq_len * bytes_per_token)))', ''),
    ('q3', 'whole seats per card x cards', 'room = n * (card_bytes - per_card) * (1 - margin)\n        if room // (seq_len * bytes_per_token) >= seats:', 'room = (card_bytes - per_card) * (1 - margin)\n        if n * (room // (seq_len * bytes_per_token)) >= seats:', 'pooled'),
    ('q3', 'does not split the weights', 'per_card = weights / n', 'per_card = weights', ''),
    ('q3', 'tries groups of any size', 'for n in (1, 2, 4, 8):', 'for n in range(1, 9):', ''),
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
