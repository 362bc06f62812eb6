"""What the benchmark scripts share: their ``--quick`` and ``--out`` arguments, the
results folder, and writing a run as ``<name>.json`` beside ``<name>.md``.

A script run as ``python benchmarks/bench_x.py`` finds this module beside it; code that
imports a script by its path puts ``benchmarks/`` on ``sys.path`` first.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def parser(description: str, *, quick_help: str = "a smoke run of seconds",
           out_default: Path | None = None, out_help: str | None = None,
           **parser_options) -> argparse.ArgumentParser:
    """An argument parser with ``--quick`` and ``--out`` (a folder, as a :class:`Path`);
    the script adds its own arguments to it. ``out_default=None`` lets
    :func:`results_folder` tell a smoke run that names no folder from a full run."""
    p = argparse.ArgumentParser(description=description, **parser_options)
    p.add_argument("--quick", action="store_true", help=quick_help)
    p.add_argument("--out", type=Path, default=out_default,
                   help=out_help or f"folder for the results (default {RESULTS})")
    return p


def results_folder(p: argparse.ArgumentParser, args) -> Path:
    """``--out``, or ``benchmarks/results`` for a full run; a ``--quick`` run must name
    ``--out`` (a smoke run never overwrites the recorded results), else the parser exits."""
    if args.quick and args.out is None:
        p.error("--quick writes a smoke run; pass --out DIR so it does not overwrite the recorded results")
    return args.out or RESULTS


def write_results(folder: Path, name: str, result: dict, markdown: str) -> None:
    """``folder/<name>.json`` (the raw result, values JSON cannot hold as strings) and
    ``folder/<name>.md`` (the report)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    (folder / f"{name}.md").write_text(markdown)
