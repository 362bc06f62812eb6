"""Runs a benchmark's ``--quick`` mode in a subprocess, its report written into a temp dir:
the one way the ``test_bench_*_quick`` tests start a benchmark."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def needs_course_model():
    if not (ROOT / "data" / "models" / "servelab-main" / "config.json").exists():
        pytest.skip("course model not trained")


#: One thread everywhere and fixed hashing: a quick run measures nothing, so it should not
#: compete with the other test workers for cores.
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}


def run_quick(script: str, out: Path, *args: str, timeout: int = 300, env: dict | None = None,
              check: bool = True) -> subprocess.CompletedProcess:
    """``python benchmarks/<script> --quick --out <out> *args`` (``env``: variables set on top
    of this process's); fails the test on a non-zero exit unless ``check=False``."""
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), "--quick", "--out", str(out), *args],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env=dict(os.environ, **env) if env else None)
    if check:
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc


def quick_results(script: str, out: Path, name: str, *args: str, timeout: int = 300, env: dict | None = None) -> dict:
    """:func:`run_quick`, then the JSON results ``<out>/<name>.json`` it wrote."""
    run_quick(script, out, *args, timeout=timeout, env=env)
    return json.loads((out / f"{name}.json").read_text())
