"""Graded exercises: questions, visible checks and the scoring rules.

An exercise ``exNN_slug`` has a notebook in ``exercises/`` (stubs), the same
notebook worked in ``solutions/``, and a module ``servelab.grading.hidden.exNN_slug``
that lists its :class:`Question` objects. Each question names the function the
student writes and grades it with :class:`Case` objects (inputs and the expected
answer, or the exception it must raise) and, for behaviour that cases cannot
express, a ``test`` callable that raises ``AssertionError`` with a one-line reason.

Inside a notebook, :func:`check` runs a question's *visible* cases and prints a
friendly verdict; it never raises, so a notebook with unfinished stubs still runs
top to bottom, and it returns None, so a check cell shows the verdict and no ``True``
(:func:`run_check` prints the same verdict and returns whether every check passed).
``python -m servelab.grade NOTEBOOK`` runs the *hidden* cases too.
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

    @property
    def input_check(self) -> bool:
        """True for a case that only checks bad input is refused (it expects an exception)."""
        return self.raises is not None

    def describe(self, function: str, show_label: bool = True) -> str:
        """``function(args)`` for messages; the label instead when it has one and ``show_label``
        (interview mode hides labels: they often name the fix)."""
        if self.label and show_label:
            return f"{function}({self.label})"
        parts = [_short_repr(a) for a in self.args] + [f"{k}={_short_repr(v)}" for k, v in self.kwargs.items()]
        return f"{function}({', '.join(parts)})"

    def full_input(self, function: str) -> str:
        """``function(args)`` with every argument in full (no label, nothing cut off), so a
        failure can be reproduced; it names no fix, so interviews show it too."""
        parts = [_exact(a) for a in self.args] + [f"{k}={_exact(v)}" for k, v in self.kwargs.items()]
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
    visible_test: Callable[[Callable], None] | None = None  # a behaviour test the notebook's check runs too

    def __post_init__(self) -> None:
        if self.level not in ("easy", "medium", "hard"):
            raise ValueError(f"question {self.id}: level must be easy, medium or hard, got {self.level!r}")
        if self.points <= 0 or self.minutes <= 0:
            raise ValueError(f"question {self.id}: points and minutes must be positive")
        if not (self.visible or self.hidden or self.test or self.visible_test):
            raise ValueError(f"question {self.id} has no tests")


#: The share of a question's points that its input checks (cases that expect an
#: exception) carry. The rest is for the math (every other case and the behaviour
#: test): correct math with a missing check keeps 3/4 of the points, wrong math
#: scores nothing whatever its checks do.
INPUT_SHARE = 0.25


def split_points(points: int, has_input_checks: bool) -> tuple[float, float]:
    """(math points, input-check points) of a question worth ``points``."""
    if not has_input_checks:
        return float(points), 0.0
    return points * (1 - INPUT_SHARE), points * INPUT_SHARE


def fmt_points(x: float) -> str:
    """2.0 -> '2', 2.25 -> '2.25'."""
    return f"{round(x, 2):g}"


@dataclass(frozen=True)
class Result:
    """One question's verdict. ``points`` may be fractional: correct math with a
    missing input check scores ``split_points(...)[0]``. ``math_passed`` and
    ``checks_passed`` (None when the question has no input checks) say which part
    failed."""

    question: str
    title: str
    points: float
    max_points: int
    passed: bool
    reason: str
    math_passed: bool | None = None
    checks_passed: bool | None = None
    detail: str = ""       # the failing case's input in full, when ``reason`` had to cut it short

    def __post_init__(self) -> None:
        if float(self.points).is_integer():
            object.__setattr__(self, "points", int(self.points))
        if self.math_passed is None:
            object.__setattr__(self, "math_passed", self.passed)

    def as_dict(self) -> dict:
        return dict(question=self.question, title=self.title, points=self.points,
                    max_points=self.max_points, passed=self.passed, reason=self.reason,
                    math_passed=self.math_passed, checks_passed=self.checks_passed, detail=self.detail)


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


def all_exercises() -> list[str]:
    """Every graded exercise module (``ex02_tokens``, ...), in order."""
    import pkgutil

    import servelab.grading.hidden as hidden

    return sorted(m.name for m in pkgutil.iter_modules(hidden.__path__) if m.name.startswith("ex"))


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


def _exact(value: Any) -> str:
    """Like :func:`_show`, but floats in full (``repr``), so the text reproduces the input."""
    if isinstance(value, float):
        return repr(float(value))
    if isinstance(value, (list, tuple)):
        inner = ", ".join(_exact(v) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner}{',' if len(value) == 1 else ''})"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_exact(k)}: {_exact(v)}" for k, v in value.items()) + "}"
    if hasattr(value, "tolist") and hasattr(value, "shape") and not isinstance(value, (bool, int)):
        return _exact(value.tolist())  # numpy arrays and tensors (and numpy scalars: shape ())
    return _show(value)


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


def first_difference(got: Any, expected: Any, rel: float = 1e-9, abs_tol: float = 0.0,
                     path: str = "") -> str | None:
    """Where ``got`` first differs from ``expected``: ``"[3]: expected 5, got 6"``,
    ``"length: expected 4, got 5"``, ``"['key']: ..."``; None when they agree."""
    if _same(got, expected, rel, abs_tol):
        return None
    sequence = isinstance(expected, (list, tuple))
    if sequence or isinstance(expected, dict):
        try:
            n = len(got)
        except TypeError:
            n = None
        if sequence and n is not None and not isinstance(got, (str, dict)):
            try:
                items = list(got)
            except TypeError:
                items = None
            if items is not None:
                for i, (g, e) in enumerate(zip(items, expected)):
                    inner = first_difference(g, e, rel, abs_tol, f"{path}[{i}]")
                    if inner:
                        return inner
                if n != len(expected):
                    return f"{path or 'the result'} has {n} elements, expected {len(expected)}"
        if isinstance(expected, dict) and isinstance(got, dict):
            missing = [k for k in expected if k not in got]
            extra = [k for k in got if k not in expected]
            if missing:
                return f"{path}[{_short_repr(missing[0], 30)}] is missing"
            if extra:
                return f"{path}[{_short_repr(extra[0], 30)}] should not be there"
            for k, v in expected.items():
                inner = first_difference(got[k], v, rel, abs_tol, f"{path}[{_short_repr(k, 30)}]")
                if inner:
                    return inner
    where = f"{path}: " if path else ""
    return f"{where}expected {_short_repr(expected)}, got {_short_repr(got)}"


def _mismatch(where: str, got: Any, expected: Any, rel: float, abs_tol: float) -> str:
    """The failure line for a wrong value: both values, and the first difference when
    the values are containers (their short forms may look alike)."""
    head = f"{where}: expected {_short_repr(expected)}, got {_short_repr(got)}"
    if isinstance(expected, (list, tuple, dict)):
        diff = first_difference(got, expected, rel, abs_tol)
        if diff and diff.startswith(("[", "the result has")):
            return f"{head}; first difference at {diff}" if diff.startswith("[") else f"{head}; {diff}"
    return head


#: The longest input a failure message prints in full (a tokenizer's 60,000-character
#: rank table is not worth printing; a trace of a hundred requests is).
FULL_INPUT_LIMIT = 4000


def input_detail(function_name: str, case: Case, show_label: bool = True) -> str:
    """The failing case's input in full, for reproducing it, when the one-line reason showed
    less (a label or cut-off arguments); "" when the reason already shows all of it."""
    full = case.full_input(function_name)
    if full == case.describe(function_name, show_label):
        return ""
    if len(full) > FULL_INPUT_LIMIT:
        return f"(the input in full is {len(full):,} characters long: too long to print)"
    return full


def run_case(function_name: str, func: Callable, case: Case, show_label: bool = True) -> str | None:
    """Run one case; return None when it passes, else a one-line reason."""
    where = case.describe(function_name, show_label)
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
        return _mismatch(where, got, case.expected, case.rel, case.abs)
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


def grade_question(question: Question, func: Any, include_hidden: bool = True,
                   interview: bool = False, missing: str | None = None) -> Result:
    """Score one question against a student's function.

    The math (every case that expects a value, and the behaviour test) carries
    most of the points; the input checks (cases that expect an exception) carry
    :data:`INPUT_SHARE` of them, scored only when the math is right. ``interview``
    hides the hidden cases' labels (they may name the fix). ``missing`` is the
    reason to give when ``func`` is None (the grader knows why: a syntax error...).
    """
    cases = list(question.visible) + (list(question.hidden) if include_hidden else [])
    has_checks = any(c.input_check for c in cases)
    math_points, _ = split_points(question.points, has_checks)

    def result(points: float, reason: str, math_ok: bool = False, checks_ok: bool | None = None,
               detail: str = "") -> Result:
        return Result(question.id, question.title, points, question.points,
                      math_ok and checks_ok is not False, reason, math_ok,
                      (checks_ok if math_ok else None) if has_checks else None, detail)

    if func is None:
        return result(0, missing or f"function not defined: write `def {question.function}(...)`")
    if not callable(func):
        return result(0, f"{question.function} is a {type(func).__name__}, not a function")
    visible = set(map(id, question.visible))
    start = time.perf_counter()
    check_failure = check_detail = None
    try:
        with time_limit(question.timeout):
            for case in cases:
                show = not interview or id(case) in visible
                reason = run_case(question.function, func, case, show_label=show)
                if reason and case.input_check:
                    if not check_failure:
                        check_failure, check_detail = reason, input_detail(question.function, case, show)
                elif reason:
                    return result(0, reason, detail=input_detail(question.function, case, show))
            behaviour = [question.visible_test] + ([question.test] if include_hidden else [])
            for test in (t for t in behaviour if t is not None):
                try:
                    test(func)
                except AssertionError as exc:
                    return result(0, clean(str(exc)) or "a hidden behaviour test failed")
                except NotImplementedError:
                    return result(0, f"{question.function}: not implemented yet (raised NotImplementedError)")
                except GradingTimeout:
                    raise
                except BaseException as exc:
                    return result(0, f"{question.function}: raised {type(exc).__name__}: "
                                     f"{clean(str(exc))[:120]}")
    except GradingTimeout:
        return result(0, f"timed out after {question.timeout:g} s (an endless loop?)")
    elapsed = time.perf_counter() - start
    if check_failure:
        return result(math_points, f"math right ({fmt_points(math_points)} of {question.points} points); "
                                   f"an input check failed: {check_failure}", True, False, check_detail)
    n_visible = len(question.visible) + (1 if question.visible_test else 0)
    hidden = (len(question.hidden) + (1 if question.test else 0)) if include_hidden else 0
    text = f"passed {n_visible} visible" + (f" and {hidden} hidden" if include_hidden else "")
    text += " check" if n_visible + hidden == 1 else " checks"
    return result(question.points, text + (f" in {elapsed:.1f} s" if elapsed > 1 else ""), True, True)


def run_check(target: str, func: Any = _MISSING, name: str | None = None) -> bool:
    """Run the visible checks of one question, print a friendly verdict and return True
    when all pass; never raises, so unfinished notebooks still run to the end.

    ``name`` is how the verdict calls the question: the exercise's ``Q4`` by default, an
    interview's ``Question 1`` in a mock interview (``servelab.interview`` writes it)."""
    try:
        exercise, qid = target.split(".", 1)
        question = get_question(exercise, qid)
    except ValueError as exc:
        print(f"check({target!r}): {exc}")
        return False
    if func is _MISSING:
        func = None
    verdict = grade_question(question, func, include_hidden=False)
    heading = f"{name or question.id.upper()} · {question.title}"
    if verdict.passed:
        n = len(question.visible) + (1 if question.visible_test else 0)
        checks = "1 visible check" if n == 1 else f"{n} visible checks"
        print(f"✅ {heading}: {checks} passed. The grader runs hidden ones too.")
    else:
        print(f"❌ {heading}: {verdict.reason}")
        if verdict.detail:
            print(f"   the input in full: {verdict.detail}")
    return verdict.passed


def check(target: str, func: Any = _MISSING, name: str | None = None) -> None:
    """Run the visible checks of one question and print a friendly verdict.

    ``check("ex11_seats.q1", kv_bytes_per_token)``. Returns None, so a notebook cell
    that ends with it shows the verdict and nothing else; :func:`run_check` is the same
    with a True/False result. Never raises, so unfinished notebooks still run to the end.
    """
    run_check(target, func, name)


__all__ = ["Case", "Question", "Result", "check", "run_check", "grade_question", "load_questions", "get_question",
           "GradingTimeout", "time_limit", "run_case", "clean", "first_difference", "split_points",
           "fmt_points", "INPUT_SHARE", "input_detail", "FULL_INPUT_LIMIT"]
