"""python -m servelab.engine.profile --quick runs and reports every phase (seconds)."""
import json

from servelab.engine import profile


def test_profile_quick_reports_every_phase(tmp_path, capsys):
    out = tmp_path / "profile.json"
    assert profile.main(["--quick", "--repeats", "1", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert [r["seats"] for r in result["runs"]] == [1, 4]
    for run in result["runs"]:
        assert set(run["phases_ms"]) == set(profile.PHASES) and run["steps"] > 0
        assert run["phases_ms"]["attention"] > 0 and run["phases_ms"]["layers"] > 0
        assert sum(run["phases_ms"].values()) <= run["step_ms"] * 1.05 + 0.05
    assert result["batch1_over_weights_read"] > 0
    assert "batch-1 step" in capsys.readouterr().out


def test_weights_read_counts_each_matrix_once():
    from servelab import arith
    model = profile.build_model(quick=True)
    params = arith.count_params(model.config).matmul_active
    assert profile.weights_read_seconds(model, 4.0) == params  # 4 bytes each at 4 bytes/s


def test_matmuls_alone_time_is_a_positive_duration():
    from servelab.engine.profile import build_model, matmuls_alone_seconds
    model = build_model(quick=True).fuse_projections(column_major=True)
    seconds = matmuls_alone_seconds(model, repeats=3)
    assert 0 < seconds < 1
