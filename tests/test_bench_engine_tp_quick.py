"""benchmarks/bench_engine_tp.py --quick runs in seconds and writes its report (into a temp dir)."""
from bench_quick import needs_course_model, quick_results


def test_bench_engine_tp_quick(tmp_path):
    needs_course_model()
    res = quick_results("bench_engine_tp.py", tmp_path, "engine_tp")
    assert res["same_tokens"]
    # every row starts from an empty prefix cache: the same steps, the same prefill tokens
    assert len(set(res["steps"].values())) == 1, res["steps"]
    assert len(set(res["prefill_tokens"].values())) == 1, res["prefill_tokens"]
    assert res["logged_run"] == {"steps": res["steps"]["2"], "prefill_tokens": res["prefill_tokens"]["2"]}
    assert set(res["tokens_per_s"]) == {"1", "1t2", "2"}
    assert res["per_step"]["calls"] == 13                 # 2 all-reduces x 6 layers + the head's gather
    assert res["fit"]["alpha_s"] > 0 and res["per_step"]["predicted_ms"] > 0
    parts = res["per_step"]
    whole = parts["compute_ms"] + parts["collectives_rank0_ms"] + parts["plan_ms"] + parts["other_ms"]
    assert abs(whole - parts["engine_ms"]) < 1e-6 * max(1.0, parts["engine_ms"])
    assert "## The alpha-beta model's prediction" in (tmp_path / "engine_tp.md").read_text()
