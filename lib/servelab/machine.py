"""What machine and software produced a measurement, recorded next to every benchmark result."""
from __future__ import annotations

import datetime
import importlib.metadata as metadata
import os
import platform
import subprocess
from pathlib import Path

DEFAULT_PACKAGES = ("torch", "numpy")
ROOT = Path(__file__).resolve().parents[2]  # the checkout: lib/servelab/machine.py


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (or what platform knows elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def describe(packages: tuple[str, ...] = DEFAULT_PACKAGES, threads: int | None = None) -> dict:
    """Machine, Python, package versions, thread count and date, as a flat dict.

    ``threads`` defaults to torch's intra-op thread count when torch is already
    imported, else to ``OMP_NUM_THREADS`` (or "unset").
    """
    versions = {}
    for name in packages:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    if threads is None:
        import sys
        torch = sys.modules.get("torch")
        threads = torch.get_num_threads() if torch else os.environ.get("OMP_NUM_THREADS", "unset")
    try:
        load = round(os.getloadavg()[0], 2)  # other work competing for the cores skews timings
    except OSError:
        load = None
    return {"platform": platform.platform(), "cpu": cpu_model(), "logical_cpus": os.cpu_count(),
            "load_average_1min": load, "python": platform.python_version(), **versions,
            "threads": threads, "date": datetime.datetime.now().isoformat(timespec="seconds")}


def git_commit() -> str:
    """The checkout's short commit; ``SERVELAB_GIT_COMMIT`` overrides it (a run from an exported
    snapshot of a commit, which is no git checkout)."""
    if os.environ.get("SERVELAB_GIT_COMMIT"):
        return os.environ["SERVELAB_GIT_COMMIT"]
    try:
        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"
