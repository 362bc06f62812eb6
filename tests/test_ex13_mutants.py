"""Exercise 13: each question's classic mistakes, as mutants of the worked solution.

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
EXERCISE = "ex13_pages"
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
    ('q1', 'reuses the most recently freed block', 'block, _ = self.free_list.popitem(last=False)', 'block, _ = self.free_list.popitem(last=True)', ''),
    ('q1', 'frees a shared block at its first free', 'self.refs[block] -= 1\n        if self.refs[block] == 0:', 'self.refs[block] = 0\n        if True:', ''),
    ('q1', 'no double-free check', 'if self.refs[block] == 0:\n            raise ValueError(f"double free', 'if False:\n            raise ValueError(f"double free', ''),
    ('q2', 'hashes each block alone (no chain)', 'parent = hash((parent, block))', 'parent = hash((0, block))', ''),
    ('q2', 'hashes the partial last block too', 'for i in range(len(token_ids) // block_size):', 'for i in range(-(-len(token_ids) // block_size)):', ''),
    ('q3', 'counts hits after a miss', 'break               # a block is only valid after its exact past', 'continue', ''),
    ('q3', 'lets a fully cached prompt skip every token', 'usable = max(prompt_len - 1, 0) // block_size', 'usable = prompt_len // block_size', ''),
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
