"""Grading isolation (issue 23, fault 9) and the grader's messages (issue 27).

The student's functions run in their kernel; the hidden checks run in the
grader's process and reach the functions over a socket (servelab.grading.remote).
Most tests here drive that link in-process (a thread plays the kernel), so they
cost milliseconds; one test runs a real kernel on a notebook that tries to cheat.
"""
import socket
import threading

import nbformat
import pytest

from servelab.grade import grade_notebook
from servelab.grading import grade_question, load_questions
from servelab.grading.remote import GRADER, KERNEL, Peer

from mutants_common import ROOT, SolutionMutants


class _Link:
    """A grader peer talking to a 'kernel' peer that serves ``namespace`` from a thread."""

    def __init__(self, namespace):
        a, b = socket.socketpair()
        self.kernel = threading.Thread(target=Peer(b, KERNEL, namespace).serve, daemon=True)
        self.kernel.start()
        self.grader = Peer(a, GRADER)

    def function(self, name):
        return self.grader.request("global", name)

    def close(self):
        from servelab.grading.remote import _send
        _send(self.grader.sock, {"op": "bye"})
        self.kernel.join(5)
        self.grader.sock.close()


EXERCISES = sorted(p.stem for p in (ROOT / "solutions").glob("ex*.ipynb"))


@pytest.mark.parametrize("exercise", EXERCISES)
def test_every_solution_passes_through_the_link(exercise):
    """Values, tensors, arrays, classes, generators and callbacks all cross the socket:
    every worked solution scores full marks graded from the other side."""
    namespace = SolutionMutants(exercise).functions()
    link = _Link(namespace)
    try:
        for q in load_questions(exercise):
            result = grade_question(q, link.function(q.function))
            assert result.passed, f"{exercise}.{q.id}: {result.reason}"
    finally:
        link.close()


def test_mutating_the_argument_is_still_seen():
    """Lists passed in are written back after the call, so 'changed its input' checks work."""
    m = SolutionMutants("ex02_tokens")
    namespace = m.functions()
    merge = namespace["merge_pair"]

    def in_place(ids, pair, new_id):
        out = merge(ids, pair, new_id)
        ids[:] = out
        return out
    namespace["merge_pair"] = in_place
    link = _Link(namespace)
    try:
        q2 = next(q for q in load_questions("ex02_tokens") if q.id == "q2")
        result = grade_question(q2, link.function("merge_pair"))
        assert not result.passed and "changed the list" in result.reason
    finally:
        link.close()


def test_the_kernel_cannot_make_the_grader_unpickle():
    link = _Link({"f": lambda: 1})
    try:
        with pytest.raises(ValueError, match="never unpickles"):
            link.grader.decode({"t": "pickle", "v": "gARLAS4="})
    finally:
        link.close()


def test_student_exceptions_keep_their_builtin_base():
    class BadInput(ValueError):
        pass

    def f(x):
        raise BadInput("negative")
    link = _Link({"f": f})
    try:
        with pytest.raises(ValueError, match="negative") as info:
            link.function("f")(-1)
        assert type(info.value).__name__ == "BadInput"
    finally:
        link.close()


def test_a_notebook_that_replaces_the_grader_scores_zero(tmp_path, capfd):
    """The cheat of issue 23 (fault 9): replace grade_question (and print a verdict) in
    the kernel. The verdicts come from the grader's process, so it scores 0; the same
    run shows the messages for a syntax error and for a cell that raised."""
    cheat = (
        "import servelab.grading as g, servelab.grade as gr\n"
        "def full_marks(question, func, *a, **k):\n"
        "    return g.Result(question.id, question.title, question.points, question.points, True, 'ok')\n"
        "g.grade_question = full_marks\n"
        "gr.grade_notebook = lambda *a, **k: []\n"
        "print('@@SERVELAB-GRADE@@{\"passed\": true}')\n"
    )
    cells = [nbformat.v4.new_code_cell(cheat),
             nbformat.v4.new_code_cell("def kv_bytes_per_token(config, b):\n    return 0"),
             nbformat.v4.new_code_cell("def seats_granted(card, weights:\n    return 1"),
             nbformat.v4.new_code_cell("x = 1 / 0\n\ndef cards_needed(*args):\n    return 1")]
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["servelab"] = {"exercise": "ex11_seats"}
    path = tmp_path / "cheat.ipynb"
    nbformat.write(nb, path)
    results = {r.question: r for r in grade_notebook(path)}
    assert sum(r.points for r in results.values()) == 0, results
    assert "expected" in results["q1"].reason
    assert "code cell 3" in results["q2"].reason and "syntax error" in results["q2"].reason
    assert "code cell 4" in results["q3"].reason and "ZeroDivisionError" in results["q3"].reason
    assert "without encryption" not in capfd.readouterr().err  # the kernel's TCP warning is gone
