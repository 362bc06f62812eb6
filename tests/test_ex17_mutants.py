"""Exercise 17: each question's classic mistakes, as mutants of the worked solution.

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
EXERCISE = "ex17_engine"
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
    ('q1', 'starts the timer at the first request ever', 'deadline = arrivals[i][1] + max_wait', 'deadline = arrivals[0][1] + max_wait', ''),
    ('q1', 'sends a full batch at the deadline', 'when = arrivals[j - 1][1] if full else deadline', 'when = deadline', ''),
    ('q1', 'leaves out a request arriving exactly at the deadline', 'arrivals[j][1] <= deadline', 'arrivals[j][1] < deadline', ''),
    ('q2', 'static batching: refills only when the batch is empty', '        while queue and len(running) < max_batch_size:\n            running.append(queue.pop(0))           # first come, first served\n', '        while queue and not running:\n            while queue and len(running) < max_batch_size:\n                running.append(queue.pop(0))\n', ''),
    ('q2', 'an ended request keeps its seat', '                continue                           # finished; the end token is not output', '                still.append((rid, prompt, max_tokens))\n                continue', 'must free its seat'),
    ('q2', 'accepts max_tokens below 1', '        if max_tokens < 1:\n            raise', '        if max_tokens < -10**9:\n            raise', 'must raise ValueError'),
    ('q2', 'accepts a negative batch size', '    if max_batch_size < 1:\n        raise ValueError(f"max_batch_size must be at least 1, got {max_batch_size}")\n    for rid', '    if max_batch_size == 0:\n        raise ValueError(f"max_batch_size must be at least 1, got {max_batch_size}")\n    for rid', 'negative max_batch_size'),
    ('q2', 'outputs the end token', '                continue                           # finished; the end token is not output', '                pass', ''),
    ('q3', 'adds a decode step to the first token', 'ttft[r[0]] = now - r[1]        # first token minus arrival', 'ttft[r[0]] = now + step_seconds - r[1]', ''),
    ('q3', "emits tokens at the step's start", 'on_token(now, r[0], token)', 'on_token(now - step_seconds, r[0], token)', 'event'),
    ('q3', 'an idle batcher never waits', 'now = max(now, min(pending[0][1] + max_wait, fills))', 'now = max(now, pending[0][1])', ''),
    ('q3', 'admits requests before they arrive', '               and pending[0][1] <= now):', '               and True):', ''),
    ('q3', 'static batching: no one joins a running batch', '               and pending[0][1] <= now):', '               and pending[0][1] <= now and not any(r[4] for r in running)):', ''),
    ('q3', 'measures the first token from time 0', 'ttft[r[0]] = now - r[1]        # first token minus arrival', 'ttft[r[0]] = now', ''),
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
