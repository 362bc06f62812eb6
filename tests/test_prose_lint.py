"""The course voice's lint (tools/lint_prose.py): its measures on crafted notebooks,
then every chapter against it."""
import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("lint_prose", ROOT / "tools" / "lint_prose.py")
lint = importlib.util.module_from_spec(_spec)
sys.modules["lint_prose"] = lint  # dataclasses look their module up by name
_spec.loader.exec_module(lint)


def md(text):
    return {"cell_type": "markdown", "metadata": {}, "source": text}


def code(text, tags=(), glued=None):
    outputs = []
    for name, value in (glued or {}).items():
        outputs.append({
            "output_type": "display_data",
            "data": {"application/papermill.record/text/plain": repr(value)},
            "metadata": {"scrapbook": {"name": name,
                                       "mime_prefix": "application/papermill.record/"}},
        })
    return {"cell_type": "code", "metadata": {"tags": list(tags)}, "source": text,
            "outputs": outputs, "execution_count": 1}


def measure(tmp_path, *cells, name="ch99_test"):
    path = tmp_path / f"{name}.ipynb"
    path.write_text(json.dumps({"cells": list(cells), "metadata": {}, "nbformat": 4,
                                "nbformat_minor": 5}))
    return lint.measure(path)


LONG = " ".join(["word"] * 50) + "."
SHORT = "This sentence has exactly six words."


def test_counts_sentences_and_words(tmp_path):
    m = measure(tmp_path, md(f"# Title\n\n{SHORT} {SHORT}\n\n- A bullet of five words\n"))
    assert m.sentence_words == [6, 6, 5]
    assert m.words == 17
    assert m.median == 6


def test_dropdown_directive_is_not_main_text(tmp_path):
    m = measure(tmp_path, md(f"{SHORT}\n\n:::{{dropdown}} How this was measured\n{LONG}\n:::\n"))
    assert m.sentence_words == [6]


def test_admonition_with_dropdown_class_is_not_main_text(tmp_path):
    m = measure(tmp_path, md(
        f"{SHORT}\n\n```{{admonition}} How this was measured\n:class: dropdown\n{LONG}\n```\n"))
    assert m.sentence_words == [6]


def test_open_admonition_is_main_text(tmp_path):
    m = measure(tmp_path, md(f":::{{admonition}} Takeaway\n:class: tip\n{LONG}\n:::\n"))
    assert m.sentence_words == [50]
    assert "long" in m.misses()


def test_nested_fold_hides_its_whole_body(tmp_path):
    m = measure(tmp_path, md(
        "::::{admonition} Answer\n:class: dropdown\n```python\nx = 1\n```\n"
        f"{LONG}\n::::\n{SHORT}\n"))
    assert m.sentence_words == [6]


def test_math_and_code_fences_are_not_sentences(tmp_path):
    m = measure(tmp_path, md(
        f"{SHORT}\n\n$$\na = b + c + d + e + f + g + h\n$$\n\n"
        "```{math}\nx = y + z + w\n```\n\n```python\nprint('one two three four')\n```\n"))
    assert m.sentence_words == [6]


def test_glue_values_are_filled_in(tmp_path):
    m = measure(tmp_path,
                code("glue('ch99_x', ...)", tags=["remove-cell"],
                     glued={"ch99_x": "one two three four five"}),
                md("It took {glue:text}`ch99_x` here.\n"))
    assert m.sentence_words == [8]
    assert not m.plumbing


def test_long_glue_value_is_a_miss(tmp_path):
    m = measure(tmp_path, code("", tags=["remove-cell"], glued={"ch99_s": "x" * 81}))
    assert m.long_glue == {"ch99_s": "x" * 81}
    assert "glue" in m.misses()


@pytest.mark.parametrize("source, what", [
    ('glue("ch99_a", f"{a:.1f}", display=False)', "glue() call"),
    ("print(json.dumps(reply, indent=1))", "JSON dump"),
    ("inspect.signature(f)", "inspect.signature"),
    ("t0 = time.perf_counter()", "timing harness"),
    ("print(f\"{'model':15} {'layers':>6}\")", "table printer"),
])
def test_visible_plumbing_is_found(tmp_path, source, what):
    m = measure(tmp_path, code(source))
    assert m.plumbing == [f"cell 0 {what}"]
    hidden = measure(tmp_path, code(source, tags=["remove-input"]))
    assert hidden.plumbing == []


def test_teaching_code_is_not_plumbing(tmp_path):
    m = measure(tmp_path, code(
        "probs = torch.softmax(logits, -1)\nassert abs(probs.sum() - 1) < 1e-6\n"
        "print(f\"{name:12} {value:>8.2f}\")"))
    assert m.plumbing == []


def test_key_numbers_bullets_are_counted(tmp_path):
    bullets = "\n".join(f"- Number {i} is {{glue:text}}`ch99_v`." for i in range(7))
    m = measure(tmp_path, code("", tags=["remove-cell"], glued={"ch99_v": "42"}),
                md(f"## Key numbers\n\n{bullets}\n\n## Interview corner\n\n{SHORT}\n"))
    assert m.key_bullets == [4] * 7
    assert "key_numbers" in m.misses()
    one_long = measure(tmp_path, md("## Key numbers\n\n- " + " ".join(["w"] * 31) + "\n"))
    assert "key_numbers" in one_long.misses()


def test_words_limit(tmp_path):
    m = measure(tmp_path, md("\n\n".join([SHORT] * 420)))
    assert m.words == 2520
    assert "words" in m.misses()


CHAPTERS = lint.chapter_paths()


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_chapter_reads_in_the_course_voice(path):
    m = lint.measure(path)
    excused = lint.ALLOWLIST.get(path.stem, set())
    failing = {k: v for k, v in m.misses().items() if k not in excused}
    assert not failing, f"{path.name}: " + "; ".join(failing.values())


def test_allowlist_names_only_chapters_9_to_24_and_nothing_stale():
    stems = {p.stem for p in CHAPTERS}
    stale = {}
    for stem, rules in lint.ALLOWLIST.items():
        assert stem in stems, f"allowlist names {stem}, which is not a chapter"
        assert 9 <= int(stem[2:4]) <= 24, f"chapters 0-8 pass with no exception: {stem}"
        met = rules - set(lint.measure(ROOT / "chapters" / f"{stem}.ipynb").misses())
        if met:
            stale[stem] = sorted(met)
    assert not stale, f"now met, remove from ALLOWLIST: {stale}"
