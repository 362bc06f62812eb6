"""Issue 27's scoring and reporting rules, graded in-process (no kernel)."""
import json
import os
import shutil
import time

import nbformat
import pytest

import servelab.grade as grade
from servelab.grading import (INPUT_SHARE, Case, Question, Result, first_difference, grade_question,
                              load_questions, run_case)

from mutants_common import ROOT, SolutionMutants


def _q(**kw):
    base = dict(id="q", title="t", function="f", points=4, level="easy", minutes=1,
                visible=[Case(args=(2,), expected=4)],
                hidden=[Case(args=(3,), expected=6, label="three: h // 2 is wrong"),
                        Case(args=(-1,), raises=ValueError, label="negative")])
    base.update(kw)
    return Question(**base)


def test_right_math_with_a_missing_check_keeps_most_of_the_points():
    result = grade_question(_q(), lambda x: 2 * x)
    assert result.points == 4 * (1 - INPUT_SHARE) == 3 and not result.passed
    assert result.math_passed and result.checks_passed is False
    assert "math right" in result.reason and "expected ValueError" in result.reason


def test_wrong_math_scores_nothing_whatever_its_checks():
    def wrong(x):
        if x < 0:
            raise ValueError("negative")
        return x + 2
    result = grade_question(_q(), wrong)
    assert result.points == 0 and not result.math_passed and result.checks_passed is None


def test_a_question_without_input_checks_is_all_math():
    q = _q(hidden=[Case(args=(3,), expected=6)])
    assert grade_question(q, lambda x: 2 * x).points == 4
    assert grade_question(q, lambda x: 2 * x).checks_passed is None


def test_every_solution_is_all_right_and_every_question_splits_its_points():
    """How many questions have input checks, and the split is a quarter of each."""
    for path in sorted((ROOT / "solutions").glob("ex*.ipynb")):
        for q in load_questions(path.stem):
            cases = list(q.visible) + list(q.hidden)
            if any(c.input_check for c in cases):
                assert any(not c.input_check for c in cases) or q.test, f"{path.stem}.{q.id}: no math cases"


def test_interview_mode_hides_labels_that_name_the_fix():
    q = _q()
    practice = grade_question(q, lambda x: 7 if x == 3 else 2 * x)
    interview = grade_question(q, lambda x: 7 if x == 3 else 2 * x, interview=True)
    assert "h // 2" in practice.reason
    assert "h // 2" not in interview.reason and "f(3)" in interview.reason
    visible_fail = grade_question(q, lambda x: 0, interview=True)
    assert "f(2)" in visible_fail.reason


def test_interview_notebooks_are_recognised_from_metadata():
    nb = nbformat.v4.new_notebook()
    assert not grade.is_interview(nb)
    nb.metadata["servelab"] = {"questions": [["ex02_tokens", "q1"]]}
    assert grade.is_interview(nb)


def test_failures_show_the_first_differing_element():
    long = list(range(100))
    wrong = long[:37] + [99] + long[38:]
    reason = run_case("f", lambda: wrong, Case(expected=long))
    assert "first difference at [37]: expected 37, got 99" in reason
    assert first_difference([[1, 2], [3, 4]], [[1, 2], [3, 5]]) == "[1][1]: expected 5, got 4"
    assert "has 3 elements, expected 2" in run_case("f", lambda: [1, 2, 3], Case(expected=[1, 2]))
    assert first_difference({"a": 1}, {"a": 1, "b": 2}) == "['b'] is missing"


def test_the_table_shows_partial_points():
    r = Result("q1", "t", 2.25, 3, False, "math right", True, False)
    table = grade.format_table([r])
    assert "2.25/3" in table and "part" in table and "total: 2.25/3" in table
    assert Result("q1", "t", 3.0, 3, True, "").points == 3 and isinstance(Result("q1", "t", 3.0, 3, True, "").points, int)


def test_a_syntax_error_or_a_raising_cell_is_reported_as_such():
    errors = [(2, "def f(:\n    pass", "SyntaxError", "invalid syntax (123456.py, line 1)"),
              (3, "x = 1/0\ndef g():\n    pass", "ZeroDivisionError", "division by zero")]
    assert grade._missing_reason("f", errors) == (
        "f is not defined: the code cell that defines it (code cell 2) has a syntax error: "
        "SyntaxError: invalid syntax (line 1)")
    assert "(code cell 3) raised: ZeroDivisionError" in grade._missing_reason("g", errors)
    assert grade._missing_reason("h", errors).startswith("function not defined: write `def h(...)` (note: code cell 2")
    assert grade._missing_reason("h", []) is None


def test_an_unknown_exercise_in_metadata_blames_the_metadata(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.metadata["servelab"] = {"exercise": "ex99_nothing"}
    with pytest.raises(ValueError, match="metadata names the exercise 'ex99_nothing'"):
        grade.questions_of(nb, tmp_path / "ex11_seats.ipynb")
    nb.metadata["servelab"] = {"questions": [["ex02_tokens", "q9"]]}
    with pytest.raises(ValueError, match="metadata asks for ex02_tokens.q9"):
        grade.questions_of(nb, tmp_path / "x.ipynb")


def _fake_grader(monkeypatch, passed=True):
    def fake(path, cell_timeout=10.0, **kw):
        name = grade.exercise_name(Path(path))
        return [Result(q.id, q.title, q.points if passed else 0, q.points, passed, "ok" if passed else "wrong")
                for q in load_questions(name)]
    from pathlib import Path
    monkeypatch.setattr(grade, "grade_notebook", fake)


def test_exit_status_is_non_zero_when_a_question_fails(monkeypatch, tmp_path, capsys):
    path = tmp_path / "ex02_tokens.ipynb"
    shutil.copy(ROOT / "solutions" / "ex02_tokens.ipynb", path)
    _fake_grader(monkeypatch, passed=True)
    assert grade.main([str(path)]) == 0
    _fake_grader(monkeypatch, passed=False)
    assert grade.main([str(path)]) == 1


def test_all_survives_an_unknown_exercise_names_the_copy_and_skips_blanks(monkeypatch, tmp_path, capsys):
    _fake_grader(monkeypatch, passed=True)
    old, new = tmp_path / "ex02_tokens.ipynb", tmp_path / "ex02 second try.ipynb"
    shutil.copy(ROOT / "solutions" / "ex02_tokens.ipynb", old)
    shutil.copy(ROOT / "solutions" / "ex02_tokens.ipynb", new)
    os.utime(old, (time.time() - 100, time.time() - 100))
    shutil.copy(ROOT / "exercises" / "ex03_sampling.ipynb", tmp_path / "ex03_sampling.ipynb")
    bad = json.loads((ROOT / "exercises" / "ex04_embeddings.ipynb").read_text())
    bad["metadata"]["servelab"]["exercise"] = "ex99_nothing"
    (tmp_path / "mine.ipynb").write_text(json.dumps(bad))
    status = grade.main(["--all", "--dir", str(tmp_path), "--jobs", "1"])
    out = capsys.readouterr().out
    assert status == 2  # the bad metadata is an error, but every other row is there
    row2 = next(line for line in out.splitlines() if line.startswith("ex02_tokens"))
    assert "ex02 second try.ipynb (newest of 2 copies)" in row2 and "3/3 passed" in row2
    row3 = next(line for line in out.splitlines() if line.startswith("ex03_sampling"))
    assert "not started" in row3
    assert "ex99_nothing: mine.ipynb's metadata names the exercise 'ex99_nothing'" in out
    assert grade.untouched(tmp_path / "ex03_sampling.ipynb", "ex03_sampling")
    assert not grade.untouched(new, "ex02_tokens")


def test_the_kernel_is_started_with_encryption_so_it_does_not_warn():
    import zmq
    client = grade._execute(nbformat.v4.new_notebook(), ROOT / "x.ipynb", 10, "python3")
    assert client.km.transport_encryption == ("auto" if zmq.has("curve") else "disabled")


def test_a_cut_short_input_is_printed_in_full_so_the_failure_can_be_reproduced():
    from servelab.grading import FULL_INPUT_LIMIT, get_question
    from servelab.grading.hidden.ex18_prefill_decode import _T, _choose_budget

    q4 = get_question("ex18_prefill_decode", "q4")

    def off_on_long_traces(trace, *rest):
        got = _choose_budget(trace, *rest)
        return (got[0], got[1] * 1.01, got[2]) if got and len(trace) > 50 else got

    interview = grade_question(q4, off_on_long_traces, interview=True)
    practice = grade_question(q4, off_on_long_traces)
    assert "..." in interview.reason and "60 requests" not in interview.reason + interview.detail
    assert "60 requests" in practice.reason  # practice mode names the case by its label
    for result in (interview, practice):  # both print the input in full, floats exact
        assert result.detail == q4.hidden[4].full_input("choose_budget")
        assert result.detail.startswith("choose_budget([(0.068, 2729, 83)") and repr(_T[-1]) in result.detail
        assert f"{result.question}: the input in full: {result.detail}" in grade.format_table([result])
    short = grade_question(_q(), lambda x: 0)
    assert short.detail == "" and "the input in full" not in grade.format_table([short])
    huge = Case(args=(list(range(FULL_INPUT_LIMIT)),), expected=0)
    assert "too long to print" in grade_question(_q(visible=[huge], hidden=[]), lambda x: 1).detail


def test_expected_values_have_the_sequence_types_the_questions_ask_for():
    """A tuple the question asks for is expected as a tuple (and a list as a list), so a
    failure never reads "expected [512, ...], got (512, ...)" like a type error; the worked
    solutions return what the questions ask for."""
    import copy

    from servelab.grading import all_exercises

    def kinds(got, expected, path="the result"):
        if isinstance(expected, (list, tuple)) and isinstance(got, (list, tuple)):
            if type(got) is not type(expected):
                yield f"{path}: expected as a {type(expected).__name__}, the solution gives a {type(got).__name__}"
            for i, (g, e) in enumerate(zip(got, expected)):
                yield from kinds(g, e, f"{path}[{i}]")
        elif isinstance(expected, dict) and isinstance(got, dict):
            for k in expected.keys() & got.keys():
                yield from kinds(got[k], expected[k], f"{path}[{k!r}]")

    wrong = []
    for exercise in all_exercises():
        m = SolutionMutants(exercise)
        functions = m.functions()
        for q in m.questions.values():
            for case in list(q.visible) + list(q.hidden):
                if case.input_check:
                    continue
                got = functions[q.function](*copy.deepcopy(case.args), **copy.deepcopy(case.kwargs))
                wrong += [f"{exercise}.{q.id} {case.label}: {k}" for k in kinds(got, case.expected)]
    assert not wrong, "\n".join(wrong[:10])
