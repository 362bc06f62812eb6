"""Smoke runs of every benchmark this file knows (engine, roofline, bpe): each one's
``--quick`` mode writes its report into a temporary folder, so a broken report or
results writer fails here instead of after a long run. No timing is asserted."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONHASHSEED="0",
           RAYON_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")


def quick(script, out, *extra, timeout=300):
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), "--quick", "--out", str(out),
                           *extra], capture_output=True, text=True, env=ENV, cwd=str(ROOT), timeout=timeout)
    return proc


def test_engine_quick(tmp_path):
    proc = quick("bench_engine.py", tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads((tmp_path / "engine.json").read_text())
    md = (tmp_path / "engine.md").read_text()
    assert r["quick"] is True
    assert set(r["policies"]) == {"continuous", "static_ragged", "static_padded"}
    p = r["policies"]
    # the same waves: the same steps; ragged computes no more rows than padded
    assert p["static_ragged"]["steps"] == p["static_padded"]["steps"] >= p["continuous"]["steps"]
    assert p["static_ragged"]["rows_computed"] <= p["static_padded"]["rows_computed"]
    d = r["decomposition"]
    assert d["total"] == pytest.approx(d["policy"] * d["implementation"], rel=0.02)
    x = r["prefix_lab"]
    assert len(x["cached_tokens_hit_each"]) == len(x["edited_tokens_hit_each"]) >= 2
    # a fresh question each repeat: every cached repeat hits exactly the preamble, none of
    # the question's full blocks (a reused question's would be cached by the first repeat)
    assert x["cached_tokens_hit_each"] == [x["preamble_tokens"]] * len(x["cached_tokens_hit_each"])
    assert x["question_tokens"] >= 16 and x["edited_tokens_hit_each"] == [0] * len(x["edited_tokens_hit_each"])
    for key in ("cached_ttft_ms", "edited_ttft_ms", "speedup"):  # chapter 13 reads these
        assert key in r["prefix_lab"]
    assert r["versus_base"]["commit"] in md and "policy" in md
    assert "static waves, ragged" in md and "static waves, padded" in md
    assert r["published_static_vs_continuous"]["url"].startswith("https://")
    # item 5's batch-1 target and the per-phase table; the wave model's predicted step ratio
    assert r["step_profile"]["batch1_over_weights_read"] > 0 and "a batch-1 step <=" in md
    assert "Where a decode step's time goes" in md
    assert all(row["predicted_step_ratio"] >= 1 for row in r["seat_sweep"]) and "H_n" not in md


def test_engine_quick_refuses_to_overwrite_results():
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_engine.py"), "--quick"],
                          capture_output=True, text=True, env=ENV, cwd=str(ROOT), timeout=120)
    assert proc.returncode != 0 and "--out" in proc.stderr


def test_roofline_quick(tmp_path):
    proc = quick("bench_roofline.py", tmp_path)
    assert proc.returncode in (0, 1), proc.stderr[-3000:]  # 1: a speed goal missed (a tiny model)
    r = json.loads((tmp_path / "roofline.json").read_text())
    assert (tmp_path / "roofline.md").exists() and (tmp_path / "roofline.png").exists()
    assert len(r["goals"]) == 3 and "matrices" in r["goals"][0]["goal"]
    for dtype in ("fp32", "bf16"):
        assert set(r["paired_step_ratio_medians"][dtype]) >= {"2", "8"}
        assert r["matvec_share_medians"][dtype] > 0
    for key in ("goal1_matmuls_alone_share", "goal1_step_matrices", "goal1_reference_row_bytes", "rows"):
        assert key in r  # chapter 8 reads these


def test_bpe_quick(tmp_path):
    proc = quick("bench_bpe.py", tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads((tmp_path / "bpe.json").read_text())
    assert r["quick"] is True and r["encoding"]["identical_to_tiktoken"] is True
    assert "--quick" in (tmp_path / "bpe.md").read_text()


def test_engine_reuse_takes_only_code_independent_parts(tmp_path):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import bench_engine as be
    finally:
        sys.path.pop(0)
    run = {"requests": 4, "seats": 2, "model": {"d": 1}, "quick": True,
           "workload": {"prompt_tokens": 10, "output_tokens": 5}}
    old = dict(run, machine={"date": "then"}, transformers={"tokens_per_cpu_s": 1.0},
               parts={"transformers": {"seconds": 3.0}}, seat_sweep=[], kv_memory={})
    path = tmp_path / "engine.json"
    path.write_text(json.dumps(old))
    got = be.reuse_parts(path, "transformers", ["sweep:2", "transformers"], run)
    assert got["transformers"]["transformers"] == {"tokens_per_cpu_s": 1.0}
    assert "then" in got["transformers"]["reused_from"]
    with pytest.raises(ValueError, match="only transformers"):
        be.reuse_parts(path, "base", ["base", "transformers"], run)
    with pytest.raises(ValueError, match="output tokens"):
        be.reuse_parts(path, "transformers", ["transformers"],
                       dict(run, workload={"prompt_tokens": 10, "output_tokens": 6}))
