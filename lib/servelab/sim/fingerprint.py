"""Which engine and which machine a calibration belongs to.

A step model is fitted to one engine's step times on one machine; change
either and the fit no longer predicts. Two keys say which it was:

* :func:`engine_fingerprint` - a hash of the code that sets the engine's step
  time: every ``servelab`` module the engine's step path imports (found by
  reading the ``import`` statements, so a module split out of the model or a
  new executor is covered as soon as the engine imports it), minus
  :data:`NOT_STEP_PATH` (modules the engine imports for other work: the
  tokenizer, the registry, speculative decoding). Each file is hashed from its
  syntax tree with docstrings dropped, so editing documentation or comments
  keeps the fingerprint; any change to code does not.
* :func:`machine_key` - the CPU model, its logical CPUs, and the torch and
  Python versions.

Pure Python (reads source files; imports nothing of the engine).
"""
from __future__ import annotations

import ast
import functools
import hashlib
import platform
from pathlib import Path

__all__ = ["engine_fingerprint", "step_path_files", "machine_key", "STEP_PATH_ROOTS", "NOT_STEP_PATH"]

LIB = Path(__file__).resolve().parents[2]  # .../lib

#: Where the engine's step starts: the engine loop, its model runner and the offline front.
STEP_PATH_ROOTS = ("servelab.engine.engine", "servelab.engine.model_runner", "servelab.engine.llm")

#: Modules the step path imports that do not run inside a plain step (or only build things
#: before the first one): their changes do not move a step's time.
NOT_STEP_PATH = frozenset({
    "servelab", "servelab._checks", "servelab.arith", "servelab.bpe", "servelab.bpe_train", "servelab.bpe_hf",
    "servelab.corpus", "servelab.specs", "servelab.sources", "servelab.machine", "servelab.ports",
    "servelab.speculative", "servelab.engine.spec_decode", "servelab.engine.stop", "servelab.engine.detokenizer",
    "servelab.generation", "servelab.checkpoint", "servelab.kvcache", "servelab.quant", "servelab.quant_formats",
    "servelab.quant_codecs", "servelab.quant_quality", "servelab.parallel.launch",
})


def _module_file(name: str) -> Path | None:
    base = LIB.joinpath(*name.split("."))
    for p in (base.with_suffix(".py"), base / "__init__.py"):
        if p.exists():
            return p
    return None


def _imports(name: str, path: Path) -> set[str]:
    st = path.stat()
    return set(_imports_cached(name, str(path), st.st_mtime_ns, st.st_size))


@functools.lru_cache(maxsize=512)
def _imports_cached(name: str, path: str, mtime_ns: int, size: int) -> frozenset:
    path = Path(path)
    tree = ast.parse(path.read_text())
    pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("servelab"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = pkg.split(".")
                parts = parts[:len(parts) - node.level + 1]
                mod = ".".join(parts + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if not mod.startswith("servelab"):
                continue
            out.add(mod)
            out.update(f"{mod}.{a.name}" for a in node.names if _module_file(f"{mod}.{a.name}"))
    return frozenset(out)


def step_path_files(roots=STEP_PATH_ROOTS, skip=NOT_STEP_PATH) -> dict[str, Path]:
    """``{module: file}`` of the step path: ``roots`` and everything they import, transitively,
    within ``servelab``, leaving out (and not following) the modules in ``skip``."""
    seen: dict[str, Path] = {}
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in seen or name in skip:
            continue
        path = _module_file(name)
        if path is None:
            continue
        seen[name] = path
        todo.extend(_imports(name, path))
    return dict(sorted(seen.items()))


def _code_only(source: str) -> str:
    """The file's syntax tree without docstrings (comments are never in it)."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
                    and isinstance(body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree, annotate_fields=False, include_attributes=False)


def engine_fingerprint(files: dict[str, Path] | None = None) -> str:
    """A short hash of the step path's code (see the module doc)."""
    files = step_path_files() if files is None else files
    h = hashlib.sha256()
    for name, path in sorted(files.items()):
        st = Path(path).stat()
        h.update(name.encode() + b"\0" + _file_digest(str(path), st.st_mtime_ns, st.st_size) + b"\0")
    return h.hexdigest()[:16]


@functools.lru_cache(maxsize=512)
def _file_digest(path: str, mtime_ns: int, size: int) -> bytes:
    """The hash of one file's code (cached while the file is unchanged)."""
    return hashlib.sha256(_code_only(Path(path).read_text()).encode()).digest()


@functools.lru_cache(maxsize=1)
def machine_key() -> str:
    """A short, file-name-safe key of this machine's CPU, core count, torch and Python."""
    import os
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        from importlib.metadata import version
        torch = version("torch")
    except Exception:  # noqa: BLE001 - no torch installed: the key still works
        torch = "none"
    desc = f"{cpu or platform.processor() or platform.machine()}|{os.cpu_count()}|{torch}|{platform.python_version()}"
    return hashlib.sha256(desc.encode()).hexdigest()[:12]
