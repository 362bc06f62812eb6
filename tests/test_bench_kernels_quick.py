"""Smoke run of benchmarks/bench_kernels.py --quick into a temporary folder (chapter 21 reads
the keys checked here). No timing is asserted."""
from bench_quick import ONE_THREAD, quick_results, run_quick


def test_kernels_quick(tmp_path):
    r = quick_results("bench_kernels.py", tmp_path, "kernels", env=ONE_THREAD)
    assert r["quick"] is True and r["compile_step"] is None
    assert set(r["fusion"]) == {"rmsnorm_residual", "swiglu"}
    f = r["fusion"]["rmsnorm_residual"]
    assert f["unfused_bytes"] == 2.5 * f["fused_bytes"]
    assert r["course_step"]["ops"] > 100 and r["op_overhead_s"] > 0
    assert {"compute_s", "copy_s", "together_s", "hidden"} <= set(r["overlap"])
    assert "## Overlap" in (tmp_path / "kernels.md").read_text()
    assert r["device"] == "cpu" and r["overlap"]["device"] == "cpu"


def test_kernels_bench_refuses_an_unknown_device(tmp_path):
    proc = run_quick("bench_kernels.py", tmp_path, "--device", "tpu", timeout=120, env=ONE_THREAD, check=False)
    assert proc.returncode == 2 and "'cpu' or 'cuda'" in proc.stderr
    assert not (tmp_path / "kernels.json").exists()
