"""A mock interview from the course's graded questions.

``python -m servelab.interview --level medium --minutes 45`` picks questions of
that level from different chapters until the time box is full, writes them into
a fresh notebook (``interview-<level>-<minutes>min.ipynb`` unless ``--out``
says otherwise) with the problem statements, stubs and visible checks copied
from the exercises, and prints how to grade it. When time is up::

    python -m servelab.interview --grade interview-medium-45min.ipynb

runs the notebook in a fresh kernel and grades every question against its
hidden tests (the notebook's metadata lists them, so a renamed copy grades),
then prints the score and how long the interview took.

``--seed`` makes the pick repeatable; ``--level mixed`` draws from every level.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import pkgutil
import random
import sys
from dataclasses import dataclass
from pathlib import Path

from servelab.grading import Question, load_questions

LEVELS = ("easy", "medium", "hard")
_LOWER = {"easy": (), "medium": ("easy",), "hard": ("medium", "easy")}


@dataclass(frozen=True)
class Pick:
    """One chosen question and the exercise it comes from."""

    exercise: str
    question: Question


def all_exercises() -> list[str]:
    """Every graded exercise module (``ex02_tokens``, ...), in order."""
    import servelab.grading.hidden as hidden

    return sorted(m.name for m in pkgutil.iter_modules(hidden.__path__) if m.name.startswith("ex"))


def pick_questions(level: str = "medium", minutes: int = 45, seed: int | None = None,
                   exercises: list[str] | None = None) -> list[Pick]:
    """Questions for a ``minutes``-long interview at ``level``.

    Questions of the asked level come first, at most one per exercise (so the
    interview spans chapters), drawn in a random order fixed by ``seed``; time
    left over is filled with easier questions, then with a second question from
    an exercise already used. The time boxes add up to at most ``minutes``.
    """
    if level not in LEVELS + ("mixed",):
        raise ValueError(f"level must be one of {LEVELS + ('mixed',)}, got {level!r}")
    if isinstance(minutes, bool) or not isinstance(minutes, int) or minutes <= 0:
        raise ValueError(f"minutes must be a positive whole number, got {minutes!r}")
    rng = random.Random(seed)
    pool = [Pick(ex, q) for ex in (exercises or all_exercises()) for q in load_questions(ex)]
    if not pool:
        raise ValueError("no graded questions found")
    rng.shuffle(pool)
    tiers = [LEVELS] if level == "mixed" else [(level,), _LOWER[level]]
    chosen: list[Pick] = []
    used_exercises: set[str] = set()
    used_functions: set[str] = set()
    budget = minutes
    for one_per_exercise in (True, False):
        for tier in tiers:
            for p in pool:
                q = p.question
                if q.level not in tier or p in chosen or q.function in used_functions or q.minutes > budget:
                    continue
                if one_per_exercise and p.exercise in used_exercises:
                    continue
                chosen.append(p)
                used_exercises.add(p.exercise)
                used_functions.add(q.function)
                budget -= q.minutes
    if not chosen:
        shortest = min(p.question.minutes for p in pool if level == "mixed" or p.question.level == level)
        raise ValueError(f"no {level} question fits in {minutes} minutes; the shortest takes {shortest}: "
                         "give more minutes or an easier level")
    return sorted(chosen, key=lambda p: (p.exercise, p.question.id))


def _repo_exercises_dir() -> Path:
    return Path(__file__).resolve().parents[2] / "exercises"


def _section(cells: list[dict], qid: str) -> list[dict]:
    """The cells of one question in an exercise notebook: from its '## Qn ·' heading to the next heading."""
    number = qid.lstrip("q")
    start = None
    for i, cell in enumerate(cells):
        text = "".join(cell["source"])
        if cell["cell_type"] == "markdown" and text.startswith(f"## Q{number} "):
            start = i
            break
    if start is None:
        raise ValueError(f"question {qid} not found in the exercise notebook")
    out = [cells[start]]
    for cell in cells[start + 1:]:
        if cell["cell_type"] == "markdown" and "".join(cell["source"]).startswith("## "):
            break
        out.append(cell)
    return out


def _setup_cells(cells: list[dict]) -> list[dict]:
    """Code cells before the first question, other than the ``check`` import."""
    out = []
    for cell in cells:
        text = "".join(cell["source"])
        if cell["cell_type"] == "markdown" and text.startswith("## Q"):
            break
        if cell["cell_type"] == "code" and text.strip() and text.strip() != "from servelab.grading import check":
            out.append(cell)
    return out


def build_notebook(picks: list[Pick], level: str, minutes: int, seed: int | None = None,
                   exercises_dir: Path | None = None) -> dict:
    """The interview notebook (nbformat 4 JSON) for ``picks``."""
    import nbformat

    folder = Path(exercises_dir) if exercises_dir else _repo_exercises_dir()
    total = sum(p.question.minutes for p in picks)
    points = sum(p.question.points for p in picks)
    intro = (f"# Mock interview · {level} · {minutes} minutes\n\n"
             f"{len(picks)} questions from {len({p.exercise for p in picks})} chapters, "
             f"{total} minutes of time boxes, {points} points. Write each function in the cell under "
             "its question and run the check cell below it; the checks show the examples only. "
             "When the time is up (or you are done), grade the whole notebook against the hidden "
             "tests:\n\n```bash\npython -m servelab.interview --grade THIS_NOTEBOOK.ipynb\n```\n\n"
             "| # | question | from | level | time box | points |\n|---|---|---|---|---|---|\n")
    for k, p in enumerate(picks, 1):
        q = p.question
        intro += f"| {k} | {q.title} | {p.exercise} | {q.level} | {q.minutes} min | {q.points} |\n"
    nb = nbformat.v4.new_notebook()
    nb.cells.append(nbformat.v4.new_markdown_cell(intro))
    nb.cells.append(nbformat.v4.new_code_cell("from servelab.grading import check"))
    loaded: dict[str, list[dict]] = {}
    for p in picks:
        path = folder / f"{p.exercise}.ipynb"
        if p.exercise not in loaded:
            if not path.is_file():
                raise FileNotFoundError(f"the exercise notebook {path} is missing: run from the course "
                                        "repository, or pass --exercises-dir")
            loaded[p.exercise] = json.loads(path.read_text())["cells"]
            for cell in _setup_cells(loaded[p.exercise]):
                nb.cells.append(nbformat.v4.new_code_cell("".join(cell["source"])))
    for k, p in enumerate(picks, 1):
        for j, cell in enumerate(_section(loaded[p.exercise], p.question.id)):
            text = "".join(cell["source"])
            if j == 0:
                first, _, rest = text.partition("\n")
                text = f"## Question {k} · {p.question.title} (from {p.exercise})\n{rest}"
                nb.cells.append(nbformat.v4.new_markdown_cell(text))
            elif cell["cell_type"] == "code":
                nb.cells.append(nbformat.v4.new_code_cell(text))
            else:
                nb.cells.append(nbformat.v4.new_markdown_cell(text))
    nb.metadata["kernelspec"] = {"display_name": "Python 3 (ipykernel)", "language": "python",
                                 "name": "python3"}
    nb.metadata["servelab"] = {
        "questions": [[p.exercise, p.question.id] for p in picks],
        "interview": {"level": level, "minutes": minutes, "seed": seed,
                      "started": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")},
    }
    return nb


def write_interview(out: Path, level: str = "medium", minutes: int = 45, seed: int | None = None,
                    exercises_dir: Path | None = None) -> list[Pick]:
    """Pick questions and write the interview notebook to ``out``; return the picks."""
    import nbformat

    picks = pick_questions(level, minutes, seed)
    nb = build_notebook(picks, level, minutes, seed, exercises_dir)
    out = Path(out)
    if out.exists():
        raise FileExistsError(f"{out} already exists: grade it with --grade, or choose another --out")
    nbformat.write(nb, out)
    return picks


def grade_interview(path: Path, cell_timeout: float = 10.0) -> tuple[str, int, int]:
    """Grade an interview notebook: (report text, points, most points)."""
    from servelab.grade import format_table, grade_notebook

    from servelab.grading import Result

    results = grade_notebook(path, cell_timeout=cell_timeout)
    servelab_meta = json.loads(Path(path).read_text()).get("metadata", {}).get("servelab", {})
    asked = servelab_meta.get("questions", [])
    if len(asked) == len(results):  # name each row by its exercise too
        results = [Result(f"{ex}.{r.question}", r.title, r.points, r.max_points, r.passed, r.reason)
                   for (ex, _), r in zip(asked, results)]
    meta = servelab_meta.get("interview", {})
    lines = [format_table(results)]
    if meta.get("started"):
        started = _dt.datetime.fromisoformat(meta["started"])
        took = (_dt.datetime.now(_dt.timezone.utc) - started).total_seconds() / 60
        lines.append(f"time box {meta.get('minutes')} min; {took:.0f} min since the notebook was written")
    points, most = sum(r.points for r in results), sum(r.max_points for r in results)
    verdict = "strong" if points >= 0.8 * most else "mixed" if points >= 0.5 * most else "keep practising"
    lines.append(f"verdict: {verdict} ({points}/{most})")
    return "\n".join(lines), points, most


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m servelab.interview",
                                     description="Write a mock-interview notebook, or grade one.")
    parser.add_argument("--level", default="medium", choices=LEVELS + ("mixed",))
    parser.add_argument("--minutes", type=int, default=45, help="the interview's length (time boxes add up to it)")
    parser.add_argument("--seed", type=int, default=None, help="repeat a previous pick")
    parser.add_argument("--out", type=Path, default=None, help="where to write the notebook")
    parser.add_argument("--exercises-dir", type=Path, default=None, help="the course's exercises/ folder")
    parser.add_argument("--grade", type=Path, default=None, metavar="FILE", help="grade an interview notebook")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds allowed per notebook cell")
    args = parser.parse_args(argv)
    try:
        if args.grade:
            if not args.grade.is_file():
                raise FileNotFoundError(f"no notebook at {args.grade}")
            report, _, _ = grade_interview(args.grade, args.timeout)
            print(report)
            return 0
        out = args.out or Path(f"interview-{args.level}-{args.minutes}min.ipynb")
        picks = write_interview(out, args.level, args.minutes, args.seed, args.exercises_dir)
    except (ValueError, FileNotFoundError, FileExistsError) as exc:
        print(f"interview: {exc}", file=sys.stderr)
        return 2
    total = sum(p.question.minutes for p in picks)
    print(f"wrote {out}: {len(picks)} questions, {total} of {args.minutes} minutes")
    for p in picks:
        print(f"  {p.exercise}.{p.question.id} {p.question.title} ({p.question.level}, {p.question.minutes} min)")
    print(f"open it in JupyterLab; when time is up: python -m servelab.interview --grade {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
