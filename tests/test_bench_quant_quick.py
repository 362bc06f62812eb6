"""Smoke run of benchmarks/bench_quant.py --quick into a temporary folder: the report and
its JSON keys (chapter 19 reads them). No timing is asserted."""
import os
import subprocess
import sys

from bench_quick import ONE_THREAD, ROOT, quick_results

ENV = dict(ONE_THREAD, RAYON_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")


def test_quant_quick(tmp_path):
    r = quick_results("bench_quant.py", tmp_path, "quant", timeout=600, env=ENV)
    assert r["quick"] is True and "load_average_1min" in r["machine"]
    assert set(r["formats"]) == {"fp32", "bf16", "int8", "int4-g128", "int4-g32"}
    f = r["formats"]
    assert f["int4-g128"]["bytes_read"] < f["int8"]["bytes_read"] < f["bf16"]["bytes_read"] < f["fp32"]["bytes_read"]
    assert f["int8"]["kernel"] == "int8pack" and f["int4-g32"]["kernel"] == "int4pack"
    assert {"fp32/int8", "bf16/int8", "bf16/int4-g32"} <= set(r["interleaved"]["speedup"])
    assert [g["target"] for g in r["goals"]] == [2.5, 1.5]
    assert all("ratio_vs_fastest_dense" in g for g in r["goals"])
    assert {"int8, unfused", "int8, head too"} <= set(r["extras"])
    assert "int8, unfused/int8" in r["interleaved"]["speedup"]
    w = r["int8_time"]
    # the quick model's int8 shapes: fused QKV, o, fused gate/up, down
    assert {(x["n"], x["k"]) for x in w["shapes"]} == {(1024, 512), (512, 512), (3072, 512), (512, 1536)}
    assert all(x["calls_per_step"] == 4 and x["int8_cold_ms"] > 0 and x["fp32_cold_ms"] > 0 for x in w["shapes"])
    assert w["int8_kernel_ms"] > 0 and w["profiled_ms"] >= w["int8_kernel_ms"]
    assert 0 < w["step_without_kernels_ms"] < w["step_with_kernels_ms"]
    assert len(w["by_shape"]) == 4 and any(x["n"] % 4 for x in w["by_shape"])
    assert all(s["last_flat_batch"] >= 1 for s in r["sweep"].values())
    variants = [q["variant"] for q in r["quality"]]
    assert variants == ["fp32", "bf16", "int8", "int4-g128", "int4-g32", "mxfp4", "nvfp4"]
    assert r["quality"][0]["top1_agreement"] == 1.0
    md = (tmp_path / "quant.md").read_text()
    assert "## Goals" in md and "Load average" in md and "## Where the int8 step's time goes" in md


def test_quant_quick_refuses_to_overwrite_results():
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_quant.py"), "--quick"],
                          capture_output=True, text=True, env=dict(os.environ, **ENV), cwd=str(ROOT), timeout=60)
    assert proc.returncode != 0 and "--out" in proc.stderr
