"""The grader: ``python -m servelab.grade exercises/ex11_seats.ipynb``.

It runs the notebook top to bottom in a fresh Jupyter kernel (a separate
process), with a time limit per cell, then runs each question's hidden tests
in *this* process against the functions the notebook defined: they run in the
kernel, called over a local socket (``servelab.grading.remote``), so a notebook
that replaces the grading code only replaces its own copy. It prints one row per
question and exits 1 when any question fails. Student code that raises, loops
forever, does not parse or defines nothing costs that question's points, with a
reason that says which cell failed; it never crashes the grader.

Scoring: a question's math (cases that expect a value, behaviour tests) carries
most of its points, its input checks (cases that expect ``ValueError``...) a
quarter, scored when the math is right (``servelab.grading.INPUT_SHARE``).
Interview notebooks hide the hidden cases' labels, which may name the fix.

Which exercise a notebook is comes from its metadata, so a renamed copy
(``my_ex11.ipynb``, ``ex11_seats-Copy1.ipynb``) grades the same::

    "metadata": {"servelab": {"exercise": "ex11_seats"}}

A mock-interview notebook (``python -m servelab.interview``) lists its
questions instead: ``{"servelab": {"questions": [["ex11_seats", "q1"], ...]}}``.

``python -m servelab.grade --all`` grades every exercise notebook in
``exercises/`` (or ``--dir``), several at once (``--jobs``), and prints a
progress table with a row for every graded exercise of the course: score,
questions passed (or "not started" for a blank notebook, which is not run),
levels, time box and which file was graded (the newest of several copies).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from servelab.grading import Question, Result, all_exercises, fmt_points, load_questions

METADATA_KEY = "servelab"


def _execute(nb, notebook: Path, cell_timeout: float, kernel_name: str):
    import zmq
    from jupyter_client.manager import AsyncKernelManager
    from nbclient import NotebookClient

    client = NotebookClient(nb, timeout=cell_timeout, kernel_name=kernel_name, allow_errors=True,
                            interrupt_on_timeout=True, resources={"metadata": {"path": str(notebook.parent)}})
    # Encrypted kernel sockets (CurveZMQ keys provisioned by the kernel manager) where
    # libzmq has them: nothing to eavesdrop on, and the kernel no longer warns "Kernel is
    # running over TCP without encryption" on every run.
    client.km = AsyncKernelManager(kernel_name=kernel_name,
                                   transport_encryption="auto" if zmq.has("curve") else "disabled")
    return client


def _known(exercise: str, where: str) -> list[Question]:
    try:
        return load_questions(exercise)
    except ValueError:
        raise ValueError(f"{where} names the exercise {exercise!r}, which does not exist (the graded "
                         f"exercises are {', '.join(all_exercises())}): correct the notebook's metadata "
                         f'("{METADATA_KEY}" under Edit > Notebook metadata)') from None


def questions_of(nb, path: Path) -> list[tuple[str, Question]]:
    """The (exercise, question) pairs a notebook answers, read from its metadata.

    Falls back to the file name when it is an exercise's name (``ex11_seats.ipynb``);
    raises ``ValueError`` when neither says which exercise this is, or when the
    metadata names an exercise or question that does not exist (blaming the metadata).
    """
    meta = (nb.get("metadata", {}) if nb is not None else {}).get(METADATA_KEY, {})
    if meta.get("questions"):
        out = []
        for ex, qid in meta["questions"]:
            questions = {q.id: q for q in _known(ex, "the notebook's metadata")}
            if qid not in questions:
                raise ValueError(f"the notebook's metadata asks for {ex}.{qid}, which does not exist: "
                                 f"correct \"{METADATA_KEY}\" under Edit > Notebook metadata")
            out.append((ex, questions[qid]))
        return out
    exercise = meta.get("exercise")
    if exercise:
        return [(exercise, q) for q in _known(exercise, "the notebook's metadata")]
    try:
        return [(path.stem, q) for q in load_questions(path.stem)]
    except ValueError:
        raise ValueError(
            f"{path.name} does not say which exercise it is: its metadata has no "
            f'"{METADATA_KEY}": {{"exercise": "exNN_slug"}} entry and its file name is not an '
            "exercise's name. Grade the notebook you started from exercises/ (copies keep the "
            "metadata), or add that entry under Edit > Notebook metadata.") from None


def is_interview(nb) -> bool:
    """A mock-interview notebook (its metadata lists questions): labels that name the fix stay hidden."""
    return bool((nb.get("metadata", {}) if nb is not None else {}).get(METADATA_KEY, {}).get("questions"))


def _cell_errors(nb) -> list[tuple[int, str, str, str]]:
    out, number = [], 0
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        number += 1
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                out.append((number, cell.source, output.get("ename", "Error"), output.get("evalue", "")))
                break
    return out


def _missing_reason(function: str, errors: list[tuple[int, str, str, str]]) -> str | None:
    """Why ``function`` is not defined, when a cell's error says why."""
    import re

    from servelab.grading import clean

    defines = re.compile(rf"^\s*(def|class)\s+{re.escape(function)}\b", re.M)
    errors = [(n, src, ename, re.sub(r"\(\d+\.py, (line \d+)\)", r"(\1)", evalue)) for n, src, ename, evalue in errors]
    for number, source, ename, evalue in errors:
        if defines.search(source):
            kind = "has a syntax error" if ename in ("SyntaxError", "IndentationError", "TabError") else "raised"
            return (f"{function} is not defined: the code cell that defines it (code cell {number}) {kind}: "
                    f"{ename}: {clean(evalue)[:160]}")
    if errors:
        number, _, ename, evalue = errors[0]
        return (f"function not defined: write `def {function}(...)` (note: code cell {number} "
                f"raised {ename}: {clean(evalue)[:120]})")
    return None


class _KernelLink:
    """The socket between this process and the student's kernel (servelab.grading.remote).

    Each question gets a session of its own: the kernel runs a small server in its
    main thread, the hidden checks run here against stand-ins for the student's
    functions. A check that runs out of time interrupts the kernel and closes the
    session; the next question opens a fresh one."""

    def __init__(self, client):
        import socket
        import tempfile

        self.client, self.dead = client, None
        self.folder = tempfile.mkdtemp(prefix="servelab-grade-")
        self.path = str(Path(self.folder) / "s")
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(self.path)
        self.listener.listen(1)

    def _wait_reply(self, msg_id: str, timeout: float) -> bool:
        import time

        from nbclient.util import run_sync

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                msg = run_sync(self.client.kc.get_shell_msg)(timeout=max(0.1, deadline - time.monotonic()))
            except Exception:
                return False
            if msg.get("parent_header", {}).get("msg_id") == msg_id:
                return True
        return False

    def grade(self, question: Question, interview: bool, missing: str | None) -> Result:
        from nbclient.util import run_sync

        from servelab.grading import grade_question
        from servelab.grading.remote import GRADER, KERNEL_CODE, Peer, _send

        if self.dead:
            return Result(question.id, question.title, 0, question.points, False, self.dead)
        msg_id = self.client.kc.execute(KERNEL_CODE.format(path=self.path), silent=True, store_history=False)
        self.listener.settimeout(30)
        try:
            conn, _ = self.listener.accept()
        except OSError:
            self.dead = "the kernel stopped responding (did a cell leave it busy or kill it?)"
            return Result(question.id, question.title, 0, question.points, False, self.dead)
        conn.settimeout(None)
        peer = Peer(conn, GRADER)
        interrupted = False
        try:
            func = peer.request("global", question.function)
            result = grade_question(question, func, interview=interview, missing=missing)
            interrupted = result.reason.startswith("timed out after")
        except Exception as exc:  # the kernel died or the session broke
            result = Result(question.id, question.title, 0, question.points, False,
                            f"the kernel stopped answering ({type(exc).__name__}: {exc})"[:200])
            interrupted = True
        if interrupted:
            try:
                run_sync(self.client.km.interrupt_kernel)()
            except Exception:
                pass
        else:
            try:
                _send(conn, {"op": "bye"})
            except OSError:
                pass
        conn.close()
        if not self._wait_reply(msg_id, 10 if interrupted else 30):
            self.dead = "the kernel stopped responding after an earlier question (student code that ignores interrupts?)"
        return result

    def close(self) -> None:
        import shutil

        self.listener.close()
        shutil.rmtree(self.folder, ignore_errors=True)


def grade_notebook(path: str | Path, cell_timeout: float = 10.0, kernel_name: str = "python3",
                   interview: bool | None = None) -> list[Result]:
    """Execute a notebook in a fresh kernel and grade every question it answers.

    The student's functions run in the kernel; the hidden checks and the scoring run in
    this process (servelab.grading.remote), out of the notebook's reach. ``interview``
    (default: the notebook's metadata lists questions) hides hidden cases' labels.
    """
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
    if interview is None:
        interview = is_interview(nb)
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
        errors = _cell_errors(nb)
        link = _KernelLink(client)
        try:
            for _, q in questions:
                results.append(link.grade(q, interview, _missing_reason(q.function, errors)))
        finally:
            link.close()
    return results


def format_table(results: list[Result]) -> str:
    rows = [("question", "points", "result", "reason")]
    for r in results:
        rows.append((f"{r.question} {r.title}", f"{fmt_points(r.points)}/{r.max_points}",
                     "pass" if r.passed else "FAIL" if not r.points else "part", r.reason))
    total, most = sum(r.points for r in results), sum(r.max_points for r in results)
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = ["  ".join(cell.ljust(widths[i]) if i < 3 else cell for i, cell in enumerate(row)) for row in rows]
    lines.insert(1, "-" * min(100, sum(widths) + 30))
    lines.append(f"total: {fmt_points(total)}/{most}")
    for r in results:  # a failure's input in full, when its reason had to cut it short
        if r.detail:
            lines.append(f"{r.question}: the input in full: {r.detail}")
    return "\n".join(lines)


def exercise_name(path: Path) -> str | None:
    """The exercise a notebook claims to be (metadata, else a matching file name), or None.

    The name in metadata is returned even when no such exercise exists (the progress
    table reports it); interview notebooks and other notebooks give None."""
    try:
        meta = json.loads(path.read_text()).get("metadata", {}).get(METADATA_KEY, {})
    except (OSError, ValueError):
        return None
    if meta.get("exercise"):
        return meta["exercise"]
    if meta.get("questions"):
        return None
    try:
        load_questions(path.stem)
    except ValueError:
        return None
    return path.stem


def find_exercises(folder: Path) -> dict[str, list[Path]]:
    """Exercise name -> its notebooks in ``folder``, newest first."""
    found: dict[str, list[Path]] = {}
    for path in sorted(folder.glob("*.ipynb")):
        name = exercise_name(path)
        if name:
            found.setdefault(name, []).append(path)
    for paths in found.values():
        paths.sort(key=lambda p: (-p.stat().st_mtime, p.name))
    return dict(sorted(found.items()))


def _code_cells(path: Path) -> list[str] | None:
    try:
        cells = json.loads(path.read_text())["cells"]
    except (OSError, ValueError, KeyError):
        return None
    return ["".join(c["source"]).strip() for c in cells if c.get("cell_type") == "code"]


def untouched(path: Path, exercise: str, blanks: Path | None = None) -> bool:
    """True when the notebook's code is the blank exercise's (nothing to grade yet)."""
    blank = (blanks or _repo_exercises()) / f"{exercise}.ipynb"
    mine = _code_cells(path)
    return blank.is_file() and mine is not None and mine == _code_cells(blank)


def _repo_exercises() -> Path:
    return Path(__file__).resolve().parents[2] / "exercises"


def _levels(questions: list[Question]) -> str:
    counts = {lvl: sum(q.level == lvl for q in questions) for lvl in ("easy", "medium", "hard")}
    return " ".join(f"{n} {lvl}" for lvl, n in counts.items() if n)


def _grade_for_table(path: Path, cell_timeout: float) -> list[Result] | str:
    """Results, or the one-line reason the notebook could not be graded (never raises)."""
    try:
        return grade_notebook(path, cell_timeout=cell_timeout)
    except Exception as exc:  # one bad notebook must not lose the others' results
        return f"{type(exc).__name__}: {exc}"


def progress_table(folder: Path, cell_timeout: float = 10.0, jobs: int = 1) -> tuple[str, list[dict]]:
    """Grade every exercise notebook in ``folder``: (printed table, rows).

    Every graded exercise of the course gets a row. Of several copies of one exercise
    the newest is graded and the row says which file it was and how many copies there
    are; a notebook whose code is still the blank exercise's is "not started" without
    starting a kernel; a notebook naming an unknown exercise gets a row saying so.
    ``jobs`` notebooks are graded at once (each in its own process and kernel)."""
    known = set(all_exercises())
    found = find_exercises(folder)
    rows, to_grade = [], {}
    for name in sorted(known | set(found)):
        paths = found.get(name, [])
        questions = load_questions(name) if name in known else []
        row = dict(exercise=name, notebook=paths[0].name if paths else None,
                   copies=[p.name for p in paths], score=0, max_score=sum(q.points for q in questions),
                   passed=0, questions=len(questions), levels=_levels(questions),
                   minutes=sum(q.minutes for q in questions), status="not started", error=None)
        rows.append(row)
        if not paths:
            continue
        if name not in known:
            row["status"] = "unknown exercise"
            row["error"] = (f"{paths[0].name}'s metadata names the exercise {name!r}, which does not exist: "
                            "correct it under Edit > Notebook metadata")
        elif not untouched(paths[0], name):
            to_grade[name] = paths[0]
    if jobs > 1 and len(to_grade) > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(max_workers=jobs) as pool:
            futures = {name: pool.submit(_grade_for_table, path, cell_timeout) for name, path in to_grade.items()}
            graded = {name: f.result() for name, f in futures.items()}
    else:
        graded = {name: _grade_for_table(path, cell_timeout) for name, path in to_grade.items()}
    for row in rows:
        results = graded.get(row["exercise"])
        if results is None:
            continue
        if isinstance(results, str):
            row.update(status="could not be graded", error=results)
            continue
        started = any("not implemented yet" not in r.reason and not r.reason.startswith("function not defined")
                      for r in results)
        row.update(score=sum(r.points for r in results), passed=sum(r.passed for r in results),
                   status=f"{sum(r.passed for r in results)}/{len(results)} passed" if started else "not started")
    header = ("exercise", "score", "questions", "levels", "time box", "notebook")
    table = [header]
    for r in rows:
        note = r["notebook"] or ""
        if len(r["copies"]) > 1:
            note += f" (newest of {len(r['copies'])} copies)"
        table.append((r["exercise"], f"{fmt_points(r['score'])}/{r['max_score']}", r["status"], r["levels"],
                      f"{r['minutes']} min", note))
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in table]
    lines.insert(1, "-" * (sum(widths) + 2 * (len(widths) - 1)))
    for r in rows:
        if r["error"]:
            lines.append(f"{r['exercise']}: {r['error']}")
    score, most = sum(r["score"] for r in rows), sum(r["max_score"] for r in rows)
    done = sum(r["max_score"] > 0 and r["score"] == r["max_score"] for r in rows)
    started = sum(r["status"] not in ("not started", "unknown exercise") for r in rows)
    lines.append(f"total: {fmt_points(score)}/{most} points; {done} of {len(known)} exercises complete, "
                 f"{started} started")
    return "\n".join(lines), rows


def _default_folder() -> Path:
    here = Path.cwd() / "exercises"
    return here if here.is_dir() else Path.cwd()


def main(argv: list[str] | None = None) -> int:
    """Exit status: 0 when every question passed, 1 when any failed, 2 when a notebook
    could not be graded at all."""
    import os

    parser = argparse.ArgumentParser(prog="python -m servelab.grade",
                                     description="Grade exercise notebooks against their hidden tests.")
    parser.add_argument("notebooks", nargs="*", help="exercise notebooks, e.g. exercises/ex11_seats.ipynb")
    parser.add_argument("--all", action="store_true",
                        help="grade every exercise notebook in --dir and print a progress table")
    parser.add_argument("--dir", type=Path, default=None, help="folder for --all (default: ./exercises)")
    parser.add_argument("--jobs", type=int, default=min(4, os.cpu_count() or 1),
                        help="notebooks graded at once by --all (default: up to 4)")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds allowed per notebook cell")
    parser.add_argument("--json", action="store_true", help="print machine-readable results")
    args = parser.parse_args(argv)
    if args.all:
        folder = args.dir or _default_folder()
        if not folder.is_dir():
            print(f"{folder}: no such folder", file=sys.stderr)
            return 2
        table, rows = progress_table(folder, cell_timeout=args.timeout, jobs=max(1, args.jobs))
        print(json.dumps(rows, indent=1) if args.json else table)
        if any(r["error"] for r in rows):
            return 2
        started = [r for r in rows if r["notebook"] and r["status"] != "not started"]
        return 0 if all(r["score"] == r["max_score"] for r in started) else 1
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
        if not all(r.passed for r in results):
            status = max(status, 1)
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
