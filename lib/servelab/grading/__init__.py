"""Graded exercises: questions, visible checks and the scoring rules.

An exercise ``exNN_slug`` has a notebook in ``exercises/`` (stubs), the same
notebook worked in ``solutions/``, and a module ``servelab.grading.hidden.exNN_slug``
that lists its :class:`Question` objects. Each question names the function the
student writes and grades it with :class:`Case` objects (inputs and the expected
answer, or the exception it must raise) and, for behaviour that cases cannot
express, a ``test`` callable that raises ``AssertionError`` with a one-line reason.

Inside a notebook, :func:`check` runs a question's *visible* cases and prints a
friendly verdict; it never raises, so a notebook with unfinished stubs still runs
top to bottom. ``python -m servelab.grade NOTEBOOK`` runs the *hidden* cases too.
"""
from __future__ import annotations

import copy
import importlib
import math
import re
import signal
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

_MISSING = object()


@dataclass(frozen=True)
class Case:
    """One input and what must come back (``expected``) or be raised (``raises``).

    ``rel``/``abs`` loosen float comparisons; ``label`` replaces the argument
    list in failure messages when the arguments are long.
    """

    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    expected: Any = _MISSING
    raises: type[BaseException] | None = None
    rel: float = 1e-9
    abs: float = 0.0
    label: str = ""

    def describe(self, function: str) -> str:
        if self.label:
            return f"{function}({self.label})"
        parts = [_short_repr(a) for a in self.args] + [f"{k}={_short_repr(v)}" for k, v in self.kwargs.items()]
        return f"{function}({', '.join(parts)})"


@dataclass(frozen=True)
class Question:
    """One graded question: the function to write, its points and its tests."""

    id: str
    title: str
    function: str
    points: int
    level: str             # "easy" | "medium" | "hard"
    minutes: int           # the time box an interviewer would give
    visible: Sequence[Case] = ()
    hidden: Sequence[Case] = ()
    test: Callable[[Callable], None] | None = None  # extra hidden behaviour test
    timeout: float = 10.0  # seconds for all of this question's hidden tests

    def __post_init__(self) -> None:
        if self.level not in ("easy", "medium", "hard"):
            raise ValueError(f"question {self.id}: level must be easy, medium or hard, got {self.level!r}")
        if self.points <= 0 or self.minutes <= 0:
            raise ValueError(f"question {self.id}: points and minutes must be positive")
        if not (self.visible or self.hidden or self.test):
            raise ValueError(f"question {self.id} has no tests")


@dataclass(frozen=True)
class Result:
    question: str
    title: str
    points: int
    max_points: int
    passed: bool
    reason: str

    def as_dict(self) -> dict:
        return dict(question=self.question, title=self.title, points=self.points,
                    max_points=self.max_points, passed=self.passed, reason=self.reason)


class GradingTimeout(BaseException):
    """Raised inside student code when a question runs past its time limit.

    A BaseException so that a student's ``except Exception`` cannot swallow it.
    """


def load_questions(exercise: str) -> list[Question]:
    """The questions of an exercise, e.g. ``load_questions("ex11_seats")``."""
    name = exercise.removesuffix(".ipynb").rsplit("/", 1)[-1]
    try:
        module = importlib.import_module(f"servelab.grading.hidden.{name}")
    except ModuleNotFoundError:
        raise ValueError(f"no graded exercise named {name!r}; the notebook's file name must match a "
                         "module in servelab/grading/hidden/ (e.g. ex11_seats)") from None
    return list(module.QUESTIONS)


def get_question(exercise: str, question_id: str) -> Question:
    for q in load_questions(exercise):
        if q.id == question_id:
            return q
    raise ValueError(f"exercise {exercise!r} has no question {question_id!r}")


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _show(value: Any) -> str:
    """A short, readable rendering: floats to 6 significant digits, functions by name."""
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, int):
        return f"{value}"
    if callable(value) and hasattr(value, "__name__"):
        return f"<function {value.__name__}>"
    if isinstance(value, (list, tuple)):
        inner = ", ".join(_show(v) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner}{',' if len(value) == 1 else ''})"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_show(k)}: {_show(v)}" for k, v in value.items()) + "}"
    if hasattr(value, "tolist") and hasattr(value, "shape"):  # numpy arrays and tensors
        return _show(value.tolist())
    if hasattr(value, "item") and hasattr(value, "dtype"):  # numpy scalars
        return _show(value.item())
    return clean(repr(value))


def clean(text: str) -> str:
    """Drop memory addresses (``<function f at 0x7f...>`` -> ``<function f>``)."""
    return _ADDRESS.sub("", text)


def _short_repr(value: Any, limit: int = 60) -> str:
    text = _show(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _same(got: Any, expected: Any, rel: float, abs_tol: float) -> bool:
    if isinstance(expected, bool):  # True must not pass as 1, nor 1 as True
        return type(got).__name__ in ("bool", "bool_") and bool(got) == expected
    if expected is None or isinstance(expected, str):
        return got == expected
    if isinstance(expected, (int, float)):
        if isinstance(got, bool) or not isinstance(got, (int, float)) and not hasattr(got, "__float__"):
            return False
        try:
            return math.isclose(float(got), float(expected), rel_tol=rel, abs_tol=abs_tol)
        except (TypeError, ValueError):
            return False
    if isinstance(expected, (list, tuple)):
        try:
            return len(got) == len(expected) and all(_same(g, e, rel, abs_tol) for g, e in zip(got, expected))
        except TypeError:
            return False
    if isinstance(expected, dict):
        return (isinstance(got, dict) and got.keys() == expected.keys()
                and all(_same(got[k], v, rel, abs_tol) for k, v in expected.items()))
    return got == expected


def run_case(function_name: str, func: Callable, case: Case) -> str | None:
    """Run one case; return None when it passes, else a one-line reason."""
    where = case.describe(function_name)
    try:
        got = func(*copy.deepcopy(case.args), **copy.deepcopy(case.kwargs))
    except GradingTimeout:
        raise
    except NotImplementedError:
        return f"{where}: not implemented yet (raised NotImplementedError)"
    except BaseException as exc:  # student code may raise anything
        if case.raises is not None and isinstance(exc, case.raises):
            return None
        if case.raises is not None:
            return f"{where}: expected {case.raises.__name__}, but it raised {type(exc).__name__}: {clean(str(exc))[:120]}"
        return f"{where}: raised {type(exc).__name__}: {clean(str(exc))[:120]}"
    if case.raises is not None:
        return f"{where}: expected {case.raises.__name__} for this input, but it returned {_short_repr(got)}"
    if not _same(got, case.expected, case.rel, case.abs):
        return f"{where}: expected {_short_repr(case.expected)}, got {_short_repr(got)}"
    return None


@contextmanager
def time_limit(seconds: float):
    """Raise :class:`GradingTimeout` in the main thread after ``seconds``."""
    def _alarm(signum, frame):
        raise GradingTimeout()

    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def grade_question(question: Question, func: Any, include_hidden: bool = True) -> Result:
    """Score one question against a student's function (all cases must pass)."""
    def result(passed: bool, reason: str) -> Result:
        return Result(question.id, question.title, question.points if passed else 0,
                      question.points, passed, reason)

    if func is None:
        return result(False, f"function not defined: write `def {question.function}(...)`")
    if not callable(func):
        return result(False, f"{question.function} is a {type(func).__name__}, not a function")
    cases = list(question.visible) + (list(question.hidden) if include_hidden else [])
    start = time.perf_counter()
    try:
        with time_limit(question.timeout):
            for case in cases:
                reason = run_case(question.function, func, case)
                if reason:
                    return result(False, reason)
            if include_hidden and question.test is not None:
                try:
                    question.test(func)
                except AssertionError as exc:
                    return result(False, clean(str(exc)) or "a hidden behaviour test failed")
                except NotImplementedError:
                    return result(False, f"{question.function}: not implemented yet (raised NotImplementedError)")
                except GradingTimeout:
                    raise
                except BaseException as exc:
                    return result(False, f"{question.function}: raised {type(exc).__name__}: "
                                          f"{clean(str(exc))[:120]}")
    except GradingTimeout:
        return result(False, f"timed out after {question.timeout:g} s (an endless loop?)")
    elapsed = time.perf_counter() - start
    visible = len(question.visible)
    hidden = (len(question.hidden) + (1 if question.test else 0)) if include_hidden else 0
    text = f"passed {visible} visible" + (f" and {hidden} hidden" if include_hidden else "") + " checks"
    return result(True, text + (f" in {elapsed:.1f} s" if elapsed > 1 else ""))


def check(target: str, func: Any = _MISSING) -> bool:
    """Run the visible checks of one question and print a friendly verdict.

    ``check("ex11_seats.q1", kv_bytes_per_token)``. Returns True when all pass;
    never raises, so unfinished notebooks still run to the end.
    """
    try:
        exercise, qid = target.split(".", 1)
        question = get_question(exercise, qid)
    except ValueError as exc:
        print(f"check({target!r}): {exc}")
        return False
    if func is _MISSING:
        func = None
    verdict = grade_question(question, func, include_hidden=False)
    if verdict.passed:
        print(f"✅ {question.id} {question.title}: {len(question.visible)} visible checks passed. "
              f"The grader runs hidden ones too.")
    else:
        print(f"❌ {question.id} {question.title}: {verdict.reason}")
    return verdict.passed


__all__ = ["Case", "Question", "Result", "check", "grade_question", "load_questions", "get_question",
           "GradingTimeout", "time_limit", "run_case", "clean"]
