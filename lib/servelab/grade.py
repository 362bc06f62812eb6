"""The grader: ``python -m servelab.grade exercises/ex11_seats.ipynb``.

It runs the notebook top to bottom in a fresh Jupyter kernel (a separate
process), with a time limit per cell, then runs each question's hidden tests
inside that same kernel against the functions the notebook defined, and prints
one row per question. Student code that raises, loops forever, does not parse
or defines nothing costs that question's points; it never crashes the grader.

Which exercise a notebook is comes from its metadata, so a renamed copy
(``my_ex11.ipynb``, ``ex11_seats-Copy1.ipynb``) grades the same::

    "metadata": {"servelab": {"exercise": "ex11_seats"}}

A mock-interview notebook (``python -m servelab.interview``) lists its
questions instead: ``{"servelab": {"questions": [["ex11_seats", "q1"], ...]}}``.

``python -m servelab.grade --all`` grades every exercise notebook in
``exercises/`` (or ``--dir``) and prints a progress table with a row for every
graded exercise of the course: score, questions passed (or "not started"),
levels and time box.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from servelab.grading import Question, Result, get_question, load_questions

_MARKER = "@@SERVELAB-GRADE@@"
METADATA_KEY = "servelab"

# Runs inside the student's kernel after the notebook: grade one question with
# the functions found in the kernel's globals, print the verdict as JSON.
_RUN_QUESTION = """
import json as _json
from servelab.grading import get_question as _gq, grade_question as _grade
_q = _gq({exercise!r}, {qid!r})
print({marker!r} + _json.dumps(_grade(_q, globals().get(_q.function)).as_dict()))
"""


def _execute(nb, notebook: Path, cell_timeout: float, kernel_name: str):
    from nbclient import NotebookClient

    return NotebookClient(nb, timeout=cell_timeout, kernel_name=kernel_name, allow_errors=True,
                          interrupt_on_timeout=True, resources={"metadata": {"path": str(notebook.parent)}})


def questions_of(nb, path: Path) -> list[tuple[str, Question]]:
    """The (exercise, question) pairs a notebook answers, read from its metadata.

    Falls back to the file name when it is an exercise's name (``ex11_seats.ipynb``);
    raises ``ValueError`` when neither says which exercise this is.
    """
    meta = (nb.get("metadata", {}) if nb is not None else {}).get(METADATA_KEY, {})
    if meta.get("questions"):
        return [(ex, get_question(ex, qid)) for ex, qid in meta["questions"]]
    exercise = meta.get("exercise")
    if exercise:
        return [(exercise, q) for q in load_questions(exercise)]
    try:
        return [(path.stem, q) for q in load_questions(path.stem)]
    except ValueError:
        raise ValueError(
            f"{path.name} does not say which exercise it is: its metadata has no "
            f'"{METADATA_KEY}": {{"exercise": "exNN_slug"}} entry and its file name is not an '
            "exercise's name. Grade the notebook you started from exercises/ (copies keep the "
            "metadata), or add that entry under Edit > Notebook metadata.") from None


def grade_notebook(path: str | Path, cell_timeout: float = 10.0, kernel_name: str = "python3") -> list[Result]:
    """Execute a notebook in a fresh kernel and grade every question it answers."""
    import nbformat

    notebook = Path(path)
    if not notebook.is_file():
        raise FileNotFoundError(f"no notebook at {notebook}")
    try:
        nb = nbformat.read(notebook, as_version=4)
    except Exception as exc:  # unreadable JSON, wrong nbformat
        questions = questions_of(None, notebook)
        return [Result(q.id, q.title, 0, q.points, False, f"notebook could not be read: {exc}")
                for _, q in questions]
    questions = questions_of(nb, notebook)
    client = _execute(nb, notebook, cell_timeout, kernel_name)

    results: list[Result] = []
    with client.setup_kernel():
        for index, cell in enumerate(nb.cells):
            if cell.cell_type == "code":
                try:
                    client.execute_cell(cell, index)
                except Exception:  # a timeout or a dead kernel; the questions will say which
                    if not client.kc or not client.km.is_alive():
                        break
        for exercise, q in questions:
            probe = nbformat.v4.new_code_cell(_RUN_QUESTION.format(exercise=exercise, qid=q.id,
                                                                   marker=_MARKER))
            nb.cells.append(probe)
            verdict = None
            try:
                client.timeout = q.timeout + 10  # the kernel's own alarm fires first
                client.execute_cell(probe, len(nb.cells) - 1)
                verdict = _find_verdict(probe)
            except Exception as exc:
                reason = f"the kernel stopped responding ({type(exc).__name__})"
            else:
                reason = "the grader got no answer from the kernel (did the notebook replace print?)"
            results.append(Result(**verdict) if verdict else Result(q.id, q.title, 0, q.points, False, reason))
    return results


def _find_verdict(cell) -> dict | None:
    for output in cell.get("outputs", []):
        text = output.get("text", "") if output.get("output_type") == "stream" else ""
        for line in text.splitlines():
            if line.startswith(_MARKER):
                return json.loads(line[len(_MARKER):])
    return None


def format_table(results: list[Result]) -> str:
    rows = [("question", "points", "result", "reason")]
    for r in results:
        rows.append((f"{r.question} {r.title}", f"{r.points}/{r.max_points}",
                     "pass" if r.passed else "FAIL", r.reason))
    total, most = sum(r.points for r in results), sum(r.max_points for r in results)
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = ["  ".join(cell.ljust(widths[i]) if i < 3 else cell for i, cell in enumerate(row)) for row in rows]
    lines.insert(1, "-" * min(100, sum(widths) + 30))
    lines.append(f"total: {total}/{most}")
    return "\n".join(lines)


def exercise_name(path: Path) -> str | None:
    """The exercise a notebook belongs to (metadata, else a matching file name), or None."""
    try:
        meta = json.loads(path.read_text()).get("metadata", {}).get(METADATA_KEY, {})
    except (OSError, ValueError):
        return None
    if meta.get("exercise"):
        return meta["exercise"]
    try:
        load_questions(path.stem)
    except ValueError:
        return None
    return path.stem


def find_exercises(folder: Path) -> dict[str, Path]:
    """Exercise name -> notebook in ``folder``; of several copies, the newest one."""
    found: dict[str, Path] = {}
    for path in sorted(folder.glob("*.ipynb")):
        name = exercise_name(path)
        if name and (name not in found or path.stat().st_mtime > found[name].stat().st_mtime):
            found[name] = path
    return dict(sorted(found.items()))


def _levels(questions: list[Question]) -> str:
    counts = {lvl: sum(q.level == lvl for q in questions) for lvl in ("easy", "medium", "hard")}
    return " ".join(f"{n} {lvl}" for lvl, n in counts.items() if n)


def progress_table(folder: Path, cell_timeout: float = 10.0) -> tuple[str, list[dict]]:
    """Grade every exercise notebook in ``folder``: (printed table, rows)."""
    from servelab.interview import all_exercises

    rows = []
    found = find_exercises(folder)
    for name in sorted(set(all_exercises()) - set(found)):  # every exercise gets a row
        questions = load_questions(name)
        rows.append(dict(exercise=name, notebook=None, score=0,
                         max_score=sum(q.points for q in questions), passed=0, questions=len(questions),
                         levels=_levels(questions), minutes=sum(q.minutes for q in questions)))
    for name, path in found.items():
        questions = load_questions(name)
        try:
            results = grade_notebook(path, cell_timeout=cell_timeout)
        except (FileNotFoundError, ValueError) as exc:
            results = [Result(q.id, q.title, 0, q.points, False, str(exc)) for q in questions]
        rows.append(dict(exercise=name, notebook=path.name, score=sum(r.points for r in results),
                         max_score=sum(r.max_points for r in results),
                         passed=sum(r.passed for r in results), questions=len(results),
                         levels=_levels(questions), minutes=sum(q.minutes for q in questions)))
    rows.sort(key=lambda r: r["exercise"])
    header = ("exercise", "score", "questions", "levels", "time box")
    table = [header] + [(r["exercise"], f"{r['score']}/{r['max_score']}",
                         f"{r['passed']}/{r['questions']} passed" if r["notebook"] else "not started",
                         r["levels"], f"{r['minutes']} min")
                        for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in table]
    lines.insert(1, "-" * (sum(widths) + 2 * (len(widths) - 1)))
    score, most = sum(r["score"] for r in rows), sum(r["max_score"] for r in rows)
    done = sum(r["score"] == r["max_score"] for r in rows)
    started = sum(r["notebook"] is not None for r in rows)
    lines.append(f"total: {score}/{most} points; {done} of {len(rows)} exercises complete, "
                 f"{started} started")
    return "\n".join(lines), rows


def _default_folder() -> Path:
    here = Path.cwd() / "exercises"
    return here if here.is_dir() else Path.cwd()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m servelab.grade",
                                     description="Grade exercise notebooks against their hidden tests.")
    parser.add_argument("notebooks", nargs="*", help="exercise notebooks, e.g. exercises/ex11_seats.ipynb")
    parser.add_argument("--all", action="store_true",
                        help="grade every exercise notebook in --dir and print a progress table")
    parser.add_argument("--dir", type=Path, default=None, help="folder for --all (default: ./exercises)")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds allowed per notebook cell")
    parser.add_argument("--json", action="store_true", help="print machine-readable results")
    args = parser.parse_args(argv)
    if args.all:
        folder = args.dir or _default_folder()
        if not folder.is_dir():
            print(f"{folder}: no such folder", file=sys.stderr)
            return 2
        table, rows = progress_table(folder, cell_timeout=args.timeout)
        print(json.dumps(rows, indent=1) if args.json else table)
        return 0
    if not args.notebooks:
        parser.error("name a notebook to grade, or use --all")
    status = 0
    report = {}
    for path in args.notebooks:
        try:
            results = grade_notebook(path, cell_timeout=args.timeout)
        except (FileNotFoundError, ValueError) as exc:
            print(f"{path}: {exc}", file=sys.stderr)
            status = 2
            continue
        if args.json:
            report[path] = [r.as_dict() for r in results]
        else:
            print(f"== {path}")
            print(format_table(results))
    if args.json:
        print(json.dumps(report, indent=1))
    return status


if __name__ == "__main__":
    sys.exit(main())
