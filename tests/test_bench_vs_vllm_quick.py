"""Smoke run of benchmarks/bench_vs_vllm.py --quick: both engines (vLLM's from .venv-vllm) on
servelab-main, eager, a few tiny requests; the same tokens, a complete record. Without
.venv-vllm it runs servelab's side alone (--servelab-only). No timing is asserted."""
from bench_quick import ONE_THREAD, ROOT, quick_results

HAS_VLLM = (ROOT / ".venv-vllm" / ".servelab-vllm-installed").exists()


def test_bench_vs_vllm_quick(tmp_path):
    r = quick_results("bench_vs_vllm.py", tmp_path, "vs_vllm_offline", *([] if HAS_VLLM else ["--servelab-only"]),
                      env=ONE_THREAD)
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
