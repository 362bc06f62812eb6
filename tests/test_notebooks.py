"""Checks on the committed notebooks that nbval itself cannot make."""
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXECUTED = sorted((ROOT / "chapters").glob("*.ipynb")) + sorted((ROOT / "solutions").glob("*.ipynb"))
EXERCISES = sorted((ROOT / "exercises").glob("*.ipynb"))


def _code_cells(path):
    cells = json.loads(path.read_text())["cells"]
    return [c for c in cells if c["cell_type"] == "code" and "".join(c["source"]).strip()]


@pytest.mark.parametrize("path", EXECUTED, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_code_cell_was_executed_without_error(path):
    # nbval never compares a cell whose execution_count is null, so a stripped
    # notebook would pass strict mode silently: catch that here.
    for index, cell in enumerate(_code_cells(path)):
        assert cell["execution_count"] is not None, f"{path.name}: code cell {index} was never executed"
        errors = [o for o in cell["outputs"] if o["output_type"] == "error"]
        assert not errors, f"{path.name}: code cell {index} stored an error: {errors[0].get('ename')}"


@pytest.mark.parametrize("path", EXERCISES, ids=lambda p: p.name)
def test_exercises_are_committed_clean_and_have_a_solution(path):
    for cell in _code_cells(path):
        assert not cell["outputs"], f"{path.name}: exercises are committed without outputs"
    assert (ROOT / "solutions" / path.name).is_file(), f"{path.name} has no worked solution"


def test_chapter_names_follow_the_convention():
    for path in (ROOT / "chapters").glob("*.ipynb"):
        stem = path.stem
        assert stem[:2] == "ch" and stem[2:4].isdigit() and stem[4] == "_", path.name
