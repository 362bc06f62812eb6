"""The library's layering rules (COURSE.md), checked on the import statements."""
import ast
import subprocess
import sys
from pathlib import Path

import pytest

LIB = Path(__file__).resolve().parents[1] / "lib" / "servelab"
CALCULATORS = ["specs", "kvcache", "arith", "cost", "roofline", "pool", "comm", "moe", "sources"]


def _imports(path: Path, top_level_only: bool = False) -> set[str]:
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    names = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _module_files(name: str) -> list[Path]:
    single = LIB / f"{name}.py"
    return [single] if single.exists() else sorted((LIB / name).rglob("*.py"))


@pytest.mark.parametrize("name", CALCULATORS)
def test_calculators_do_not_import_torch_at_module_level(name):
    for path in _module_files(name):
        heavy = {m for m in _imports(path, top_level_only=True) if m.split(".")[0] in ("torch", "transformers")}
        assert not heavy, f"{path.name} imports {heavy} at module level; import it inside the function"


def test_importing_the_calculators_does_not_load_torch():
    code = ("import sys; import servelab.specs, servelab.kvcache; "
            + "".join(f"import servelab.{n}; " for n in CALCULATORS if (LIB / f'{n}.py').exists())
            + "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("low,forbidden", [
    ("model", ("servelab.engine", "servelab.server", "servelab.widgets", "servelab.grading")),
    ("attention", ("servelab.engine", "servelab.widgets", "servelab.grading")),
    ("sampling", ("servelab.engine", "servelab.widgets", "servelab.grading")),
    ("engine", ("servelab.server", "servelab.widgets", "servelab.grading")),
    ("paged", ("servelab.engine", "servelab.widgets", "servelab.grading")),
    ("prefix_cache", ("servelab.engine", "servelab.widgets", "servelab.grading")),
    ("bpe", ("servelab.model", "servelab.engine", "servelab.widgets", "servelab.grading")),
] + [(c, ("servelab.widgets", "servelab.grading", "servelab.engine")) for c in CALCULATORS])
def test_lower_layers_never_import_higher_ones(low, forbidden):
    files = _module_files(low)
    if not files:
        pytest.skip(f"servelab.{low} does not exist yet")
    for path in files:
        bad = {m for m in _imports(path) if m.startswith(forbidden)}
        assert not bad, f"{path.relative_to(LIB)} imports {bad}, which sit above it"
