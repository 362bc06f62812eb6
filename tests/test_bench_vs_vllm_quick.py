"""Smoke run of benchmarks/bench_vs_vllm.py --quick: both engines (vLLM's from .venv-vllm) on
servelab-main, eager, a few tiny requests; the same tokens, a complete record. Without
.venv-vllm it runs servelab's side alone (--servelab-only). No timing is asserted."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONHASHSEED="0")
HAS_VLLM = (ROOT / ".venv-vllm" / ".servelab-vllm-installed").exists()


def test_bench_vs_vllm_quick(tmp_path):
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_vs_vllm.py"), "--quick", "--out", str(tmp_path)]
    if not HAS_VLLM:
        cmd.append("--servelab-only")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=ENV, cwd=str(ROOT), timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    r = json.loads((tmp_path / "vs_vllm_offline.json").read_text())
    assert r["quick"] is True and len(r["cases"]) == 1
    case = r["cases"][0]
    engines = ["vllm", "servelab"] if HAS_VLLM else ["servelab"]
    assert sorted(case["load"]) == sorted(engines)
    assert all(case["load"][e]["torch_threads"] == 1 for e in engines)
    for w, n in (("seats", 8), ("alone", 1)):
        row = case["summary"][w]
        assert all(row[e]["tokens_per_s"] > 0 and row[e]["tokens_per_cpu_s"] > 0 for e in engines)
        if HAS_VLLM:
            assert case["same_outputs"][w] == {"identical": [n], "of": n}  # greedy: the same tokens
            assert row["servelab_over_vllm"] > 0
