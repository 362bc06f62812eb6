"""The mock interview: picks within the time box, writes a notebook, grades it."""
import json

import nbformat
import pytest

from servelab.grade import grade_notebook
from servelab.grading import load_questions
from servelab.interview import Pick, all_exercises, build_notebook, grade_interview, main, pick_questions

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
    report, points, _ = grade_interview(blank)  # the table numbers rows as the interview does
    assert points == 0 and "Question 1 · Count adjacent pairs [ex02_tokens.q1]" in report
    assert "Question 2 · " in report and "[ex03_sampling.q3]" in report
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


# ---------------------------------------------------------------- issue 27: the mock interview

def test_the_seed_is_recorded_so_an_interview_repeats(tmp_path, capsys):
    from servelab.interview import write_interview
    out = tmp_path / "iv.ipynb"
    picks = write_interview(out, "easy", 15)
    nb = nbformat.read(out, as_version=4)
    seed = nb.metadata["servelab"]["interview"]["seed"]
    assert isinstance(seed, int) and f"--seed {seed}" in nb.cells[0].source
    assert pick_questions("easy", 15, seed=seed) == picks
    assert main(["--level", "easy", "--minutes", "10", "--out", str(tmp_path / "b.ipynb")]) == 0
    assert "repeats this pick" in capsys.readouterr().out


def test_an_empty_pool_says_so():
    with pytest.raises(ValueError, match="pool is empty"):
        pick_questions("easy", 30, exercises=[])
    with pytest.raises(ValueError, match="no hard questions"):
        pick_questions("hard", 60, exercises=["ex02_tokens"])


def test_hard_interviews_draw_hard_questions_first_and_say_when_they_run_short():
    from servelab.interview import pick_notes
    hard = [p for p in pick_questions("mixed", 10_000, seed=0) if p.question.level == "hard"]
    shortest = min(p.question.minutes for p in hard)
    with pytest.raises(ValueError, match=f"no hard question fits in {shortest - 1} minutes"):
        pick_questions("hard", shortest - 1)
    for seed in range(5):
        picks = pick_questions("hard", 90, seed=seed)
        chosen = [p for p in picks if p.question.level == "hard"]
        left = 90 - sum(p.question.minutes for p in chosen)
        unused = [p for p in hard if p not in chosen and p.question.function not in
                  {c.question.function for c in chosen}]
        assert all(p.question.minutes > left for p in unused), "a hard question that fitted was skipped"
        notes = pick_notes(picks, "hard", 90)
        if len(chosen) < len(picks):
            assert any("are hard" in n for n in notes)


def test_links_into_the_chapters_work_wherever_the_notebook_is_written(tmp_path):
    import re
    picks = [Pick(ex, q) for ex in all_exercises() for q in load_questions(ex)]
    out_dir = tmp_path / "deep" / "folder"
    out_dir.mkdir(parents=True)
    nb = build_notebook(picks, "mixed", 1000, seed=0, out_dir=out_dir)
    links = [m.group(1) for c in nb.cells if c.cell_type == "markdown"
             for m in re.finditer(r"\]\((?![a-z]+:|#)([^)\s#]+)", c.source)]
    assert links, "no relative links to check"
    for link in links:
        assert (out_dir / link).resolve().is_file(), link


def test_every_question_is_self_contained():
    """A generated interview renumbers questions, so no question may point at another
    ("as in Q1", "Q2's rules"), nor at "the chapter" it came from: each states what it needs."""
    import re
    from servelab.interview import _section
    for ex in all_exercises():
        cells = json.loads((ROOT / "exercises" / f"{ex}.ipynb").read_text())["cells"]
        for q in load_questions(ex):
            text = "\n".join("".join(c["source"]) for c in _section(cells, q.id) if c["cell_type"] == "markdown")
            body = text.partition("\n")[2]
            assert not re.search(r"\bQ\d\b", body), f"{ex}.{q.id} refers to another question: " + \
                re.search(r".{0,40}\bQ\d\b.{0,40}", body).group(0)
            flat = re.sub(r"\s+", " ", body)
            assert not re.search(r"\b(this|the) chapter\b", flat, re.I), f"{ex}.{q.id} leans on a chapter " \
                "the candidate may not have read: " + re.search(r".{0,40}\b(this|the) chapter\b.{0,40}", flat, re.I).group(0)


def test_grade_and_interview_import_in_one_direction():
    """The interview builds on the grader, never the other way round: servelab.grade
    (and the grading package under it) never imports servelab.interview, not even
    inside a function, so there is no import circle."""
    import ast
    lib = ROOT / "lib" / "servelab"
    for path in [lib / "grade.py", *sorted((lib / "grading").rglob("*.py"))]:
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n.startswith("servelab.interview") for n in names), \
                f"{path.relative_to(lib)} imports servelab.interview"


def test_check_cells_use_the_interviews_numbering(capsys):
    """An interview's check says "Question 2", not the exercise's "q3"."""
    from servelab.interview import number_checks

    nb = build_notebook(_picks(), "easy", 15, seed=1)
    checks = [c.source for c in nb.cells if c.cell_type == "code" and c.source.startswith("check(")]
    assert checks == ['check("ex02_tokens.q1", count_pairs, name="Question 1")',
                      'check("ex03_sampling.q3", sample_token, name="Question 2")']
    namespace = {}
    exec(_solution_source("ex02_tokens", "count_pairs"), namespace)
    exec("from servelab.grading import check\n" + checks[0], namespace)
    out = capsys.readouterr().out
    assert out.startswith("✅ Question 1 · Count adjacent pairs: 1 visible check passed.")
    other = 'check("ex02_tokens.q2", apply_merge)'  # another question's call is left alone
    assert number_checks(other, _picks()[0], 1) == other

