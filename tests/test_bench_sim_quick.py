"""benchmarks/bench_sim.py --quick runs in seconds and writes its tables (into a temp dir)."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_bench_sim_quick(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_sim.py"), "--quick", "--out",
                          str(tmp_path)], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    res = json.loads((tmp_path / "sim.json").read_text())
    assert res["speed"]["requests"] == 20_000 and res["speed"]["cpu_s"] > 0
    md = (tmp_path / "sim.md").read_text()
    assert "## Speed" in md
    if (ROOT / "data" / "sim" / "calibration_runs.json").exists():
        assert "held-out" in md and "worst held-out error" in md
