"""benchmarks/bench_sim.py --quick runs in seconds and writes its tables (into a temp dir)."""
from bench_quick import ROOT, quick_results


def test_bench_sim_quick(tmp_path):
    res = quick_results("bench_sim.py", tmp_path, "sim", timeout=600)
    assert res["speed"]["requests"] == 20_000 and res["speed"]["cpu_s"] > 0
    md = (tmp_path / "sim.md").read_text()
    assert "## Speed" in md
    if (ROOT / "data" / "sim" / "calibration_runs.json").exists():
        assert "held-out" in md and "worst held-out error" in md
