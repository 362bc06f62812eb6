"""The grader: ``python -m servelab.grade exercises/ex11_seats.ipynb``.

It runs the notebook top to bottom in a fresh Jupyter kernel (a separate
process), with a time limit per cell, then runs each question's hidden tests
inside that same kernel against the functions the notebook defined, and prints
one row per question. Student code that raises, loops forever, does not parse
or defines nothing costs that question's points; it never crashes the grader.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from servelab.grading import Result, load_questions

_MARKER = "@@SERVELAB-GRADE@@"

# Runs inside the student's kernel after the notebook: grade one question with
# the functions found in the kernel's globals, print the verdict as JSON.
_RUN_QUESTION = """
import json as _json
from servelab.grading import get_question as _gq, grade_question as _grade
_q = _gq({exercise!r}, {qid!r})
print({marker!r} + _json.dumps(_grade(_q, globals().get(_q.function)).as_dict()))
"""


def _execute(notebook: Path, cell_timeout: float, kernel_name: str):
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(notebook, as_version=4)
    client = NotebookClient(nb, timeout=cell_timeout, kernel_name=kernel_name, allow_errors=True,
                            interrupt_on_timeout=True, resources={"metadata": {"path": str(notebook.parent)}})
    return nb, client


def grade_notebook(path: str | Path, cell_timeout: float = 10.0, kernel_name: str = "python3") -> list[Result]:
    """Execute a notebook in a fresh kernel and grade every question of its exercise."""
    import nbformat

    notebook = Path(path)
    if not notebook.is_file():
        raise FileNotFoundError(f"no notebook at {notebook}")
    questions = load_questions(notebook.stem)
    try:
        nb, client = _execute(notebook, cell_timeout, kernel_name)
    except Exception as exc:  # unreadable JSON, wrong nbformat
        return [Result(q.id, q.title, 0, q.points, False, f"notebook could not be read: {exc}") for q in questions]

    results: list[Result] = []
    with client.setup_kernel():
        for index, cell in enumerate(nb.cells):
            if cell.cell_type == "code":
                try:
                    client.execute_cell(cell, index)
                except Exception:  # a timeout or a dead kernel; the questions will say which
                    if not client.kc or not client.km.is_alive():
                        break
        for q in questions:
            probe = nbformat.v4.new_code_cell(_RUN_QUESTION.format(exercise=notebook.stem, qid=q.id,
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m servelab.grade",
                                     description="Grade an exercise notebook against its hidden tests.")
    parser.add_argument("notebooks", nargs="+", help="exercise notebooks, e.g. exercises/ex11_seats.ipynb")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds allowed per notebook cell")
    parser.add_argument("--json", action="store_true", help="print machine-readable results")
    args = parser.parse_args(argv)
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
