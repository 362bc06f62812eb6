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

Every interview has a seed (drawn when ``--seed`` is not given), printed and
written into the notebook, so ``--seed N`` repeats the same pick; ``--level
mixed`` draws from every level. Questions of the asked level come first; when
there are too few of them, or the time boxes cannot fill the interview, the
notebook and the command say so. Links into the chapters are rewritten to work
from wherever the notebook is written.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import re
import random
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from servelab.grading import Question, all_exercises, load_questions

LEVELS = ("easy", "medium", "hard")
_LOWER = {"easy": (), "medium": ("easy",), "hard": ("medium", "easy")}


@dataclass(frozen=True)
class Pick:
    """One chosen question and the exercise it comes from."""

    exercise: str
    question: Question


def pick_questions(level: str = "medium", minutes: int = 45, seed: int | None = None,
                   exercises: list[str] | None = None) -> list[Pick]:
    """Questions for a ``minutes``-long interview at ``level``.

    Questions of the asked level come first, at most one per exercise (so the
    interview spans chapters), drawn in a random order fixed by ``seed``; time
    left over is filled with easier questions, then with a second question from
    an exercise already used. The time boxes add up to at most ``minutes``.
    Raises ``ValueError`` when the pool has no question of that level, or none
    that fits in ``minutes`` (never a silently easier interview).
    """
    if level not in LEVELS + ("mixed",):
        raise ValueError(f"level must be one of {LEVELS + ('mixed',)}, got {level!r}")
    if isinstance(minutes, bool) or not isinstance(minutes, int) or minutes <= 0:
        raise ValueError(f"minutes must be a positive whole number, got {minutes!r}")
    names = all_exercises() if exercises is None else list(exercises)
    rng = random.Random(seed)
    pool = [Pick(ex, q) for ex in names for q in load_questions(ex)]
    if not pool:
        raise ValueError("the question pool is empty: " + (f"the exercises {names} have no graded questions"
                         if names else "no exercises were given"))
    of_level = [p for p in pool if level == "mixed" or p.question.level == level]
    if not of_level:
        raise ValueError(f"the question pool has no {level} questions (exercises: {', '.join(names)}): "
                         "choose another level or more exercises")
    shortest = min(p.question.minutes for p in of_level)
    if shortest > minutes:
        raise ValueError(f"no {level} question fits in {minutes} minutes; the shortest takes {shortest}: "
                         "give more minutes or an easier level")
    rng.shuffle(pool)
    tiers = [LEVELS] if level == "mixed" else [(level,), _LOWER[level]]
    chosen: list[Pick] = []
    used_exercises: set[str] = set()
    used_functions: set[str] = set()
    budget = minutes
    for tier in tiers:  # every question of the asked level that fits, before any easier one
        for one_per_exercise in (True, False):
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
    return sorted(chosen, key=lambda p: (p.exercise, p.question.id))


def pick_notes(picks: list[Pick], level: str, minutes: int) -> list[str]:
    """What the candidate should know about a pick: too few questions of the level, time left over."""
    notes = []
    total = sum(p.question.minutes for p in picks)
    if level != "mixed":
        at_level = sum(p.question.level == level for p in picks)
        if at_level < len(picks):
            notes.append(f"only {at_level} of the {len(picks)} questions are {level}: no other {level} "
                         f"question fits in the time left, so easier ones fill it")
    if total < minutes:
        notes.append(f"the time boxes fill {total} of the {minutes} minutes: no other question fits "
                     "the time left")
    return notes


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


_LINK = re.compile(r"(\]\()(?![a-z][a-z0-9+.-]*:|#|/)([^)\s]+)(\))")


def relink(markdown: str, source_dir: Path, out_dir: Path) -> str:
    """Rewrite relative links written from ``source_dir`` so they work from ``out_dir``."""
    def fix(m: re.Match) -> str:
        path, _, anchor = m.group(2).partition("#")
        target = os.path.relpath((source_dir / path).resolve(), out_dir.resolve())
        return f"{m.group(1)}{Path(target).as_posix()}{'#' + anchor if anchor else ''}{m.group(3)}"
    return _LINK.sub(fix, markdown)


def number_checks(code: str, pick: Pick, number: int) -> str:
    """A check cell's ``check("ex05_attention.q4", f)`` as ``check("ex05_attention.q4", f,
    name="Question 1")``, so its verdict uses the interview's numbering; other code as it is."""
    target = re.escape(f"{pick.exercise}.{pick.question.id}")
    call = re.compile(rf"""^(\s*check\(\s*["']{target}["']\s*,\s*[A-Za-z_][A-Za-z0-9_]*)\s*\)\s*$""", re.M)
    return call.sub(rf'\1, name="Question {number}")', code)


def build_notebook(picks: list[Pick], level: str, minutes: int, seed: int | None = None,
                   exercises_dir: Path | None = None, out_dir: Path | None = None) -> dict:
    """The interview notebook (nbformat 4 JSON) for ``picks``, to be written in ``out_dir``
    (default: the current folder; links into the chapters are rewritten for it)."""
    import nbformat

    folder = Path(exercises_dir) if exercises_dir else _repo_exercises_dir()
    out_dir = Path(out_dir) if out_dir is not None else Path.cwd()
    total = sum(p.question.minutes for p in picks)
    points = sum(p.question.points for p in picks)
    intro = (f"# Mock interview · {level} · {minutes} minutes\n\n"
             f"{len(picks)} questions from {len({p.exercise for p in picks})} chapters, "
             f"{total} minutes of time boxes, {points} points. Write each function in the cell under "
             "its question and run the check cell below it; the checks show the examples only. "
             "When the time is up (or you are done), grade the whole notebook against the hidden "
             "tests:\n\n```bash\npython -m servelab.interview --grade THIS_NOTEBOOK.ipynb\n```\n\n")
    if seed is not None:
        intro += (f"Seed {seed}: `python -m servelab.interview --level {level} --minutes {minutes} "
                  f"--seed {seed}` writes this interview again.\n\n")
    for note in pick_notes(picks, level, minutes):
        intro += f"Note: {note}.\n\n"
    intro += "| # | question | from | level | time box | points |\n|---|---|---|---|---|---|\n"
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
                nb.cells.append(nbformat.v4.new_markdown_cell(relink(text, folder, out_dir)))
            elif cell["cell_type"] == "code":
                nb.cells.append(nbformat.v4.new_code_cell(number_checks(text, p, k)))
            else:
                nb.cells.append(nbformat.v4.new_markdown_cell(relink(text, folder, out_dir)))
    nb.metadata["kernelspec"] = {"display_name": "Python 3 (ipykernel)", "language": "python",
                                 "name": "python3"}
    nb.metadata["servelab"] = {
        "questions": [[p.exercise, p.question.id] for p in picks],
        "interview": {"level": level, "minutes": minutes, "seed": seed,
                      "started": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")},
    }
    return nb


def new_seed() -> int:
    """A seed for an interview that was not given one (recorded, so it can be repeated)."""
    return random.SystemRandom().randrange(1_000_000)


def write_interview(out: Path, level: str = "medium", minutes: int = 45, seed: int | None = None,
                    exercises_dir: Path | None = None) -> list[Pick]:
    """Pick questions and write the interview notebook to ``out``; return the picks.
    Without a ``seed`` one is drawn; either way it is written into the notebook."""
    import nbformat

    seed = new_seed() if seed is None else seed
    picks = pick_questions(level, minutes, seed)
    out = Path(out)
    nb = build_notebook(picks, level, minutes, seed, exercises_dir, out_dir=out.parent)
    if out.exists():
        raise FileExistsError(f"{out} already exists: grade it with --grade, or choose another --out")
    nbformat.write(nb, out)
    return picks


def grade_interview(path: Path, cell_timeout: float = 10.0) -> tuple[str, int, int]:
    """Grade an interview notebook: (report text, points, most points)."""
    from servelab.grade import format_table, grade_notebook

    results = grade_notebook(path, cell_timeout=cell_timeout)
    servelab_meta = json.loads(Path(path).read_text()).get("metadata", {}).get("servelab", {})
    asked = servelab_meta.get("questions", [])
    if len(asked) == len(results):  # the interview's numbering, and the exercise each comes from
        results = [replace(r, question=f"Question {k} ·", title=f"{r.title} [{ex}.{r.question}]")
                   for k, ((ex, _), r) in enumerate(zip(asked, results), 1)]
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
        seed = new_seed() if args.seed is None else args.seed
        picks = write_interview(out, args.level, args.minutes, seed, args.exercises_dir)
    except (ValueError, FileNotFoundError, FileExistsError) as exc:
        print(f"interview: {exc}", file=sys.stderr)
        return 2
    total = sum(p.question.minutes for p in picks)
    print(f"wrote {out}: {len(picks)} questions, {total} of {args.minutes} minutes, seed {seed} "
          f"(--seed {seed} repeats this pick)")
    for note in pick_notes(picks, args.level, args.minutes):
        print(f"note: {note}")
    for p in picks:
        print(f"  {p.exercise}.{p.question.id} {p.question.title} ({p.question.level}, {p.question.minutes} min)")
    print(f"open it in JupyterLab; when time is up: python -m servelab.interview --grade {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
