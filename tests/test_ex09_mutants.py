"""Exercise 09: each question's classic mistakes, as mutants of the worked solution.

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
EXERCISE = "ex09_batching"
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
    ('q1', 'ignores the cached tokens', 'ops = 2 * num_params * (prompt_tokens - cached_tokens)', 'ops = 2 * num_params * prompt_tokens', ''),
    ('q1', 'one operation per parameter', 'ops = 2 * num_params * (prompt_tokens - cached_tokens)', 'ops = num_params * (prompt_tokens - cached_tokens)', ''),
    ('q1', 'forgets the chips', 'return ops / (num_chips * peak_ops_per_chip * efficiency)', 'return ops / (peak_ops_per_chip * efficiency)', ''),
    ('q2', 'reads one cache, not one per person', 'bytes_read = weights_bytes + batch * tokens_per_person * kv_bytes_per_token', 'bytes_read = weights_bytes + tokens_per_person * kv_bytes_per_token', ''),
    ('q2', 'reads the weights once per person', 'bytes_read = weights_bytes + batch * tokens_per_person * kv_bytes_per_token', 'bytes_read = batch * (weights_bytes + tokens_per_person * kv_bytes_per_token)', ''),
    ('q2', 'forgets the overhead', 'return bytes_read / (bandwidth * efficiency) + overhead_s', 'return bytes_read / (bandwidth * efficiency)', ''),
    ('q3', 'adds a decode step before the first token', 'return queue_seconds + prefill + (tokens - 1) * step_seconds', 'return queue_seconds + prefill + tokens * step_seconds', ''),
    ('q3', 'a fully cached prompt computes nothing', 'fresh = max(prompt_tokens - cached_tokens, 1)', 'fresh = prompt_tokens - cached_tokens', ''),
    ('q3', 'forgets the queue', 'return queue_seconds + prefill + (tokens - 1) * step_seconds', 'return prefill + (tokens - 1) * step_seconds', ''),
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
