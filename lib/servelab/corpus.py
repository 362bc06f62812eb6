"""The course corpus: a fixed, redistributable slice of CPython 3.11 plus its own prose.

Why this corpus: the course trains its own tokenizer (chapter 2) and its own tiny
language model, and both need text that anybody may copy, that is the same on every
machine, and that mixes code with English. The CPython standard library is exactly
that: Python source under the PSF License, full of English docstrings and comments,
and already installed wherever Python is. The prose part is CPython's own reference
documentation (``pydoc_data/topics.py``, the text ``help('topics')`` shows), IDLE's
help page and notes, and the CPython license text, all PSF-licensed.

The committed file is ``data/corpus/corpus.jsonl.gz``: one JSON object per line with
``name`` (path inside the stdlib, prefixed ``prose:`` for prose), ``kind``
(``"code"`` or ``"prose"``) and ``text``. Rebuild it with::

    python -m servelab.corpus build          # writes data/corpus/corpus.jsonl.gz
    python -m servelab.corpus info           # sizes, split sizes, sha256

A rebuild on CPython 3.11.7 reproduces the committed file byte for byte (the gzip
header carries no timestamp); another CPython version gives a different corpus.

Train/validation split rule: a document belongs to the validation split when the
first byte of ``sha256(name)`` is below 13 (about 5% of documents), otherwise to the
training split. Splitting whole documents, not offsets, keeps a file's code from
leaking between the splits; hashing the name keeps the rule stable if documents are
added or removed.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import html
import io
import json
import re
import sys
import sysconfig
from functools import lru_cache
from pathlib import Path

__all__ = [
    "CORPUS_PATH",
    "DOCUMENT_SEPARATOR",
    "VALIDATION_THRESHOLD",
    "load_documents",
    "load_text",
    "split_of",
    "build_corpus",
]

REPO_ROOT = Path(__file__).resolve().parents[2]
CORPUS_DIR = REPO_ROOT / "data" / "corpus"
CORPUS_PATH = CORPUS_DIR / "corpus.jsonl.gz"

#: ``load_text`` joins documents with this string; it is also the course tokenizer's
#: end-of-text special token, so a model learns where one file ends and the next begins.
DOCUMENT_SEPARATOR = "<|endoftext|>"

#: A document is in the validation split when ``sha256(name)[0] < VALIDATION_THRESHOLD``
#: (13/256, about 5% of documents).
VALIDATION_THRESHOLD = 13

# Directories of the stdlib that are left out: tests (huge, repetitive, full of odd
# bytes on purpose), third-party packages, and the generated codec tables.
_EXCLUDED_DIRS = {"test", "tests", "idle_test", "site-packages", "__pycache__", "lib-dynload",
                  "turtledemo", "ensurepip"}
_EXCLUDED_DIR_PREFIXES = ("config-",)
_GENERATED_CODEC = re.compile(r"^(cp\d+|mac_\w+|iso8859_\d+|koi8_\w+|kz1048|ptcp154|hp_roman8|"
                              r"palmos|tis_620)\.py$")
_MAX_FILE_BYTES = 300_000  # leaves out the few giant generated files (e.g. pydoc topics as code)


def split_of(name: str) -> str:
    """Return ``"val"`` or ``"train"`` for a document name (the documented split rule)."""
    return "val" if hashlib.sha256(name.encode("utf-8")).digest()[0] < VALIDATION_THRESHOLD else "train"


def _stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _code_documents(stdlib: Path):
    for path in sorted(stdlib.rglob("*.py")):
        rel = path.relative_to(stdlib)
        parts = rel.parts[:-1]
        if any(p in _EXCLUDED_DIRS or p.startswith(_EXCLUDED_DIR_PREFIXES) for p in parts):
            continue
        if rel.parts[0] == "pydoc_data":
            continue  # used as prose below
        if parts[:1] == ("encodings",) and _GENERATED_CODEC.match(rel.name):
            continue
        if rel.name.startswith("_sysconfigdata"):
            continue  # machine-specific build settings, not source
        data = path.read_bytes()
        if len(data) > _MAX_FILE_BYTES:
            continue
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            continue
        yield {"name": rel.as_posix(), "kind": "code", "text": _normalise(text)}


def _html_to_text(source: str) -> str:
    source = re.sub(r"(?is)<(script|style|head)\b.*?</\1>", "", source)
    source = re.sub(r"(?i)<br\s*/?>|</p>|</h\d>|</li>|</pre>|</div>|</dt>|</dd>", "\n", source)
    source = re.sub(r"<[^>]+>", "", source)
    source = html.unescape(source)
    lines = [line.rstrip() for line in source.splitlines()]
    text = "\n".join(lines)
    return re.sub(r"\n{3,}", "\n\n", text).strip() + "\n"


def _prose_documents(stdlib: Path):
    # The language reference / library topics, as shipped for help().
    namespace: dict = {}
    exec(compile((stdlib / "pydoc_data" / "topics.py").read_text("utf-8"), "topics.py", "exec"), namespace)
    for key in sorted(namespace["topics"]):
        yield {"name": f"prose:pydoc_data/topics/{key}", "kind": "prose",
               "text": _normalise(namespace["topics"][key])}
    idle = stdlib / "idlelib"
    yield {"name": "prose:idlelib/help.html", "kind": "prose",
           "text": _normalise(_html_to_text((idle / "help.html").read_text("utf-8")))}
    for name in ("NEWS.txt", "NEWS2x.txt", "HISTORY.txt", "README.txt", "CREDITS.txt", "TODO.txt", "extend.txt"):
        path = idle / name
        if path.exists():
            yield {"name": f"prose:idlelib/{name}", "kind": "prose", "text": _normalise(path.read_text("utf-8"))}
    yield {"name": "prose:LICENSE.txt", "kind": "prose", "text": _normalise((stdlib / "LICENSE.txt").read_text("utf-8"))}


def _normalise(text: str) -> str:
    # One newline convention, no trailing spaces at line ends, no separator text inside a document.
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = "\n".join(line.rstrip() for line in text.split("\n"))
    return text.replace(DOCUMENT_SEPARATOR, "<| endoftext |>").strip("\n") + "\n"


def build_corpus(out: Path | str = CORPUS_PATH, stdlib: Path | str | None = None) -> dict:
    """Rebuild the corpus file from the running interpreter's stdlib; return its summary."""
    stdlib = Path(stdlib) if stdlib is not None else _stdlib_dir()
    if not (stdlib / "pydoc_data" / "topics.py").exists():
        raise ValueError(f"{stdlib} does not look like a CPython stdlib (no pydoc_data/topics.py); "
                         "pass stdlib= the lib/python3.X folder")
    docs = list(_prose_documents(stdlib)) + list(_code_documents(stdlib))
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    raw = io.BytesIO()
    # mtime=0 and no file name keep the gzip bytes reproducible.
    with gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=9, mtime=0) as gz:
        for doc in docs:
            gz.write(json.dumps(doc, ensure_ascii=False, sort_keys=True).encode("utf-8") + b"\n")
    out.write_bytes(raw.getvalue())
    load_documents.cache_clear()
    return info(out)


@lru_cache(maxsize=4)
def _read(path: str) -> tuple:
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"corpus file {p} is missing; rebuild it with `python -m servelab.corpus build`")
    docs = []
    with gzip.open(p, "rt", encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            try:
                doc = json.loads(line)
                docs.append((doc["name"], doc["kind"], doc["text"]))
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise ValueError(f"{p}, line {lineno}: not a corpus record ({exc}); rebuild the corpus") from exc
    return tuple(docs)


@lru_cache(maxsize=8)
def load_documents(split: str = "all", kind: str = "all", path: str | None = None) -> tuple:
    """Return the corpus documents as a tuple of ``(name, kind, text)``, in file order.

    ``split`` is ``"train"``, ``"val"`` or ``"all"``; ``kind`` is ``"code"``, ``"prose"`` or ``"all"``.
    """
    if split not in ("train", "val", "all"):
        raise ValueError(f"split must be 'train', 'val' or 'all', not {split!r}")
    if kind not in ("code", "prose", "all"):
        raise ValueError(f"kind must be 'code', 'prose' or 'all', not {kind!r}")
    docs = _read(str(path or CORPUS_PATH))
    return tuple(d for d in docs
                 if (split == "all" or split_of(d[0]) == split) and (kind == "all" or d[1] == kind))


def load_text(split: str = "train", kind: str = "all", max_chars: int | None = None,
              separator: str = DOCUMENT_SEPARATOR) -> str:
    """Return one split of the corpus as a single string, documents joined by ``separator``.

    ``max_chars`` keeps whole documents from the start until the limit (the last one is cut),
    so "the first 10 MB of the corpus" means the same text everywhere.
    """
    text = separator.join(d[2] for d in load_documents(split, kind))
    return text if max_chars is None else text[:max_chars]


def info(path: Path | str = CORPUS_PATH) -> dict:
    """Sizes and checksum of the corpus file (what ``python -m servelab.corpus info`` prints)."""
    path = Path(path)
    docs = _read(str(path))
    summary = {"file": str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else str(path),
               "compressed_bytes": path.stat().st_size,
               "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
               "documents": len(docs)}
    for split in ("train", "val"):
        chosen = [d for d in docs if split_of(d[0]) == split]
        summary[f"{split}_documents"] = len(chosen)
        summary[f"{split}_chars"] = sum(len(d[2]) for d in chosen)
        summary[f"{split}_utf8_bytes"] = sum(len(d[2].encode("utf-8")) for d in chosen)
    summary["prose_chars"] = sum(len(d[2]) for d in docs if d[1] == "prose")
    summary["code_chars"] = sum(len(d[2]) for d in docs if d[1] == "code")
    return summary


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m servelab.corpus", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="rebuild data/corpus/corpus.jsonl.gz from this Python's stdlib")
    b.add_argument("--out", default=str(CORPUS_PATH))
    b.add_argument("--stdlib", default=None, help="a CPython lib/python3.X folder (default: this interpreter's)")
    sub.add_parser("info", help="print sizes and checksum of the committed corpus")
    args = parser.parse_args(argv)
    if args.command == "build":
        if sys.version_info[:2] != (3, 11) and args.stdlib is None:
            print(f"note: the committed corpus was built from CPython 3.11.7; this is {sys.version.split()[0]}",
                  file=sys.stderr)
        summary = build_corpus(args.out, args.stdlib)
    else:
        summary = info()
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
