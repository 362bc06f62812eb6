"""The book builds cleanly and its pages work offline in a real browser.

Two kinds of checks:
- fast ones (no browser): the committed ``_toc.yml`` and problem-set page are what
  ``tools/build_book.py`` generates from ``chapters/`` and ``exercises/``;
- browser ones (``-m browser``): the book is built into a temp folder (warnings are
  errors, notebooks are not executed), then every page is opened in headless Chromium,
  driven over the DevTools protocol. A page fails on a JavaScript error or console
  error, an image that did not load, math that MathJax did not typeset, a widget that
  did not render, or any request to a URL that is not a local file. A small fixture
  book with an ipywidgets lab (tests/fixtures/book) is always checked too, so the
  widget path is covered even before a chapter has a widget.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import build_book  # noqa: E402
from chromium import READY_JS, Browser, find_chromium  # noqa: E402

FIXTURE = ROOT / "tests" / "fixtures" / "book" / "widget_fixture.ipynb.json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"


# --- staleness of generated files (no browser) -----------------------------------

def test_committed_toc_matches_the_chapters_present():
    committed = (ROOT / "_toc.yml").read_text(encoding="utf-8")
    assert committed == build_book.render_toc(ROOT), (
        "_toc.yml is stale: run `.venv/bin/python tools/build_book.py --toc-only` and commit it"
    )


def test_committed_problem_set_matches_the_exercises():
    page = ROOT / build_book.PROBLEM_SET_PAGE
    assert page.read_text(encoding="utf-8") == build_book.render_problem_set(ROOT), (
        f"{build_book.PROBLEM_SET_PAGE} is stale: run `.venv/bin/python tools/build_book.py --toc-only`"
    )


def test_toc_puts_chapters_in_their_parts(tmp_path):
    (tmp_path / "chapters").mkdir()
    for name in ["ch00_intro", "ch02_tokens", "ch11_seats", "ch13_pages", "ch24_cost"]:
        (tmp_path / "chapters" / f"{name}.ipynb").write_text("{}")
    toc = build_book.render_toc(tmp_path)
    assert "root: chapters/ch00_intro" in toc
    assert toc.index("I. A request's life") < toc.index("ch02_tokens") < toc.index("IV. Memory")
    assert toc.index("IV. Memory") < toc.index("ch11_seats") < toc.index("ch13_pages")
    assert "II. Inside the model" not in toc  # empty parts are left out
    assert toc.index("VII. Cheaper steps") < toc.index("ch24_cost")


def test_toc_rejects_a_chapter_outside_the_map(tmp_path):
    (tmp_path / "chapters").mkdir()
    (tmp_path / "chapters" / "ch00_intro.ipynb").write_text("{}")
    (tmp_path / "chapters" / "ch31_extra.ipynb").write_text("{}")
    with pytest.raises(ValueError, match="not in COURSE.md's map"):
        build_book.render_toc(tmp_path)


def test_problem_set_reads_level_and_time_box(tmp_path):
    (tmp_path / "exercises").mkdir()
    cell = {"cell_type": "markdown", "metadata": {}, "source": [
        "## Q1 · Bytes per token\n", "**Level:** easy · **Time box:** 5 min · **Points:** 3\n\nText."]}
    title = {"cell_type": "markdown", "metadata": {}, "source": ["# Exercise 11 · Seats"]}
    (tmp_path / "exercises" / "ex11_seats.ipynb").write_text(json.dumps({"cells": [title, cell]}))
    page = build_book.render_problem_set(tmp_path)
    assert "## Exercise 11 · Seats" in page
    assert "| Q1 · Bytes per token | easy | 5 min | 3 |" in page


# --- building ------------------------------------------------------------------------

def _build(source: Path, out: Path) -> Path:
    toc = out / "_toc.yml"
    out.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "build_book.py"), "--source", str(source),
         "--out", str(out), "--toc", str(toc), "--quiet"],
        capture_output=True, text=True, timeout=300,
    )
    if proc.returncode != 0:
        lines = [re.sub(r"\x1b\[[0-9;]*m", "", line) for line in (proc.stdout + proc.stderr).splitlines()]
        problems = [line for line in lines if "WARNING" in line or "ERROR" in line or "Error" in line]
        shown = "\n".join(problems[:25] or lines[-40:])
        more = f"\n... and {len(problems) - 25} more" if len(problems) > 25 else ""
        pytest.fail(f"book build failed ({len(problems)} warnings, which are errors):\n{shown}{more}", pytrace=False)
    return out / "html"


def _toc_docnames(toc_text: str) -> list[str]:
    names = []
    for line in toc_text.splitlines():
        line = line.strip()
        for key in ("root:", "- file:"):
            if line.startswith(key):
                names.append(line[len(key):].strip())
    return names


def _has_widget_state(path: Path) -> bool:
    if path.suffix != ".ipynb":
        return False
    metadata = json.loads(path.read_text(encoding="utf-8")).get("metadata", {})
    return bool(metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state"))


@pytest.fixture(scope="module")
def real_book(tmp_path_factory):
    out = tmp_path_factory.mktemp("book")
    html = _build(ROOT, out)
    docnames = _toc_docnames((out / "_toc.yml").read_text(encoding="utf-8"))
    pages = []
    for doc in docnames:
        source = next((ROOT / f"{doc}{s}" for s in (".ipynb", ".md") if (ROOT / f"{doc}{s}").is_file()), None)
        pages.append((html / f"{doc}.html", source is not None and _has_widget_state(source)))
    # Sphinx's own pages: the search page loads the index and runs a query from disk.
    pages += [(html / "search.html", False), (html / "genindex.html", False)]
    return pages


@pytest.fixture(scope="module")
def widget_book(tmp_path_factory):
    src = tmp_path_factory.mktemp("fixture_src")
    shutil.copy(ROOT / "_config.yml", src / "_config.yml")
    shutil.copytree(ROOT / "book" / "static", src / "book" / "static")
    shutil.copytree(ROOT / "book" / "_ext", src / "book" / "_ext", ignore=shutil.ignore_patterns("__pycache__"))
    (src / "chapters").mkdir()
    shutil.copy(FIXTURE, src / "chapters" / "ch00_intro.ipynb")
    html = _build(src, tmp_path_factory.mktemp("fixture_out"))
    return html / "chapters" / "ch00_intro.html"


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    executable = find_chromium()
    if executable is None:
        pytest.skip("chromium is not installed (make test installs it: `make browser`)")
    b = Browser(executable, tmp_path_factory.mktemp("chromium-profile"))
    yield b
    b.close()


PAGE_STATE_JS = """(() => ({
  brokenImages: [...document.images].filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.src),
  untypesetMath: [...document.querySelectorAll('.math')].filter(m => !m.querySelector('mjx-container')).length,
  widgetViews: document.querySelectorAll('script[type="application/vnd.jupyter.widget-view+json"]').length,
  renderedViews: [...document.querySelectorAll('script[type="application/vnd.jupyter.widget-view+json"]')]
      .filter(v => v.parentElement.querySelector('.jupyter-widgets')).length,
  widgetElements: document.querySelectorAll('.jupyter-widgets').length,
  sliders: document.querySelectorAll('.widget-slider').length,
  searchHits: document.querySelectorAll('#search-results li').length,
  title: document.title,
}))()"""


def _check_page(browser: Browser, page: Path, expect_widgets: bool) -> dict:
    assert page.is_file(), f"{page} was not built"
    browser.open(page.as_uri() + ("?q=cache" if page.name == "search.html" else ""), READY_JS)
    state = browser.evaluate(PAGE_STATE_JS)
    problems = browser.problems()
    if state["brokenImages"]:
        problems.append(f"images did not load: {state['brokenImages']}")
    if state["untypesetMath"]:
        problems.append(f"{state['untypesetMath']} math elements not typeset by MathJax")
    if state["renderedViews"] < state["widgetViews"]:
        problems.append(f"only {state['renderedViews']} of {state['widgetViews']} widget views rendered")
    if page.name == "search.html" and not state["searchHits"]:
        problems.append("searching the book for 'cache' found nothing")
    if expect_widgets and not state["widgetElements"]:
        problems.append("notebook has embedded widget state but the page shows no rendered widget")
    assert not problems, f"{page.name}:\n  " + "\n  ".join(problems)
    return state


@pytest.mark.browser
def test_fixture_widgets_math_and_images_render_offline(widget_book, browser):
    state = _check_page(browser, widget_book, expect_widgets=True)
    assert state["sliders"] >= 1 and state["renderedViews"] == state["widgetViews"] >= 1, state


@pytest.mark.browser
def test_every_book_page_works_offline(real_book, browser):
    failures = []
    for page, has_widgets in real_book:
        try:
            _check_page(browser, page, expect_widgets=has_widgets)
        except AssertionError as exc:
            failures.append(str(exc))
    assert not failures, "\n".join(failures)


@pytest.mark.browser
def test_built_pages_reference_no_remote_scripts_or_styles(real_book):
    # Belt and braces beside the browser check: no <script src>, <link href> or <img src>
    # in the HTML points off the machine (anchors to papers are fine: they are not fetched).
    pattern = re.compile(r"<(?:script|link|img|iframe)\b[^>]*\b(?:src|href)=\"((?:https?:)?//[^\"]+)\"", re.I)
    offenders = {}
    for page, _ in real_book:
        found = pattern.findall(page.read_text(encoding="utf-8"))
        if found:
            offenders[page.name] = found
    assert not offenders, offenders
