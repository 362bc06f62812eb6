"""Smoke run of benchmarks/bench_kernels.py --quick into a temporary folder (chapter 21 reads
the keys checked here). No timing is asserted."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONHASHSEED="0")


def test_kernels_quick(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_kernels.py"), "--quick", "--out",
                           str(tmp_path)], capture_output=True, text=True, env=ENV, cwd=str(ROOT), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads((tmp_path / "kernels.json").read_text())
    assert r["quick"] is True and r["compile_step"] is None
    assert set(r["fusion"]) == {"rmsnorm_residual", "swiglu"}
    f = r["fusion"]["rmsnorm_residual"]
    assert f["unfused_bytes"] == 2.5 * f["fused_bytes"]
    assert r["course_step"]["ops"] > 100 and r["op_overhead_s"] > 0
    assert {"compute_s", "copy_s", "together_s", "hidden"} <= set(r["overlap"])
    assert "## Overlap" in (tmp_path / "kernels.md").read_text()
    assert r["device"] == "cpu" and r["overlap"]["device"] == "cpu"


def test_kernels_bench_refuses_an_unknown_device(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_kernels.py"), "--quick", "--device",
                           "tpu", "--out", str(tmp_path)], capture_output=True, text=True, env=ENV, cwd=str(ROOT),
                          timeout=120)
    assert proc.returncode == 2 and "'cpu' or 'cuda'" in proc.stderr
    assert not (tmp_path / "kernels.json").exists()
