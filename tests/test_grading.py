"""The grader: full marks for every solution, zero for every blank, and student
code that misbehaves costs only its own question."""
import json
import shutil
from pathlib import Path

import nbformat
import pytest

from servelab.grade import format_table, grade_notebook
from servelab.grading import Case, Question, check, grade_question, load_questions

ROOT = Path(__file__).resolve().parents[1]
SOLUTIONS = sorted((ROOT / "solutions").glob("ex*.ipynb"))
EXERCISES = sorted((ROOT / "exercises").glob("ex*.ipynb"))


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.stem)
def test_every_solution_scores_full_marks(path):
    results = grade_notebook(path)
    assert results, "no questions graded"
    failed = [f"{r.question}: {r.reason}" for r in results if not r.passed]
    assert not failed, "\n".join(failed)


@pytest.mark.parametrize("path", EXERCISES, ids=lambda p: p.stem)
def test_every_blank_exercise_scores_zero(path):
    results = grade_notebook(path)
    assert results and sum(r.points for r in results) == 0, format_table(results)


def test_every_question_has_a_level_a_time_box_and_hidden_tests():
    for path in EXERCISES:
        for q in load_questions(path.stem):
            assert q.level in ("easy", "medium", "hard") and q.minutes > 0
            assert q.hidden or q.test, f"{path.stem}.{q.id} has no hidden tests"


def _variant(tmp_path, source: Path, edit) -> Path:
    nb = nbformat.read(source, as_version=4)
    edit(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    out = tmp_path / source.name  # the file name selects the hidden tests
    nbformat.write(nb, out)
    return out


def test_the_classic_mistake_loses_exactly_that_question(tmp_path):
    def heads_instead_of_kv_heads(nb):
        for cell in nb.cells:
            cell.source = cell.source.replace('config.get("num_key_value_heads") or heads', "heads")
    path = _variant(tmp_path, ROOT / "solutions" / "ex11_seats.ipynb", heads_instead_of_kv_heads)
    results = {r.question: r for r in grade_notebook(path)}
    assert not results["q1"].passed and "expected 131072, got 524288" in results["q1"].reason
    assert results["q2"].passed and results["q3"].passed


def test_misbehaving_student_code_never_crashes_the_grader(tmp_path):
    cells = [
        nbformat.v4.new_code_cell("def broken(:\n    pass"),                 # syntax error
        nbformat.v4.new_code_cell("while True:\n    pass"),                 # endless top-level loop
        nbformat.v4.new_code_cell("def kv_bytes_per_token(config, b):\n    raise ValueError('oops')"),
        nbformat.v4.new_code_cell("def seats_granted(*args, **kw):\n    while True:\n        pass"),
        # cards_needed is never defined
    ]
    nb = nbformat.v4.new_notebook(cells=cells)
    path = tmp_path / "ex11_seats.ipynb"
    nbformat.write(nb, path)
    results = {r.question: r for r in grade_notebook(path, cell_timeout=3)}
    assert "raised ValueError: oops" in results["q1"].reason
    assert "timed out after" in results["q2"].reason
    assert "function not defined" in results["q3"].reason
    assert sum(r.points for r in results.values()) == 0


def test_cli_prints_a_table_and_json(tmp_path, capsys):
    from servelab.grade import main
    assert main([str(ROOT / "solutions" / "ex11_seats.ipynb"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    (rows,) = report.values()
    assert [r["passed"] for r in rows] == [True, True, True]
    assert main([str(tmp_path / "missing.ipynb")]) == 2


def test_unknown_exercise_name_is_a_clear_error(tmp_path):
    path = tmp_path / "ex99_nothing.ipynb"
    nb = nbformat.read(ROOT / "exercises" / "ex11_seats.ipynb", as_version=4)
    nb.metadata.pop("servelab")
    nbformat.write(nb, path)
    with pytest.raises(ValueError, match="does not say which exercise"):
        grade_notebook(path)


def test_every_exercise_and_solution_names_its_exercise_in_metadata():
    for path in EXERCISES + SOLUTIONS:
        meta = json.loads(path.read_text())["metadata"].get("servelab", {})
        assert meta.get("exercise") == path.stem, (
            f"{path.relative_to(ROOT)}: add to the notebook's top-level metadata "
            f'"servelab": {{"exercise": "{path.stem}"}} (so renamed copies grade)')


def test_a_renamed_copy_grades_from_its_metadata(tmp_path):
    path = tmp_path / "my answers-Copy1.ipynb"
    shutil.copy(ROOT / "solutions" / "ex02_tokens.ipynb", path)
    results = grade_notebook(path)
    assert results and all(r.passed for r in results)
    assert all("hidden" in r.reason for r in results)  # a pass says how many hidden checks it passed


def test_progress_table_over_a_folder(tmp_path, capsys):
    from servelab.grade import main
    shutil.copy(ROOT / "solutions" / "ex02_tokens.ipynb", tmp_path / "tokens_done.ipynb")
    shutil.copy(ROOT / "exercises" / "ex03_sampling.ipynb", tmp_path / "ex03_sampling.ipynb")
    (tmp_path / "notes.ipynb").write_text(json.dumps(nbformat.v4.new_notebook()))
    assert main(["--all", "--dir", str(tmp_path)]) == 0  # nothing started has a failing question
    out = capsys.readouterr().out
    most2 = sum(q.points for q in load_questions("ex02_tokens"))
    most3 = sum(q.points for q in load_questions("ex03_sampling"))
    assert f"{most2}/{most2}" in out and "tokens_done.ipynb" in out  # the row names the file graded
    assert f"0/{most3}" in out and "min" in out and "1 started" in out and "1 of" in out
    ex03_row = next(line for line in out.splitlines() if line.startswith("ex03_sampling"))
    assert "not started" in ex03_row  # a blank exercise is not started (and not run), not "0/3 passed"


def test_failure_reasons_read_cleanly():
    from servelab.grading import run_case
    reason = run_case("f", lambda x: 0.1 + 0.2, Case(args=(print,), expected=1 / 3))
    assert reason == "f(<function print>): expected 0.333333, got 0.3"
    q = Question(id="q", title="t", function="f", points=1, level="easy", minutes=1,
                 visible=[Case(args=(1,), expected=1)], test=lambda f: f(f))
    bad = grade_question(q, lambda x: (_ for _ in ()).throw(ValueError(repr(lambda: 0))) if callable(x) else x)
    assert "0x" not in bad.reason and "<function " in bad.reason


def test_grade_question_in_process_rules():
    q = Question(id="q", title="t", function="f", points=2, level="easy", minutes=1,
                 visible=[Case(args=(2,), expected=4)], hidden=[Case(args=(-1,), raises=ValueError),
                                                               Case(args=(0.1,), expected=0.2)])
    def good(x):
        if x < 0:
            raise ValueError
        return 2 * x
    assert grade_question(q, good).points == 2
    assert "expected ValueError" in grade_question(q, lambda x: 2 * x).reason
    assert grade_question(q, None).reason.startswith("function not defined")
    assert "not a function" in grade_question(q, 3).reason
    assert grade_question(q, lambda x: True if x == 2 else 2 * x).passed is False  # True is not 4


def test_check_prints_and_never_raises(capsys):
    from servelab.grading import run_check
    assert run_check("ex11_seats.q1", lambda c, b: 131_072) is True
    assert run_check("ex11_seats.q1") is False
    assert run_check("ex11_seats.q9", print) is False
    out = capsys.readouterr().out
    assert "✅ Q1 · " in out and "function not defined" in out and "no question" in out


def test_check_returns_none_so_a_notebook_cell_does_not_echo_true(capsys):
    # a notebook shows a cell's last value: check's verdict is printed, not returned
    assert check("ex11_seats.q1", lambda c, b: 131_072) is None
    assert check("ex11_seats.q1") is None
    out = capsys.readouterr().out
    assert out.count("Q1 · ") == 2 and "True" not in out


def test_check_counts_in_the_singular_and_takes_the_interview_numbering(capsys):
    from servelab.grading import get_question, run_check
    one = get_question("ex11_seats", "q1")
    assert len(one.visible) + bool(one.visible_test) == 1
    assert run_check("ex11_seats.q1", lambda c, b: 131_072, name="Question 3")
    out = capsys.readouterr().out
    assert out.startswith(f"✅ Question 3 · {one.title}: 1 visible check passed.") and "q1" not in out
    q = Question(id="q", title="t", function="f", points=1, level="easy", minutes=1,
                 visible=[Case(args=(1,), expected=1)], hidden=[Case(args=(2,), expected=2)])
    assert grade_question(q, lambda x: x).reason == "passed 1 visible and 1 hidden checks"
    assert grade_question(q, lambda x: x, include_hidden=False).reason == "passed 1 visible check"


def test_merging_partials_through_exp_m_overflows_and_fails_only_that_case():
    import math

    def through_exp_m(a, b):  # the textbook-looking merge that multiplies exp(m) back in
        (m1, l1, x1), (m2, l2, x2) = a, b
        m = max(m1, m2)
        e1, e2 = (0.0 if mi == -math.inf else math.exp(mi) for mi in (m1, m2))
        return m, (l1 * e1 + l2 * e2) / math.exp(m), [(u * e1 + w * e2) / math.exp(m) for u, w in zip(x1, x2)]

    q4 = next(q for q in load_questions("ex05_attention") if q.id == "q4")
    result = grade_question(q4, through_exp_m)
    assert result.points == 0 and "1,000" in result.reason
