"""benchmarks/bench_parallel.py --quick runs in seconds and writes its tables (into a temp dir)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_bench_parallel_quick(tmp_path):
    if not (ROOT / "data" / "models" / "servelab-main" / "config.json").exists():
        pytest.skip("course model not trained")
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_parallel.py"), "--quick", "--out",
                          str(tmp_path)], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    res = json.loads((tmp_path / "parallel.json").read_text())
    assert [r["bytes"] for r in res["collectives"]["rows"]] == [4096, 1_048_576]
    assert res["tensor"]["2"]["all_reduces_per_token"] == 12      # 2 per layer x 6 layers
    assert [r["microbatches"] for r in res["pipeline"]["rows"]] == [1, 2]
    assert "## Tensor-parallel decoding" in (tmp_path / "parallel.md").read_text()
