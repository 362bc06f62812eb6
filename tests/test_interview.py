"""The mock interview: picks within the time box, writes a notebook, grades it."""
import json

import nbformat
import pytest

from servelab.grade import grade_notebook
from servelab.grading import load_questions
from servelab.interview import Pick, all_exercises, build_notebook, main, pick_questions

from mutants_common import ROOT


def test_picks_fit_the_time_box_and_level_and_repeat_with_a_seed():
    for level, minutes in (("easy", 20), ("medium", 45), ("hard", 60), ("mixed", 90)):
        picks = pick_questions(level, minutes, seed=3)
        assert picks and sum(p.question.minutes for p in picks) <= minutes
        assert len({p.question.function for p in picks}) == len(picks)
        if level != "mixed":
            allowed = {"easy": {"easy"}, "medium": {"easy", "medium"}, "hard": {"easy", "medium", "hard"}}
            assert {p.question.level for p in picks} <= allowed[level]
            assert any(p.question.level == level for p in picks)
        assert picks == pick_questions(level, minutes, seed=3)


def test_questions_come_from_different_chapters_first():
    picks = pick_questions("medium", 45, seed=0)
    exercises = [p.exercise for p in picks]
    mediums = sum(len([q for q in load_questions(e) if q.level == "medium"]) > 0 for e in all_exercises())
    assert len(set(exercises)) == len(exercises) or len(set(exercises)) == mediums


def test_bad_requests_are_clear_errors():
    with pytest.raises(ValueError, match="level"):
        pick_questions("expert", 45)
    with pytest.raises(ValueError, match="minutes"):
        pick_questions("easy", 0)
    with pytest.raises(ValueError, match="fits in 1 minutes"):
        pick_questions("hard", 1)


def _picks():
    ex2 = {q.id: q for q in load_questions("ex02_tokens")}
    ex3 = {q.id: q for q in load_questions("ex03_sampling")}
    return [Pick("ex02_tokens", ex2["q1"]), Pick("ex03_sampling", ex3["q3"])]


def _solution_source(exercise, function):
    cells = json.loads((ROOT / "solutions" / f"{exercise}.ipynb").read_text())["cells"]
    return next("".join(c["source"]) for c in cells
                if c["cell_type"] == "code" and f"def {function}(" in "".join(c["source"]))


def test_the_notebook_grades_zero_blank_and_full_when_answered(tmp_path):
    nb = build_notebook(_picks(), "easy", 15, seed=1)
    assert nb.metadata["servelab"]["questions"] == [["ex02_tokens", "q1"], ["ex03_sampling", "q3"]]
    text = "\n".join(c.source for c in nb.cells)
    assert "## Question 1 · Count adjacent pairs" in text and "check(\"ex03_sampling.q3\"" in text
    blank = tmp_path / "blank.ipynb"
    nbformat.write(nb, blank)
    assert sum(r.points for r in grade_notebook(blank)) == 0
    for exercise, function in (("ex02_tokens", "count_pairs"), ("ex03_sampling", "sample_token")):
        nb.cells.append(nbformat.v4.new_code_cell(_solution_source(exercise, function)))
    answered = tmp_path / "renamed copy.ipynb"
    nbformat.write(nb, answered)
    results = grade_notebook(answered)
    assert [r.passed for r in results] == [True, True]


def test_cli_writes_refuses_to_overwrite_and_grades(tmp_path, capsys):
    out = tmp_path / "iv.ipynb"
    assert main(["--level", "easy", "--minutes", "10", "--seed", "2", "--out", str(out)]) == 0
    assert "open it" in capsys.readouterr().out and out.is_file()
    assert main(["--level", "easy", "--minutes", "10", "--out", str(out)]) == 2
    assert main(["--grade", str(tmp_path / "missing.ipynb")]) == 2
    assert "already exists" in capsys.readouterr().err
