"""bench_speculative --quick runs end to end and writes its report (a smoke run, no timing asserted)."""
import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_quick_run_writes_results(tmp_path):
    spec = importlib.util.spec_from_file_location("bench_speculative", ROOT / "benchmarks" / "bench_speculative.py")
    bench = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(ROOT / "benchmarks"))  # where the script finds its shared helper, _common
    try:
        spec.loader.exec_module(bench)
    finally:
        sys.path.pop(0)
    assert bench.main(["--quick", "--out", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "speculative.json").read_text())
    assert set(res["workloads"]) == {"edit_ngram", "code_ngram", "code_draft", "edit_draft"}
    for sweep in res["workloads"].values():
        for row in sweep:
            assert row["tokens_per_pass"] >= 1 and 0 <= row["acceptance_rate"] <= 1
            assert row["speedup"] > 0 and row["predicted_speedup"] > 0
    assert "| edit_ngram |" in (tmp_path / "speculative.md").read_text()
    fade = res["engine_fade"]   # the same requests at every concurrency
    assert [r["concurrency"] for r in fade] == [1, 4]
    assert len({r["requests"] for r in fade}) == 1 and len({r["tokens"] for r in fade}) == 1
