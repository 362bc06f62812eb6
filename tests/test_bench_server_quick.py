"""Smoke run of benchmarks/bench_server.py: its --quick mode writes a complete report into a
temporary folder (a real server process on an OS-chosen loopback port). No timing is asserted."""
from bench_quick import ONE_THREAD, quick_results


def test_server_bench_quick(tmp_path):
    r = quick_results("bench_server.py", tmp_path, "server", env=ONE_THREAD)
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
