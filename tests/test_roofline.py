"""servelab.roofline: intensity, ridge, the step-time model and the seed's worked figures."""
import subprocess
import sys

import pytest
from hypothesis import given, settings, strategies as st

from servelab import roofline as rl
from servelab import specs
from servelab.kvcache import kv_bytes_per_token
from servelab.specs import GB, TB

R = rl.EXAMPLE_REPLICA


# -- seed figures ------------------------------------------------------------------

def test_seed_b200_ops_per_byte_and_decode_gap():
    assert rl.ops_per_byte("B200", "fp8") == pytest.approx(562.5)   # "about 560"
    assert rl.decode_intensity(1, bytes_per_param=1) == 2.0          # 2 ops per weight byte at 8 bits
    assert rl.ops_per_byte("B200") / rl.decode_intensity(1) == pytest.approx(281.25)  # "280 times below"


def test_seed_balance_point_about_230_people():
    b = rl.balance_batch("B200", "fp8", bytes_per_param=1, compute_efficiency=0.5, bandwidth_efficiency=0.6)
    assert b == pytest.approx(4.5e15 * 0.5 / (8e12 * 0.6) / 2)
    assert 225 <= b <= 240
    assert R.balance_batch == pytest.approx(b)


def test_seed_example_replica_shape():
    assert R.num_chips == 8 and R.chip is specs.B200
    assert R.weights_bytes == 200 * GB
    assert R.kv_bytes_per_token == 163_840 == kv_bytes_per_token(specs.EXAMPLE_200B, "fp8")


def test_seed_step_11_6_ms_at_128_people_8k():
    step = R.step_seconds(128, 8000)
    manual = (200e9 + 128 * 8000 * 163_840) / (8 * 8e12 * 0.6) + 0.002
    assert step == pytest.approx(manual)
    assert round(step * 1e3, 1) == 11.6
    assert rl.decode_step_seconds(200e9, 163_840, 128, 8000, 64e12) == pytest.approx(manual)
    assert round(R.per_person_tokens_per_s(128, 8000)) == 86
    assert R.replica_tokens_per_s(128, 8000) == pytest.approx(11_000, rel=0.01)


def test_seed_people_per_replica_900_56_7():
    # Assumption: free memory = (8 x 180 GB usable - 200 GB) x (1 - 5% margin) = 1,178 GB,
    # lengths decimal (8k = 8,000 tokens).
    assert R.free_bytes == pytest.approx(1178 * GB)
    assert [R.people(n) for n in (8_000, 128_000, 1_000_000)] == [898, 56, 7]
    assert round(R.people(8_000), -2) == 900


def test_seed_lone_request_70b_bf16():
    tps = rl.lone_request_tokens_per_s(140 * GB, 3.35 * TB)
    assert tps == pytest.approx(23.93, abs=0.01)
    assert round(tps) == 24


# -- shapes of the model ------------------------------------------------------------

def test_step_grows_with_batch_and_context_and_overhead_is_floor():
    assert R.step_seconds(1, 0) == R.step_seconds(64, 0)  # no cache to read: batching is free
    assert R.step_seconds(1, 1000) < R.step_seconds(64, 1000) < R.step_seconds(64, 8000)
    assert R.step_seconds(1, 0) == pytest.approx(200e9 / (64e12 * 0.6) + 0.002)
    assert R.with_(overhead_s=0).step_seconds(1, 0) == pytest.approx(200e9 / 38.4e12)


def test_compute_takes_over_past_balance():
    r = R.with_(kv_bytes_per_token=1e-9)  # weights only
    below, above = 100, 1000
    assert r.memory_seconds(below, 0) > r.compute_seconds(below)
    assert r.compute_seconds(above) > r.memory_seconds(above, 0)
    b = r.balance_batch
    assert r.compute_seconds(1) * b == pytest.approx(r.memory_seconds(1, 0), rel=1e-6)


def test_per_person_vs_replica_throughput():
    step = 0.0116
    assert rl.per_person_tokens_per_s(step) == pytest.approx(86.2, abs=0.1)
    assert rl.replica_tokens_per_s(128, step) == pytest.approx(128 / step)


def test_decode_intensity_with_kv_reads_is_capped():
    params, seat = 200e9, 8000 * 163_840
    i1 = rl.decode_intensity(1, 1.0, seat, params)
    i_big = rl.decode_intensity(10_000, 1.0, seat, params)
    assert i1 < 2.0
    assert i_big < 2 * params / seat  # cap: 2 x params / seat bytes
    assert rl.decode_intensity(128, 2.0) == 128


def test_prefill_intensity_and_attainable():
    assert rl.prefill_intensity(3000, 1) == 6000
    peak, bw = 4.5e15, 8e12
    assert rl.attainable_ops(2, peak, bw) == 16e12
    assert rl.attainable_ops(6000, peak, bw) == peak


def test_ridge_point_efficiencies():
    assert rl.ridge_point("B200") == pytest.approx(562.5)
    assert rl.ridge_point("B200", compute_efficiency=0.5, bandwidth_efficiency=0.6) == pytest.approx(468.75)
    assert rl.ridge_point("H100", "bf16") == pytest.approx(989.4e12 / 3.35e12)


def test_replica_for_model():
    r = rl.Replica.for_model("Llama-3-70B", "H100", 2, weight_dtype="bf16", cache_dtype="bf16")
    assert r.weights_bytes == 140 * GB
    assert r.kv_bytes_per_token == 327_680
    assert r.people(4000) == int(r.free_bytes // (4000 * 327_680))
    s = r.summary(8, 4000)
    assert s["step_ms"] == pytest.approx(r.step_seconds(8, 4000) * 1e3)
    assert s["replica_tok_s"] == pytest.approx(8 * s["per_person_tok_s"])
    assert r.lone_request_tokens_per_s() < rl.lone_request_tokens_per_s(140 * GB, 6.7 * TB)


def test_memory_tiers_ordered_by_speed():
    bws = [t.bandwidth for t in rl.MEMORY_TIERS if t.bandwidth]
    assert bws == sorted(bws, reverse=True)
    assert all(t.source for t in rl.MEMORY_TIERS)


# -- validation ------------------------------------------------------------------------

@pytest.mark.parametrize("call", [
    lambda: rl.ops_per_byte("no-such-chip"),
    lambda: rl.ops_per_byte("A100 80GB", "fp8"),
    lambda: rl.decode_intensity(0),
    lambda: rl.decode_intensity(1, 0),
    lambda: rl.decode_intensity(1, 1, kv_bytes_per_seat=10),  # needs params
    lambda: rl.prefill_intensity(-5),
    lambda: rl.ridge_point("B200", compute_efficiency=0),
    lambda: rl.ridge_point("B200", bandwidth_efficiency=1.01),
    lambda: rl.balance_batch("B200", bytes_per_param=-1),
    lambda: rl.decode_step_seconds(0, 1, 1, 1, 1e12),
    lambda: rl.decode_step_seconds(1e9, 1, 0, 1, 1e12),
    lambda: rl.decode_step_seconds(1e9, 1, 1, -1, 1e12),
    lambda: rl.decode_step_seconds(1e9, 1, 1, 1, 1e12, bandwidth_efficiency=0),
    lambda: rl.decode_step_seconds(1e9, 1, 1, 1, 1e12, overhead_s=-0.001),
    lambda: rl.per_person_tokens_per_s(0),
    lambda: rl.replica_tokens_per_s(0, 0.01),
    lambda: rl.lone_request_tokens_per_s(140e9, 3.35e12, efficiency=2),
    lambda: rl.people_per_replica(1e9, 1000, 0),
    lambda: rl.people_per_replica(-1e9, 1000, 10),
    lambda: R.with_(num_chips=0),
    lambda: R.with_(bandwidth_efficiency=0.0),
    lambda: R.with_(compute_efficiency=1.5),
    lambda: R.with_(dtype="fp3"),
    lambda: R.with_(weights_bytes=2000 * GB).free_bytes,  # weights do not fit
    lambda: rl.Replica.for_model("Llama-3-70B", "no-chip", 2),
    lambda: rl.attainable_ops(0, 1, 1),
])
def test_bad_input_raises_value_error(call):
    with pytest.raises(ValueError):
        call()


# -- properties -------------------------------------------------------------------------

@settings(max_examples=60, deadline=None)
@given(batch=st.integers(1, 2048), ctx=st.integers(0, 200_000), eff=st.floats(0.05, 1.0))
def test_step_monotone_and_throughput_consistent(batch, ctx, eff):
    r = R.with_(bandwidth_efficiency=eff)
    step = r.step_seconds(batch, ctx)
    assert step >= r.overhead_s
    assert r.step_seconds(batch + 1, ctx) >= step
    assert r.step_seconds(batch, ctx + 1) >= step
    assert r.replica_tokens_per_s(batch, ctx) == pytest.approx(batch / step)
    # batching never lowers the replica's output
    assert r.replica_tokens_per_s(batch + 1, ctx) >= r.replica_tokens_per_s(batch, ctx) * (1 - 1e-9)


@settings(max_examples=40, deadline=None)
@given(ctx=st.integers(1, 2_000_000))
def test_people_fit_in_free_memory(ctx):
    n = R.people(ctx)
    assert n * ctx * R.kv_bytes_per_token <= R.free_bytes
    assert (n + 1) * ctx * R.kv_bytes_per_token > R.free_bytes


# -- import hygiene and plotting ----------------------------------------------------------

def test_pure_part_imports_without_torch():
    code = "import sys, servelab.roofline, servelab.arith, servelab.cost; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_plot_roofline_returns_axes():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ax = rl.plot_roofline(4.5e15, 8e12, points=[(2, 16e12, "decode B=1"), (6000, 2.25e15, "prefill")],
                          title="B200")
    assert ax.get_xscale() == "log" and len(ax.lines) >= 3
    plt.close(ax.figure)
    with pytest.raises(ValueError):
        rl.plot_roofline(0, 8e12)


# -- measuring the machine (tiny sizes; no timing thresholds) ---------------------------------

TINY = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2)


def test_measure_tiny_returns_tidy_rows_and_plots():
    pytest.importorskip("torch")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import torch

    before = torch.get_num_threads()
    res = rl.measure(model=TINY, batches=(1, 2, 4), repeats=1, bandwidth_mb=4, matmul_n=32, progress=False)
    assert torch.get_num_threads() == before  # restored
    assert res.machine["threads"] == 1 and res.machine["torch"]
    assert res.machine["bf16_units"] == rl.bf16_units()  # recorded with every result
    kinds = {(r["kind"], r["dtype"]) for r in res.rows}
    assert {("bandwidth", "fp32"), ("matmul", "fp32"), ("matmul", "bf16"), ("decode", "fp32"),
            ("decode", "bf16")} <= kinds
    for r in res.rows:
        assert r["seconds"] > 0
        assert set(r) >= {"kind", "name", "dtype", "batch", "seconds", "bytes", "ops", "GB_per_s", "GFLOP_per_s"}
    dec = res.decode("fp32")
    assert [r["batch"] for r in dec] == [1, 2, 4]
    assert dec[1]["ops"] == 2 * dec[0]["ops"]
    assert dec[0]["tokens_per_s"] == pytest.approx(1 / dec[0]["seconds"])
    assert res.model["params"] == res.rows[-1]["params"]
    assert res.step_ms("bf16", 2) > 0 and res.matvec_bandwidth > 0 and res.peak_ops("fp32") > 0
    text = res.table()
    assert "decode step" in text and "matrix-vector" in text
    ax = res.plot()
    assert ax.get_xscale() == "log"
    plt.close(ax.figure)
    d = res.to_dict()
    assert d["rows"] == res.rows
    with pytest.raises(ValueError):
        res.step_ms("fp32", 3)
    with pytest.raises(ValueError):
        res.value("matmul", "matmul", "fp8", "seconds")


def test_measure_rejects_bad_input():
    pytest.importorskip("torch")
    with pytest.raises(ValueError):
        rl.measure(model="huge", progress=False)
    with pytest.raises(ValueError):
        rl.measure(threads=0, progress=False)
    with pytest.raises(ValueError):
        rl.measure_matmul(16, dtypes=("fp8",), repeats=1)
    m = rl.build_sweep_model(TINY, "fp32")
    with pytest.raises(ValueError):
        rl.measure_decode(m, batches=(0,), repeats=1)


def test_cli_main_tiny(monkeypatch, tmp_path, capsys):
    pytest.importorskip("torch")
    import json

    from servelab import roofline_measure as rm  # the measuring half, where main() finds measure()

    real = rm.measure
    monkeypatch.setattr(rm, "measure", lambda quick, threads, device="cpu": real(
        model=TINY, batches=(1,), repeats=1, bandwidth_mb=4, matmul_n=32, progress=False, threads=threads,
        device=device))
    out = tmp_path / "r.json"
    png = tmp_path / "r.png"
    assert rl.main is rm.main
    assert rl.main(["--json", str(out), "--plot", str(png)]) == 0
    assert json.loads(out.read_text())["rows"] and png.stat().st_size > 0
    assert "decode step" in capsys.readouterr().out


def test_roofline_labs_build():
    pytest.importorskip("ipywidgets")
    from servelab.widgets import roofline_labs as labs

    html = labs.step_readout_html(labs.step_settings(batch=128, context_tokens=8000))
    assert "step time" in html and " ms" in html  # the labs' own tests check the figures
    assert labs.step_time_lab().children
    from servelab import cost
    assert "$" in labs.cost_readout_html(cost.chat_cost())
    assert labs.chat_cost_lab().children


def test_measure_min_statistic_and_bad_statistic():
    pytest.importorskip("torch")
    res = rl.measure(model=TINY, batches=(1,), repeats=2, bandwidth_mb=4, matmul_n=32, progress=False,
                     statistic="min", dtypes=("fp32",))
    assert res.model["statistic"] == "min" and res.decode("fp32")
    with pytest.raises(ValueError, match="statistic"):
        rl.measure_bandwidth(4, 1, statistic="mean")


def test_measure_device_is_checked():
    torch = pytest.importorskip("torch")
    with pytest.raises(ValueError, match="'cpu' or 'cuda'"):
        rl.measure(model=TINY, progress=False, device="tpu")
    with pytest.raises(TypeError, match="device"):
        rl.check_device(0)
    assert rl.check_device("cpu") == "cpu"
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA GPU"):
            rl.measure(model=TINY, progress=False, device="cuda")


def test_measure_on_cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU here; the CPU stays the default")
    res = rl.measure(model=TINY, batches=(1, 2), repeats=1, bandwidth_mb=4, matmul_n=64, progress=False,
                     device="cuda")
    assert res.model["device"] == "cuda" and "device" in res.machine
    assert res.decode("fp32") and res.decode("bf16") and res.matvec_bandwidth > 0


def test_measure_with_the_cpu_clock():
    pytest.importorskip("torch")
    res = rl.measure(model=TINY, batches=(1,), repeats=1, bandwidth_mb=4, matmul_n=32, progress=False,
                     dtypes=("fp32",), clock="cpu")
    assert res.model["clock"] == "cpu" and res.decode("fp32")[0]["seconds"] > 0
    with pytest.raises(ValueError, match="clock"):
        rl.measure_bandwidth(4, 1, clock="sundial")
    with pytest.raises(ValueError, match="threads=1"):
        rl.measure(model=TINY, progress=False, threads=2, clock="cpu")


def test_measurements_run_on_the_cpu_when_named_and_refuse_unknown_devices():
    torch = pytest.importorskip("torch")
    for device in ("cpu", torch.device("cpu")):
        bw = rl.measure_bandwidth(4, 1, device=device)
        mm = rl.measure_matmul(32, ("fp32", "bf16"), 1, device=device)
        assert all(r["seconds"] > 0 for r in bw + mm)
    assert rl.check_device(torch.device("cpu")) == "cpu"
    for bad in ("tpu", "gpu", "cuda:x", "cpu:1", "mps"):
        with pytest.raises(ValueError, match="'cpu' or 'cuda'"):
            rl.measure_bandwidth(4, 1, device=bad)
        with pytest.raises(ValueError, match="'cpu' or 'cuda'"):
            rl.measure_matmul(32, ("fp32",), 1, device=bad)


def test_a_gpu_is_synchronised_around_every_timed_call(monkeypatch):
    """A stand-in torch.cuda records the order: synchronise, start the clock, call, synchronise."""
    torch = pytest.importorskip("torch")
    events = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: events.append(("sync", device)))
    assert rl.check_device("cuda:1") == "cuda:1"
    rl.time_call(lambda: events.append("call"), repeats=2, warmup=1, device="cuda:1")
    assert events == ["call", ("sync", "cuda:1"), "call", ("sync", "cuda:1"), "call", ("sync", "cuda:1")]
    with pytest.raises(ValueError, match="2 CUDA GPU"):
        rl.check_device("cuda:2")
    with pytest.raises(ValueError, match="clock='cpu'"):
        rl.time_call(lambda: None, 1, device="cuda", clock="cpu")


def test_bandwidth_and_matmul_on_cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU here; the CPU stays the default")
    bw = rl.measure_bandwidth(8, 2, device="cuda")
    mm = rl.measure_matmul(256, ("fp32", "bf16"), 2, device="cuda")
    assert all(r["GB_per_s"] > 0 for r in bw) and all(r["GFLOP_per_s"] > 0 for r in mm)
    model = rl.build_sweep_model(TINY, "bf16", device="cuda")
    rows = rl.measure_decode(model, batches=(1,), repeats=1)
    assert rows[0]["seconds"] > 0 and next(model.parameters()).device.type == "cuda"


def test_compute_knee_counts_cache_reads_and_matches_a_search():
    from servelab.roofline import EXAMPLE_REPLICA as R

    def search(ctx):
        return next((b for b in range(1, 100_000)
                     if R.compute_seconds(b) > R.memory_seconds(b, ctx)), None)

    for ctx in (1, 100, 1_000, 2_000, 4_000):
        assert R.compute_knee(ctx) == search(ctx)
    assert R.compute_knee(1_000) > R.balance_batch      # cache reads push it right
    assert R.compute_knee(8_000) is None and R.compute_knee(32_000) is None
    with pytest.raises(ValueError):
        R.compute_knee(0)


# -- chapter 8's ladder, recorded curves and bf16 units --------------------------------

def test_sram_tier_is_the_sum_of_the_h100_per_sm_figures():
    from servelab import sources
    sram = rl.MEMORY_TIERS[0]
    per_sm = 256 * 1024 + 256 * 1024  # registers + L1/shared, KiB as NVIDIA prints them
    assert sram.capacity_bytes == 132 * per_sm + 50 * 1024 * 1024
    assert 0.1e9 < sram.capacity_bytes < 0.13e9  # "a little over a hundred megabytes"
    assert sram.source == sources.cite("h100_sxm_sms") and "sum" in sram.note


def test_step_ratio_and_its_plot_from_recorded_rows():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [{"kind": "decode", "name": "decode step", "dtype": d, "batch": b, "seconds": s}
            for d, pts in (("fp32", ((1, 0.1), (2, 0.2), (8, 0.25))), ("bf16", ((1, 0.05), (2, 0.05), (8, 0.07))))
            for b, s in pts]
    res = rl.MeasureResult(rows=rows, machine={"cpu": "test CPU"})
    assert res.step_ratio("fp32", 2) == pytest.approx(2.0)
    assert res.step_ratio("bf16", 8) == pytest.approx(1.4)
    ax = res.plot_step_ratios()
    assert ax.get_xscale() == "log" and "test CPU" in ax.get_title()
    labels = [line.get_label() for line in ax.get_lines()]
    assert "fp32" in labels and "bf16" in labels
    plt.close(ax.figure)
    with pytest.raises(ValueError):
        res.step_ratio("bf16", 3)
    with pytest.raises(ValueError, match="no decode"):
        rl.MeasureResult(rows=[], machine={}).plot_step_ratios()


def test_bf16_units_from_cpu_flags():
    assert rl.bf16_units(["avx2", "amx_tile", "amx_bf16", "avx512_bf16"]) == "AMX tiles"
    assert rl.bf16_units(["avx2", "avx512f", "avx512_bf16"]) == "AVX-512 bf16 dot products"
    assert rl.bf16_units(["avx2", "fma"]) == "no bf16 units"
    assert rl.bf16_units() in ("AMX tiles", "AVX-512 bf16 dot products", "no bf16 units", "unknown")


def test_recorded_bf16_units_says_only_what_is_known():
    assert rl.recorded_bf16_units({"cpu": "Intel Xeon", "bf16_units": "AMX tiles"}) == "AMX tiles"
    assert rl.recorded_bf16_units({"cpu": "AMD EPYC"}) == "no AMX tiles (an AMD CPU)"
    assert rl.recorded_bf16_units({"cpu": "Intel Xeon"}) == "not recorded"
    assert rl.recorded_bf16_units({}) == "not recorded"
    with pytest.raises(TypeError, match="mapping"):
        rl.recorded_bf16_units("AMD EPYC")


def test_measure_result_loads_the_recorded_benchmark(tmp_path):
    from pathlib import Path
    rec = rl.MeasureResult.load(Path(__file__).resolve().parents[1] / "benchmarks/results/roofline.json")
    assert rec.decode("bf16")[0]["batch"] == 1 and rec.matvec_bandwidth > 0 and rec.machine["cpu"]
    bad = tmp_path / "bad.json"
    bad.write_text("[]")
    with pytest.raises(ValueError, match="no measurement rows"):
        rl.MeasureResult.load(bad)
