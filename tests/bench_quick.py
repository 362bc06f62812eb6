"""Runs a benchmark's ``--quick`` mode in a subprocess, its report written into a temp dir:
the one way the ``test_bench_*_quick`` tests start a benchmark."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def needs_course_model():
    if not (ROOT / "data" / "models" / "servelab-main" / "config.json").exists():
        pytest.skip("course model not trained")


def run_quick(script: str, out: Path, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """``python benchmarks/<script> --quick --out <out> *args``; fails the test on a non-zero exit."""
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), "--quick", "--out", str(out), *args],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc


def quick_results(script: str, out: Path, name: str, *args: str, timeout: int = 300) -> dict:
    """:func:`run_quick`, then the JSON results ``<out>/<name>.json`` it wrote."""
    run_quick(script, out, *args, timeout=timeout)
    return json.loads((out / f"{name}.json").read_text())
