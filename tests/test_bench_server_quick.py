"""Smoke run of benchmarks/bench_server.py: its --quick mode writes a complete report into a
temporary folder (a real server process on an OS-chosen loopback port). No timing is asserted."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONHASHSEED="0")


def test_server_bench_quick(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_server.py"), "--quick", "--out",
                           str(tmp_path)], capture_output=True, text=True, env=ENV, cwd=str(ROOT), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads((tmp_path / "server.json").read_text())
    assert r["quick"] is True and r["server_exit_code"] == 0
    assert len(r["throughput"]["pairs"]) == 1 and r["throughput"]["ratio_median"] > 0
    assert r["throughput"]["cpu_ratio_median"] > 0
    assert r["throughput"]["thread_mode_ratio_median"] > 0 and len(r["throughput"]["thread_mode_pairs"]) == 1
    assert set(r["ttft_low_load"]["server_split_ms_median"]) == {
        "client_to_server", "http_and_tokenize", "engine_queue", "engine_prefill", "token_to_client"}
    rows = r["rate_sweep"]["rows"]
    assert len(rows) == 2 and all(row["completed"] == r["params"]["rate_requests"] for row in rows)
    for key in ("saturation_rps_estimate", "knee_offered_rps", "knee_fraction"):  # chapters read these
        assert key in r["rate_sweep"]
    md = (tmp_path / "server.md").read_text()
    assert "QUICK" in md and "Knee" in md and (tmp_path / "server.png").stat().st_size > 1000
