"""benchmarks/bench_parallel.py --quick runs in seconds and writes its tables (into a temp dir)."""
from bench_quick import needs_course_model, quick_results


def test_bench_parallel_quick(tmp_path):
    needs_course_model()
    res = quick_results("bench_parallel.py", tmp_path, "parallel")
    assert [r["bytes"] for r in res["collectives"]["rows"]] == [4096, 1_048_576]
    assert res["tensor"]["2"]["all_reduces_per_token"] == 12      # 2 per layer x 6 layers
    assert [r["microbatches"] for r in res["pipeline"]["rows"]] == [1, 2]
    assert "## Tensor-parallel decoding" in (tmp_path / "parallel.md").read_text()
