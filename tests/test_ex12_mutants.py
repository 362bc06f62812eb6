"""Exercise 12: each question's classic mistakes, as mutants of the worked solution.

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
EXERCISE = "ex12_shrinking"
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
    ('q1', "stores MLA's latent twice (as keys and values)", 'return layers * (config["kv_lora_rank"] + config["qk_rope_head_dim"]) * bytes_per_value', 'return 2 * layers * (config["kv_lora_rank"] + config["qk_rope_head_dim"]) * bytes_per_value', ''),
    ('q1', "forgets MLA's rotary key", 'return layers * (config["kv_lora_rank"] + config["qk_rope_head_dim"]) * bytes_per_value', 'return layers * config["kv_lora_rank"] * bytes_per_value', ''),
    ('q1', 'treats MLA like GQA', 'if config.get("kv_lora_rank") is not None:', 'if False:', ''),
    ('q2', 'a window layer always keeps the whole window', 'total += min(seq_len, window)', 'total += window', ''),
    ('q2', 'windows change nothing', 'total += min(seq_len, window)', 'total += seq_len', ''),
    ('q2', 'accepts a window of 0', 'elif window <= 0:', 'elif window < 0:', ''),
    ('q3', 'one scale for the whole tensor', 'scale = np.abs(x).max(axis=1, keepdims=True) / 127', 'scale = np.abs(x).max() / 127 * np.ones((x.shape[0], 1))', ''),
    ('q3', 'divides by 128', 'scale = np.abs(x).max(axis=1, keepdims=True) / 127', 'scale = np.abs(x).max(axis=1, keepdims=True) / 128', ''),
    ('q3', 'truncates instead of rounding', 'codes = np.clip(np.round(x / scale), -127, 127)', 'codes = np.clip(np.trunc(x / scale), -127, 127)', ''),
    ('q3', 'no guard for an all-zero row', 'scale[scale == 0] = 1.0', 'pass', ''),
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
